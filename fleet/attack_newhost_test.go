package fleet_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/fleet"
)

func zzFail(t *testing.T, b *breaker.Breaker, n int) {
	t.Helper()
	for range n {
		p, err := b.Allow()
		if err != nil {
			t.Fatalf("allow: %v (state %v)", err, b.State())
		}
		b.Done(p, false)
	}
}

// The doc (package, The breaker): "its outcomes are counted (an atomic add)
// and synced; when the fleet's window ... holds at least Config.MinCalls
// calls with failures >= FailureRatio·calls, the script opens the fleet's
// breaker". A process that starts tracking a host after the fleet's breaker
// of that host went through one open and close (a new process, or a host
// new to this process) must have its failures counted like any other's.
func TestAttackNewHostAfterFleetCycleCountsFailures(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: time.Second, MinCalls: 4,
		Breaker: breaker.Config{MinCalls: 1000, OpenFor: 100 * time.Millisecond}}
	newF := func() *fleet.Fleet {
		f, err := fleet.New(atkClient(t, atkAddr(t)), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	a := newF()
	ga, _ := a.Guards("h")
	watcher := newF()
	gw, _ := watcher.Guards("h")

	// 1. The fleet opens on a's failures; the watcher hears it.
	zzFail(t, ga.Breaker, 4)
	if !atkEventually(3*time.Second, func() bool { return gw.Breaker.State() != breaker.Closed }) {
		t.Fatalf("fleet did not open: a %v, watcher %v", ga.Breaker.State(), gw.Breaker.State())
	}
	// 2. a's probe closes its breaker, and the fleet's: the watcher resets.
	if !atkEventually(3*time.Second, func() bool {
		p, err := ga.Breaker.Allow()
		if err != nil {
			return false
		}
		ga.Breaker.Done(p, true)
		return ga.Breaker.State() == breaker.Closed
	}) {
		t.Fatalf("a's probe did not close: %v", ga.Breaker.State())
	}
	if !atkEventually(3*time.Second, func() bool { return gw.Breaker.State() == breaker.Closed }) {
		t.Fatalf("fleet did not close: watcher %v", gw.Breaker.State())
	}
	// 3. A new process, b, fails 4 calls on h at once (MinCalls of the
	// fleet: 4; its own MinCalls 1000, so it cannot trip alone).
	b := newF()
	gb, _ := b.Guards("h")
	zzFail(t, gb.Breaker, 4)
	if !atkEventually(2*time.Second, func() bool { return gw.Breaker.State() != breaker.Closed }) {
		// control: 4 more failures after b's first sync open it.
		zzFail(t, gb.Breaker, 4)
		opened := atkEventually(2*time.Second, func() bool { return gw.Breaker.State() != breaker.Closed })
		t.Fatalf("4 failures of a new process (fleet MinCalls 4, ratio 1.0) did not open the fleet's breaker: "+
			"watcher %v, b %v, a %v; 4 more failures from b after its first sync opened it: %v",
			gw.Breaker.State(), gb.Breaker.State(), ga.Breaker.State(), opened)
	}
}

// The doc (package, Modes): "The success path is the same in both modes, and
// never waits on Redis"; (No lock) "the success path (Deposit, the
// breaker's Allow and Done, Outcome) is a few atomic operations on local
// memory: no Redis I/O, no lock, no allocation". In local mode (Redis
// refusing connections at New) the success path must not allocate either.
func TestAttackLocalModeSuccessPathAllocs(t *testing.T) {
	c := atkClient(t, "127.0.0.1:1") // nothing listens: refused
	f, err := fleet.New(c, fleet.Config{Name: "zz-local-allocs", SyncEvery: time.Hour, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Mode() != fleet.ModeLocal {
		t.Fatalf("mode %v", f.Mode())
	}
	g, _ := f.Guards("h")
	allocs := testing.AllocsPerRun(1000, func() {
		g.Budget.Deposit()
		p, err := g.Breaker.Allow()
		if err != nil {
			t.Fatal(err)
		}
		g.Breaker.Done(p, true)
	})
	if allocs != 0 {
		t.Fatalf("local mode success path: %v allocs per call", allocs)
	}
}

// The doc (Close): "waits for every round trip to end". A lease request a
// short-deadline caller left behind (Redis slow, under Timeout) must have
// ended when Close returns: no goroutine of the fleet left once the client
// is closed.
func TestAttackCloseWaitsAbandonedLease(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	nc := atkClient(t, atkAddr(t))
	name := atkName(t, nc)
	c := atkClient(t, p.addr())
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: time.Hour, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := f.Guards("h")
	g.Budget.Deposit()
	p.set(atkDelay, 300*time.Millisecond)
	if g.Budget.(*fleet.Budget).WithdrawWithin(5 * time.Millisecond) {
		t.Fatal("granted within 5ms through a 300ms Redis")
	}
	rt := f.Stats().RoundTrips
	start := time.Now()
	if err := f.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	took := time.Since(start)
	if took < 200*time.Millisecond {
		t.Fatalf("Close returned after %v, before the lease request (300ms) ended (round trips %d)", took, rt)
	}
	if f.Mode() != fleet.ModeLocal {
		t.Fatalf("mode %v", f.Mode())
	}
}
