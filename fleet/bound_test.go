package fleet

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// TestShortDeadlinesKeepTheFleetBound runs 20 processes whose callers ask
// for a retry with less time left (5-25 ms) than a lease round trip takes:
// a proxy the test controls delays every Redis command by 30 ms, well
// within Timeout, so the fleet stays in fleet mode. A retry the fleet
// cannot charge in time is refused (it was granted from the process's
// local budget and its floor, which let 20 processes spend 20 local
// floors): the retries granted stay within Ratio·requests + the fleet's
// floor, and the fleet's window counts every one of them.
func TestShortDeadlinesKeepTheFleetBound(t *testing.T) {
	rc := redisClient(t)
	px := newProxy(t, redisAddr(t))
	const (
		procs = 20
		run   = 1500 * time.Millisecond
		slow  = 30 * time.Millisecond
	)
	// Timeout and the clients' dial timeout are long: the test needs
	// Redis slow (30 ms), not failing, on a machine that may be busy.
	cfg := Config{Name: uniqueName(t), SyncEvery: 100 * time.Millisecond, Timeout: 5 * time.Second,
		Budget:   budget.Config{Ratio: 0.1, MinPerSecond: 2, Window: 20 * time.Second, Slices: 20},
		MinCalls: 1_000_000, Breaker: breaker.Config{MinCalls: 1_000_000}}
	cleanup(t, rc, cfg.Name)
	var fleets []*Fleet
	for range procs { // a client each, as processes have
		c := redis.NewClient(&redis.Options{Addr: px.addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 5 * time.Second})
		t.Cleanup(func() { c.Close() })
		fleets = append(fleets, newFleets(t, c, 1, cfg)...)
	}
	px.set(delayed, slow)

	var deposits, granted, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i, f := range fleets {
		b, err := f.hostBudget("api")
		if err != nil {
			t.Fatal(err)
		}
		for g := range 2 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(i), uint64(g)))
				for time.Since(start) < run {
					b.Deposit()
					deposits.Add(1)
					left := 5*time.Millisecond + time.Duration(r.Int64N(int64(20*time.Millisecond)))
					if b.WithdrawWithin(left) {
						granted.Add(1)
					} else {
						refused.Add(1)
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	px.set(pass, 0)
	var used, leaseCalls int64
	for _, f := range fleets {
		if err := f.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		s := f.stats()
		if s.ModeChanges != 0 {
			t.Errorf("a process left fleet mode (%+v): the test needs Redis slow, not failing", s)
		}
		hs, _ := f.hostStats("api")
		used += hs.Used
		leaseCalls += s.LeaseCalls
	}
	q, r := redisWindow(t, rc, cfg, "api")
	limit := 0.1*float64(deposits.Load()) + 40
	t.Logf("%d processes, %d requests, retries asked with 5-25ms left and Redis %v slower: %d granted, %d refused (fleet bound %.1f; %d spent from fleet leases, %d lease round trips); the fleet counts %d requests and %d retries",
		procs, deposits.Load(), slow, granted.Load(), refused.Load(), limit, used, leaseCalls, q, r)
	if float64(granted.Load()) > limit {
		t.Errorf("%d retries granted, over the fleet's bound Ratio·requests + floor = %.1f", granted.Load(), limit)
	}
	if granted.Load() != used || r != used {
		t.Errorf("%d retries granted, %d spent from fleet leases, %d counted by the fleet: every retry granted must be charged to the fleet", granted.Load(), used, r)
	}
	if q != deposits.Load() {
		t.Errorf("the fleet counts %d requests, the processes deposited %d", q, deposits.Load())
	}
	if granted.Load() == 0 {
		t.Error("no retry granted: a lease that comes after its caller gave up should serve the next callers")
	}
}
