package fleet

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// workload runs calls through a retry policy on many goroutines until
// stopped, and counts what the callers saw.
type workload struct {
	calls, attempts, errs atomic.Int64
	mu                    sync.Mutex
	badErrs               []error // errors that are neither the dependency's nor the breaker's
	stop                  chan struct{}
	wg                    sync.WaitGroup
}

// startWorkload calls op through p from n goroutines, pausing 100µs
// between calls.
func startWorkload(p *retry.Policy, n int, op func(context.Context, int) error) *workload {
	return startPaced(p, n, op, 100*time.Microsecond)
}

// startPaced calls op through p from n goroutines, pausing between calls.
func startPaced(p *retry.Policy, n int, op func(context.Context, int) error, pause time.Duration) *workload {
	w := &workload{stop: make(chan struct{})}
	counted := func(ctx context.Context, attempt int) error {
		w.attempts.Add(1)
		return op(ctx, attempt)
	}
	for range n {
		until(&w.wg, w.stop, func() {
			w.calls.Add(1)
			if err := p.Do(context.Background(), counted); err != nil {
				w.errs.Add(1)
				if !errors.Is(err, errDependency) && !errors.Is(err, breaker.ErrOpen) {
					w.mu.Lock()
					w.badErrs = append(w.badErrs, err)
					w.mu.Unlock()
				}
			}
			time.Sleep(pause)
		})
	}
	return w
}

func (w *workload) end() {
	close(w.stop)
	w.wg.Wait()
}

func ok(context.Context, int) error   { return nil }
func fail(context.Context, int) error { return errDependency }

// newPolicy returns a retry policy on the fleet guards of host: 3 attempts,
// backoff of at most a millisecond, every error retryable.
func newPolicy(t *testing.T, f *Fleet, host string) *retry.Policy {
	t.Helper()
	bo, err := backoff.New(backoff.Config{Base: 100 * time.Microsecond, Cap: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return policy(t, f, host, retry.WithClassifier(always), retry.WithMaxAttempts(3), retry.WithBackoff(bo))
}

// TestFaultsThroughProxy puts a proxy the test controls between the fleet
// and Redis and cuts it, delays it by 200 ms, blackholes it and restores
// it, while callers run: no caller ever sees an error caused by Redis, the
// success path sends nothing to Redis (the proxy counts every command: only
// the syncs pass), the fleet goes local during each fault with the local
// budget holding, and comes back by itself.
func TestFaultsThroughProxy(t *testing.T) {
	rc := redisClient(t)
	px := newProxy(t, redisAddr(t))
	const every = 20 * time.Millisecond
	cfg := Config{Name: uniqueName(t), SyncEvery: every, Timeout: 50 * time.Millisecond,
		LocalBudget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second},
		MinCalls:    1_000_000, Breaker: breaker.Config{MinCalls: 1_000_000}}
	cleanup(t, rc, cfg.Name)
	f, err := New(newClient(t, px.addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	good := startWorkload(newPolicy(t, f, "api"), 4, ok)
	flaky := newPolicy(t, f, "flaky")

	phases := []struct {
		name  string
		mode  proxyMode
		delay time.Duration
		want  Mode
	}{
		{"healthy", pass, 0, ModeFleet},
		{"cut", cut, 0, ModeLocal},
		{"restored after cut", pass, 0, ModeFleet},
		{"200ms delay", delayed, 200 * time.Millisecond, ModeLocal},
		{"restored after delay", pass, 0, ModeFleet},
		{"blackhole", blackhole, 0, ModeLocal},
		{"restored after blackhole", pass, 0, ModeFleet},
	}
	for _, ph := range phases {
		px.set(ph.mode, ph.delay)
		var took time.Duration
		start := time.Now()
		if !eventually(3*time.Second, func() bool { return f.Mode() == ph.want }) {
			t.Fatalf("%s: mode %v after 3s, want %v (stats %+v)", ph.name, f.Mode(), ph.want, f.stats())
		}
		took = time.Since(start)
		before, cmds := f.stats(), px.count("EVALSHA")+px.count("EVAL")
		calls := good.calls.Load()
		var bad *workload
		if ph.want == ModeLocal {
			bad = startWorkload(flaky, 2, fail) // a failing dependency during the fault
		}
		time.Sleep(15 * every)
		if bad != nil {
			bad.end()
			retries := bad.attempts.Load() - bad.calls.Load()
			if limit := 0.1*float64(bad.calls.Load()) + 10; float64(retries) > limit {
				t.Errorf("%s: %d retries for %d failing calls in local mode, over the local budget's %.1f",
					ph.name, retries, bad.calls.Load(), limit)
			}
			if len(bad.badErrs) > 0 {
				t.Errorf("%s: a failing call ended with %v, not the dependency's error", ph.name, bad.badErrs[0])
			}
			flaky = newPolicy(t, f, "flaky") // fresh counts for the next fault
		}
		after := f.stats()
		rate := float64(after.RoundTrips-before.RoundTrips) / (15 * every).Seconds()
		t.Logf("%-25s mode %v after %3dms; %6d successful calls, %4.0f round trips/s, %d script commands reached Redis",
			ph.name, f.Mode(), took.Milliseconds(), good.calls.Load()-calls, rate, px.count("EVALSHA")+px.count("EVAL")-cmds)
		if f.Mode() != ph.want {
			t.Errorf("%s: mode changed to %v during the phase", ph.name, f.Mode())
		}
	}
	good.end()
	s := f.stats()
	if good.errs.Load() != 0 || len(good.badErrs) != 0 {
		t.Errorf("%d of %d successful calls returned an error through the faults", good.errs.Load(), good.calls.Load())
	}
	if s.LeaseCalls != 0 {
		t.Errorf("%d lease round trips: only the failing workload (local mode) retried", s.LeaseCalls)
	}
	if s.ProbeCalls != 0 {
		t.Errorf("%d probe round trips with closed breakers", s.ProbeCalls)
	}
	if n := px.count("EVALSHA") + px.count("EVAL"); n > s.RoundTrips {
		t.Errorf("Redis got %d script commands, the fleet made only %d round trips", n, s.RoundTrips)
	}
	if good.calls.Load() < 10*s.RoundTrips {
		t.Errorf("%d calls for %d round trips: too few calls to show the success path costs none", good.calls.Load(), s.RoundTrips)
	}
	t.Logf("%d successful calls, 0 errors; %d round trips in all (%d syncs ok, %d failed), %d mode changes; last error: %v",
		good.calls.Load(), s.RoundTrips, s.Syncs, s.SyncFailures, s.ModeChanges, s.LastError)
}

// TestRoundTripRates prints the Redis round trips per second of one
// process with ten hosts, idle and during an outage.
func TestRoundTripRates(t *testing.T) {
	rc := redisClient(t)
	px := newProxy(t, redisAddr(t))
	cfg := Config{Name: uniqueName(t), Timeout: 50 * time.Millisecond} // the default 100ms interval
	cleanup(t, rc, cfg.Name)
	f, err := New(newClient(t, px.addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, h := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"} {
		if _, err := f.Guards(h); err != nil {
			t.Fatal(err)
		}
	}
	measure := func(d time.Duration) float64 {
		before := f.stats().RoundTrips
		time.Sleep(d)
		return float64(f.stats().RoundTrips-before) / d.Seconds()
	}
	idle := measure(time.Second)
	px.set(cut, 0)
	if !eventually(time.Second, func() bool { return f.Mode() == ModeLocal }) {
		t.Fatal("no local mode with Redis cut")
	}
	down := measure(time.Second)
	px.set(blackhole, 0)
	hole := measure(time.Second)
	px.set(pass, 0)
	t.Logf("round trips per second, one process, 10 hosts, sync every %v: idle %.1f, Redis refusing %.1f, Redis blackholed %.1f",
		f.cfg.SyncEvery, idle, down, hole)
	if idle > 11 || down > 11 || hole > 11 {
		t.Errorf("more than one round trip per interval: idle %.1f, down %.1f, blackholed %.1f per second", idle, down, hole)
	}
	if idle < 5 {
		t.Errorf("idle: %.1f round trips per second, want about 10", idle)
	}
}

// A lease request cut short by the caller's own deadline refuses that
// retry (the fleet could not charge it in time; the local budget's floor
// would admit it) and does not switch the fleet to local mode: only Redis
// being slower than Timeout does. The lease the request brings, if it
// comes, serves the next caller.
func TestWithdrawWithinShortDeadline(t *testing.T) {
	rc := redisClient(t)
	px := newProxy(t, redisAddr(t))
	// One slice of an hour: a lease ends with its slice, and the late
	// lease must not come after the end of a shorter one.
	cfg := Config{Name: uniqueName(t), SyncEvery: 50 * time.Millisecond, Timeout: time.Second,
		Budget:   budget.Config{Window: time.Hour, Slices: 1},
		MinCalls: 1_000_000, Breaker: breaker.Config{MinCalls: 1_000_000}}
	cleanup(t, rc, cfg.Name)
	f, err := New(newClient(t, px.addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := f.hostBudget("h")
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b.Deposit()
	}
	// Redis answers 100 ms late: a lease that waited Timeout (1 s) would
	// come; the caller's 20 ms end the wait first.
	px.set(delayed, 100*time.Millisecond)
	if b.WithdrawWithin(20 * time.Millisecond) {
		t.Errorf("WithdrawWithin(20ms) with Redis 100ms late = true, want a refusal (no fleet retry in time)")
	}
	if m := f.Mode(); m != ModeFleet {
		t.Errorf("mode %v after a lease cut short by the caller, want fleet (stats %+v)", m, f.stats())
	}
	// The request went on without its caller: its lease serves the next.
	if !eventually(2*time.Second, func() bool { hs, _ := f.hostStats("h"); return hs.Lease > 0 }) {
		hs, _ := f.hostStats("h")
		t.Fatalf("no lease installed after the late reply: %+v", hs)
	}
	calls := f.stats().LeaseCalls
	if !b.WithdrawWithin(time.Millisecond) {
		t.Errorf("WithdrawWithin(1ms) with a lease held = false")
	}
	if n := f.stats().LeaseCalls - calls; n != 0 {
		t.Errorf("%d lease round trips with a lease held", n)
	}
	px.set(pass, 0)
	if m := f.Mode(); m != ModeFleet {
		t.Errorf("mode %v, want fleet", m)
	}
	if hs, _ := f.hostStats("h"); hs.Used != 1 || hs.Granted != 1 {
		t.Errorf("%+v: want the one retry granted late, spent by the next caller", hs)
	}
}
