package httpretry

import (
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// giveUpTokens are the reason tokens of a wire.GiveUpHeader value, indexed
// by retry.Reason (wire.ParseGiveUp reads them; a test checks each one
// parses back to itself).
var giveUpTokens = [...]string{
	retry.NotRetryable:      "not-retryable",
	retry.AttemptsExhausted: "attempts-exhausted",
	retry.Deadline:          "deadline",
	retry.Canceled:          "canceled",
	retry.BudgetExhausted:   "budget-exhausted",
	retry.CircuitOpen:       "circuit-open",
	retry.Limited:           "limited",
}

// giveUpValue returns the wire.GiveUpHeader value of a give-up.
func giveUpValue(re *retry.Error) string {
	tok := "unknown"
	if int(re.Reason) < len(giveUpTokens) && giveUpTokens[re.Reason] != "" {
		tok = giveUpTokens[re.Reason]
	}
	v := tok + ";attempts=" + strconv.Itoa(re.Attempts)
	if d := retry.RetryAfter(re); d > 0 { // the breaker's next probe round, the refused sleep or the server's hint
		s := int64(d / time.Second) // rounded up, without the overflow of d+time.Second-1 near the largest Duration
		if d%time.Second != 0 {
			s++
		}
		v += ";retry-after=" + strconv.FormatInt(s, 10)
	}
	return v
}

// dontRetry reports whether the layer below said not to retry resp's
// request: the don't-retry signal, or a give-up of its own (a Transport
// under this one, or a handler that copied its dependency's give-up).
func dontRetry(h http.Header) bool {
	return wire.DontRetry(h) || len(h[wire.GiveUpHeader]) > 0
}

// probeValue is the wire.ProbeHeader value, shared and never modified.
var probeValue = []string{"1"}

// timeoutValues keeps recent wire.TimeoutHeader values for reuse, by their
// number of milliseconds modulo its size: with an attempt timeout, most
// attempts of a transport send the same few values (the timeout less a
// millisecond), which then cost no allocation. A value is shared by the
// requests that send it and never modified. Safe for concurrent use.
type timeoutValues [64]atomic.Pointer[[1]string]

// get returns the wire.TimeoutHeader value of an attempt with left until
// its deadline (whole milliseconds, rounded down, at least 0), reused when
// the same value was made last for its slot.
func (tv *timeoutValues) get(left time.Duration) []string {
	ms := max(int64(left/time.Millisecond), 0)
	var buf [20]byte
	b := strconv.AppendInt(buf[:0], ms, 10)
	slot := &tv[ms&int64(len(tv)-1)]
	if v := slot.Load(); v != nil && v[0] == string(b) {
		return v[:]
	}
	v := &[1]string{string(b)}
	slot.Store(v)
	return v[:]
}

// attemptHeader returns the header of attempt n of a request with header
// src and the transport's idempotency key (nil if none): see call.header.
// src's wire.AttemptHeader and wire.ProbeHeader are not copied (skipped
// rather than deleted after: a delete from a map costs a lookup): the
// attempt number is set here from the second attempt on, and the probe mark
// by the caller, on a probe only.
func attemptHeader(src http.Header, key []string, n int) http.Header {
	h := make(http.Header, len(src)+2)
	for k, v := range src {
		switch {
		case isMark(k):
		case key != nil && isKeyField(k):
			// The transport's key goes instead: the request had none but
			// blank fields, which a server would refuse as an empty key.
		case len(k) == len(wire.TimeoutHeader) && strings.EqualFold(k, wire.TimeoutHeader):
			// Every spelling under the canonical key, which an attempt with
			// a deadline replaces: a forwarded spelling of the caller's
			// must not go beside the transport's own value.
			h[wire.TimeoutHeader] = slices.Concat(h[wire.TimeoutHeader], v) // a new slice: the caller's stays as it is
		default:
			h[k] = v
		}
	}
	if n > 1 {
		h[wire.AttemptHeader] = attemptValue(n)
	}
	if key != nil {
		h[idempotency.Header] = key
	}
	return h
}

// canonicalHeader returns h with every field under its canonical key: h
// itself when all its keys are canonical (the header's methods write them
// so), else a copy in which the lines of the keys that differ only in
// case are merged. A header set by assigning to the map keeps the
// caller's spelling ("authorization"), net/http sends it as written, and
// the server reads it as the canonical field: the cache must see it too.
func canonicalHeader(h http.Header) http.Header {
	for k := range h {
		if http.CanonicalHeaderKey(k) != k {
			// Merged in the order of the keys, as net/http writes them
			// (sorted), not in the map's: the same request must read the
			// same fields every time.
			keys := slices.Sorted(maps.Keys(h))
			c := make(http.Header, len(h))
			for _, k := range keys {
				ck := http.CanonicalHeaderKey(k)
				c[ck] = append(c[ck], h[k]...)
			}
			return c
		}
	}
	return h
}

// callerMarks reports whether a caller's request carries the transport's
// own marks, the attempt number or the probe mark (a proxy that forwards
// the header fields of the request it got): such a request goes as a copy,
// whose attempt number and probe mark are the transport's, so that the
// server does not take an original for a third attempt and a probe. Two
// map lookups per spelling, canonical and lower case (a field assigned to
// the map under another spelling is sent as written: HTTP/2 and many
// proxies write names in lower case): a plain request still goes as it is,
// with no allocation and no walk over its fields. Other spellings are
// found only when the request goes as a copy (see attemptHeader).
func callerMarks(h http.Header) bool {
	//lint:ignore SA1008 a field assigned to the map under its lower-case name is sent so: looked up on purpose
	return len(h[wire.AttemptHeader]) > 0 || len(h[wire.ProbeHeader]) > 0 || len(h[attemptLower]) > 0 || len(h[probeLower]) > 0
}

// attemptLower and probeLower are the lower-case spellings of the marks
// (a test checks them against package wire's names).
const (
	attemptLower = "stormguard-attempt"
	probeLower   = "stormguard-probe"
)

// isKeyField reports whether k is a spelling of an idempotency key field:
// Idempotency-Key or X-Idempotency-Key.
func isKeyField(k string) bool {
	return len(k) == len(idempotency.Header) && strings.EqualFold(k, idempotency.Header) ||
		len(k) == len("X-Idempotency-Key") && strings.EqualFold(k, "X-Idempotency-Key")
}

// isMark reports whether header key k names wire.AttemptHeader or
// wire.ProbeHeader, in any spelling.
func isMark(k string) bool {
	return len(k) == len(wire.AttemptHeader) && (k == wire.AttemptHeader || strings.EqualFold(k, wire.AttemptHeader)) ||
		len(k) == len(wire.ProbeHeader) && (k == wire.ProbeHeader || strings.EqualFold(k, wire.ProbeHeader))
}

// fieldValues returns the values of the field name (canonical) in h,
// whatever the spelling of its key: h[name] alone, or the lines of every
// spelling merged in the order of the keys, as net/http writes them
// (sorted) and so as the server reads them, never in the map's order.
func fieldValues(h http.Header, name string) []string {
	var buf [2]string // on the stack: one spelling, or two, cost no allocation
	keys := buf[:0]
	for k, vs := range h {
		if len(vs) > 0 && len(k) == len(name) && (k == name || strings.EqualFold(k, name)) {
			keys = append(keys, k)
		}
	}
	switch len(keys) {
	case 0:
		return nil
	case 1:
		return h[keys[0]]
	}
	slices.Sort(keys)
	var vs []string
	for _, k := range keys {
		vs = append(vs, h[k]...)
	}
	return vs
}
