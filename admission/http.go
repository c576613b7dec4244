package admission

import (
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stormguard/stormguard/wire"
)

// The HTTP side.

// maxTableSeconds bounds the precomputed Retry-After values.
const maxTableSeconds = 3600

// envoyTimeoutHeader is Envoy's field for the time its router gives the
// upstream request, in milliseconds (canonical form of
// x-envoy-expected-rq-timeout-ms).
const envoyTimeoutHeader = "X-Envoy-Expected-Rq-Timeout-Ms"

// httpValues are the strings of header values built once per Controller
// (strings are immutable: sharing them is safe; each response gets slices
// of its own, which the handler that holds its header may modify).
type httpValues struct {
	retryAfter []string // index s: "s", for 1 <= s < len
	capacity   string   // the wire.CapacityHeader value; "": no limit
}

// textPlain is the Content-Type value of every answer of the package's own.
const textPlain = "text/plain; charset=utf-8"

func newHTTPValues(longest time.Duration, maxInFlight int) httpValues {
	n := min(int(longest/time.Second), maxTableSeconds) + 1
	v := httpValues{
		retryAfter: make([]string, n),
	}
	for s := 1; s < n; s++ {
		v.retryAfter[s] = strconv.Itoa(s)
	}
	if maxInFlight > 0 {
		v.capacity = strconv.Itoa(maxInFlight)
	}
	return v
}

// retryAfterSeconds converts a refusal's RetryAfter to the whole seconds
// HTTP carries: rounded down, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(int(d/time.Second), 1)
}

// maxMillisDigits bounds the digits parseMillis reads: 15 digits of
// milliseconds are over 31,000 years, and cannot overflow.
const maxMillisDigits = 15

// parseMillis parses a timeout field's value (wire.TimeoutHeader, Envoy's
// x-envoy-expected-rq-timeout-ms): a decimal number of milliseconds,
// digits only, surrounding spaces and tabs ignored, the first element of a
// comma-separated list counting. A value of more than 15 significant digits saturates
// at the largest Duration (no deadline worth keeping). ok is false for
// anything else, an empty value included. It never panics and allocates
// nothing.
func parseMillis(value string) (d time.Duration, ok bool) {
	if i := strings.IndexByte(value, ','); i >= 0 {
		value = value[:i]
	}
	v := strings.Trim(value, " \t")
	if v == "" {
		return 0, false
	}
	var n int64
	digits := 0 // significant digits: leading zeros do not count
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		if digits > 0 || c != '0' {
			digits++
		}
		if digits <= maxMillisDigits {
			n = n*10 + int64(c-'0')
		}
	}
	if digits > maxMillisDigits || n > math.MaxInt64/int64(time.Millisecond) {
		return math.MaxInt64, true
	}
	return time.Duration(n) * time.Millisecond, true
}

// farTimeout is where a timeout field stops meaning a deadline: 100 years.
const farTimeout = 100 * 365 * 24 * time.Hour

// fieldDeadline returns the earlier of dl (the context's deadline; zero:
// none) and now plus each of the timeout fields own (wire.TimeoutHeader)
// and envoy (Envoy's), read now; zero if there is none. A malformed field
// is ignored.
func (c *Controller) fieldDeadline(dl time.Time, own, envoy []string) time.Time {
	now := c.now()
	dl = earlierField(dl, now, own)
	return earlierField(dl, now, envoy)
}

// earlierField returns the earlier of dl (zero: none) and now plus the
// fewest milliseconds a timeout field's values vs say: every line, and
// every element of a comma-separated list, counts; a malformed element is
// ignored, and so is one of 100 years or more. dl if none is left.
func earlierField(dl, now time.Time, vs []string) time.Time {
	left, found := farTimeout, false
	for _, v := range vs {
		for v != "" {
			elem := v
			if i := strings.IndexByte(v, ','); i >= 0 {
				elem, v = v[:i], v[i+1:]
			} else {
				v = ""
			}
			// >= farTimeout: no deadline worth keeping (and no overflow)
			if d, ok := parseMillis(elem); ok && d < left {
				left, found = d, true
			}
		}
	}
	if !found {
		return dl
	}
	if at := now.Add(left); dl.IsZero() || at.Before(dl) {
		return at
	}
	return dl
}

// isProbe reports whether vs, the values of a request's wire.ProbeHeader,
// are the probe mark "1".
func isProbe(vs []string) bool {
	return len(vs) > 0 && strings.Trim(vs[0], " \t") == "1"
}

// fields are the values of the header fields Wrap reads, nil for a field
// that is absent.
type fields struct {
	attempt, key, xkey, probe, timeout, envoy []string
	probeRead                                 bool // probe was read
}

// rangeFieldsMax is the most fields a request may have for Wrap to read
// its fields in one pass over the map: up to about 6 fields that is
// cheaper than a lookup per name, and much cheaper for a few (callgrind,
// Go 1.25 on amd64: the handler's five names read from a map of 0, 2, 6,
// 8, 12 fields cost 71, 462, 755, 901, 1,679 instructions in one pass,
// 123, 789, 808, 839, 600 by lookups).
const rangeFieldsMax = 4

// read fills f from h, reading the map directly by the canonical names
// (Header.Get would canonicalise the name on every request). The probe
// mark is read only if f.probeRead, and may be read later with
// [fields.isProbe].
func (f *fields) read(h http.Header) {
	if len(h) > rangeFieldsMax {
		f.attempt = h[wire.AttemptHeader]
		f.key, f.xkey = h[idempotencyKeyHeader], h[xIdempotencyKeyHeader]
		f.timeout, f.envoy = h[wire.TimeoutHeader], h[envoyTimeoutHeader]
		return
	}
	f.probeRead = true
	for name, vs := range h {
		switch name {
		case wire.AttemptHeader:
			f.attempt = vs
		case idempotencyKeyHeader:
			f.key = vs
		case xIdempotencyKeyHeader:
			f.xkey = vs
		case wire.ProbeHeader:
			f.probe = vs
		case wire.TimeoutHeader:
			f.timeout = vs
		case envoyTimeoutHeader:
			f.envoy = vs
		}
	}
}

// isProbe reports whether h, the header f was read from, carries the probe
// mark, wire.ProbeHeader with the value "1".
func (f *fields) isProbe(h http.Header) bool {
	if !f.probeRead {
		f.probe, f.probeRead = h[wire.ProbeHeader], true
	}
	return isProbe(f.probe)
}

// Wrap returns next behind c: net/http middleware for a server or the
// gateway in front of it. For every request it reads
//   - the attempt number from the wire.AttemptHeader field (absent, or not
//     a valid number as wire.ParseAttempt reads it: an original);
//   - the probe mark, wire.ProbeHeader "1" (see [Controller.AcquireProbe]);
//   - the caller's deadline: the earliest of the request context's deadline
//     and the time the request is read plus the milliseconds of the
//     wire.TimeoutHeader field and of Envoy's
//     x-envoy-expected-rq-timeout-ms (malformed values are ignored; 100
//     years or more means no deadline);
//
// and calls [Controller.Acquire] (or AcquireProbe) with them and the
// request's context. It then either runs next (releasing the permit when
// next returns or panics) or answers without calling next:
//
//	503 Service Unavailable
//	Retry-After: <whole seconds>
//	Stormguard-Retry: no          (when Decision.DontRetry)
//	Stormguard-Capacity: <n>      (when shed for lack of room, see below)
//	Content-Type: text/plain; charset=utf-8
//
// Retry-After is the decision's RetryAfter rounded down to whole seconds,
// at least 1: with RetryAfterBase and RetryAfterSpread in whole seconds,
// it is uniform over the RetryAfterSpread/1s values from RetryAfterBase up.
// A request shed for lack of room ([QueueFull], [QueueTimeout]) carries
// the capacity hint wire.CapacityHeader: the in-flight limit in force,
// MaxInFlight or the adaptive limit (none when MaxInFlight is negative). A request
// dropped because its caller's deadline passed or cannot be met is a
// [Canceled] refusal with the don't-retry signal. The handler's request
// is the caller's own: its context is not given the deadline read from
// the fields. A nil next answers 404 to every admitted request. The
// returned handler allocates nothing on the admitted path.
func (c *Controller) Wrap(next http.Handler) http.Handler {
	if next == nil {
		next = http.NotFoundHandler()
	}
	c.init() // here, so that the handler need not
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f fields
		if len(r.Header) > 0 {
			f.read(r.Header)
		} else {
			f.probeRead = true // none to read: all nil
		}
		// Without a valid attempt header: an original, or a client that does
		// not count.
		attempt := 1
		if len(f.attempt) > 0 {
			if n, ok := wire.ParseAttempt(f.attempt[0]); ok {
				attempt = n
			}
		}
		// The work on a field's value is done only if it is there.
		if len(f.key)+len(f.xkey) > 0 {
			if key := requestKey(f.key, f.xkey); key != "" && c.keys.seen(key, c.now()) {
				attempt = max(attempt, 2) // its key was seen: a retry, whatever it says
			}
		}
		// The probe mark matters for a retry only: an original is an
		// original, marked or not.
		probe := attempt >= 2 && f.isProbe(r.Header)
		// The caller's deadline: the context's, and the timeout fields'.
		ctx := r.Context()
		dl, _ := ctx.Deadline()
		if len(f.timeout)+len(f.envoy) > 0 {
			dl = c.fieldDeadline(dl, f.timeout, f.envoy)
		}
		var cl *clientBucket
		if c.clients != nil {
			cl = c.clients.bucket(c.cfg.Client(r))
		}
		p, d := c.acquire(ctx, attempt, probe, dl, cl)
		if d.Outcome != Admitted {
			c.writeRefusal(w, d)
			return
		}
		defer p.Release()
		next.ServeHTTP(w, r)
	})
}

// writeRefusal answers a refused request.
func (c *Controller) writeRefusal(w http.ResponseWriter, d Decision) {
	hdr := w.Header()
	// One array for the response's values, sliced per field (each slice
	// capped at its own element): the response owns them, so a handler
	// that edits one in place changes no other response's.
	vals := make([]string, 0, 3)
	add := func(key, v string) {
		vals = append(vals, v)
		hdr[key] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	if s := retryAfterSeconds(d.RetryAfter); s < len(c.http.retryAfter) {
		add("Retry-After", c.http.retryAfter[s])
	} else {
		add("Retry-After", strconv.Itoa(s))
	}
	if d.Outcome == QueueFull || d.Outcome == QueueTimeout {
		switch {
		case c.lim != nil:
			add(wire.CapacityHeader, strconv.FormatInt(c.maxInFlight.Load(), 10))
		case c.http.capacity != "":
			add(wire.CapacityHeader, c.http.capacity)
		}
	}
	body := "overloaded; try again later\n"
	if d.DontRetry {
		wire.SetDontRetry(hdr)
		body = "overloaded; don't retry\n"
	}
	add("Content-Type", textPlain)
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, body)
}
