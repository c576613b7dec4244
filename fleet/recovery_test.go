package fleet

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// TestLocalTripProbesAlone: while the fleet's breaker is closed, a process
// whose own breaker trips on its own calls probes on its own schedule. The
// fleet-wide limit on probe rounds is for a fleet that is open; here it
// would make the locally open processes take turns, one round per probe
// interval for all of them, while the fleet (and the dependency) are fine.
func TestLocalTripProbesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const openFor = time.Second
		cfg := Config{Name: "lt", SyncEvery: 100 * time.Millisecond, MinCalls: 1000, ProbeRounds: 1,
			Breaker: breaker.Config{MinCalls: 3, OpenFor: openFor, Probes: 1, Rand: fixedRand}}
		const n = 8
		fleets := fleetOf(t, be, n, cfg)
		brks := breakers(t, fleets, "api")
		for _, b := range brks {
			for range 3 {
				p, err := b.Allow()
				if err != nil {
					t.Fatal(err)
				}
				b.Done(p, false)
			}
			if s := b.State(); s != breaker.Open {
				t.Fatalf("breaker %v after 3 failures with MinCalls 3, want open", s)
			}
		}
		time.Sleep(150 * time.Millisecond) // a sync: the fleet stays closed (MinCalls 1000)
		if hs, _ := fleets[0].hostStats("api"); hs.Breaker != breaker.Closed {
			t.Fatalf("fleet breaker %v after 24 failures with MinCalls 1000, want closed", hs.Breaker)
		}
		// The dependency is fine again; each process calls every 10 ms.
		start := time.Now()
		closedAt := make([]time.Duration, n)
		for time.Since(start) < 5*openFor {
			for i, b := range brks {
				if p, err := b.Allow(); err == nil {
					b.Done(p, true)
					if closedAt[i] == 0 && b.State() == breaker.Closed {
						closedAt[i] = time.Since(start)
					}
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		for i, at := range closedAt {
			// Open for openFor from the trip, then one probe.
			if at == 0 || at > openFor {
				t.Errorf("process %d: breaker closed %v after the dependency was back (0: not within %v), want within %v",
					i, at, 5*openFor, openFor)
			}
		}
	})
}

// tripFleet makes the fleet of fleets open on host "api": each process's
// breaker fails calls calls, and the test waits for the syncs to spread the
// verdict. It fails t if a breaker is not open then. A breaker may reject
// calls before its own are done, once its process has heard the fleet's
// verdict: each process's first failure asks for a sync at once, on its
// fleet's goroutine, and a reply that comes after the fleet has counted
// enough failures opens the breaker while this loop goes on (its fleet
// state is stored before it trips the breaker). A rejection from a breaker
// whose process has not heard it fails t.
func tripFleet(t *testing.T, fleets []*Fleet, calls int, wait time.Duration) {
	t.Helper()
	brks := breakers(t, fleets, "api")
	for i, b := range brks {
		for range calls {
			p, err := b.Allow()
			if err != nil {
				if hs, _ := fleets[i].hostStats("api"); hs.Breaker == breaker.Open {
					break
				}
				t.Fatalf("breaker %d rejected a call before its process heard the fleet's verdict: %v", i, err)
			}
			b.Done(p, false)
		}
	}
	time.Sleep(wait)
	for i, b := range brks {
		if s := b.State(); s != breaker.Open {
			t.Fatalf("breaker %d is %v after the fleet saw up to %d failures, want open", i, s, len(brks)*calls)
		}
	}
}

// TestOneProbeClosesFleet: with the fleet's default Probes, the process
// granted a probe round needs only the call that asked for it. Its one
// successful probe closes its breaker, the fleet's, and within a sync
// every other process's. (With three probes per round, a process that
// holds a single call stays half-open, and the whole fleet with it, until
// two more calls come.)
func TestOneProbeClosesFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const every = 100 * time.Millisecond
		cfg := Config{Name: "op", SyncEvery: every, MinCalls: 10,
			Breaker: breaker.Config{MinCalls: 100, OpenFor: time.Second, Rand: fixedRand}}
		fleets := fleetOf(t, be, 5, cfg)
		if p := fleets[0].cfg.Breaker.Probes; p != defaultProbes || defaultProbes != 1 {
			t.Fatalf("Breaker.Probes %d, defaultProbes %d: want 1", p, defaultProbes)
		}
		brks := breakers(t, fleets, "api")
		tripFleet(t, fleets, 4, 2*every+10*time.Millisecond)
		time.Sleep(time.Second) // the open period ends
		p, err := brks[0].Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("first call after the open period: %v, probe %v; want a probe", err, p.Probe())
		}
		brks[0].Done(p, true)
		if s := brks[0].State(); s != breaker.Closed {
			t.Fatalf("the prober's breaker is %v after one successful probe, want closed", s)
		}
		time.Sleep(every + 10*time.Millisecond)
		for i, b := range brks {
			if s := b.State(); s != breaker.Closed {
				t.Errorf("breaker %d is %v one sync after the fleet's probe succeeded, want closed", i, s)
			}
		}
		if hs, _ := fleets[4].hostStats("api"); hs.Breaker != breaker.Closed || hs.Epoch != 2 {
			t.Errorf("fleet breaker %v, epoch %d; want closed, epoch 2", hs.Breaker, hs.Epoch)
		}
	})
}

// TestProbeRoundsSpread keeps an open fleet's processes asking for probe
// rounds all the time: the fleet grants ProbeRounds rounds per probe
// interval, one in each slot of OpenFor/ProbeRounds, so that a dependency
// that comes back is probed within about a slot.
func TestProbeRoundsSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const openFor = 300 * time.Millisecond
		const rounds = 3
		cfg := Config{Name: "ps", SyncEvery: 10 * time.Millisecond, MinCalls: 10, ProbeRounds: rounds,
			Breaker: breaker.Config{MinCalls: 100, OpenFor: openFor}}
		fleets := fleetOf(t, be, 20, cfg)
		brks := breakers(t, fleets, "api")
		tripFleet(t, fleets, 1, 30*time.Millisecond)
		slot := (openFor / rounds).Microseconds()
		perSlot := map[int64]int{}
		start := time.Now()
		for time.Since(start) < 10*openFor {
			for _, b := range brks {
				if p, err := b.Allow(); err == nil {
					if !p.Probe() {
						t.Fatal("a closed-state permit while the dependency is down")
					}
					perSlot[time.Now().UnixMicro()/slot]++
					b.Done(p, false)
				}
			}
			time.Sleep(time.Millisecond)
		}
		n := 0
		for s, k := range perSlot {
			n += k
			if k > 1 {
				t.Errorf("slot %d: %d probes, want at most 1", s, k)
			}
		}
		// 10 intervals of 3 slots; every slot after the first open period
		// (1 s ± 20%) has a taker among 20 processes asking every ms.
		if n < 20 || n > 31 {
			t.Errorf("%d probes in 10 probe intervals of %d rounds, want 20..31", n, rounds)
		}
	})
}

// TestBucketTripsFleet: the fleet's breaker trips on its current bucket
// alone, as a process's breaker does, when a window full of successes from
// before would dilute the failures below the ratio.
func TestBucketTripsFleet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const every = 10 * time.Millisecond
		cfg := Config{Name: "bt", SyncEvery: every, MinCalls: 20,
			Breaker: breaker.Config{MinCalls: 1000, Window: 10 * time.Second, Buckets: 10}}
		fleets := fleetOf(t, be, 2, cfg)
		brks := breakers(t, fleets, "api")
		for range 500 {
			p, _ := brks[0].Allow()
			brks[0].Done(p, true)
		}
		time.Sleep(1500 * time.Millisecond) // synced; a new bucket
		for range 30 {
			p, _ := brks[1].Allow()
			brks[1].Done(p, false)
		}
		time.Sleep(3 * every)
		hs, _ := fleets[0].hostStats("api")
		if hs.Breaker != breaker.Open {
			t.Errorf("fleet breaker %v after a bucket of 30 failures (window: 30 of 530), want open", hs.Breaker)
		}
		for i, b := range brks {
			if s := b.State(); s != breaker.Open {
				t.Errorf("breaker %d is %v, want open", i, s)
			}
		}
	})
}

// TestFirstFailureSyncsAtOnce: the first failure after a sync that carried
// none is sent at once, not at the next interval; the failures right after
// it wait for a tenth of the interval (TestFailureBurstSyncsWithinATenth).
func TestFirstFailureSyncsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const every = time.Second
		f := mustNew(t, be, Config{Name: "ff", SyncEvery: every, Breaker: breaker.Config{MinCalls: 1000}})
		b, _ := f.hostBreaker("api")
		for range 10 {
			p, _ := b.Allow()
			b.Done(p, true)
		}
		time.Sleep(every + every/2) // one sync of successes, half an interval more
		synctest.Wait()
		syncs := be.mode('s')
		p, _ := b.Allow()
		b.Done(p, false)
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := be.mode('s'); got != syncs+1 {
			t.Fatalf("%d syncs right after the first failure, want %d", got, syncs+1)
		}
		if hs, _ := f.hostStats("api"); hs.Failures != 1 {
			t.Errorf("fleet window after the first failure's sync: %d failures, want 1", hs.Failures)
		}
		for range 5 {
			p, _ := b.Allow()
			b.Done(p, false)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := be.mode('s'); got != syncs+1 {
			t.Errorf("%d syncs after more failures within the interval, want still %d", got, syncs+1)
		}
	})
}

// TestFailureBurstSyncsWithinATenth: a burst of failures shorter than a
// tenth of an interval, then quiet (a dependency that fails the calls in
// flight at once, the others waiting for the breaker), is sent a tenth of
// an interval after the first failure's sync, not at the next interval:
// the fleet's window holds all of them within about 100 ms of SyncEvery
// 1 s. Before, only the first failure's sync was sent early; the burst
// waited for the interval.
func TestFailureBurstSyncsWithinATenth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const every = time.Second
		f := mustNew(t, be, Config{Name: "fb", SyncEvery: every, Breaker: breaker.Config{MinCalls: 1000}})
		b, _ := f.hostBreaker("api")
		for range 10 {
			p, _ := b.Allow()
			b.Done(p, true)
		}
		time.Sleep(every + every/2) // one sync of successes, half an interval more
		synctest.Wait()
		start := time.Now()
		var last time.Duration // when the last failure was recorded
		for range 15 {         // 15 failures in 60 ms
			p, _ := b.Allow()
			b.Done(p, false)
			last = time.Since(start)
			time.Sleep(4 * time.Millisecond)
		}
		for {
			if hs, _ := f.hostStats("api"); hs.Failures == 15 {
				break
			}
			if time.Since(start) > every {
				hs, _ := f.hostStats("api")
				t.Fatalf("fleet window holds %d of the burst's 15 failures after %v", hs.Failures, time.Since(start))
			}
			time.Sleep(time.Millisecond)
		}
		// A failure is sent a tenth of the interval after the sync before
		// it: the first's, ~100 ms, or a periodic one (its phase comes
		// from the process's random id) that fell within the burst, as
		// late as the last failure (156 ms once in CI, the tick at 56 ms).
		if d := time.Since(start); d > last+every/10 {
			t.Errorf("the burst's 15 failures reached the fleet after %v, want within a tenth of the interval after the sync before the last (at most %v)", d, last+every/10)
		}
	})
}

// TestOpenBreakerHoldsRetries: a retry the breaker holds costs no budget.
// The fleet's budget admits no retry at all here; a lease request that finds
// the fleet's breaker open (before this process's sync has told it) opens
// this process's breaker and grants the retry, and while the breaker is
// open every retry is granted without a round trip. A call whose first
// attempt fails as the fleet opens then waits for the breaker and succeeds
// after the fleet closes, instead of failing for want of budget.
func TestOpenBreakerHoldsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		// MinCalls 1: the sync a's first failure starts may carry only some
		// of its five failures (the loop runs it while the test records the
		// rest); any of them opens the fleet.
		cfg := Config{Name: "oh", SyncEvery: time.Second, MinCalls: 1,
			Budget:  budget.Config{Ratio: -1, MinPerSecond: -1},
			Breaker: breaker.Config{MinCalls: 1000, OpenFor: time.Second, Rand: fixedRand}}
		fa, fb := mustNew(t, be, cfg), mustNew(t, be, cfg)
		ba, _ := fa.hostBreaker("api")
		budgetB, _ := fb.hostBudget("api")
		bb, _ := fb.hostBreaker("api")
		if budgetB.Withdraw() {
			t.Fatal("a budget with no ratio and no floor granted a retry")
		}
		for range 5 {
			p, _ := ba.Allow()
			ba.Done(p, false)
		}
		time.Sleep(10 * time.Millisecond) // a's first failure syncs at once: the fleet opens
		synctest.Wait()
		if s := bb.State(); s != breaker.Closed {
			t.Fatalf("b's breaker %v before b's sync, want closed", s)
		}
		fb.hostFor("api").denied.Store(false) // as after a sync that showed room
		leases := fb.stats().LeaseCalls
		if !budgetB.Withdraw() {
			t.Fatal("Withdraw refused a retry while the fleet's breaker is open")
		}
		if s := bb.State(); s != breaker.Open {
			t.Errorf("b's breaker %v after a lease reply showed the fleet open, want open", s)
		}
		for range 10 {
			if !budgetB.Withdraw() {
				t.Fatal("Withdraw refused a retry while the breaker is open")
			}
		}
		if s := fb.stats(); s.LeaseCalls != leases+1 {
			t.Errorf("%d lease calls, want %d (one, then none while open)", s.LeaseCalls, leases+1)
		}
		if hs, _ := fb.hostStats("api"); hs.Used != 0 || hs.Retries != 0 {
			t.Errorf("retries held by the breaker were charged: %+v", hs)
		}
	})
}

// TestFailingProcessSyncsEarly: while a process's unsent outcomes are
// mostly failures, it syncs every tenth of an interval instead of every
// interval; once they are mostly successes again, at the interval.
func TestFailingProcessSyncsEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		const every = time.Second
		f := mustNew(t, be, Config{Name: "fe", SyncEvery: every, Breaker: breaker.Config{MinCalls: 1000}})
		b, _ := f.hostBreaker("api")
		outcome := func(ok bool) {
			p, _ := b.Allow()
			b.Done(p, ok)
		}
		time.Sleep(every / 2)
		synctest.Wait()
		syncs := be.mode('s')
		// A failure every 10 ms for one interval: the first syncs at
		// once, then one sync per tenth of an interval at most.
		for range 100 {
			outcome(false)
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		got := be.mode('s') - syncs
		// 13 in about one run of ten: the periodic tick and a tenth's
		// timer due at the same instant are taken in either order (select
		// picks at random), one after the other.
		if got < 10 || got > 13 {
			t.Errorf("%d syncs in one interval of failures, want 10..13 (the periodic one, the first failure's, every tenth)", got)
		}
		// Mostly successes: one sync per interval, and the first
		// failure's (its unsent outcomes are a failure alone); 3 once
		// in a CI run under -race (not traced: likely timers due at one
		// instant taken in either order, as with the 13 above).
		syncs = be.mode('s')
		for i := range 100 {
			outcome(i%10 != 0)
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		if got := be.mode('s') - syncs; got > 3 {
			t.Errorf("%d syncs in one interval of 10%% failures, want 1 to 3", got)
		}
	})
}

// TestFleetOpensWhenSuccessesCompleteTheWindow: the failures of a window
// reach the fleet before the successes that bring it to MinCalls (failures
// are news: their processes sync at once); the fleet opens when the
// successes arrive, as its rule says (failures >= FailureRatio·calls and
// calls >= MinCalls). It stayed closed: the rule was checked only on a
// sync that carried failures.
func TestFleetOpensWhenSuccessesCompleteTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		cfg := Config{Name: "order", SyncEvery: 10 * time.Millisecond, MinCalls: 10,
			Breaker: breaker.Config{Window: 2 * time.Second, Buckets: 2, MinCalls: 1000, FailureRatio: 0.5, OpenFor: 5 * time.Second}}
		fleets := fleetOf(t, be, 10, cfg)
		brks := breakers(t, fleets, "dep")
		for _, b := range brks[:6] { // 6 failures, synced first
			p, _ := b.Allow()
			b.Done(p, false)
		}
		time.Sleep(60 * time.Millisecond)
		for _, b := range brks[6:] { // then 4 successes: 10 calls
			p, _ := b.Allow()
			b.Done(p, true)
		}
		time.Sleep(300 * time.Millisecond)
		open := 0
		for _, b := range brks {
			if b.State() != breaker.Closed {
				open++
			}
		}
		if open != len(brks) {
			t.Errorf("the fleet's window holds 10 calls, 6 failed (ratio 0.5, MinCalls 10): %d of %d breakers open, want all", open, len(brks))
		}
	})
}
