// Black-box attacks on package fleet (area fleet4): the fleet's breaker,
// Config.Limit, Close, hosts, validation, Stats.

package fleet_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
)

func ft4Client(t *testing.T) *redis.Client {
	t.Helper()
	return atkClient(t, atkAddr(t)) // the attack suite's Redis (skipped without it, failing in CI)
}

func ft4Name(t *testing.T) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ft4-" + t.Name() + "-" + hex.EncodeToString(b[:])
}

func ft4New(t *testing.T, c redis.UniversalClient, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func ft4Eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return cond()
}

// Package doc, The breaker: "A process whose breaker opened on its own
// calls while the fleet's stayed closed probes on its own schedule: the
// fleet's limit on rounds is for the fleet's outage, not for one
// process's." Breaker.Reset is documented as "for a recovery found
// elsewhere"; the fleet resets "when a process's probes close its breaker".
//
// A new host whose breaker trips on its own calls before its first sync
// (the failure kicks that sync) is closed again by the sync's reply,
// though the fleet's breaker never opened (epoch 0, closed): nobody found
// a recovery, and the process did not probe.
func TestAttackFleet4LocalTripBeforeFirstSyncNotReset(t *testing.T) {
	c := ft4Client(t)
	f := ft4New(t, c, fleet.Config{Name: ft4Name(t), SyncEvery: time.Hour, Timeout: 2 * time.Second,
		MinCalls: 1000, // the fleet's breaker never opens here
		Breaker:  breaker.Config{MinCalls: 1, FailureRatio: 0.5, OpenFor: 30 * time.Second}})
	g, err := f.Guards("api")
	if err != nil {
		t.Fatal(err)
	}
	b := g.Breaker
	before := f.Stats().RoundTrips
	p, err := b.Allow()
	if err != nil {
		t.Fatal(err)
	}
	b.Done(p, false) // trips the local breaker (1 call, 1 failure), and kicks a sync
	if s := b.State(); s != breaker.Open {
		t.Fatalf("local breaker %v after its own failure, want open", s)
	}
	// Wait for the kicked sync to come back.
	if !ft4Eventually(5*time.Second, func() bool { return f.Stats().RoundTrips > before }) {
		t.Fatal("no sync after the failure")
	}
	time.Sleep(200 * time.Millisecond) // the reply is taken in
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("mode %v", f.Mode())
	}
	if s := b.State(); s != breaker.Open {
		t.Errorf("breaker that opened on its own calls is %v after the first sync, want open (OpenFor 30 s; the fleet's breaker never opened)", s)
	}
}

// Package doc, The breaker: "the script opens the fleet's breaker and
// publishes the opening on the fleet's channel: every process trips its
// breaker (breaker.Breaker.Trip) as soon as it hears it"; News on a
// channel: "trips the breaker of a host it tracks when it hears its
// opening". breaker.Trip: "a half-open one reopens". And package breaker:
// "a slow call that started before the breaker tripped cannot close it".
//
// Process P holds a probe (half-open) granted while the fleet was open
// (epoch 1). Q's probe closes the fleet (epoch 2), then Q's failures open
// it again (epoch 3), published on the channel. P hears the opening but
// its half-open breaker is not tripped; P's old probe then succeeds, P's
// breaker closes, and its close (carrying the epoch it heard, 3) closes
// the fleet's breaker that Q's fresh failures had just opened: Q's
// breaker is reset.
func TestAttackFleet4HalfOpenProbeAcrossReopenClosesFleet(t *testing.T) {
	c := ft4Client(t)
	const openFor = 200 * time.Millisecond
	name := ft4Name(t)
	bc := breaker.Config{MinCalls: 2, FailureRatio: 0.5, OpenFor: openFor, Probes: 1}
	base := fleet.Config{Name: name, Timeout: 2 * time.Second, MinCalls: 2, ProbeRounds: 1, Breaker: bc}
	pc, qc := base, base
	pc.SyncEvery = time.Hour // P learns only from the channel, its own round trips and kicks
	qc.SyncEvery = 20 * time.Millisecond
	p := ft4New(t, c, pc)
	q := ft4New(t, c, qc)
	pg, _ := p.Guards("api")
	qg, _ := q.Guards("api")
	pb, qb := pg.Breaker, qg.Breaker
	ft4Subscribed(t, c, name, 2)

	// 1. Q's failures open the fleet (epoch 1); P hears it on the channel.
	for range 2 {
		pm, err := qb.Allow()
		if err != nil {
			t.Fatal(err)
		}
		qb.Done(pm, false)
	}
	if !ft4Eventually(3*time.Second, func() bool { return pb.State() == breaker.Open }) {
		t.Fatalf("P did not hear the opening: %v", pb.State())
	}
	// 2. P's open period ends; it asks for a round and holds the probe.
	time.Sleep(openFor*3/2 + 50*time.Millisecond)
	var pp breaker.Permit
	if !ft4Eventually(3*time.Second, func() bool {
		var err error
		pp, err = pb.Allow()
		if err != nil {
			time.Sleep(20 * time.Millisecond)
		}
		return err == nil
	}) {
		t.Fatal("P got no probe round")
	}
	if !pp.Probe() {
		t.Fatalf("P's permit is not a probe (state %v)", pb.State())
	}
	// 3. In a later slot Q probes successfully: the fleet closes (epoch 2).
	time.Sleep(openFor + 50*time.Millisecond)
	var qp breaker.Permit
	if !ft4Eventually(3*time.Second, func() bool {
		var err error
		qp, err = qb.Allow()
		if err != nil {
			time.Sleep(20 * time.Millisecond)
		}
		return err == nil
	}) {
		t.Fatal("Q got no probe round")
	}
	qb.Done(qp, true)
	if s := qb.State(); s != breaker.Closed {
		t.Fatalf("Q's probe did not close Q: %v", s)
	}
	time.Sleep(200 * time.Millisecond) // Q's close reaches the fleet, Q's syncs see epoch 2
	// 4. The dependency fails again: Q's failures open the fleet (epoch 3),
	// published on the channel.
	for range 2 {
		pm, err := qb.Allow()
		if err != nil {
			t.Fatalf("Q: %v", err)
		}
		qb.Done(pm, false)
	}
	time.Sleep(300 * time.Millisecond) // Q's sync opens the fleet; P hears it
	if s := qb.State(); s != breaker.Open {
		t.Fatalf("Q after its failures: %v", s)
	}
	t.Logf("P after hearing the reopening: %v (its probe of the old epoch still out)", pb.State())
	// 5. P's old probe comes back successful.
	pb.Done(pp, true)
	time.Sleep(500 * time.Millisecond) // P's close is synced (kicked); Q syncs every 20 ms
	st, _ := c.HGet(context.Background(), "stormguard:fleet:{"+name+"}:api", "st").Result()
	ep, _ := c.HGet(context.Background(), "stormguard:fleet:{"+name+"}:api", "ep").Result()
	t.Logf("fleet hash: st=%s ep=%s; P %v, Q %v", st, ep, pb.State(), qb.State())
	if s := qb.State(); s != breaker.Open {
		t.Errorf("Q's breaker, opened by failures the fleet published (epoch 3), is %v: closed by P's probe issued before that opening", s)
	}
}

// ft4Subscribed waits until n subscribers listen on the fleet's channel.
func ft4Subscribed(t *testing.T, c *redis.Client, name string, n int64) {
	t.Helper()
	ch := "stormguard:fleet:{" + name + "}/open"
	if !ft4Eventually(5*time.Second, func() bool {
		m, err := c.PubSubNumSub(context.Background(), ch).Result()
		return err == nil && m[ch] >= n
	}) {
		t.Fatalf("fewer than %d subscribers on %s", n, ch)
	}
}

// Close: "stops the background sync ... and waits for every round trip to
// end"; News on a channel: "Fleet.Close ends it". Ten fleets with Limit,
// a few hosts each, leases and probe rounds used, closed: no goroutine of
// theirs is left.
func TestAttackFleet4CloseLeavesNoGoroutine(t *testing.T) {
	c := ft4Client(t)
	_ = c.Ping(context.Background())
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	name := ft4Name(t)
	var fs []*fleet.Fleet
	for range 10 {
		f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Limit: &limit.Config{},
			MinCalls: 2, Breaker: breaker.Config{MinCalls: 2, OpenFor: 20 * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
		for _, h := range []string{"a", "b", "c d", ""} {
			g, _ := f.Guards(h)
			g.Budget.Deposit()
			g.Budget.Withdraw()
			if pm, err := g.Breaker.Allow(); err == nil {
				g.Breaker.Done(pm, false)
			}
		}
	}
	time.Sleep(100 * time.Millisecond)
	for _, f := range fs {
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	var after int
	ok := ft4Eventually(2*time.Second, func() bool { after = runtime.NumGoroutine(); return after <= before })
	if !ok {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("goroutines: %d before, %d after Close of 10 fleets\n%s", before, after, buf[:n])
	}
}
