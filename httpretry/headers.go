package httpretry

import (
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// AttemptHeader is the request header field the [Transport] puts on every
// retry: the attempt number, 2 for the first retry, 3 for the next, and so
// on, as a decimal integer ("Stormguard-Attempt: 2"). A first attempt
// carries none (so it costs nothing): a request without the field is an
// original. Like Envoy's x-envoy-attempt-count, it lets a server see retry
// pressure; read it with [AttemptFromRequest]. A value the caller set on
// the request is replaced on retries and removed from a first attempt that
// the transport copies anyway.
// (net/http's own Transport may resend a request once, unseen by this
// package, when a kept-alive connection turns out closed before anything
// was read from it; the resend carries the same number.)
const AttemptHeader = "Stormguard-Attempt"

// RetryHeader is the response header field that carries the "overloaded;
// don't retry" signal. Its one defined value is [RetryNo] ("no", compared
// without regard to case or surrounding spaces); other values are ignored
// and reserved.
//
// A server (or a layer below it that already did its retrying) sends
// "Stormguard-Retry: no" on a failure response to say: this layer has
// already retried, or the dependency is overloaded, so do not add retries
// on top. The [Transport] honours it from below: a response carrying it is
// never retried and is returned to the caller as is. Handlers send it
// upward with [DontRetry], [WriteOverloaded] or [PushBack]. It plays the
// role of gRPC's grpc-retry-pushback-ms with a negative value and of the
// SRE book's "overloaded; don't retry" error.
const RetryHeader = "Stormguard-Retry"

// RetryNo is the value of [RetryHeader] that means "don't retry".
const RetryNo = "no"

// maxAttemptValue bounds what [ParseAttempt] accepts, so that a hostile
// header can neither overflow nor claim absurd numbers.
const maxAttemptValue = 1 << 20

// ParseAttempt parses the value of an [AttemptHeader] field leniently:
// surrounding spaces and tabs are ignored and, if a proxy folded several
// lines into one comma-separated value, the first element counts. The
// number must be decimal digits only (no sign), from 1 to 1048576. ok is
// false, and n 0, otherwise. ParseAttempt never panics and allocates
// nothing.
func ParseAttempt(value string) (n int, ok bool) {
	if i := strings.IndexByte(value, ','); i >= 0 {
		value = value[:i]
	}
	v := strings.Trim(value, " \t")
	if v == "" || len(v) > 7 {
		return 0, false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > maxAttemptValue {
		return 0, false
	}
	return n, true
}

// AttemptFromRequest returns the attempt number a client put in r's
// [AttemptHeader] (first line, parsed with [ParseAttempt]). ok is false if
// r is nil, the header is absent or its value is not a valid number. A
// [Transport] sends no header on a first attempt, so a request without it is
// an original (or comes from a client that does not count): count it as
// attempt 1.
func AttemptFromRequest(r *http.Request) (n int, ok bool) {
	if r == nil {
		return 0, false
	}
	vs := r.Header[AttemptHeader]
	if len(vs) == 0 {
		return 0, false
	}
	return ParseAttempt(vs[0])
}

// dontRetry reports whether h carries RetryHeader: no.
func dontRetry(h http.Header) bool {
	for _, v := range h[RetryHeader] {
		if strings.EqualFold(strings.Trim(v, " \t"), RetryNo) {
			return true
		}
	}
	return false
}

// DontRetry marks the response w is about to send with "Stormguard-Retry:
// no" ([RetryHeader]): the caller should not retry it. Call it before
// WriteHeader or Write. Use it on failure responses only; the signal means
// "this layer already retried (or the dependency is overloaded)".
func DontRetry(w http.ResponseWriter) {
	w.Header()[RetryHeader] = []string{RetryNo}
}

// WriteOverloaded answers a request with 503 Service Unavailable and
// "Stormguard-Retry: no", with a short plain-text body. Handlers call it
// when their own retries to a dependency stopped (see [Overloaded]) so that
// their caller does not retry on top.
func WriteOverloaded(w http.ResponseWriter) {
	DontRetry(w)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, "overloaded; don't retry\n")
}

// Overloaded reports whether resp and err, as returned by a client whose
// transport is a [Transport], show that the retrying for this dependency is
// done and the caller should be told not to retry:
//   - err says the retries stopped because the attempts were exhausted
//     (retry.AttemptsExhausted), the retry budget refused one
//     (retry.BudgetExhausted) or a circuit breaker was open
//     (retry.CircuitOpen, breaker.ErrOpen); or
//   - resp is a response the Transport gave back after giving up on a
//     retryable status for one of those reasons (see [GaveUp]); or
//   - resp carries "Stormguard-Retry: no" from the layer below.
//
// A plain failure that was not retried (a 404, a non-idempotent POST) and a
// canceled call are not "overloaded". Both arguments may be nil.
func Overloaded(resp *http.Response, err error) bool {
	if err != nil {
		return errors.Is(err, retry.AttemptsExhausted) ||
			errors.Is(err, retry.BudgetExhausted) ||
			errors.Is(err, retry.CircuitOpen) ||
			errors.Is(err, breaker.ErrOpen)
	}
	if resp == nil {
		return false
	}
	if dontRetry(resp.Header) {
		return true
	}
	if g, ok := GaveUp(resp); ok {
		switch g.Reason {
		case retry.AttemptsExhausted, retry.BudgetExhausted, retry.CircuitOpen:
			return true
		}
	}
	return false
}

// PushBack is the one-line helper for handlers: if [Overloaded](resp, err),
// it drains and closes resp's body (if any), answers w with
// [WriteOverloaded] and returns true; otherwise it does nothing and returns
// false, and the handler goes on with resp and err.
//
//	resp, err := client.Do(req)
//	if httpretry.PushBack(w, resp, err) {
//		return
//	}
func PushBack(w http.ResponseWriter, resp *http.Response, err error) bool {
	if !Overloaded(resp, err) {
		return false
	}
	if resp != nil && resp.Body != nil {
		drainClose(resp.Body)
	}
	WriteOverloaded(w)
	return true
}

// GaveUpHeader is the response header field a [Transport] adds to a
// response it returns because it gave up retrying (the last response, whose
// status was retryable): why, as a token, after how many attempts and, when
// known, in how many seconds the host may be tried again, e.g.
// "Stormguard-Gave-Up: circuit-open;attempts=2;retry-after=3". The tokens
// are not-retryable (the request could not be retried, or the response said
// "Stormguard-Retry: no", or a second 500), attempts-exhausted,
// budget-exhausted, circuit-open and deadline (the wait the server asked
// for ends past the deadline or exceeds the maximum). Read it with
// [GaveUp]. A server never needs to send it; if a handler copies it from
// its dependency's response into its own, it means the same there: a layer
// below gave up.
const GaveUpHeader = "Stormguard-Gave-Up"

// reasonTokens are the GaveUpHeader tokens, indexed by retry.Reason.
var reasonTokens = [...]string{
	retry.NotRetryable:      "not-retryable",
	retry.AttemptsExhausted: "attempts-exhausted",
	retry.Deadline:          "deadline",
	retry.Canceled:          "canceled",
	retry.BudgetExhausted:   "budget-exhausted",
	retry.CircuitOpen:       "circuit-open",
}

// gaveUpValue returns the GaveUpHeader value for a give-up.
func gaveUpValue(re *retry.Error) string {
	tok := "unknown"
	if int(re.Reason) < len(reasonTokens) && reasonTokens[re.Reason] != "" {
		tok = reasonTokens[re.Reason]
	}
	v := tok + ";attempts=" + strconv.Itoa(re.Attempts)
	if d := retryIn(re); d > 0 {
		v += ";retry-after=" + strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
	}
	return v
}

// retryIn returns how long until the host may be tried again, as far as a
// give-up tells: the breaker's time until its next probe round, the sleep
// the loop refused, or the server's hint.
func retryIn(re *retry.Error) time.Duration {
	var oe *breaker.OpenError
	if errors.As(re, &oe) && oe.Wait > 0 {
		return oe.Wait
	}
	if re.Delay > 0 {
		return re.Delay
	}
	return retry.RetryAfter(re.Err)
}

// GiveUp is what [GaveUpHeader] says.
type GiveUp struct {
	// Reason is why the transport gave up.
	Reason retry.Reason
	// Attempts is how many attempts it made (0 if the value does not say).
	Attempts int
	// RetryAfter is how long until the host may be tried again, in whole
	// seconds (0 if the value does not say).
	RetryAfter time.Duration
}

// GaveUp reports whether resp carries [GaveUpHeader]: it is a failure
// response a [Transport] returned because it gave up retrying. If so it
// returns what the header says. ok is false for a nil resp, a response
// without the field, or a value whose reason token is unknown. GaveUp never
// panics.
func GaveUp(resp *http.Response) (g GiveUp, ok bool) {
	if resp == nil {
		return GiveUp{}, false
	}
	vs := resp.Header[GaveUpHeader]
	if len(vs) == 0 {
		return GiveUp{}, false
	}
	tok, params, _ := strings.Cut(vs[0], ";")
	tok = strings.Trim(tok, " \t")
	for r, t := range reasonTokens {
		if t != "" && strings.EqualFold(tok, t) {
			g.Reason = retry.Reason(r)
		}
	}
	if g.Reason == 0 {
		return GiveUp{}, false
	}
	for p := range strings.SplitSeq(params, ";") {
		k, v, found := strings.Cut(strings.Trim(p, " \t"), "=")
		switch {
		case !found:
		case strings.EqualFold(k, "attempts"):
			g.Attempts, _ = ParseAttempt(v)
		case strings.EqualFold(k, "retry-after"):
			if d, isNum := parseSeconds(strings.Trim(v, " \t")); isNum {
				g.RetryAfter = d
			}
		}
	}
	return g, true
}

// attemptValues returns the header values for attempts 1 to n, built once
// per Transport: every attempt shares them and nobody modifies them.
func attemptValues(n int) [][]string {
	vs := make([][]string, n)
	for i := range vs {
		vs[i] = []string{strconv.Itoa(i + 1)}
	}
	return vs
}
