package httpretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// switchable answers from memory: 503 while down, 200 otherwise. It counts
// the requests it gets. Used inside a synctest bubble, where sockets would
// keep the bubble from idling.
type switchable struct {
	down  atomic.Bool
	calls atomic.Int64
}

func (s *switchable) RoundTrip(r *http.Request) (*http.Response, error) {
	s.calls.Add(1)
	code := 200
	if s.down.Load() {
		code = 503
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("x")), Request: r}, nil
}

// TestWaitsBehindOpenBreaker: a request whose deadline lies beyond the
// breaker's next probe round waits for it instead of failing, and goes out
// as a probe; one without a deadline, or with too short a one, fails at
// once. Run on synctest's clock.
func TestWaitsBehindOpenBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &switchable{}
		base.down.Store(true)
		var waits atomic.Int64
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.BreakerWait && e.Outcome == "admitted" {
				waits.Add(1)
			}
		})
		tr, err := httpretry.NewTransport(base, httpretry.WithBudget(nil), httpretry.WithObserver(obs),
			httpretry.WithBreaker(&breaker.Config{MinCalls: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }}))
		if err != nil {
			t.Fatal(err)
		}
		call := func(ctx context.Context) (*http.Response, error) {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://dependency.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			return resp, err
		}

		// Trip the breaker: open for exactly 1 s.
		resp, err := call(context.Background())
		if g, _ := gaveUp(resp); err != nil || g.Reason != "circuit-open" {
			t.Fatalf("first call = %v, %v; want a 503 given up for the open circuit", resp, err)
		}
		base.down.Store(false)

		// No deadline: fails fast.
		start := time.Now()
		if _, err := call(context.Background()); !errors.Is(err, breaker.ErrOpen) || time.Since(start) != 0 {
			t.Errorf("call without a deadline = %v after %v; want the open breaker's error at once", err, time.Since(start))
		}
		// A deadline before the probe round: fails fast too.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		if _, err := call(ctx); !errors.Is(err, retry.CircuitOpen) || time.Since(start) != 0 {
			t.Errorf("call with 500ms left = %v after %v; want circuit open at once", err, time.Since(start))
		}
		cancel()
		if n := base.calls.Load(); n != 1 {
			t.Errorf("base got %d requests while the breaker was open, want only the first", n)
		}

		// A deadline beyond the round: waits, then goes as a probe.
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err = call(ctx)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("call with 10s left = %v, %v; want the 200 after waiting", resp, err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("waited %v, want the 1s until the probe round", waited)
		}
		if waits.Load() != 1 || base.calls.Load() != 2 {
			t.Errorf("%d admitted waits, %d requests; want 1 wait and the probe", waits.Load(), base.calls.Load())
		}
	})
}

// recordingBase is a switchable that also records each request's attempt
// header.
type recordingBase struct {
	switchable
	attempts []string
}

func (r *recordingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	r.attempts = append(r.attempts, req.Header.Get(wire.AttemptHeader))
	return r.switchable.RoundTrip(req)
}

// A request that waits behind the breaker through several failed probes
// sends more requests than its attempt limit (probes do not count against
// it): their attempt headers go on counting, and nothing panics.
func TestProbesBeyondTheAttemptLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &recordingBase{}
		base.down.Store(true)
		tr, err := httpretry.NewTransport(base, httpretry.WithBudget(nil),
			httpretry.WithBreaker(&breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }}))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(4500 * time.Millisecond) // the dependency comes back
			base.down.Store(false)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://dependency.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("RoundTrip = %v, %v; want the 200 after the outage", resp, err)
		}
		_ = resp.Body.Close()
		// The first attempt trips the breaker; probes at 1, 2, 3 and 4 s
		// fail, the one at 5 s succeeds.
		if want := []string{"", "2", "3", "4", "5", "6"}; !slices.Equal(base.attempts, want) {
			t.Errorf("attempt headers %q, want %q", base.attempts, want)
		}
	})
}
