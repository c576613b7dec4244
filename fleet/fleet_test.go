package fleet

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
)

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		field string // the Go field the error names
	}{
		{"empty name", Config{}, "Name"},
		{"brace in name", Config{Name: "a{b"}, "Name"},
		{"closing brace in name", Config{Name: "a}"}, "Name"},
		{"sync interval below 1ms", Config{Name: "a", SyncEvery: time.Microsecond}, "SyncEvery"},
		{"negative sync interval", Config{Name: "a", SyncEvery: -time.Second}, "SyncEvery"},
		{"negative timeout", Config{Name: "a", Timeout: -1}, "Timeout"},
		{"negative min calls", Config{Name: "a", MinCalls: -1}, "MinCalls"},
		{"negative probe rounds", Config{Name: "a", ProbeRounds: -1}, "ProbeRounds"},
		{"negative max hosts", Config{Name: "a", MaxHosts: -1}, "MaxHosts"},
		{"shared set", Config{Name: "a", Breaker: breaker.Config{Shared: &host{}}}, "Breaker.Shared"},
		{"bad fleet budget", Config{Name: "a", Budget: budget.Config{Ratio: 2}}, "Budget: "},
		{"bad local budget", Config{Name: "a", LocalBudget: budget.Config{Slices: -1}}, "LocalBudget: "},
		{"bad breaker", Config{Name: "a", Breaker: breaker.Config{FailureRatio: 2}}, "Breaker: "},
		{"too many slices", Config{Name: "a", Budget: budget.Config{Window: (maxSlices + 1) * time.Millisecond, Slices: maxSlices + 1}}, "Budget.Slices"},
		{"too many buckets", Config{Name: "a", Breaker: breaker.Config{Window: (maxSlices + 1) * time.Millisecond, Buckets: maxSlices + 1}}, "Breaker.Buckets"},
		{"slice not whole microseconds", Config{Name: "a", Budget: budget.Config{Window: 1_000_500, Slices: 1}}, "Budget.Window/Budget.Slices"},
		{"bucket not whole microseconds", Config{Name: "a", Breaker: breaker.Config{Window: 1_000_500, Buckets: 1}}, "Breaker.Window/Breaker.Buckets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			be := newModelBackend()
			f, err := newFleet(be, tt.cfg)
			if !errors.Is(err, ErrInvalidConfig) {
				if f != nil {
					f.Close()
				}
				t.Fatalf("newFleet(%+v) = %v, want ErrInvalidConfig", tt.cfg, err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("newFleet(%+v) = %v, want an error naming %s", tt.cfg, err, tt.field)
			}
			if be.calls.Load() != 0 {
				t.Errorf("a bad config made %d round trips", be.calls.Load())
			}
		})
	}
	if _, err := New(nil, Config{Name: "a"}); err == nil {
		t.Error("New(nil client) succeeded")
	}
}

func TestConfigDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := mustNew(t, newModelBackend(), Config{Name: "d"})
		c := f.cfg
		if c.SyncEvery != defaultSyncEvery || c.Timeout != defaultTimeout || c.ProbeRounds != defaultProbeRounds ||
			c.MaxHosts != defaultMaxHosts || c.Breaker.Probes != defaultProbes || f.keyPrefix != "stormguard:fleet:{d}:" {
			t.Errorf("config %+v, key prefix %q, want the defaults", c, f.keyPrefix)
		}
		if f.set.reserve != 10 || f.set.ratio != 0.1 || f.set.sliceUS != 1_000_000 || f.set.minCalls != 20 || f.set.probeUS != 1_000_000 {
			t.Errorf("settings %+v, want budget and breaker defaults", f.set)
		}
		if got := f.Mode(); got != ModeFleet {
			t.Errorf("Mode() = %v after a first sync that succeeded, want fleet", got)
		}
	})
}

// fixedRand pins the breaker's jitter, so open periods are exactly OpenFor.
func fixedRand() float64 { return 0.5 }

// always is a classifier for which every error is retryable.
func always(error) bool { return true }

var errDependency = errors.New("dependency failed")

// TestSuccessPathMakesNoRoundTrips runs calls through retry policies with
// fleet budgets and breakers over many sync intervals: Redis sees the
// syncs, one per interval, and nothing else.
func TestSuccessPathMakesNoRoundTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		f := mustNew(t, be, Config{Name: "s", SyncEvery: 10 * time.Millisecond})
		p := policy(t, f, "api")
		ctx := context.Background()
		before := f.stats()
		for i := range 10_000 {
			if err := p.Do(ctx, ok); err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			if i%100 == 0 {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(25 * time.Millisecond) // between two syncs
		s := f.stats()
		syncs := s.Syncs - before.Syncs
		if syncs < 10 {
			t.Errorf("%d syncs in 120ms of 10ms intervals, want at least 10", syncs)
		}
		if s.LeaseCalls != 0 || s.ProbeCalls != 0 || be.mode('l') != 0 || be.mode('p') != 0 {
			t.Errorf("successes made lease or probe round trips: %+v", s)
		}
		if got := be.calls.Load(); got != s.RoundTrips {
			t.Errorf("backend saw %d calls, stats count %d", got, s.RoundTrips)
		}
		hs, _ := f.hostStats("api")
		if hs.Requests != 10_000 || hs.Calls != 10_000 || hs.Failures != 0 {
			t.Errorf("fleet window after 10000 successes: %+v", hs)
		}
	})
}

// TestBudgetSharedAcrossProcesses gives three processes one fleet budget:
// together they get exactly Ratio·requests + the floor, however the
// requests are spread.
func TestBudgetSharedAcrossProcesses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		cfg := Config{Name: "b", Budget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second}}
		var fleets []*Fleet
		var budgets []*Budget
		for range 3 {
			f := mustNew(t, be, cfg)
			b, err := f.hostBudget("api")
			if err != nil {
				t.Fatal(err)
			}
			fleets, budgets = append(fleets, f), append(budgets, b)
		}
		for i, n := range []int{300, 50, 0} {
			for range n {
				budgets[i].Deposit()
			}
		}
		time.Sleep(150 * time.Millisecond) // a sync
		// 350 requests: 35 retries, plus a floor of 10 for the whole fleet.
		total := 0
		for round := 0; round < 100; round++ {
			for _, b := range budgets {
				if b.Withdraw() {
					total++
				}
			}
		}
		if total != 45 {
			t.Errorf("fleet admitted %d retries for 350 requests, want 35 + 10", total)
		}
		// Three local budgets would have admitted 30 + 15 + 10.
		for _, f := range fleets {
			f.Close()
		}
		var used, returned int64
		for _, f := range fleets {
			hs, _ := f.hostStats("api")
			used += hs.Used
			returned += hs.Returned
		}
		_, r := sumWindow(be, "stormguard:fleet:{b}:api")
		if used != 45 || r != used {
			t.Errorf("used %d (returned %d), fleet counts %d retries: want 45 both", used, returned, r)
		}
	})
}

// sumWindow returns the requests and retries a model's hash holds, in
// every slice.
func sumWindow(be *modelBackend, key string) (q, r int64) {
	be.mu.Lock()
	defer be.mu.Unlock()
	return sumRing(be.m.hashes[key])
}

// TestLeaseExpiresWithItsSlice leases retries, lets the slice end, and
// checks that none is spent afterwards and that the next sync gives them
// back.
func TestLeaseExpiresWithItsSlice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		f := mustNew(t, be, Config{Name: "l",
			Budget: budget.Config{Ratio: 1, MinPerSecond: 100, Window: time.Second, Slices: 10}})
		b, _ := f.hostBudget("api")
		// Grow the ask: 1, 2, 4, 8.
		for range 1 + 2 + 4 {
			if !b.Withdraw() {
				t.Fatal("Withdraw refused with room in the fleet budget")
			}
		}
		if !b.Withdraw() {
			t.Fatal("Withdraw refused")
		}
		hs, _ := f.hostStats("api")
		if hs.Granted != 15 || hs.Lease != 7 || f.stats().LeaseCalls != 4 {
			t.Fatalf("after 8 withdrawals: %+v, %d lease calls; want 15 granted (1+2+4+8), 7 held, 4 calls", hs, f.stats().LeaseCalls)
		}
		time.Sleep(100 * time.Millisecond) // the slice (100ms) is over
		if hs, _ := f.hostStats("api"); hs.Lease != 0 {
			t.Errorf("lease holds %d retries after its slice ended", hs.Lease)
		}
		time.Sleep(150 * time.Millisecond) // a sync gives them back
		hs, _ = f.hostStats("api")
		if hs.Returned != 7 || hs.Retries != 8 {
			t.Errorf("after the slice: %+v, want 7 returned and 8 retries counted", hs)
		}
		if got := f.hostFor("api").want.Load(); got != 4 {
			t.Errorf("next ask %d after a lease expired half-used, want 4", got)
		}
	})
}

// hostFor returns the host named name (a test helper).
func (f *Fleet) hostFor(name string) *host {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hosts[name]
}

// recorder collects observe events and log records.
type recorder struct {
	mu     sync.Mutex
	events []observe.Event
	logs   []string
}

func (r *recorder) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) kinds(k observe.Kind) []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []observe.Event
	for _, e := range r.events {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.logs = append(r.logs, rec.Level.String()+" "+rec.Message)
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

// TestModeSwitch takes Redis away and brings it back: the fleet goes local
// at the first failed sync, decides with the local budget (not unlimited),
// comes back by itself at the first good sync, and says so once per change.
func TestModeSwitch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		rec := &recorder{}
		f := mustNew(t, be, Config{Name: "m", SyncEvery: 10 * time.Millisecond, Logger: slog.New(rec), Observer: rec,
			LocalBudget: budget.Config{Ratio: 0.1, MinPerSecond: 0.5, Window: 10 * time.Second}})
		b, _ := f.hostBudget("api")
		be.down.Store(true)
		time.Sleep(55 * time.Millisecond) // five failed syncs
		s := f.stats()
		if s.Mode != ModeLocal || !errors.Is(s.LastError, errDown) || s.SyncFailures < 5 {
			t.Fatalf("with Redis down: %+v", s)
		}
		for range 100 {
			b.Deposit()
		}
		admitted := 0
		for range 100 {
			if b.Withdraw() {
				admitted++
			}
		}
		if admitted != 15 { // the local rule: 10% of 100 plus 0.5/s over 10s
			t.Errorf("local mode admitted %d retries of 100 requests, want 15", admitted)
		}
		if s.LeaseCalls != 0 || be.mode('l') != 0 {
			t.Errorf("local mode asked Redis for leases")
		}
		be.down.Store(false)
		time.Sleep(15 * time.Millisecond)
		if got := f.Mode(); got != ModeFleet {
			t.Fatalf("Mode() = %v one interval after Redis came back, want fleet", got)
		}
		ev := rec.kinds(observe.FleetMode)
		if len(ev) != 2 || ev[0].From != "fleet" || ev[0].To != "local" || !errors.Is(ev[0].Err, errDown) ||
			ev[1].From != "local" || ev[1].To != "fleet" || ev[1].Err != nil {
			t.Errorf("FleetMode events %+v, want fleet->local (with the error) then local->fleet", ev)
		}
		rec.mu.Lock()
		logs := append([]string(nil), rec.logs...)
		rec.mu.Unlock()
		if len(logs) != 2 || !strings.HasPrefix(logs[0], "WARN") {
			t.Errorf("logs %q, want one Warn per change", logs)
		}
		if f.stats().ModeChanges != 2 {
			t.Errorf("ModeChanges = %d, want 2", f.stats().ModeChanges)
		}
	})
}

// TestSlowRedis makes every round trip take ten times the timeout: the
// fleet goes local, a retry waits at most one timeout for its lease, and
// successes wait for nothing.
func TestSlowRedis(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		f := mustNew(t, be, Config{Name: "slow", SyncEvery: 10 * time.Millisecond, Timeout: 20 * time.Millisecond})
		g, _ := f.Guards("api")
		be.delay.Store(int64(200 * time.Millisecond))
		start := time.Now()
		if !g.Budget.Withdraw() {
			t.Error("Withdraw refused: the local budget's floor should admit it")
		}
		if d := time.Since(start); d != 20*time.Millisecond {
			t.Errorf("Withdraw with a slow Redis took %v, want the 20ms timeout", d)
		}
		if f.Mode() != ModeLocal || !errors.Is(f.stats().LastError, errTimeout) {
			t.Errorf("after a timeout: mode %v, last error %v", f.Mode(), f.stats().LastError)
		}
		start = time.Now()
		for range 1000 {
			g.Budget.Deposit()
			p, err := g.Breaker.Allow()
			if err != nil {
				t.Fatal(err)
			}
			g.Breaker.Done(p, true)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("1000 successes took %v of fake time with a slow Redis, want 0", d)
		}
		time.Sleep(time.Second)
		if f.Mode() != ModeLocal {
			t.Errorf("mode %v with every round trip over time", f.Mode())
		}
		be.delay.Store(0)
		time.Sleep(250 * time.Millisecond) // the last slow one ends, then a sync
		if f.Mode() != ModeFleet {
			t.Errorf("mode %v after Redis got fast again", f.Mode())
		}
		// The late lease reply was given back: the fleet counts only what was spent.
		time.Sleep(50 * time.Millisecond)
		hs, _ := f.hostStats("api")
		if hs.Granted != 1 || hs.Used != 0 || hs.Retries != 0 {
			t.Errorf("a lease granted after its caller left: %+v, want 1 granted, none used, none counted by the fleet", hs)
		}
	})
}

// fleetOf builds n processes of one fleet on be.
func fleetOf(t *testing.T, be *modelBackend, n int, cfg Config) []*Fleet {
	t.Helper()
	out := make([]*Fleet, n)
	for i := range out {
		out[i] = mustNew(t, be, cfg)
	}
	return out
}

func breakers(t *testing.T, fleets []*Fleet, host string) []*breaker.Breaker {
	t.Helper()
	var out []*breaker.Breaker
	for _, f := range fleets {
		b, err := f.hostBreaker(host)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// TestFleetTripsAndRecovers: five processes each see too few calls to trip
// their own breaker; the fleet sees enough, and trips all of them within
// one interval. One probe round for the whole fleet finds the dependency
// back, and every breaker closes.
func TestFleetTripsAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		rec := &recorder{}
		cfg := Config{Name: "t", SyncEvery: 10 * time.Millisecond, MinCalls: 20, Observer: rec,
			Breaker: breaker.Config{MinCalls: 100, OpenFor: time.Second, Probes: 2, Rand: fixedRand}}
		fleets := fleetOf(t, be, 5, cfg)
		brks := breakers(t, fleets, "api")
		// Each process's first failure asks for a sync at once, on its
		// fleet's goroutine, while this loop goes on: a reply that comes
		// after the fleet has counted 20 failures opens that process's
		// breaker (the fleet's verdict, not the breaker's own) before its
		// 6 calls are done. The first three processes' 18 failures cannot
		// trip the fleet, so their breakers must be closed after their
		// calls; later ones may be open only if their process heard the
		// fleet's verdict (its fleet state is stored before it trips the
		// breaker).
		fleetOpened := func(i int) bool {
			hs, _ := fleets[i].hostStats("api")
			return i >= 3 && hs.Breaker == breaker.Open
		}
		for i, b := range brks {
			for range 6 {
				p, err := b.Allow()
				if err != nil {
					if fleetOpened(i) {
						break
					}
					t.Fatalf("breaker %d, MinCalls 100, rejected a call after at most 6: %v", i, err)
				}
				b.Done(p, false)
			}
			if b.State() != breaker.Closed && !fleetOpened(i) {
				t.Fatalf("breaker %d tripped alone on 6 calls with MinCalls 100", i)
			}
		}
		time.Sleep(25 * time.Millisecond) // one sync flushes, the next reads the verdict
		for i, b := range brks {
			if s := b.State(); s != breaker.Open {
				t.Errorf("breaker %d is %v 20ms after the fleet saw at least 20 failures of 20", i, s)
			}
		}
		// Probe rounds: every breaker asks when its open period ends; the
		// fleet grants one round.
		time.Sleep(time.Second)
		var probes []struct {
			b *breaker.Breaker
			p breaker.Permit
		}
		for _, b := range brks {
			for range 3 {
				if p, err := b.Allow(); err == nil {
					if !p.Probe() {
						t.Fatalf("a closed-state permit from an open fleet")
					}
					probes = append(probes, struct {
						b *breaker.Breaker
						p breaker.Permit
					}{b, p})
				}
			}
		}
		if len(probes) != 2 {
			t.Fatalf("%d probes in the fleet's first probe interval, want 2 (1 round of 2)", len(probes))
		}
		for _, pr := range probes {
			pr.b.Done(pr.p, true)
		}
		time.Sleep(20 * time.Millisecond) // the prober's sync, then everyone's
		for i, b := range brks {
			if s := b.State(); s != breaker.Closed {
				t.Errorf("breaker %d is %v after the fleet's probes succeeded", i, s)
			}
		}
		hs, _ := fleets[0].hostStats("api")
		if hs.Breaker != breaker.Closed || hs.Epoch != 2 || hs.Calls != 0 {
			t.Errorf("fleet breaker after recovery: %+v, want closed, epoch 2, an empty window", hs)
		}
		if ev := rec.kinds(observe.BreakerState); len(ev) == 0 || ev[0].Name != "api" {
			t.Errorf("BreakerState events %+v, want them named after the host", ev)
		}
	})
}

// TestProbeRoundsFleetWide keeps the dependency down with twenty open
// breakers asking for probes all the time: the fleet sends at most
// ProbeRounds·Probes probes per probe interval.
func TestProbeRoundsFleetWide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		cfg := Config{Name: "p", SyncEvery: 10 * time.Millisecond, MinCalls: 5, ProbeRounds: 2,
			Breaker: breaker.Config{MinCalls: 5, OpenFor: 100 * time.Millisecond, Probes: 3}}
		fleets := fleetOf(t, be, 20, cfg)
		brks := breakers(t, fleets, "api")
		var probes atomic.Int64
		call := func(b *breaker.Breaker) {
			if p, err := b.Allow(); err == nil {
				if p.Probe() {
					probes.Add(1)
				}
				b.Done(p, false)
			}
		}
		for _, b := range brks {
			for range 5 {
				call(b)
			}
		}
		start := time.Now()
		for time.Since(start) < 2*time.Second {
			for _, b := range brks {
				call(b)
			}
			time.Sleep(time.Millisecond)
		}
		// 2s of 100ms intervals: 20 intervals (21 counting both ends), 2
		// rounds of 3 probes each.
		if n := probes.Load(); n > 21*2*3 || n == 0 {
			t.Errorf("%d probes in 2s, want 1..%d (local breakers alone: about %d)", n, 21*2*3, 20*20*3)
		}
		var rounds int64
		for _, f := range fleets {
			hs, _ := f.hostStats("api")
			rounds += hs.ProbeRounds
		}
		if rounds > 21*2 {
			t.Errorf("%d probe rounds granted in 2s, want at most %d", rounds, 21*2)
		}
	})
}

// TestCloseStopsEverything closes fleets with a round trip in flight; the
// synctest bubble fails the test if any goroutine is left.
func TestCloseStopsEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := newModelBackend()
		f, err := newFleet(be, Config{Name: "c", SyncEvery: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		b, _ := f.hostBudget("api")
		for range 10 {
			b.Deposit()
		}
		be.delay.Store(int64(time.Hour))
		time.Sleep(15 * time.Millisecond) // a sync is stuck in flight
		if err := f.Close(); !errors.Is(err, errTimeout) {
			t.Errorf("Close() = %v, want its last sync's timeout", err)
		}
		if err := f.Close(); !errors.Is(err, errTimeout) {
			t.Errorf("second Close() = %v, want the same error", err)
		}
		if f.Mode() != ModeLocal {
			t.Errorf("mode %v after Close, want local", f.Mode())
		}
		if !b.Withdraw() {
			t.Error("a budget refused its local floor after Close")
		}
		synctest.Wait()
	})
}

func TestZeroBudget(t *testing.T) {
	var b Budget
	b.Deposit()
	if b.Withdraw() || b.WithdrawWithin(time.Second) || b.Stats() != (budget.Stats{}) {
		t.Error("a zero Budget admitted a retry or reported a window")
	}
}

func TestTooManyHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := mustNew(t, newModelBackend(), Config{Name: "h", MaxHosts: 2})
		for _, h := range []string{"a", "b", "a"} {
			if _, err := f.Guards(h); err != nil {
				t.Fatalf("Guards(%q): %v", h, err)
			}
		}
		if _, err := f.hostBudget("c"); !errors.Is(err, ErrTooManyHosts) {
			t.Errorf("third host: %v, want ErrTooManyHosts", err)
		}
		b1, _ := f.hostBreaker("a")
		b2, _ := f.hostBreaker("a")
		if b1 != b2 {
			t.Error("two breakers for one host")
		}
		if _, ok := f.hostStats("zzz"); ok {
			t.Error("HostStats of an unknown host")
		}
	})
}

// TestTTLSaturates: the host key's expiry, twice the longest window plus
// 10 s, saturates for windows and open periods near the largest Duration
// (twice a window of a century overflowed, and the key expired at once:
// the fleet counted nothing).
func TestTTLSaturates(t *testing.T) {
	huge := time.Duration(1<<62) - time.Duration(1<<62)%time.Microsecond
	for _, c := range []Config{
		{Name: "ttl", Budget: budget.Config{Window: huge, Slices: 1}},
		{Name: "ttl", Breaker: breaker.Config{Window: huge, Buckets: 1}},
		{Name: "ttl", Breaker: breaker.Config{OpenFor: math.MaxInt64}},
	} {
		_, s, err := c.resolve()
		if err != nil {
			t.Fatalf("resolve: %v", err)
		}
		if s.ttlMS < int64(huge/time.Millisecond) {
			t.Errorf("%+v: key TTL %d ms, want at least the window (%d ms)", c, s.ttlMS, int64(huge/time.Millisecond))
		}
	}
}

// TestStatsSnapshot: Stats is one snapshot: a failure is counted together
// with its error (Failures > 0 exactly when LastError is set), and never
// more failures than round trips, while syncs fail and succeed and a
// reader polls (under -race). The count came from the trip's goroutine
// and the error from its caller, at different times.
func TestStatsSnapshot(t *testing.T) {
	be := newModelBackend()
	f := mustNew(t, be, Config{Name: "stats", SyncEvery: time.Millisecond, Timeout: 50 * time.Millisecond})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Bool
	until(&wg, stop, func() {
		if s := f.Stats(); (s.Failures == 0) != (s.LastError == nil) || s.Failures > s.RoundTrips {
			if !bad.Swap(true) {
				t.Errorf("inconsistent snapshot: %+v", s)
			}
		}
	})
	for i := range 20 {
		be.down.Store(i%2 == 0)
		time.Sleep(3 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if s := f.Stats(); s.Failures == 0 {
		t.Errorf("no failure counted: %+v", s)
	}
}
