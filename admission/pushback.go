package admission

import (
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// writeOverloaded answers a request with 503 Service Unavailable and the
// don't-retry signal ("Stormguard-Retry: no", see wire.SetDontRetry), with
// a short plain-text body: [PushBack]'s answer.
func writeOverloaded(w http.ResponseWriter) {
	h := w.Header()
	wire.SetDontRetry(h)
	h["Content-Type"] = []string{textPlain}
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = io.WriteString(w, "overloaded; don't retry\n")
}

// PushBack is the one-line helper for a handler whose own call to a
// dependency went through a retrying client (package httpretry): if resp
// and err show that the retrying for that dependency is done, it drains and
// closes resp's body (if any), answers w with 503 Service Unavailable,
// the don't-retry signal ("Stormguard-Retry: no") and the plain-text body
// "overloaded; don't retry", and returns true; otherwise it does nothing and returns false, and the handler goes
// on with resp and err.
//
//	resp, err := client.Do(req.WithContext(r.Context()))
//	if admission.PushBack(w, resp, err) {
//		return
//	}
//
// The retrying is done when err says it stopped because the attempts were
// exhausted (retry.AttemptsExhausted), the retry budget refused one
// (retry.BudgetExhausted), a circuit breaker was open (retry.CircuitOpen,
// breaker.ErrOpen) or the concurrency limit had no slot in time
// (retry.Limited); when resp is a response the client gave back after
// giving up for one of those reasons (its wire.GiveUpHeader); or when resp
// carries the don't-retry signal from the layer below. A plain failure
// that was not retried (a 404, a POST without an idempotency key) and a
// canceled call are not pushed back. Both resp and err may be nil.
//
// To send the signal on an answer of the handler's own (its own overload,
// a failure it retried already), call wire.SetDontRetry(w.Header())
// before writing it.
func PushBack(w http.ResponseWriter, resp *http.Response, err error) bool {
	if !overloaded(resp, err) {
		return false
	}
	if resp != nil && resp.Body != nil {
		drainClose(resp.Body)
	}
	writeOverloaded(w)
	return true
}

// overloaded reports whether resp and err show that the retrying for a
// dependency is done (see PushBack).
func overloaded(resp *http.Response, err error) bool {
	if err != nil {
		return errors.Is(err, retry.AttemptsExhausted) ||
			errors.Is(err, retry.BudgetExhausted) ||
			errors.Is(err, retry.CircuitOpen) ||
			errors.Is(err, retry.Limited) ||
			errors.Is(err, breaker.ErrOpen)
	}
	if resp == nil {
		return false
	}
	if wire.DontRetry(resp.Header) {
		return true
	}
	if vs := resp.Header[wire.GiveUpHeader]; len(vs) > 0 {
		g, _ := wire.ParseGiveUp(vs[0])
		switch g.Reason {
		case "attempts-exhausted", "budget-exhausted", "circuit-open", "limited":
			return true
		}
	}
	return false
}

// drainClose reads up to 64 KiB of a discarded response body, for at most
// 50 ms (a body that stalls must not hold the handler), and closes it, so
// that its connection can be reused.
func drainClose(rc io.ReadCloser) {
	t := time.AfterFunc(50*time.Millisecond, func() { _ = rc.Close() })
	_, _ = io.CopyN(io.Discard, rc, 64<<10)
	t.Stop()
	_ = rc.Close()
}
