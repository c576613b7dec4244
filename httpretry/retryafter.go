package httpretry

import (
	"math"
	"net/http"
	"strings"
	"time"
)

// maxSeconds is the largest number of whole seconds a time.Duration holds.
const maxSeconds = math.MaxInt64 / int64(time.Second)

// ParseRetryAfter parses the value of a Retry-After header (RFC 9110
// section 10.2.3) and returns how long to wait from now.
//
// Surrounding spaces are trimmed. A value of digits only is delay-seconds;
// one too large for a time.Duration saturates at the largest Duration
// instead of overflowing. Anything else is parsed as an HTTP-date in any of
// the three forms [http.ParseTime] accepts (IMF-fixdate, obsolete RFC 850,
// ANSI C asctime); a date at or before now gives 0. ok is false, and d 0,
// for an empty value or garbage (a sign, a fraction, an unknown date form):
// such a header is to be ignored, as if absent.
//
// d is never negative. ParseRetryAfter never panics and does not cap d:
// deciding how long a hint is worth honouring is the retry policy's job
// (see retry.WithMaxRetryAfter).
func ParseRetryAfter(value string, now time.Time) (d time.Duration, ok bool) {
	v := strings.TrimSpace(value)
	if v == "" {
		return 0, false
	}
	if secs, isNum := parseSeconds(v); isNum {
		return secs, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// parseSeconds parses a string of ASCII digits as a number of seconds,
// saturating at the largest Duration. isNum is false if v holds anything
// but digits.
func parseSeconds(v string) (d time.Duration, isNum bool) {
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= maxSeconds { // once past maxSeconds, only validate the rest
			n = n*10 + int64(c-'0')
		}
	}
	if n > maxSeconds {
		return math.MaxInt64, true
	}
	return time.Duration(n) * time.Second, true
}

// retryAfterOf returns the Retry-After of resp, 0 if none.
func retryAfterOf(resp *http.Response) time.Duration {
	if v := resp.Header["Retry-After"]; len(v) > 0 {
		d, _ := ParseRetryAfter(v[0], time.Now())
		return d
	}
	return 0
}
