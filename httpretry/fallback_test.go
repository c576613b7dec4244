package httpretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// fallbackRecorder is a fallback that answers 200 "cached" and records
// what it was given.
type fallbackRecorder struct {
	mu   sync.Mutex
	reqs []*http.Request
	errs []*retry.Error
}

func (f *fallbackRecorder) fallback(req *http.Request, err *retry.Error) (*http.Response, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.errs = append(f.errs, err)
	f.mu.Unlock()
	return &http.Response{
		StatusCode: 200, Status: "200 OK", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"X-From": {"fallback"}}, Body: io.NopCloser(strings.NewReader("cached")), Request: req,
	}, nil
}

func (f *fallbackRecorder) calls() ([]*http.Request, []*retry.Error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*http.Request(nil), f.reqs...), append([]*retry.Error(nil), f.errs...)
}

// TestFallback: a request the host's failure defeated gets the fallback's
// answer, with the reason; the last response from the host has been
// closed. A request that was not retryable or was canceled gets none.
func TestFallback(t *testing.T) {
	always503 := func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}
	tests := []struct {
		name     string
		handler  func(w http.ResponseWriter, r *http.Request, n int)
		opts     []httpretry.Option
		ctx      func(t *testing.T) context.Context
		method   string
		calls    int          // RoundTrips made, the last one checked
		reason   retry.Reason // 0: no fallback
		attempts int          // attempts of the checked call
		status   int          // status returned without a fallback; 0: an error
	}{
		{name: "attempts exhausted", handler: always503, calls: 1, reason: retry.AttemptsExhausted, attempts: 3},
		{name: "budget exhausted", handler: always503, calls: 1, reason: retry.BudgetExhausted, attempts: 1,
			opts: []httpretry.Option{httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: -1})}},
		{name: "breaker tripped by the call", handler: always503, calls: 1, reason: retry.CircuitOpen, attempts: 1,
			opts: []httpretry.Option{httpretry.WithBreaker(tripFast())}},
		{name: "breaker open before the call (fails fast)", handler: always503, calls: 2, reason: retry.CircuitOpen, attempts: 0,
			opts: []httpretry.Option{httpretry.WithBreaker(tripFast())}},
		{name: "Retry-After beyond the deadline", handler: func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(503)
		}, calls: 1, reason: retry.Deadline, attempts: 1},
		{name: "deadline during an attempt", handler: func(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() },
			opts: []httpretry.Option{httpretry.WithTimeout(50 * time.Millisecond)}, calls: 1, reason: retry.Deadline, attempts: 1},
		{name: "404", handler: func(w http.ResponseWriter, r *http.Request, n int) { http.NotFound(w, r) }, calls: 1, status: 404},
		{name: "unkeyed POST", handler: always503, method: "POST", calls: 1, status: 503},
		{name: "canceled", handler: always503, calls: 1, ctx: func(t *testing.T) context.Context {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			return ctx
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, tt.handler)
			rec := &recordingRT{base: srv.Client().Transport}
			fb := &fallbackRecorder{}
			tr, _ := newTransport(t, rec, append(tt.opts, httpretry.WithFallback(fb.fallback))...)
			ctx := context.Background()
			if tt.ctx != nil {
				ctx = tt.ctx(t)
			}
			method := tt.method
			if method == "" {
				method = "GET"
			}
			var (
				req  *http.Request
				resp *http.Response
				err  error
			)
			for range tt.calls {
				req = newRequest(t, ctx, method, srv.URL, nil)
				resp, err = tr.RoundTrip(req)
				if err == nil {
					readClose(t, resp)
				}
			}
			reqs, errs := fb.calls()
			if tt.reason == 0 {
				if len(reqs) != 0 {
					t.Fatalf("fallback called (%v), want no fallback", errs[0])
				}
				switch {
				case tt.status == 0 && err == nil:
					t.Errorf("RoundTrip = %d, want an error", resp.StatusCode)
				case tt.status != 0 && (err != nil || resp.StatusCode != tt.status):
					t.Errorf("RoundTrip = %v, %v; want the %d", resp, err, tt.status)
				}
				return
			}
			if err != nil {
				t.Fatalf("RoundTrip error %v, want the fallback's response", err)
			}
			if resp.StatusCode != 200 || resp.Header.Get("X-From") != "fallback" {
				t.Errorf("RoundTrip = %d %v, want the fallback's 200", resp.StatusCode, resp.Header)
			}
			if len(reqs) != tt.calls {
				t.Fatalf("fallback called %d times, want %d", len(reqs), tt.calls)
			}
			got := errs[len(errs)-1]
			if reqs[len(reqs)-1] != req {
				t.Errorf("fallback got another request than the caller's")
			}
			if got.Reason != tt.reason || got.Attempts != tt.attempts || !errors.Is(got, tt.reason) {
				t.Errorf("fallback error = %v (reason %v, %d attempts), want %v after %d", got, got.Reason, got.Attempts, tt.reason, tt.attempts)
			}
			if tt.reason == retry.CircuitOpen && !errors.Is(got, breaker.ErrOpen) {
				t.Errorf("fallback error %v does not wrap the breaker's", got)
			}
			if open := rec.unclosed(); len(open) != 0 {
				t.Errorf("responses %v of the host left open", open)
			}
			if n := len(rec.sent()); n != obs.count() && tt.name != "deadline during an attempt" {
				t.Errorf("base sent %d, server saw %d", n, obs.count())
			}
		})
	}
	t.Run("fallback's error", func(t *testing.T) {
		srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
		boom := errors.New("no cached copy")
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithFallback(func(*http.Request, *retry.Error) (*http.Response, error) {
			return nil, boom
		}))
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if resp != nil || !errors.Is(err, boom) {
			t.Errorf("RoundTrip = %v, %v; want nil and the fallback's error", resp, err)
		}
	})
}

// TestGaveUpRetryAfter: the give-up mark says when the host may be tried
// again: the breaker's time until its probe, the refused sleep, or the
// server's hint.
func TestGaveUpRetryAfter(t *testing.T) {
	tests := []struct {
		name    string
		handler func(w http.ResponseWriter, r *http.Request, n int)
		opts    []httpretry.Option
		want    string
	}{
		{"circuit open", func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) },
			[]httpretry.Option{httpretry.WithBreaker(tripFast())}, "circuit-open;attempts=1;retry-after=3600"},
		{"circuit open, server's hint shorter than the open period", func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(503)
		}, []httpretry.Option{httpretry.WithBreaker(tripFast())}, "circuit-open;attempts=1;retry-after=3600"},
		{"hint beyond the maximum", func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(503)
		}, nil, "deadline;attempts=1;retry-after=3600"},
		{"attempts exhausted with a hint", func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(429)
		}, nil, "attempts-exhausted;attempts=3;retry-after=2"},
		{"attempts exhausted", func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(502) },
			nil, "attempts-exhausted;attempts=3"},
		{"don't retry from below", func(w http.ResponseWriter, r *http.Request, n int) { writeOverloaded(w) },
			nil, "not-retryable;attempts=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv, _ := serveMem(t, tt.handler)
				tr, _ := newTransport(t, srv.Client().Transport, tt.opts...)
				resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
				if err != nil {
					t.Fatalf("RoundTrip: %v", err)
				}
				readClose(t, resp)
				if got := resp.Header.Get(wire.GiveUpHeader); got != tt.want {
					t.Errorf("%s = %q, want %q", wire.GiveUpHeader, got, tt.want)
				}
				// What wire.ParseGiveUp reads is what the header says.
				g, ok := gaveUp(resp)
				want, wok := gaveUp(&http.Response{Header: http.Header{wire.GiveUpHeader: {tt.want}}})
				if g != want || ok != wok || !ok {
					t.Errorf("ParseGiveUp = %+v, %v; want %+v, true", g, ok, want)
				}
			})
		})
	}
}

// TestFallbackCircuitOpenRetryAfter: the fallback's error tells how long
// until the breaker probes again (retry.RetryAfter), whether the breaker
// was open before the call or the call's own failure tripped it.
func TestFallbackCircuitOpenRetryAfter(t *testing.T) {
	for _, calls := range []int{1, 2} {
		name := map[int]string{1: "tripped by the call", 2: "open before the call"}[calls]
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv, _ := serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
				fb := &fallbackRecorder{}
				tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithBreaker(tripFast()), httpretry.WithFallback(fb.fallback))
				for range calls {
					resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
					if err != nil {
						t.Fatal(err)
					}
					readClose(t, resp)
				}
				_, errs := fb.calls()
				if len(errs) != calls {
					t.Fatalf("fallback called %d times, want %d", len(errs), calls)
				}
				got := errs[calls-1]
				if d := retry.RetryAfter(got); d != time.Hour {
					t.Errorf("retry.RetryAfter(%v) = %v, want the breaker's hour until its probe", got, d)
				}
			})
		})
	}
}

// TestFallbackAnswersOnce: whatever the fallback returns, RoundTrip
// returns exactly one of a response and an error (a response with an
// error is closed); an error carries the key the transport made.
func TestFallbackAnswersOnce(t *testing.T) {
	var sentKey string
	base := answerFunc(func(r *http.Request) (int, []string) {
		sentKey = r.Header.Get("Idempotency-Key")
		return http.StatusServiceUnavailable, nil
	})
	closed := false
	for name, fb := range map[string]func(*http.Request, *retry.Error) (*http.Response, error){
		"both": func(r *http.Request, e *retry.Error) (*http.Response, error) {
			return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Request: r,
				Body: closeFunc(func() { closed = true })}, errors.New("cache miss")
		},
		"neither": func(*http.Request, *retry.Error) (*http.Response, error) { return nil, nil },
		"error":   func(_ *http.Request, e *retry.Error) (*http.Response, error) { return nil, e },
	} {
		tr, err := httpretry.NewTransport(base, httpretry.WithFallback(fb), httpretry.WithAutoIdempotencyKey(),
			httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodPost, "http://h.example/", strings.NewReader("p"))
		resp, err := tr.RoundTrip(req)
		if resp != nil || err == nil {
			t.Errorf("%s: RoundTrip = %v, %v; want only an error", name, resp, err)
			continue
		}
		if got := httpretry.IdempotencyKey(nil, err); sentKey == "" || got != sentKey {
			t.Errorf("%s: IdempotencyKey(nil, err) = %q, the request went with %q", name, got, sentKey)
		}
	}
	if !closed {
		t.Error("the response the fallback returned with an error was not closed")
	}
}

// closeFunc is a body that calls f when closed.
type closeFunc func()

func (closeFunc) Read([]byte) (int, error) { return 0, io.EOF }
func (f closeFunc) Close() error           { f(); return nil }

// TestRefreshToAnotherHostRefused: a 401 refresh that points the request
// at another host is an error: its sends would count against the first
// host's budget, breaker and limiter.
func TestRefreshToAnotherHostRefused(t *testing.T) {
	sends := map[string]int{}
	base := answerFunc(func(r *http.Request) (int, []string) {
		sends[r.URL.Host]++
		return http.StatusUnauthorized, nil
	})
	tr, err := httpretry.NewTransport(base, httpretry.WithRefreshOn401(func(*http.Request) (*http.Request, error) {
		return http.NewRequest(http.MethodGet, "http://api.example/", nil)
	}))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://auth.example/", nil)
	if resp, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "another host") {
		t.Errorf("RoundTrip = %v, %v; want the refresh refused", resp, err)
	}
	if sends["api.example"] != 0 {
		t.Errorf("sends %v: api.example got the refreshed request", sends)
	}
}
