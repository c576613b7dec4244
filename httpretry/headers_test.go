package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// FuzzRetryAfterResponse sends fuzzed Retry-After values through a real
// Transport, on a synctest bubble's clock: whatever the header says, the
// transport never panics, never sleeps less than a valid hint asks, and
// retries a 503 at most twice.
func FuzzRetryAfterResponse(f *testing.F) {
	for _, s := range []string{"2", "0", "-1", "1.5", "Sun, 06 Nov 1994 08:49:37 GMT", "Sat, 01 Jan 2000 00:00:03 GMT", "99999999999999999999", "", "soon"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsFunc(s, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
			return // control characters: not a header value net/http sends as is
		}
		synctest.Test(t, func(t *testing.T) {
			srv, o := serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header()["Retry-After"] = []string{s}
				w.WriteHeader(503)
			})
			tr, tl := newTransport(t, srv.Client().Transport, httpretry.WithBudget(nil))
			hint, valid := httpretry.ParseRetryAfter(s, time.Now()) // as the first 503 reads it
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
			if err != nil {
				t.Fatalf("RoundTrip with Retry-After %q: %v", s, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n := o.count(); n < 1 || n > 3 || resp.StatusCode != 503 {
				t.Fatalf("Retry-After %q: %d attempts, status %d", s, n, resp.StatusCode)
			}
			if valid {
				if sl := tl.Sleeps(); len(sl) > 0 && sl[0] < hint {
					t.Fatalf("Retry-After %q (%v): slept %v, less than the hint", s, hint, sl[0])
				}
				if hint > time.Minute && len(tl.Sleeps()) > 0 {
					t.Fatalf("Retry-After %q (%v) beyond the default MaxRetryAfter: slept %v", s, hint, tl.Sleeps())
				}
			}
		})
	})
}

// TestGaveUpThroughClientTimeout: an http.Client with a Timeout wraps the
// response body; the give-up mark must survive that.
func TestGaveUpThroughClientTimeout(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) })
	tr, _ := newTransport(t, srv.Client().Transport)
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readClose(t, resp)
	if g, ok := gaveUp(resp); g.Reason != "attempts-exhausted" || g.Attempts != 3 || !ok {
		t.Errorf("GaveUp = %+v, %v; want attempts exhausted, 3, true", g, ok)
	}
	if !overloaded(resp, nil) {
		t.Errorf("Overloaded = false, want true")
	}
}

// TestGiveUpReasonOneSpelling: the reason a give-up header names is the
// Reason of the GiveUp event the same call reported (and so of the
// metrics, spans and logs built on the event): one spelling per reason.
func TestGiveUpReasonOneSpelling(t *testing.T) {
	always503 := func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusServiceUnavailable) }
	tests := []struct {
		name, method, want string
		handler            func(w http.ResponseWriter, r *http.Request, n int)
		opts               []httpretry.Option
	}{
		{"attempts", "GET", "attempts-exhausted", always503, nil},
		{"unkeyed POST", "POST", "not-retryable", always503, nil},
		{"budget", "GET", "budget-exhausted", always503,
			[]httpretry.Option{httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: -1})}},
		{"breaker", "GET", "circuit-open", always503, []httpretry.Option{httpretry.WithBreaker(tripFast())}},
		{"Retry-After past the deadline", "GET", "deadline", func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusServiceUnavailable)
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := serveMem(t, tt.handler)
			var mu sync.Mutex
			var reasons []string
			obs := observe.Func(func(_ context.Context, e observe.Event) {
				if e.Kind == observe.GiveUp {
					mu.Lock()
					reasons = append(reasons, e.Reason)
					mu.Unlock()
				}
			})
			tr, _ := newTransport(t, srv.Client().Transport, append(tt.opts, httpretry.WithObserver(obs))...)
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), tt.method, srv.URL, nil))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			readClose(t, resp)
			g, ok := gaveUp(resp)
			mu.Lock()
			defer mu.Unlock()
			if !ok || g.Reason != tt.want || !slices.Equal(reasons, []string{tt.want}) {
				t.Errorf("header reason %q (%v), events' reasons %q; want %q in both", g.Reason, ok, reasons, tt.want)
			}
		})
	}
}

// TestCallerMarksNotForwarded: a caller's own attempt number and probe
// mark (header fields a proxy copied from the request it got) never go out
// on a first attempt that is not a probe, with or without an attempt
// timeout (without one the first attempt was the caller's request as is).
func TestCallerMarksNotForwarded(t *testing.T) {
	for _, at := range []time.Duration{0, time.Second} {
		var got http.Header
		base := answerFunc(func(r *http.Request) (int, []string) {
			got = r.Header.Clone()
			return http.StatusOK, nil
		})
		tr, err := httpretry.NewTransport(base, httpretry.WithAttemptTimeout(at))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://h.example/", nil)
		req.Header.Set(wire.AttemptHeader, "3")
		req.Header.Set(wire.ProbeHeader, "1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got.Get(wire.AttemptHeader) != "" || got.Get(wire.ProbeHeader) != "" {
			t.Errorf("attempt timeout %v: the first attempt went with %s %q, %s %q", at,
				wire.AttemptHeader, got.Get(wire.AttemptHeader), wire.ProbeHeader, got.Get(wire.ProbeHeader))
		}
		if req.Header.Get(wire.AttemptHeader) != "3" {
			t.Errorf("the caller's request was changed: %v", req.Header)
		}
	}
}
