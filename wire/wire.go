// Package wire is stormguard's protocol on the wire: the HTTP header fields
// and gRPC metadata through which a client and the servers it calls keep
// retries to one layer. Clients (packages httpretry and grpcretry) write
// and read them, servers (package admission, grpcretry's server
// interceptors) read and write them; this package depends on nothing but
// the standard library, so neither side imports the other.
//
// The protocol, in one paragraph: a client numbers its retries
// ([AttemptHeader] over HTTP, [PreviousAttemptsMetadata] over gRPC), so
// that a server sees retry pressure and can refuse retries beyond a ratio.
// A server (or a layer below it that already did its retrying) tells its
// caller not to retry on top: "Stormguard-Retry: no" over HTTP
// ([SetDontRetry], read with [DontRetry]), a negative pushback over gRPC
// ([PushbackMetadata]). A client that gave up on a failure response marks
// the response it hands back with [GiveUpHeader], read with [ParseGiveUp].
// So that a server drops work for callers who left, a client says how long
// it waits for each attempt ([TimeoutHeader]; gRPC has its own deadline);
// so that a server that came back is seen to be back, a client marks its
// circuit breaker's probes ([ProbeHeader]), which a server's admission
// lets past its retry ratio onto idle capacity; and a server that sheds
// for lack of room says how many requests it runs at once
// ([CapacityHeader]).
package wire

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// AttemptHeader is the request header field a client puts on every retry:
// the attempt number, 2 for the first retry, 3 for the next, and so on, as
// a decimal integer ("Stormguard-Attempt: 2"). A first attempt carries none
// (so it costs nothing): a request without the field is an original. Like
// Envoy's x-envoy-attempt-count, it lets a server see retry pressure. A
// server reads it with
//
//	n, ok := wire.ParseAttempt(r.Header.Get(wire.AttemptHeader))
//
// (net/http's own Transport may resend a request once, unseen by the
// client's retry loop, when a kept-alive connection turns out closed before
// anything was read from it; the resend carries the same number.)
const AttemptHeader = "Stormguard-Attempt"

// ProbeHeader is the request header field a client puts on an attempt that
// its circuit breaker let through to find out whether the server is back:
// a probe, or the first send of a call released after waiting behind the
// open breaker ("Stormguard-Probe: 1"; a server reads only the value "1",
// without regard to surrounding spaces and tabs). Such an attempt usually
// carries an [AttemptHeader] of 2 or more (it follows a failed one), yet it
// is not retry pressure: a breaker sends a few per round however many calls
// wait. A server's admission lets it skip its retry ratio, within bounds
// it documents (package admission), so that recovery is seen when it
// happens. Over gRPC the same mark is the metadata key "stormguard-probe"
// (the field's name in lower case) with the value "1". Package httpretry
// and grpcretry's client send it (retry.IsProbe says when).
const ProbeHeader = "Stormguard-Probe"

// TimeoutHeader is the request header field in which a client says how
// long it will wait for this attempt's answer: the time left until the
// earlier of the attempt's timeout and the call's deadline, in whole
// milliseconds, rounded down, as a decimal integer
// ("Stormguard-Timeout-Ms: 950"; 0 means the time is up). It plays the
// role of gRPC's grpc-timeout and Envoy's x-envoy-expected-rq-timeout-ms
// (which package admission also reads): a server drops work whose caller
// has left, or will have left before the work can start, instead of doing
// it for nobody. The time counts from when the server reads the field; the
// time the request spent on the network is not subtracted. Package
// httpretry sends it on every attempt that has a deadline except the first
// attempt of a plain request (no attempt timeout nor overall timeout of
// the transport's, among the conditions its package lists), which it sends
// unchanged (so that a request that succeeds at once costs nothing): with
// its attempt timeout set, every attempt carries it.
const TimeoutHeader = "Stormguard-Timeout-Ms"

// CapacityHeader is the response header field a server's admission puts
// on an answer that sheds a request for lack of room: its capacity hint,
// the number of requests it runs at once at most as it stands now (its
// in-flight limit), a decimal integer ("Stormguard-Capacity: 40"). A
// client that is the server's only caller (a gateway, one shared transport
// per process) should keep fewer attempts than that in flight to it; a
// client that is one of many gets a share of it, which the server does not
// know. It is a hint about the server's capacity, not a grant: it says
// nothing of the other callers' use of it. Package httpretry, with a
// limiter it built (its WithLimit), caps that limiter at the hint for a
// while after each hinted 503 or 429. Over gRPC there is no equivalent
// yet: grpcretry's server interceptors send none.
const CapacityHeader = "Stormguard-Capacity"

// PreviousAttemptsMetadata is the gRPC request metadata key that carries how
// many attempts of the same call came before this one: "1" on the second
// attempt, "2" on the third (gRPC's own name, from its retry design). A
// first attempt carries none. Its values parse with [ParseAttempt].
const PreviousAttemptsMetadata = "grpc-previous-rpc-attempts"

// PushbackMetadata is the gRPC trailer key of the server's retry pushback
// (gRPC's own name): a non-negative decimal number of milliseconds to wait
// before the next attempt (a floor), or a negative or malformed value
// meaning "do not retry" (the server is overloaded, or a layer below it
// already retried): gRPC's form of the don't-retry signal.
const PushbackMetadata = "grpc-retry-pushback-ms"

// dontRetryHeader carries the HTTP don't-retry signal; dontRetryValue is
// its one defined value.
const (
	dontRetryHeader = "Stormguard-Retry"
	dontRetryValue  = "no"
)

// DontRetry reports whether h carries the don't-retry signal,
// "Stormguard-Retry: no" (the value compared without regard to case or
// surrounding spaces and tabs; other values are ignored and reserved). A
// server, or a layer below it that already did its retrying, sends it on a
// failure response to say: this layer has already retried, or the
// dependency is overloaded, so do not add retries on top. It plays the role
// of gRPC's negative pushback and of the SRE book's "overloaded; don't
// retry" error.
func DontRetry(h http.Header) bool {
	for _, v := range h[dontRetryHeader] {
		if asciiEqualFold(strings.Trim(v, " \t"), "no") {
			return true
		}
	}
	return false
}

// SetDontRetry sets the don't-retry signal, "Stormguard-Retry: no", in h
// (see [DontRetry]). The value's slice is h's own (one small allocation):
// code that edits it in place changes no other header.
func SetDontRetry(h http.Header) {
	h[dontRetryHeader] = []string{dontRetryValue}
}

// maxAttempt bounds what [ParseAttempt] accepts, so that a hostile value
// can neither overflow nor claim absurd numbers.
const maxAttempt = 1 << 20

// ParseAttempt parses the value of an [AttemptHeader] field (or of
// [PreviousAttemptsMetadata]) leniently: surrounding spaces and tabs are
// ignored and, if a proxy folded several lines into one comma-separated
// value, the first element counts. The number must be decimal digits only
// (no sign), from 1 to 1048576. ok is false, and n 0, otherwise (an empty
// value included). ParseAttempt never panics and allocates nothing.
func ParseAttempt(value string) (n int, ok bool) {
	if i := strings.IndexByte(value, ','); i >= 0 {
		value = value[:i]
	}
	v := strings.Trim(value, " \t")
	if v == "" {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if n <= maxAttempt { // leading zeros of any length are the number's; past the bound it is out
			n = n*10 + int(c-'0')
		}
	}
	if n < 1 || n > maxAttempt {
		return 0, false
	}
	return n, true
}

// GiveUpHeader is the response header field a client adds to a failure
// response it hands back because it gave up retrying: why, as a token,
// after how many attempts and, when known, in how many whole seconds the
// server may be tried again, e.g.
// "Stormguard-Gave-Up: circuit-open;attempts=2;retry-after=3" (see
// [GiveUp]). A server never needs to send it; a handler that copies it from
// its dependency's response into its own says the same there: a layer
// below gave up.
const GiveUpHeader = "Stormguard-Gave-Up"

// giveUpReasons are the reason tokens of a GiveUpHeader value.
var giveUpReasons = [...]string{"not-retryable", "attempts-exhausted", "deadline", "canceled", "budget-exhausted", "circuit-open", "limited"}

// GiveUp is what a [GiveUpHeader] value says.
type GiveUp struct {
	// Reason is why the client gave up, one of the tokens
	// "not-retryable" (the request could not be retried, or the response
	// carried the don't-retry signal), "attempts-exhausted",
	// "budget-exhausted" (its retry budget refused a retry),
	// "circuit-open" (its circuit breaker refused the next attempt),
	// "limited" (its concurrency limiter had no slot for the next attempt
	// in time),
	// "deadline" (the wait the server asked for ends past the deadline or
	// exceeds the client's maximum) and "canceled", in lower case.
	Reason string
	// Attempts is how many attempts it made (0 if the value does not say).
	Attempts int
	// RetryAfter is how long until the server may be tried again, in whole
	// seconds (0 if the value does not say; a number too large for a
	// time.Duration saturates at the largest one).
	RetryAfter time.Duration
}

// ParseGiveUp parses a [GiveUpHeader] value: a reason token and the
// parameters attempts and retry-after, each "name=value" after a ';'
// (names and the token compared without regard to case; spaces trimmed
// around a parameter and around its value, but a name followed by a space,
// as in "attempts = 2", is not one it knows; attempts read as
// [ParseAttempt] reads a value; the last valid one of a parameter wins).
// Unknown parameters and malformed values are ignored. ok is false, and g the zero GiveUp, when the reason token is
// unknown (an empty value included). ParseGiveUp never panics.
func ParseGiveUp(value string) (g GiveUp, ok bool) {
	tok, params, _ := strings.Cut(value, ";")
	tok = strings.Trim(tok, " \t")
	for _, r := range giveUpReasons {
		if asciiEqualFold(tok, r) {
			g.Reason = r
		}
	}
	if g.Reason == "" {
		return GiveUp{}, false
	}
	for p := range strings.SplitSeq(params, ";") {
		k, v, found := strings.Cut(strings.Trim(p, " \t"), "=")
		switch {
		case !found:
		case asciiEqualFold(k, "attempts"):
			if n, ok := ParseAttempt(v); ok { // a malformed value is ignored, not a reset
				g.Attempts = n
			}
		case asciiEqualFold(k, "retry-after"):
			if d, isNum := parseSeconds(strings.Trim(v, " \t")); isNum {
				g.RetryAfter = d
			}
		}
	}
	return g, true
}

// parseSeconds parses a string of ASCII digits as a number of seconds,
// saturating at the largest Duration. isNum is false if v is empty or holds
// anything but digits.
func parseSeconds(v string) (d time.Duration, isNum bool) {
	// Digits only, checked first: ParseUint reports a range error as soon
	// as the digits overflow, before it reaches a junk character after them.
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseUint(v, 10, 64) // digits only: no sign, no underscore
	var ne *strconv.NumError
	switch {
	case err == nil && n <= math.MaxInt64/uint64(time.Second):
		return time.Duration(n) * time.Second, true
	case err == nil, errors.As(err, &ne) && ne.Err == strconv.ErrRange:
		return math.MaxInt64, true
	}
	return 0, false
}

// asciiEqualFold reports whether s and t are equal under ASCII case
// folding only: a header's tokens are ASCII, and Unicode folding would
// take "\u017f" (long s) for an "s".
func asciiEqualFold(s, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := 0; i < len(s); i++ {
		a, b := s[i], t[i]
		if 'A' <= a && a <= 'Z' {
			a += 'a' - 'A'
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		if a != b {
			return false
		}
	}
	return true
}
