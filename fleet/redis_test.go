package fleet

import (
	"context"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// newFleets builds n processes of one fleet on Redis through client c.
func newFleets(t *testing.T, c redis.UniversalClient, n int, cfg Config) []*Fleet {
	t.Helper()
	out := make([]*Fleet, n)
	for i := range out {
		f, err := New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		out[i] = f
	}
	return out
}

// redisWindow sums the requests and retries the fleet's hash for host holds,
// over every slice.
func redisWindow(t *testing.T, c redis.UniversalClient, cfg Config, host string) (q, r int64) {
	t.Helper()
	raw, err := c.HGetAll(context.Background(), keyPrefix+"{"+cfg.Name+"}:"+host).Result()
	if err != nil {
		t.Fatal(err)
	}
	h := map[string]int64{}
	for f, v := range raw {
		if h[f], err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("field %s = %q: %v", f, v, err)
		}
	}
	return sumRing(h)
}

// TestRedisFleetAccounting runs 100 processes' budgets, each used by
// concurrent goroutines, against one Redis for less than one window: the
// fleet counts exactly the requests deposited and the retries spent, and
// admits no more than Ratio·requests + the fleet's floor (100 local budgets
// would have admitted 100 floors).
func TestRedisFleetAccounting(t *testing.T) {
	c := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 50 * time.Millisecond, Timeout: 2 * time.Second,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 20 * time.Second, Slices: 20}}
	cleanup(t, c, cfg.Name)
	fleets := newFleets(t, c, 100, cfg)
	var deposits, admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for i, f := range fleets {
		b, err := f.hostBudget("api")
		if err != nil {
			t.Fatal(err)
		}
		for g := range 2 {
			wg.Go(func() {
				for k := range 60 {
					for range 1 + (i+g+k)%4 {
						b.Deposit()
						deposits.Add(1)
					}
					if b.Withdraw() {
						admitted.Add(1)
					} else {
						refused.Add(1)
					}
					if k%10 == 0 {
						time.Sleep(5 * time.Millisecond)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, f := range fleets {
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var used, granted, returned int64
	for _, f := range fleets {
		if s := f.stats(); s.SyncFailures != 0 || s.ModeChanges != 0 {
			t.Fatalf("a process left fleet mode: %+v", s)
		}
		hs, _ := f.hostStats("api")
		used, granted, returned = used+hs.Used, granted+hs.Granted, returned+hs.Returned
	}
	q, r := redisWindow(t, c, cfg, "api")
	limit := 0.1*float64(deposits.Load()) + 20
	t.Logf("100 processes: %d requests, %d retries admitted, %d refused; fleet limit %.1f; leased %d, returned %d",
		deposits.Load(), admitted.Load(), refused.Load(), limit, granted, returned)
	if q != deposits.Load() {
		t.Errorf("fleet counts %d requests, processes deposited %d", q, deposits.Load())
	}
	if r != admitted.Load() || used != admitted.Load() || granted-returned != r {
		t.Errorf("fleet counts %d retries; admitted %d, used %d, leased %d - returned %d", r, admitted.Load(), used, granted, returned)
	}
	if float64(admitted.Load()) > limit {
		t.Errorf("fleet admitted %d retries, over Ratio·requests + floor = %.1f", admitted.Load(), limit)
	}
	if refused.Load() == 0 {
		t.Error("no retry refused: the test did not reach the fleet's limit")
	}
}

// TestRedisSlidingWindow runs 100 processes for several windows and checks
// every span of (window - one slice): the retries admitted in it are at most
// Ratio times the requests deposited in it and the window before (plus
// the sync's lag) plus the fleet's floor.
func TestRedisSlidingWindow(t *testing.T) {
	c := redisClient(t)
	const (
		window = time.Second
		slice  = 100 * time.Millisecond
		every  = 50 * time.Millisecond
		tmo    = 2 * time.Second
		run    = 3 * time.Second
	)
	cfg := Config{Name: uniqueName(t), SyncEvery: every, Timeout: tmo,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: 2, Window: window, Slices: int(window / slice)}}
	cleanup(t, c, cfg.Name)
	fleets := newFleets(t, c, 100, cfg)
	var mu sync.Mutex
	var deposits, retries []time.Duration
	start := time.Now()
	var wg sync.WaitGroup
	for _, f := range fleets {
		b, _ := f.hostBudget("api")
		wg.Go(func() {
			var d, r []time.Duration
			for time.Since(start) < run {
				b.Deposit()
				d = append(d, time.Since(start))
				for range 3 {
					if b.Withdraw() {
						r = append(r, time.Since(start))
					}
				}
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			deposits, retries = append(deposits, d...), append(retries, r...)
			mu.Unlock()
		})
	}
	wg.Wait()
	var rtt time.Duration
	for _, f := range fleets {
		s := f.stats()
		if s.ModeChanges != 0 {
			t.Fatalf("a process left fleet mode: %+v", s)
		}
		rtt = max(rtt, s.MaxRoundTrip)
	}
	sort.Slice(deposits, func(i, j int) bool { return deposits[i] < deposits[j] })
	sort.Slice(retries, func(i, j int) bool { return retries[i] < retries[j] })
	count := func(xs []time.Duration, from, to time.Duration) int {
		return sort.Search(len(xs), func(i int) bool { return xs[i] >= to }) -
			sort.Search(len(xs), func(i int) bool { return xs[i] >= from })
	}
	// A deposit reaches the fleet's window at the next sync: up to one
	// interval and two round trips later. A retry is counted in the slice
	// its lease was granted in: a span of window - slice - (a round trip)
	// meets at most Slices slices, all in the window of its last grant.
	reserve := 2 * window.Seconds()
	lag := slice + every + 2*rtt + 10*time.Millisecond
	span := window - slice - rtt - 10*time.Millisecond
	worst := 0.0
	for a := time.Duration(0); a < run; a += 5 * time.Millisecond {
		got := count(retries, a, a+span)
		bound := 0.1*float64(count(deposits, a-window-lag, a+span)) + reserve
		if float64(got) > bound {
			t.Errorf("[%v, %v): %d retries, bound %.1f", a, a+span, got, bound)
		}
		worst = max(worst, float64(got)/bound)
	}
	// What 100 local budgets would admit: each its own 10% plus a floor of 1 per window.
	t.Logf("%d requests, %d retries over %v; the fullest span used %.0f%% of its bound (longest round trip %v)",
		len(deposits), len(retries), run, 100*worst, rtt)
	if worst < 0.5 {
		t.Errorf("the fullest span used %.0f%% of its bound: the test did not press the budget", 100*worst)
	}
}

// TestRedisProbesFleetWide keeps a dependency down with 100 breakers in
// 100 processes that call it all the time: the fleet sends at most
// ProbeRounds·Probes probes per probe interval.
func TestRedisProbesFleetWide(t *testing.T) {
	c := redisClient(t)
	const openFor = 200 * time.Millisecond
	cfg := Config{Name: uniqueName(t), SyncEvery: 50 * time.Millisecond, Timeout: 2 * time.Second,
		MinCalls: 50, ProbeRounds: 1, Breaker: breaker.Config{MinCalls: 1000, OpenFor: openFor, Probes: 2}}
	cleanup(t, c, cfg.Name)
	fleets := newFleets(t, c, 100, cfg)
	var probes, calls atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	var tripped time.Duration
	var once sync.Once
	for _, f := range fleets {
		b, _ := f.hostBreaker("api")
		wg.Go(func() {
			for time.Since(start) < 2500*time.Millisecond {
				if p, err := b.Allow(); err == nil {
					calls.Add(1)
					if p.Probe() {
						probes.Add(1)
					}
					b.Done(p, false)
				} else {
					once.Do(func() { tripped = time.Since(start) })
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	for _, f := range fleets {
		if s := f.stats(); s.ModeChanges != 0 {
			t.Fatalf("a process left fleet mode: %+v", s)
		}
	}
	intervals := int64((2500*time.Millisecond-tripped)/openFor) + 2
	limit := intervals * 1 * 2
	t.Logf("100 breakers: tripped after %v, %d calls, %d probes in %d probe intervals (at most %d allowed; 100 local breakers: about %d)",
		tripped, calls.Load(), probes.Load(), intervals, limit, intervals*100*2)
	if probes.Load() > limit {
		t.Errorf("%d probes, want at most %d", probes.Load(), limit)
	}
	if probes.Load() == 0 {
		t.Error("no probe at all")
	}
}

// TestRedisTripAndRecover: 20 processes, each with too few calls to trip
// alone, trip together within a few intervals; the fleet's probes find the
// dependency back and every breaker closes. The fleet grants probe rounds
// at its documented rate (one per slot of OpenFor/ProbeRounds on Redis's
// clock) for as long as it stays open: the close takes the prober's sync, a
// round trip that a loaded machine may stretch over later slots, so the
// bound is counted in the slots the recovery took, not as a fixed number
// (TestOneProbeClosesFleet shows on fake time that one round is enough).
func TestRedisTripAndRecover(t *testing.T) {
	c := redisClient(t)
	const every = 20 * time.Millisecond
	cfg := Config{Name: uniqueName(t), SyncEvery: every, Timeout: 2 * time.Second, MinCalls: 20,
		Breaker: breaker.Config{MinCalls: 100, OpenFor: 100 * time.Millisecond, Probes: 1}}
	cleanup(t, c, cfg.Name)
	fleets := newFleets(t, c, 20, cfg)
	var brks []*breaker.Breaker
	for _, f := range fleets {
		b, _ := f.hostBreaker("api")
		brks = append(brks, b)
		for range 2 {
			p, _ := b.Allow()
			b.Done(p, false)
		}
	}
	allIn := func(s breaker.State) bool {
		for _, b := range brks {
			if b.State() != s {
				return false
			}
		}
		return true
	}
	start := time.Now()
	if !eventually(10*time.Second, func() bool { return allIn(breaker.Open) }) {
		t.Fatal("the breakers did not all open within 10s of 40 failures")
	}
	t.Logf("all 20 breakers open %v after 40 failures (sync interval %v)", time.Since(start), every)
	// The dependency is back: every process keeps calling, and one probe
	// round is enough.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	recovery := time.Now() // no probe round is asked for before: nobody calls
	for _, b := range brks {
		until(&wg, stop, func() {
			if p, err := b.Allow(); err == nil {
				b.Done(p, true)
			}
			time.Sleep(2 * time.Millisecond)
		})
	}
	ok := eventually(10*time.Second, func() bool { return allIn(breaker.Closed) })
	took := time.Since(recovery) // every round was granted within it
	close(stop)
	wg.Wait()
	if !ok {
		t.Fatal("the breakers did not all close within 10s after the dependency came back")
	}
	var rounds int64
	for _, f := range fleets {
		hs, _ := f.hostStats("api")
		rounds += hs.ProbeRounds
	}
	// An interval of length took overlaps at most took/slot + 2 slots.
	slot := fleets[0].cfg.Breaker.OpenFor / time.Duration(fleets[0].cfg.ProbeRounds)
	limit := int64(took/slot) + 2
	t.Logf("%d probe rounds granted in the %v the fleet took to close (slots of %v: at most %d)", rounds, took, slot, limit)
	if rounds < 1 || rounds > limit {
		t.Errorf("%d probe rounds in %v with one allowed per %v slot, want 1..%d", rounds, took, slot, limit)
	}
}

// TestRedisCloseLeavesNoGoroutine builds and closes fleets on a real
// client: afterwards the process has the goroutines it had before.
func TestRedisCloseLeavesNoGoroutine(t *testing.T) {
	cfg := Config{Name: uniqueName(t), SyncEvery: 5 * time.Millisecond}
	cleanup(t, redisClient(t), cfg.Name)
	before := runtime.NumGoroutine()
	c := redis.NewClient(&redis.Options{Addr: redisAddr(t), ContextTimeoutEnabled: true})
	for range 10 {
		f, err := New(c, cfg)
		if err != nil {
			t.Fatal(err)
		}
		g, _ := f.Guards("api")
		g.Budget.Deposit()
		g.Budget.Withdraw()
		time.Sleep(10 * time.Millisecond)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	var after int
	if !eventually(2*time.Second, func() bool { after = runtime.NumGoroutine(); return after <= before }) {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines before, %d after closing every fleet:\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}
