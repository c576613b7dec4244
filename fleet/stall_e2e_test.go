package fleet

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// openings counts the breaker openings a fleet observes.
type openings struct{ n atomic.Int64 }

func (o *openings) Observe(_ context.Context, e observe.Event) {
	if e.Kind == observe.BreakerState && e.To == breaker.Open.String() {
		o.n.Add(1)
	}
}

// stallRig is n processes, each a fleet on the test Redis with
// Config.Limit, each starting a call to host "api" every 100 ms (10 a
// second) on a goroutine of its own, until stop. Each call is one attempt,
// with attemptTimeout; the dependency is dep.
type stallRig struct {
	t            *testing.T
	fleets       []*Fleet
	obs          openings
	name         string
	stop         chan struct{}
	wg           sync.WaitGroup
	timeouts     atomic.Int64 // attempts that ran out of time
	firstTimeout atomic.Int64 // when the first did (ns since the rig began; 0: none)
	begin        time.Time
}

func newStallRig(t *testing.T, n int, attemptTimeout time.Duration, dep func(ctx context.Context) error) *stallRig {
	r := &stallRig{t: t, name: uniqueName(t), stop: make(chan struct{}), begin: time.Now()}
	rc := redisClient(t)
	cleanup(t, rc, r.name)
	for range n {
		f, err := New(rc, Config{Name: r.name, Limit: &limit.Config{}, Observer: &r.obs})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		r.fleets = append(r.fleets, f)
		p := policy(t, f, "api", retry.WithMaxAttempts(1), retry.WithAttemptTimeout(attemptTimeout))
		r.wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-r.stop:
					return
				case <-tick.C:
				}
				r.wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*attemptTimeout)
					defer cancel()
					_ = p.Do(ctx, func(ctx context.Context, _ int) error {
						err := dep(ctx)
						if errors.Is(err, context.DeadlineExceeded) {
							r.timeouts.Add(1)
							r.firstTimeout.CompareAndSwap(0, int64(time.Since(r.begin)))
						}
						return err
					})
				})
			}
		})
	}
	t.Cleanup(r.close)
	return r
}

// close stops the calls and waits for them.
func (r *stallRig) close() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
}

// field reads a field of the host's hash on Redis (0 if absent).
func (r *stallRig) field(name string) int64 {
	r.t.Helper()
	v, err := redisClient(r.t).HGet(context.Background(), keyPrefix+"{"+r.name+"}:api", name).Result()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseFloat(v, 64)
	return int64(n)
}

// sleepCtx sleeps for d or until ctx ends, and returns ctx's error then.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestStallRuleLatencyRampNoOpening: ten processes of 10 calls a second
// against a dependency that answers every call, its latency rising from
// 5 ms to 400 ms over 8 s (after 4 s at 5 ms for the fleet to learn its
// baseline): the stall rule sees stalled watches (its reports reach
// Redis) and never opens a breaker, since answers keep coming. (A rule
// that counted slow calls alone opened the breakers 23-26 times in such a
// ramp: docs/fleet.md.)
func TestStallRuleLatencyRampNoOpening(t *testing.T) {
	if testing.Short() {
		t.Skip("14 s of real time")
	}
	start := time.Now()
	latency := func() time.Duration {
		e := time.Since(start) - 4*time.Second
		if e <= 0 {
			return 5 * time.Millisecond
		}
		return 5*time.Millisecond + time.Duration(min(float64(e)/float64(8*time.Second), 1)*float64(395*time.Millisecond))
	}
	r := newStallRig(t, 10, 3*time.Second, func(ctx context.Context) error { return sleepCtx(ctx, latency()) })
	time.Sleep(14 * time.Second)
	r.close()
	if r.field("zr") == 0 {
		t.Fatal("no stall report reached Redis: the ramp did not exercise the rule")
	}
	if n := r.obs.n.Load(); n != 0 {
		t.Fatalf("%d breaker openings on a dependency that answered every call", n)
	}
}

// TestStallRuleHangOpensBeforeTimeouts: the same processes; after 4 s the
// dependency stops answering (every attempt waits for its 3 s timeout).
// Every process's breaker opens before the first attempt times out (the
// rule, not the timeouts, opened them: the host's hash says so).
func TestStallRuleHangOpensBeforeTimeouts(t *testing.T) {
	start := time.Now()
	r := newStallRig(t, 10, 3*time.Second, func(ctx context.Context) error {
		if time.Since(start) < 4*time.Second {
			return sleepCtx(ctx, 5*time.Millisecond)
		}
		<-ctx.Done()
		return ctx.Err()
	})
	allOpen := func() bool {
		for _, f := range r.fleets {
			if f.hostFor("api").brk.State() == breaker.Closed {
				return false
			}
		}
		return true
	}
	if !eventually(10*time.Second, allOpen) {
		t.Fatal("the breakers did not all open within 6 s of the hang")
	}
	if n := r.timeouts.Load(); n != 0 {
		t.Fatalf("%d attempts had timed out (the first %v into the run) before every breaker opened", n, time.Duration(r.firstTimeout.Load()))
	}
	if r.field("zo") != 1 {
		t.Fatal("the host's hash does not say the stall rule opened the breaker")
	}
}
