package grpcretry

import (
	"math"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/wire"
)

// keyMetadata is the request metadata key of an idempotency key:
// idempotency.Header in lower case, as gRPC writes metadata keys (a test
// holds them equal).
const keyMetadata = "idempotency-key"

// maxPushback bounds a parsed pushback: longer values saturate here, 200
// years, beyond the longest retry.WithMaxRetryAfter (150 years), so the
// loop gives up at once on them, and far enough from the largest Duration
// that a time a hint ahead never wraps.
const maxPushback = 200 * 365 * 24 * time.Hour

// hint is what a failed attempt's server said about retrying.
type hint struct {
	after time.Duration // the floor on the next sleep
	set   bool          // a pushback >= 0 or a RetryInfo was sent
	stop  bool          // a negative or malformed pushback: do not retry
}

// outranks reports whether a race's failed copy a carries more of the
// server's word than b, a later one: a don't-retry pushback, or a longer
// one (the loop's floor).
func outranks(a, b end) bool {
	wa, _, sa := parsePushback(a.trailer[wire.PushbackMetadata])
	wb, _, sb := parsePushback(b.trailer[wire.PushbackMetadata])
	if sa != sb {
		return sa
	}
	return wa > wb
}

// parsePushback reads the values of a grpc-retry-pushback-ms trailer as
// grpc-go's own retry does (strconv.Atoi on the one value): no value, no
// pushback; one value that is a decimal integer of 64 bits (an optional
// sign, then digits; nothing around them) and not below 0: wait at least
// that many milliseconds (saturating at maxPushback); anything else (a
// negative number, a space, garbage, an empty value, a number beyond 64
// bits, several values) means "do not retry". It never panics and
// allocates nothing.
func parsePushback(values []string) (after time.Duration, present, stop bool) {
	switch len(values) {
	case 0:
		return 0, false, false
	case 1:
	default:
		return 0, true, true
	}
	v := values[0]
	neg := false
	if len(v) > 0 && (v[0] == '+' || v[0] == '-') {
		neg, v = v[0] == '-', v[1:]
	}
	if v == "" {
		return 0, true, true
	}
	var ms int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, true, true
		}
		d := int64(c - '0')
		if ms > (math.MaxInt64-d)/10 {
			return 0, true, true // out of Atoi's range: an error there too
		}
		ms = ms*10 + d
	}
	if neg && ms != 0 {
		return 0, true, true
	}
	return time.Duration(min(ms, int64(maxPushback/time.Millisecond))) * time.Millisecond, true, false
}

// retryInfo returns the delay of the first google.rpc.RetryInfo among st's
// details, if it has one with a valid, non-negative delay.
func retryInfo(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		ri, ok := d.(*errdetails.RetryInfo)
		if !ok || ri.GetRetryDelay() == nil {
			continue
		}
		rd := ri.GetRetryDelay()
		if rd.CheckValid() != nil || rd.GetSeconds() < 0 || rd.GetNanos() < 0 {
			continue
		}
		return min(rd.AsDuration(), maxPushback), true
	}
	return 0, false
}

// serverHint reads the pushback trailer and the RetryInfo of a failed
// attempt. With both, the longer floor counts; a don't-retry pushback wins
// over everything.
func serverHint(trailer metadata.MD, st *status.Status) hint {
	var h hint
	var present bool
	h.after, present, h.stop = parsePushback(trailer[wire.PushbackMetadata])
	h.set = present && !h.stop
	if h.stop {
		return hint{stop: true}
	}
	if d, ok := retryInfo(st); ok {
		h.after, h.set = max(h.after, d), true
	}
	return h
}

// statusOf returns err's gRPC status (Unknown for an error without one).
func statusOf(err error) *status.Status {
	st, _ := status.FromError(err)
	if st == nil {
		st = status.New(codes.Unknown, err.Error())
	}
	return st
}
