package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// capacityHost is a host in memory that serves workers requests at a time,
// each for service (workers/service requests per second), queueing the
// rest, and answers 503 at once until up. For a synctest bubble.
type capacityHost struct {
	up      time.Time
	service time.Duration
	slots   chan struct{}
}

func newCapacityHost(up time.Time, workers int, service time.Duration) *capacityHost {
	return &capacityHost{up: up, service: service, slots: make(chan struct{}, workers)}
}

func (h *capacityHost) RoundTrip(r *http.Request) (*http.Response, error) {
	code := 200
	if time.Now().Before(h.up) {
		code = 503
	} else {
		select {
		case h.slots <- struct{}{}:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
		time.Sleep(h.service)
		<-h.slots
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("x")), Request: r}, nil
}

// coldStart runs n requests started together during an outage of a host
// that serves 5000 requests per second (50 at a time, 10 ms each) through
// a new transport with opts, each with a 20 s deadline, and returns when
// each succeeded after the host came back (in order) and the failures,
// each with its time since the recovery ("+" for one after it).
func coldStart(t *testing.T, n int, outage time.Duration, opts ...httpretry.Option) (done []time.Duration, failed []string) {
	t.Helper()
	up := time.Now().Add(outage)
	host := newCapacityHost(up, 50, 10*time.Millisecond)
	tr, err := httpretry.NewTransport(host, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		if i > 0 {
			// One start per millisecond (200 ms for 200): requests that
			// all start in one instant all pass the breaker before any
			// answer trips it, or not, as the scheduler runs them (170
			// of 200 refused a retry by the budget in one loaded run).
			time.Sleep(time.Millisecond)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://dependency.test/", nil)
			resp, err := tr.RoundTrip(req)
			mu.Lock()
			defer mu.Unlock()
			at := time.Since(up).Round(time.Millisecond) // negative: before the recovery
			if err != nil {
				failed = append(failed, fmt.Sprintf("%+v: %v", at, err))
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != 200 {
				g, _ := gaveUp(resp)
				failed = append(failed, fmt.Sprintf("%+v: %d %s", at, resp.StatusCode, g.Reason))
				return
			}
			done = append(done, time.Since(up))
		})
	}
	wg.Wait()
	slices.Sort(done)
	return done, failed
}

// TestColdStartAfterOutage: 200 requests started together during a 2 s
// outage of a host that serves 5000/s, through a new transport (no rate
// seen before the breaker trips) with the default breaker, its probe
// rounds pinned 1 s apart. With a limiter the breaker releases the waiting
// requests at once and the limiter's slots pace them: every request that
// waited is served within 1 s of the host's recovery. A few requests fail
// long before the recovery, in the milliseconds before the breaker trips:
// with the default budget, those whose first attempt failed then and were
// refused a retry (Reason BudgetExhausted); with or without one, one whose
// three attempts all met instant 503s then, its full-jitter pauses drawn
// near zero (Reason AttemptsExhausted: 1-2 runs in 60 under -race, at 11 to
// 16 ms into the outage). None fails for another reason or after the
// recovery, and at most a tenth fail.
// Without a limiter the release is paced by the rate the breaker saw
// before it tripped: the test logs how long that takes. Run on synctest's
// clock.
func TestColdStartAfterOutage(t *testing.T) {
	const n, outage = 200, 2 * time.Second
	tests := []struct {
		name    string
		limit   *limit.Config
		budget  bool
		checked bool // false: only logged
	}{
		{"limiter, default budget", &limit.Config{}, true, true},
		{"limiter, no budget", &limit.Config{}, false, true},
		{"no limiter, default budget", nil, true, false},
		{"no limiter, no budget", nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				opts := []httpretry.Option{httpretry.WithLimit(tt.limit),
					httpretry.WithBreaker(&breaker.Config{Rand: func() float64 { return 0.5 }})}
				if !tt.budget {
					opts = append(opts, httpretry.WithBudget(nil))
				}
				done, failed := coldStart(t, n, outage, opts...)
				if len(done) == 0 {
					t.Fatalf("no request served; %d failed: %v", len(failed), failed[:min(len(failed), 5)])
				}
				t.Logf("%d of %d served after the recovery, p50 %v, last %v; %d failed %v",
					len(done), n, done[len(done)/2], done[len(done)-1], len(failed), failed[:min(len(failed), 3)])
				if !tt.checked {
					return
				}
				if last := done[len(done)-1]; last > time.Second {
					t.Errorf("last request served %v after the recovery, want within 1s", last)
				}
				for _, f := range failed {
					refused := tt.budget && strings.Contains(f, "budget-exhausted")
					if strings.HasPrefix(f, "+") || !(refused || strings.Contains(f, "attempts-exhausted")) {
						t.Errorf("a request failed: %s; want every one served but those that gave up before the recovery (budget or attempts exhausted)", f)
					}
				}
				if len(failed) > n/10 {
					t.Errorf("%d of %d requests failed before the recovery, want at most %d", len(failed), n, n/10)
				}
			})
		})
	}
}

// TestWithLimitRefusal: with a limit of one attempt in flight and waiting
// off, a request made while another holds the slot sends nothing and
// fails at once with Reason Limited (limit.ErrLimited reachable), gets the
// fallback, and is one a handler pushes back; a bad limit configuration is
// an error of NewTransport naming the field. Run on synctest's clock.
func TestWithLimitRefusal(t *testing.T) {
	if _, err := httpretry.NewTransport(nil, httpretry.WithLimit(&limit.Config{Throttle: 0.5})); err == nil || !strings.Contains(err.Error(), "Config.Throttle") {
		t.Errorf("NewTransport(WithLimit(Throttle 0.5)) = %v, want an error naming Config.Throttle", err)
	}
	synctest.Test(t, func(t *testing.T) {
		host := newCapacityHost(time.Now(), 1, time.Second)
		var fellBack *retry.Error
		tr, err := httpretry.NewTransport(host, httpretry.WithLimit(&limit.Config{Max: 1, Waiting: -1}),
			httpretry.WithFallback(func(r *http.Request, re *retry.Error) (*http.Response, error) {
				fellBack = re
				return nil, re
			}))
		if err != nil {
			t.Fatal(err)
		}
		held := make(chan error, 1)
		go func() { _, err := getClose(t, tr, "http://dependency.test/"); held <- err }() // holds the slot for 1 s
		synctest.Wait()
		resp, err := getClose(t, tr, "http://dependency.test/")
		if resp != nil || !errors.Is(err, retry.Limited) || !errors.Is(err, limit.ErrLimited) || !overloaded(nil, err) {
			t.Errorf("request while the slot is held = %v, %v; want Reason Limited, pushed back", resp, err)
		}
		if fellBack == nil || fellBack.Reason != retry.Limited || fellBack.Attempts != 0 {
			t.Errorf("fallback got %v, want the limited give-up after 0 attempts", fellBack)
		}
		if len(host.slots) != 1 {
			t.Errorf("host busy with %d requests, want 1: the refused request sent nothing", len(host.slots))
		}
		if err := <-held; err != nil {
			t.Errorf("the request holding the slot = %v", err)
		}
	})
}
