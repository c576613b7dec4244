package httpretry

import (
	"net/http"
	"strings"
	"time"
)

// cacheControl is what the stale cache reads of a Cache-Control field (RFC
// 9111 section 5.2, RFC 5861 section 4).
type cacheControl struct {
	noStore, noCache, private, public bool
	mustRevalidate, proxyRevalidate   bool
	// maxAge and staleIfError are in seconds; -1 when absent.
	maxAge, staleIfError int64
}

// maxDelta is the largest delta-seconds value kept: RFC 9111 section 1.2.2
// has a recipient take a larger one as 2^31.
const maxDelta = 1 << 31

// parseCacheControl reads the Cache-Control field lines of h. Directive
// names are case-insensitive; values may be tokens or quoted strings. A
// directive that appears twice keeps its first value (RFC 9111 section
// 4.2.1). A max-age whose value is not delta-seconds counts as 0 (the
// response is stale at once); such a stale-if-error counts as absent. A
// no-cache or private with a field-name list counts as the bare directive
// (the response is not kept). It never fails: anything it cannot read is
// skipped.
func parseCacheControl(h http.Header) cacheControl {
	cc := cacheControl{maxAge: -1, staleIfError: -1}
	seenMaxAge, seenSIE := false, false
	for _, line := range h.Values("Cache-Control") {
		for len(line) > 0 {
			var name, value string
			name, value, line = nextDirective(line)
			switch strings.ToLower(name) {
			case "no-store":
				cc.noStore = true
			case "no-cache":
				cc.noCache = true
			case "private":
				cc.private = true
			case "public":
				cc.public = true
			case "must-revalidate":
				cc.mustRevalidate = true
			case "proxy-revalidate":
				cc.proxyRevalidate = true
			case "max-age":
				if !seenMaxAge {
					seenMaxAge = true
					if cc.maxAge = deltaSeconds(value); cc.maxAge < 0 {
						cc.maxAge = 0
					}
				}
			case "stale-if-error":
				if !seenSIE {
					seenSIE = true
					cc.staleIfError = deltaSeconds(value)
				}
			}
		}
	}
	return cc
}

// nextDirective splits the first directive off a Cache-Control field value:
// its name, its value (unquoted; "" if none) and the rest after the comma
// that ends it. A quoted value may contain commas and backslash escapes.
func nextDirective(s string) (name, value, rest string) {
	s = strings.TrimLeft(s, " \t,")
	i := strings.IndexAny(s, "=,")
	if i < 0 {
		return strings.TrimSpace(s), "", ""
	}
	name = strings.TrimSpace(s[:i])
	if s[i] == ',' {
		return name, "", s[i+1:]
	}
	s = strings.TrimLeft(s[i+1:], " \t")
	if strings.HasPrefix(s, `"`) {
		var b strings.Builder
		for j := 1; j < len(s); j++ {
			switch c := s[j]; {
			case c == '\\' && j+1 < len(s):
				j++
				b.WriteByte(s[j])
			case c == '"':
				rest = s[j+1:]
				if k := strings.IndexByte(rest, ','); k >= 0 {
					rest = rest[k+1:]
				} else {
					rest = ""
				}
				return name, b.String(), rest
			default:
				b.WriteByte(c)
			}
		}
		return name, b.String(), "" // unterminated: the rest of the line
	}
	if k := strings.IndexByte(s, ','); k >= 0 {
		return name, strings.TrimSpace(s[:k]), s[k+1:]
	}
	return name, strings.TrimSpace(s), ""
}

// deltaSeconds parses a delta-seconds value (1*DIGIT): a number of seconds,
// at most 2^31 (a larger one counts as 2^31); -1 if s is not one.
func deltaSeconds(s string) int64 {
	if s == "" {
		return -1
	}
	var n int64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return -1
		}
		if n < maxDelta {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, maxDelta)
}

// seconds converts delta-seconds to a Duration.
func seconds(n int64) time.Duration { return time.Duration(n) * time.Second }
