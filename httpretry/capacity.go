package httpretry

import (
	"net/http"
	"strings"

	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/wire"
)

// capacityHint applies the capacity hint of a shed answer (a 503 or 429
// carrying wire.CapacityHeader) to h's limiter, when the transport built
// it (WithLimit): see guards.CapHint. Other answers, and a hint that does
// not parse, change nothing.
func capacityHint(h *host, code int, hdr http.Header) {
	if h.Hint == nil || (code != http.StatusServiceUnavailable && code != http.StatusTooManyRequests) {
		return
	}
	if n, ok := parseCapacity(hdr[wire.CapacityHeader]); ok {
		h.Hint.Apply(n)
	}
}

// parseCapacity reads the values of a wire.CapacityHeader field: exactly
// one value of decimal digits, surrounding spaces and tabs aside. Anything
// else (no value, several, an empty one, a sign, garbage) is no hint. A
// hint of 0 reads as 1 (a server that answers runs something), and values
// above guards.MaxHint saturate there. It never panics and allocates
// nothing.
func parseCapacity(values []string) (n int, ok bool) {
	if len(values) != 1 {
		return 0, false
	}
	v := strings.Trim(values[0], " \t")
	if v == "" {
		return 0, false
	}
	var x int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if x < guards.MaxHint {
			x = x*10 + int64(c-'0')
		}
	}
	return int(min(max(x, 1), guards.MaxHint)), true
}
