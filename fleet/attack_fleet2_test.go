// Black-box attacks on package fleet (area fleet2): each test names the
// documented sentence it checks.

package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// zzObs records the events it gets.
type zzObs struct {
	mu sync.Mutex
	ev []observe.Event
}

func (o *zzObs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.ev = append(o.ev, e)
	o.mu.Unlock()
}

func (o *zzObs) kind(k observe.Kind) []observe.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []observe.Event
	for _, e := range o.ev {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// zzWarns counts Warn records.
type zzWarns struct{ n atomic.Int64 }

func (h *zzWarns) Enabled(context.Context, slog.Level) bool { return true }
func (h *zzWarns) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *zzWarns) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *zzWarns) WithGroup(string) slog.Handler      { return h }

func zzNew(t *testing.T, c redis.UniversalClient, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// zzDelayProxy forwards TCP to target, delaying each chunk a client sends
// by delay (0: none).
type zzDelayProxy struct {
	ln     net.Listener
	target string
	delay  atomic.Int64
	down   atomic.Bool // refuse connections, and cut those open
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func zzNewDelayProxy(t *testing.T, target string) *zzDelayProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &zzDelayProxy{ln: ln, target: target}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if p.down.Load() {
				c.Close()
				continue
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Go(func() { io.Copy(c, s); c.Close() })
			p.wg.Go(func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if d := p.delay.Load(); d > 0 {
							time.Sleep(time.Duration(d))
						}
						if _, err := s.Write(buf[:n]); err != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				s.Close()
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Modes: "each change (not each call) is logged at Warn (Config.Logger)
// and reported as an observe.FleetMode event (Config.Observer)". Close
// switches the Fleet to local mode ("Budgets and breakers keep working
// afterwards, in local mode"; Mode() says local): that change must be
// reported like any other.
// cut refuses new connections and closes those open (down), or lets them
// through again.
func (p *zzDelayProxy) cut(down bool) {
	p.down.Store(down)
	if down {
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
		p.mu.Unlock()
	}
}

func TestAttackFleet2CloseModeChangeReported(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	obs := &zzObs{}
	warns := &zzWarns{}
	f, err := fleet.New(c, fleet.Config{Name: atkName(t, c), Observer: obs, Logger: slog.New(warns)})
	if err != nil {
		t.Fatal(err)
	}
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("mode %v before Close", f.Mode())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Mode() != fleet.ModeLocal {
		t.Fatalf("mode %v after Close, want local", f.Mode())
	}
	ev := obs.kind(observe.FleetMode)
	if len(ev) != 1 || ev[0].From != "fleet" || ev[0].To != "local" {
		t.Errorf("Mode() went fleet -> local at Close: FleetMode events %+v, want one fleet->local", ev)
	}
	if warns.n.Load() != 1 {
		t.Errorf("Mode() went fleet -> local at Close: %d Warn records, want 1", warns.n.Load())
	}
}

// Stats: "MaxRoundTrip is the longest round trip that got a reply (late
// ones included)"; "Failures counts the round trips that failed or took
// longer than Timeout"; "A round trip that ... takes longer than
// Config.Timeout, switches it to ModeLocal ... the first one that succeeds
// switches back to ModeFleet". A client without ContextTimeoutEnabled gets
// late replies from a Redis slowed by a proxy.
func TestAttackFleet2SlowRedisLateRepliesStats(t *testing.T) {
	p := zzNewDelayProxy(t, atkAddr(t))
	c := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String(), MaxRetries: -1, ReadTimeout: 3 * time.Second})
	t.Cleanup(func() { c.Close() })
	name := atkName(t, atkClient(t, atkAddr(t)))
	f := zzNew(t, c, fleet.Config{Name: name, SyncEvery: 50 * time.Millisecond, Timeout: 60 * time.Millisecond})
	g, _ := f.Guards("h")
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatal("not in fleet mode")
	}
	p.delay.Store(int64(250 * time.Millisecond))
	start := time.Now()
	for i := 0; i < 100; i++ {
		g.Budget.Deposit() // the success path never waits
	}
	if d := time.Since(start); d > 20*time.Millisecond {
		t.Errorf("100 deposits took %v on a slow Redis", d)
	}
	if !atkEventually(3*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatalf("a Redis 250 ms slow with Timeout 60 ms: mode %v", f.Mode())
	}
	if !atkEventually(3*time.Second, func() bool { return f.Stats().MaxRoundTrip >= 250*time.Millisecond }) {
		t.Errorf("late replies of >= 250 ms: MaxRoundTrip %v", f.Stats().MaxRoundTrip)
	}
	st := f.Stats()
	if st.Failures < 1 || st.LastError == nil || st.Failures > st.RoundTrips {
		t.Errorf("stats %+v", st)
	}
	p.delay.Store(0)
	if !atkEventually(5*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatalf("Redis fast again: mode %v, stats %+v", f.Mode(), f.Stats())
	}
}

// Close: "Budgets and breakers keep working afterwards, in local mode";
// Stats: "RoundTrips counts the round trips attempted". After Close,
// Guards for a new host works, and nothing (a retry, a probe round) goes
// to Redis.
func TestAttackFleet2GuardsAfterClose(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	f, err := fleet.New(c, fleet.Config{Name: atkName(t, c), SyncEvery: 10 * time.Millisecond,
		Breaker: breaker.Config{OpenFor: 20 * time.Millisecond, MinCalls: 2}, Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	g0, _ := f.Guards("old")
	g0.Budget.Deposit()
	f.Close()
	rt := f.Stats().RoundTrips
	for _, h := range []string{"old", "new"} {
		g, err := f.Guards(h)
		if err != nil {
			t.Fatalf("Guards(%q) after Close: %v", h, err)
		}
		for range 100 {
			g.Budget.Deposit()
		}
		ok := 0
		for range 50 {
			if g.Budget.Withdraw() {
				ok++
			}
		}
		if ok == 0 || ok == 50 {
			t.Errorf("%s: %d of 50 retries granted after Close (the local budget decides)", h, ok)
		}
		for range 10 {
			if p, err := g.Breaker.Allow(); err == nil {
				g.Breaker.Done(p, false)
			}
		}
		if g.Breaker.State() != breaker.Open {
			t.Errorf("%s: breaker %v after failures", h, g.Breaker.State())
		}
		time.Sleep(40 * time.Millisecond)
		if p, err := g.Breaker.Allow(); err == nil {
			g.Breaker.Done(p, true)
		}
		if g.Breaker.State() != breaker.Closed {
			t.Errorf("%s: breaker %v after its own probe succeeded (local)", h, g.Breaker.State())
		}
	}
	time.Sleep(50 * time.Millisecond)
	if got := f.Stats().RoundTrips; got != rt {
		t.Errorf("round trips after Close: %d -> %d", rt, got)
	}
	if f.Mode() != fleet.ModeLocal {
		t.Errorf("mode %v after Close", f.Mode())
	}
}

// Budget: "When a reply shows the fleet's budget spent, withdrawals are
// refused without asking until a sync shows room again." With the fleet's
// budget spent, many withdrawals make (almost) no round trips.
func TestAttackFleet2SpentBudgetRefusesWithoutAsking(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	f := zzNew(t, c, fleet.Config{Name: atkName(t, c), SyncEvery: time.Second,
		Budget: budget.Config{Ratio: 1e-9, MinPerSecond: 0.3, Window: 10 * time.Second}})
	g, _ := f.Guards("h")
	granted := 0
	for range 20 {
		if g.Budget.Withdraw() {
			granted++
		}
	}
	if granted != 3 {
		t.Errorf("floor 0.3/s x 10 s = 3 retries for the fleet; granted %d", granted)
	}
	rt := f.Stats().RoundTrips
	for range 500 {
		if g.Budget.Withdraw() {
			t.Fatal("granted beyond the spent budget")
		}
	}
	if d := f.Stats().RoundTrips - rt; d > 2 {
		t.Errorf("500 refused withdrawals made %d round trips (spent budget: refused without asking)", d)
	}
}

// Fleet.Guards / MaxHosts: "MaxHosts bounds the destination hosts the
// Fleet tracks ... Beyond it, Guards returns ErrTooManyHosts"; "A Fleet is
// safe for concurrent use". Many goroutines ask for many hosts at once:
// exactly MaxHosts hosts are tracked, and every caller of one host gets
// the same guards.
func TestAttackFleet2ConcurrentGuardsManyHosts(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	f := zzNew(t, c, fleet.Config{Name: atkName(t, c), MaxHosts: 50, Limit: &limit.Config{}})
	var mu sync.Mutex
	seen := map[string]fleet.Budget{}
	var okHosts = map[string]bool{}
	var tooMany atomic.Int64
	var wg sync.WaitGroup
	for gi := range 16 {
		wg.Go(func() {
			for i := range 120 {
				h := fmt.Sprintf("host-%d", (i*7+gi)%120)
				g, err := f.Guards(h)
				if errors.Is(err, fleet.ErrTooManyHosts) {
					tooMany.Add(1)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if b, ok := seen[h]; ok && b != *g.Budget.(*fleet.Budget) {
					t.Errorf("host %s: two different budgets", h)
				}
				seen[h] = *g.Budget.(*fleet.Budget)
				okHosts[h] = true
				mu.Unlock()
				g.Budget.Deposit()
			}
		})
	}
	wg.Wait()
	if len(okHosts) != 50 {
		t.Errorf("%d hosts tracked, want MaxHosts 50", len(okHosts))
	}
	if tooMany.Load() == 0 {
		t.Error("no ErrTooManyHosts")
	}
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Errorf("mode %v", f.Mode())
	}
}

// The package doc: Probes are fleet-wide: "while the fleet's breaker is
// open the whole fleet gets Config.ProbeRounds rounds per probe interval
// (Breaker.OpenFor), one per slot of OpenFor/ProbeRounds, so a thousand
// processes send a handful of probes". Six Fleets of one Name (six
// processes) call a dependency that stays down; the calls that reach it
// after the fleet's breaker opened are the probes.
func TestAttackFleet2ProbeRoundsAcrossFleets(t *testing.T) {
	for _, probes := range []int{1, 3} {
		t.Run(fmt.Sprint("probes=", probes), func(t *testing.T) { zzProbeRounds(t, probes) })
	}
}

func zzProbeRounds(t *testing.T, probesPerRound int) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	const openFor, rounds, procs = 300 * time.Millisecond, 2, 6
	cfg := fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, ProbeRounds: rounds,
		Breaker: breaker.Config{OpenFor: openFor, MinCalls: 5, Probes: probesPerRound}}
	var brs []*breaker.Breaker
	for range procs {
		f := zzNew(t, atkClient(t, atkAddr(t)), cfg)
		g, err := f.Guards("down")
		if err != nil {
			t.Fatal(err)
		}
		brs = append(brs, g.Breaker)
	}
	var mu sync.Mutex
	var calls []time.Time
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, b := range brs {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p, err := b.Allow(); err == nil {
					mu.Lock()
					calls = append(calls, time.Now())
					mu.Unlock()
					b.Done(p, false)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	if !atkEventually(3*time.Second, func() bool {
		for _, b := range brs {
			if b.State() == breaker.Closed {
				return false
			}
		}
		return true
	}) {
		close(stop)
		wg.Wait()
		t.Fatal("the fleet did not open")
	}
	// Let the first probe interval pass (each breaker's first open
	// period ends within 1.2 OpenFor).
	time.Sleep(openFor * 2)
	mu.Lock()
	from := len(calls)
	t0 := time.Now()
	mu.Unlock()
	const span = 8 * openFor
	time.Sleep(span)
	mu.Lock()
	probes := append([]time.Time(nil), calls[from:]...)
	mu.Unlock()
	close(stop)
	wg.Wait()
	el := time.Since(t0)
	bound := (int(float64(rounds)*float64(el)/float64(openFor)) + rounds) * probesPerRound
	maxIn := 0
	sort.Slice(probes, func(i, j int) bool { return probes[i].Before(probes[j]) })
	for i := range probes {
		n := 0
		for j := i; j < len(probes) && probes[j].Sub(probes[i]) < openFor; j++ {
			n++
		}
		maxIn = max(maxIn, n)
	}
	t.Logf("%d probes in %v (bound %d), at most %d in one OpenFor", len(probes), el, bound, maxIn)
	if len(probes) > bound {
		t.Errorf("%d probes reached the dependency in %v: more than ProbeRounds %d per OpenFor %v for the fleet (bound %d)",
			len(probes), el, rounds, openFor, bound)
	}
	if maxIn > (rounds+1)*probesPerRound {
		t.Errorf("%d probes within one OpenFor (ProbeRounds %d)", maxIn, rounds)
	}
}

// The package doc: "one round trip per interval per process, whatever the
// traffic"; MaxHosts "0 means 1024"; "A Fleet is in ModeFleet while Redis
// answers". A process with the default bound's worth of hosts, all in
// use, on a healthy local Redis. The Timeout is 2 s, not the default
// 100 ms: how long a sync of 1024 hosts takes is a speed, for a benchmark
// (50-100 ms here with Limit; over 100 ms for most syncs of a -race build
// on a loaded machine, which failed CI), not for a test of the mode.
func TestAttackFleet2DefaultMaxHostsStaysFleet(t *testing.T) {
	for _, withLimit := range []bool{false, true} {
		t.Run(fmt.Sprint("limit=", withLimit), func(t *testing.T) {
			c := atkClient(t, atkAddr(t))
			cfg := fleet.Config{Name: atkName(t, c), Timeout: 2 * time.Second}
			if withLimit {
				cfg.Limit = &limit.Config{}
			}
			f := zzNew(t, c, cfg)
			var gs []*fleet.Budget
			for i := range 1024 {
				g, err := f.Guards(fmt.Sprintf("host-%04d.example.com", i))
				if err != nil {
					t.Fatal(err)
				}
				gs = append(gs, g.Budget.(*fleet.Budget))
			}
			end := time.Now().Add(2500 * time.Millisecond)
			for time.Now().Before(end) {
				for _, b := range gs {
					b.Deposit()
				}
				time.Sleep(5 * time.Millisecond)
			}
			// Only persistent flapping fails the test: back in fleet mode
			// within two syncs, and at most a third of the round trips
			// failed.
			back := atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeFleet })
			st := f.Stats()
			t.Logf("mode %v, stats %+v", f.Mode(), st)
			if !back || 3*st.Failures > st.RoundTrips {
				t.Errorf("1024 hosts (the default MaxHosts) on a healthy Redis: mode %v, %d failed round trips of %d, longest %v, last error %v",
					f.Mode(), st.Failures, st.RoundTrips, st.MaxRoundTrip, st.LastError)
			}
		})
	}
}

// LocalBudget: "It counts every call in fleet mode too, so that it is
// ready when Redis goes away." Requests deposited in fleet mode (and
// synced), then Redis down: the local budget admits Ratio of them.
func TestAttackFleet2LocalBudgetReadyWhenRedisGoes(t *testing.T) {
	p := zzNewDelayProxy(t, atkAddr(t))
	c := atkClient(t, p.ln.Addr().String())
	name := atkName(t, atkClient(t, atkAddr(t)))
	f := zzNew(t, c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 50 * time.Millisecond,
		Budget:      budget.Config{Ratio: 0.5, MinPerSecond: -1},
		LocalBudget: budget.Config{Ratio: 0.5, MinPerSecond: -1}})
	g, _ := f.Guards("h")
	for range 100 {
		g.Budget.Deposit()
	}
	time.Sleep(100 * time.Millisecond) // a few syncs
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("mode %v", f.Mode())
	}
	// 10 retries spent in fleet mode: the local budget hears of them too.
	for i := range 10 {
		if !g.Budget.Withdraw() {
			t.Fatalf("fleet retry %d refused", i)
		}
	}
	p.cut(true)
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("Redis down: still fleet")
	}
	n := 0
	for range 100 {
		if g.Budget.Withdraw() {
			n++
		}
	}
	if n != 40 {
		t.Errorf("local mode after 100 requests and 10 retries in fleet mode (Ratio 0.5, no floor): %d retries granted, want 40", n)
	}
}

// MinCalls: "0 means Breaker.MinCalls (with its default)" (breaker: at
// least 20 calls). 19 failures over 4 processes leave the fleet closed; the
// 20th opens every process's breaker.
func TestAttackFleet2MinCallsDefaultFromBreaker(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Breaker: breaker.Config{OpenFor: time.Hour}}
	var brs []*breaker.Breaker
	for range 4 {
		f := zzNew(t, atkClient(t, atkAddr(t)), cfg)
		g, _ := f.Guards("h")
		brs = append(brs, g.Breaker)
	}
	fail := func(b *breaker.Breaker, n int) {
		for range n {
			p, err := b.Allow()
			if err != nil {
				t.Fatal(err)
			}
			b.Done(p, false)
		}
	}
	for i, b := range brs {
		fail(b, []int{5, 5, 5, 4}[i])
	}
	time.Sleep(300 * time.Millisecond)
	for i, b := range brs {
		if b.State() != breaker.Closed {
			t.Fatalf("19 calls < default MinCalls 20: process %d's breaker %v", i, b.State())
		}
	}
	fail(brs[3], 1)
	if !atkEventually(2*time.Second, func() bool {
		for _, b := range brs {
			if b.State() == breaker.Closed {
				return false
			}
		}
		return true
	}) {
		t.Errorf("20 failures of 20 calls: states %v %v %v %v", brs[0].State(), brs[1].State(), brs[2].State(), brs[3].State())
	}
}

// News on a channel: "A message that ... claims a time more than a minute
// past the newest reply's, is ignored" (a message from the future would
// make the process ignore every reply and opening until then). A host the
// process began tracking after its last sync has had no reply of its own:
// a forged opening an hour ahead, for it, must still be ignored (the
// process's newest reply is New's first sync), and must not deafen the
// host to the fleet's real opening afterwards.
func TestAttackFleet2FutureNewsForNewHost(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, atkClient(t, atkAddr(t)))
	f := zzNew(t, c, fleet.Config{Name: name, SyncEvery: time.Second})
	time.Sleep(50 * time.Millisecond) // the subscription is up; New's sync is the newest reply
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("mode %v", f.Mode())
	}
	g, err := f.Guards("h") // tracked from now on; its first sync is up to 1 s away
	if err != nil {
		t.Fatal(err)
	}
	fut := atkNewsServerMicros(t, c) + int64(time.Hour/time.Microsecond)
	ch := "stormguard:fleet:{" + name + "}/open"
	if err := c.Publish(context.Background(), ch, "7 "+itoa(fut)+" stormguard:fleet:{"+name+"}:h").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if st := g.Breaker.State(); st != breaker.Closed {
		t.Errorf("an opening claiming a server time 1 h past the newest reply tripped h's breaker: %v", st)
		g.Breaker.Reset()
	}
	// Wait for a sync of h, then the fleet opens h for real (another process).
	time.Sleep(1100 * time.Millisecond)
	f2 := atkNewsNew(t, atkClient(t, atkAddr(t)), fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, MinCalls: 5,
		Breaker: breaker.Config{MinCalls: 100000}})
	atkNewsTripFleet(t, f2, "h")
	if !atkEventually(3*time.Second, func() bool { return g.Breaker.State() != breaker.Closed }) {
		t.Errorf("after a forged future opening, the fleet's real opening of h never reached this process (channel nor syncs, 3 s)")
	}
}

// Budget: "every retry granted in fleet mode was counted in the fleet's
// window before it was sent, whatever the callers' deadlines"; Close
// "returns the unused leases in one last sync". Five processes, callers
// with short and no deadlines, a Redis slowed by a few ms (Timeout long:
// fleet mode throughout): after Close, the fleet's window holds exactly
// the retries granted, within Ratio·requests + floor.
func TestAttackFleet2GrantedEqualsCountedInRedis(t *testing.T) {
	p := zzNewDelayProxy(t, atkAddr(t))
	p.delay.Store(int64(2 * time.Millisecond))
	admin := atkClient(t, atkAddr(t))
	name := atkName(t, admin)
	cfg := fleet.Config{Name: name, SyncEvery: 15 * time.Millisecond, Timeout: 5 * time.Second,
		Budget: budget.Config{Ratio: 0.2, MinPerSecond: 0.5, Window: time.Minute}}
	var fs []*fleet.Fleet
	for range 5 {
		f, err := fleet.New(atkClient(t, p.ln.Addr().String()), cfg)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	var granted, requests atomic.Int64
	var wg sync.WaitGroup
	for i, f := range fs {
		g, _ := f.Guards("h")
		for j := range 4 {
			wg.Go(func() {
				for k := range 150 {
					g.Budget.Deposit()
					requests.Add(1)
					left := time.Duration((i*7+j*3+k)%5) * time.Millisecond // 0: no deadline
					if g.Budget.(*fleet.Budget).WithdrawWithin(left) {
						granted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, f := range fs {
		if f.Mode() != fleet.ModeFleet {
			t.Fatalf("a process went local: %v", f.Stats().LastError)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	h, err := admin.HGetAll(context.Background(), "stormguard:fleet:{"+name+"}:h").Result()
	if err != nil {
		t.Fatal(err)
	}
	var q, r int64
	for k, v := range h {
		var n float64
		fmt.Sscan(v, &n)
		switch {
		case strings.HasPrefix(k, "bq"):
			q += int64(n)
		case strings.HasPrefix(k, "br"):
			r += int64(n)
		}
	}
	bound := 0.2*float64(requests.Load()) + 0.5*60
	t.Logf("requests %d (fleet counted %d), granted %d, fleet counted %d retries, bound %.1f", requests.Load(), q, granted.Load(), r, bound)
	if q != requests.Load() {
		t.Errorf("fleet counted %d requests, %d deposited", q, requests.Load())
	}
	if r != granted.Load() {
		t.Errorf("granted %d retries, the fleet's window holds %d after Close gave back the leases", granted.Load(), r)
	}
	if float64(granted.Load()) > bound {
		t.Errorf("granted %d > bound %.1f", granted.Load(), bound)
	}
}

// Modes: "each change (not each call) is logged at Warn ... and reported
// as an observe.FleetMode event"; observe.FleetMode: "Err the cause of a
// switch to local". Redis cut while callers ask for leases and syncs fail,
// then back: exactly two events, fleet->local with its cause, local->fleet.
func TestAttackFleet2ModeEventsThroughCut(t *testing.T) {
	p := zzNewDelayProxy(t, atkAddr(t))
	c := atkClient(t, p.ln.Addr().String())
	name := atkName(t, atkClient(t, atkAddr(t)))
	obs := &zzObs{}
	warns := &zzWarns{}
	f := zzNew(t, c, fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: 30 * time.Millisecond,
		Observer: obs, Logger: slog.New(warns), Budget: budget.Config{MinPerSecond: 1000}})
	g, _ := f.Guards("h")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				g.Budget.Deposit()
				g.Budget.Withdraw()
				time.Sleep(time.Millisecond)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	p.cut(true)
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("cut: still fleet")
	}
	time.Sleep(200 * time.Millisecond)
	p.cut(false)
	if !atkEventually(3*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatal("back: still local")
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	ev := obs.kind(observe.FleetMode)
	if len(ev) != 2 || ev[0].To != "local" || ev[0].Err == nil || ev[1].To != "fleet" || ev[1].Err != nil || ev[0].Name != name {
		for _, e := range ev {
			t.Logf("%s->%s err=%v", e.From, e.To, e.Err)
		}
		t.Errorf("one cut and back: %d FleetMode events, want fleet->local (with Err), local->fleet", len(ev))
	}
	if warns.n.Load() != 2 {
		t.Errorf("%d Warn records, want 2", warns.n.Load())
	}
}

// zzRetries returns the retries the fleet's hash of host counts, all slices.
func zzRetries(t *testing.T, c *redis.Client, name, host string) int64 {
	h, err := c.HGetAll(context.Background(), "stormguard:fleet:{"+name+"}:"+host).Result()
	if err != nil {
		t.Fatal(err)
	}
	var r int64
	for k, v := range h {
		if strings.HasPrefix(k, "br") {
			var n float64
			fmt.Sscan(v, &n)
			r += int64(n)
		}
	}
	return r
}

// Budget: "A lease asks for one retry at first, doubles its ask (up to 8
// retries) each time a whole lease is spent and halves it when one
// expires unused ... the retries it did not spend are given back by the
// next sync." The fleet's count of retries in Redis shows each ask.
func TestAttackFleet2LeaseAsksDoubleAndHalve(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f := zzNew(t, c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: time.Second,
		Budget: budget.Config{Ratio: -1, MinPerSecond: 1000, Window: 10 * time.Second, Slices: 10}})
	g, _ := f.Guards("h")
	// Start just after a slice boundary (server clock, 1 s slices).
	for {
		now := atkNewsServerMicros(t, c)
		if now%1_000_000 < 50_000 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	var counted []int64
	for range 16 { // asks 1, 2, 4, 8: 15 retries, then one more from the lease of 8
		if !g.Budget.Withdraw() {
			t.Fatal("refused")
		}
		counted = append(counted, zzRetries(t, c, name, "h"))
	}
	t.Logf("fleet's count after each retry: %v", counted)
	if counted[0] != 1 || counted[2] != 3 || counted[6] != 7 || counted[14] != 15 || counted[15] != 23 {
		t.Errorf("asks should be 1, 2, 4, 8, 8: counts after retries 1, 3, 7, 15, 16 are %d %d %d %d %d, want 1 3 7 15 23",
			counted[0], counted[2], counted[6], counted[14], counted[15])
	}
	// 7 of the last lease are left: it expires with its slice, unused;
	// the next sync gives them back, and the next ask is 4.
	time.Sleep(1200 * time.Millisecond)
	if r := zzRetries(t, c, name, "h"); r != 16 {
		t.Errorf("after the lease expired: fleet counts %d retries, want 16 (7 unused given back)", r)
	}
	if !g.Budget.Withdraw() {
		t.Fatal("refused")
	}
	if r := zzRetries(t, c, name, "h"); r != 20 {
		t.Errorf("after an unused lease expired the ask halves to 4: fleet counts %d, want 20", r)
	}
}

// The package doc: "while the fleet's breaker is open the whole fleet gets
// Config.ProbeRounds rounds per probe interval (Breaker.OpenFor), one per
// slot of OpenFor/ProbeRounds, so ... a dependency that is back is found
// within about a slot". Six processes call a dependency that is down, then
// back at a random point; the time from its return to the first call that
// succeeds (found), and to every breaker closed.
func TestAttackFleet2RecoveryFoundWithinASlot(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	const openFor, rounds, procs = 600 * time.Millisecond, 3, 6
	slot := openFor / rounds
	cfg := fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, ProbeRounds: rounds,
		Breaker: breaker.Config{OpenFor: openFor, MinCalls: 5}}
	var brs []*breaker.Breaker
	for range procs {
		f := zzNew(t, atkClient(t, atkAddr(t)), cfg)
		g, err := f.Guards("dep")
		if err != nil {
			t.Fatal(err)
		}
		brs = append(brs, g.Breaker)
	}
	var up atomic.Bool
	var firstOK atomic.Int64 // unix ns of the first success since up
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, b := range brs {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if p, err := b.Allow(); err == nil {
					ok := up.Load()
					if ok {
						firstOK.CompareAndSwap(0, time.Now().UnixNano())
					}
					b.Done(p, ok)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	allClosed := func() bool {
		for _, b := range brs {
			if b.State() != breaker.Closed {
				return false
			}
		}
		return true
	}
	var found, closed []time.Duration
	for cycle := range 4 {
		up.Store(false)
		if !atkEventually(3*time.Second, func() bool {
			for _, b := range brs {
				if b.State() == breaker.Closed {
					return false
				}
			}
			return true
		}) {
			t.Fatal("the fleet did not open")
		}
		time.Sleep(3*openFor + time.Duration(cycle)*137*time.Millisecond)
		firstOK.Store(0)
		t0 := time.Now()
		up.Store(true)
		if !atkEventually(5*time.Second, allClosed) {
			t.Fatal("not closed 5 s after the dependency came back")
		}
		closed = append(closed, time.Since(t0))
		found = append(found, time.Duration(firstOK.Load()-t0.UnixNano()))
	}
	t.Logf("slot %v: found after %v, all closed after %v", slot, found, closed)
	for i, d := range found {
		if d > openFor {
			t.Errorf("cycle %d: the dependency back was found after %v, more than OpenFor (slot %v, OpenFor %v / ProbeRounds %d)",
				i, d, slot, openFor, rounds)
		}
	}
}

// Close: "waits for every round trip to end ... It returns the last
// sync's error, if any; the Fleet is closed either way. Close is safe to
// call more than once." A client without ContextTimeoutEnabled on a Redis
// 400 ms slow (Timeout 50 ms): round trips outlive their Timeout; once
// Close returns none is left to change Stats, and a second Close says the
// same.
func TestAttackFleet2CloseWaitsLateRoundTrips(t *testing.T) {
	p := zzNewDelayProxy(t, atkAddr(t))
	c := redis.NewClient(&redis.Options{Addr: p.ln.Addr().String(), MaxRetries: -1, ReadTimeout: 3 * time.Second, PoolSize: 50})
	t.Cleanup(func() { c.Close() })
	name := atkName(t, atkClient(t, atkAddr(t)))
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var gs []*fleet.Budget
	for i := range 5 {
		g, _ := f.Guards(fmt.Sprint("h", i))
		gs = append(gs, g.Budget.(*fleet.Budget))
	}
	time.Sleep(50 * time.Millisecond)
	p.delay.Store(int64(400 * time.Millisecond))
	var wg sync.WaitGroup
	for _, b := range gs {
		wg.Go(func() { b.Withdraw() }) // lease requests, abandoned after 50 ms
	}
	wg.Wait()
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	err1 := f.Close()
	el := time.Since(t0)
	st := f.Stats()
	time.Sleep(1500 * time.Millisecond)
	st2 := f.Stats()
	err2 := f.Close()
	t.Logf("Close took %v, err %v; stats %+v", el, err1, st)
	if st2.RoundTrips != st.RoundTrips || st2.Failures != st.Failures || st2.MaxRoundTrip != st.MaxRoundTrip {
		t.Errorf("round trips still ended after Close returned: stats %+v then %+v", st, st2)
	}
	if (err1 == nil) != (err2 == nil) || (err1 != nil && err1.Error() != err2.Error()) {
		t.Errorf("second Close: %v, first: %v", err2, err1)
	}
}

var _ = strings.Contains
