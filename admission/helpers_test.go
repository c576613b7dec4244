package admission_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// peak keeps the running count of something and its highest value; safe
// for concurrent use.
type peak struct{ cur, max atomic.Int64 }

// enter counts one more and records the peak.
func (p *peak) enter() {
	n := p.cur.Add(1)
	for {
		m := p.max.Load()
		if n <= m || p.max.CompareAndSwap(m, n) {
			return
		}
	}
}

// leave counts one less.
func (p *peak) leave() { p.cur.Add(-1) }

// newController builds a Controller from c or fails the test.
func newController(t testing.TB, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return ctl
}

// request returns a GET request carrying attempt in its attempt header (no
// header for attempt 0).
func request(attempt int) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "http://provider.test/pay", nil)
	if attempt > 0 {
		r.Header.Set(wire.AttemptHeader, strconv.Itoa(attempt))
	}
	return r
}

// serve sends one request with the given attempt number through h and
// returns the recorded response.
func serve(h http.Handler, attempt int) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request(attempt))
	return rec
}

// checkRefusal checks that rec is a refusal: 503, a Retry-After of whole
// seconds in [lo, hi], and the don't-retry signal exactly when dontRetry.
func checkRefusal(t *testing.T, rec *httptest.ResponseRecorder, lo, hi int, dontRetry bool) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("refusal status = %d, want 503", rec.Code)
	}
	ra := rec.Header().Get("Retry-After")
	if s, err := strconv.Atoi(ra); err != nil || s < lo || s > hi {
		t.Errorf("refusal Retry-After = %q, want whole seconds in [%d, %d]", ra, lo, hi)
	}
	if got := wire.DontRetry(rec.Header()); got != dontRetry {
		t.Errorf("refusal carries the don't-retry signal: %v, want %v (header %v)", got, dontRetry, rec.Header())
	}
}

// nopWriter is a ResponseWriter that keeps nothing, for allocation counts
// and benchmarks. Like net/http's own, it has WriteString.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header               { return w.h }
func (w *nopWriter) Write(p []byte) (int, error)       { return len(p), nil }
func (w *nopWriter) WriteString(s string) (int, error) { return len(s), nil }
func (w *nopWriter) WriteHeader(int)                   {}

// seeded returns the Float64 of a seeded generator for Config.Rand.
func seeded(seed uint64) func() float64 { return rand.New(rand.NewPCG(seed, 0)).Float64 }

// handlerOf returns a handler that calls f with the request's attempt
// number (1 without a valid header) and answers 200.
func handlerOf(f func(attempt int)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, ok := wire.ParseAttempt(r.Header.Get(wire.AttemptHeader))
		if !ok {
			n = 1
		}
		f(n)
	})
}

// recorder is an observer that keeps every event, in order; safe for
// concurrent use.
type recorder struct {
	mu     sync.Mutex
	events []observe.Event
}

func (r *recorder) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// all returns a copy of the events kept so far.
func (r *recorder) all() []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observe.Event(nil), r.events...)
}

// last returns the latest event, the zero Event if none.
func (r *recorder) last() observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.events) == 0 {
		return observe.Event{}
	}
	return r.events[len(r.events)-1]
}

// counter is an observer that only counts events; safe for concurrent use.
type counter struct{ n atomic.Int64 }

func (c *counter) Observe(context.Context, observe.Event) { c.n.Add(1) }
