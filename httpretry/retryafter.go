// Package httpretry applies stormguard's retry rules to HTTP: a
// [Transport] (an [http.RoundTripper]) and [NewClient] that retry what is
// worth retrying, per destination host, behind a retry budget and a
// circuit breaker, and the header helpers that keep retries to one layer.
//
//	client, err := httpretry.NewClient(httpretry.WithTimeout(10 * time.Second))
//	...
//	resp, err := client.Get(url) // 503, 503, 200: the caller sees the 200
//
// What is retried (the rest is returned at once):
//
//	| outcome                                    | retried?                                    |
//	| ------------------------------------------ | ------------------------------------------- |
//	| timeout, connection reset/refused/closed   | yes, if the request is safe to repeat       |
//	| 408, 429, 502, 503, 504                    | yes, same condition; 429/503 Retry-After    |
//	| 500                                        | once, and only for an idempotent method     |
//	| 401                                        | no; optional credential refresh and resend  |
//	| other 4xx, 1xx, 2xx, 3xx                   | no                                          |
//	| any response with "Stormguard-Retry: no"   | no                                          |
//
// A request is safe to repeat when its method is idempotent (GET, HEAD,
// OPTIONS, TRACE, PUT, DELETE) or it carries an Idempotency-Key
// ([WithAutoIdempotencyKey] adds one, once per request, reused on every
// attempt), and its body can be sent again: a body with GetBody (as
// [http.NewRequest] sets for in-memory bodies) is replayed through it; a
// body without one is sent once, or buffered up to a bound with
// [WithBufferBodies]. A POST without a key gets exactly one attempt.
//
// Delays: full-jitter backoff by default; a Retry-After on 429 and 503
// (delay-seconds or any of the three HTTP-date forms, see
// [ParseRetryAfter]) is a floor. If the wait would end past the deadline
// ([WithTimeout], or the request context's) or exceeds [WithMaxRetryAfter],
// the transport gives up at once and returns that response.
//
// Giving up: on a retryable status the caller gets the last response with
// a nil error, so it can read the status and body; the transport marks it
// with [GaveUpHeader] ("Stormguard-Gave-Up: attempts-exhausted;attempts=3",
// read with [GaveUp]);
// on a network error, a [*retry.Error] that says why it stopped and wraps
// the cause. Bodies of discarded responses are drained (up to 64 KiB) and
// closed so their connections are reused; the connection pool is never
// closed.
//
// One layer retries: every attempt carries [AttemptHeader]
// ("Stormguard-Attempt: 1", 2, ...; servers read it with
// [AttemptFromRequest]). A response with [RetryHeader] ("Stormguard-Retry:
// no") is never retried, and a handler whose own retries to a dependency
// stopped sends that signal upward with [PushBack]:
//
//	resp, err := client.Do(req.WithContext(r.Context()))
//	if httpretry.PushBack(w, resp, err) { // 503 + Stormguard-Retry: no
//		return
//	}
//
// Each destination host (URL.Host) gets its own retry budget and circuit
// breaker, kept in a bounded table ([WithMaxHosts]). The transport logs
// only to a logger given with [WithLogger]; time comes from [WithClock].
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
