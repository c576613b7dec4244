// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package fleet_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

const (
	atkPass = iota
	atkCut
	atkBlackhole
	atkDelay
)

type atkProxy struct {
	ln     net.Listener
	target string
	mode   atomic.Int32
	delay  atomic.Int64
	mu     sync.Mutex
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func atkNewProxy(t *testing.T, target string) *atkProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &atkProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() { ln.Close(); p.set(atkCut, 0); p.wg.Wait() })
	return p
}

func (p *atkProxy) addr() string { return p.ln.Addr().String() }

func (p *atkProxy) set(m int32, d time.Duration) {
	p.delay.Store(int64(d))
	p.mode.Store(m)
	if m == atkCut {
		p.mu.Lock()
		for c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
	}
}

func (p *atkProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mode.Load() == atkCut {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *atkProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *atkProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil || !p.track(s) {
			c.Close()
			if s != nil {
				s.Close()
			}
			continue
		}
		p.wg.Go(func() { // client -> server
			defer p.untrack(c)
			defer p.untrack(s)
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					switch p.mode.Load() {
					case atkBlackhole:
						continue
					case atkDelay:
						time.Sleep(time.Duration(p.delay.Load()))
					case atkCut:
						return
					}
					if _, werr := s.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		p.wg.Go(func() { // server -> client
			defer p.untrack(c)
			defer p.untrack(s)
			_, _ = io.Copy(c, s)
		})
	}
}

type atkWarnCounter struct{ n atomic.Int64 }

func (h *atkWarnCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *atkWarnCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		h.n.Add(1)
	}
	return nil
}
func (h *atkWarnCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *atkWarnCounter) WithGroup(string) slog.Handler      { return h }

// Blackholed Redis: no caller waits longer than Timeout, the fleet goes
// local (one Warn, one event), the local budget decides, and fleet mode
// comes back by itself; Close is bounded.
func TestAttackBlackholeAndBack(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	var modeEv atomic.Int64
	wc := &atkWarnCounter{}
	const timeout = 50 * time.Millisecond
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: timeout,
		Logger: slog.New(wc),
		Observer: observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.FleetMode {
				modeEv.Add(1)
			}
		})})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := f.Guards("h")
	b := g.Budget.(*fleet.Budget)
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("mode %v", f.Mode())
	}
	for range 20 {
		b.Deposit()
	}
	if !b.Withdraw() {
		t.Fatal("fleet refused a retry within its floor")
	}
	p.set(atkBlackhole, 0)
	// Success path: never waits.
	start := time.Now()
	for range 1000 {
		b.Deposit()
		pm, err := g.Breaker.Allow()
		if err != nil {
			t.Fatal(err)
		}
		g.Breaker.Done(pm, true)
	}
	// A bound, not a speed: one wait on the blackholed Redis would cost a
	// Timeout per call (1000 of them); the margin is for a loaded machine.
	if d := time.Since(start); d > time.Second {
		t.Errorf("success path took %v with Redis blackholed", d)
	}
	var worst time.Duration
	for range 20 {
		s := time.Now()
		b.Withdraw()
		worst = max(worst, time.Since(s))
	}
	if worst > timeout+time.Second { // a bound: the blackhole itself never answers
		t.Errorf("a Withdraw waited %v, Timeout %v", worst, timeout)
	}
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("never went local")
	}
	p.set(atkPass, 0)
	if !atkEventually(3*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatalf("never back: %v", f.Stats().LastError)
	}
	// The mode changes before its change is logged and observed (Fleet's
	// setMode): the event may come a moment after Mode says fleet.
	if !atkEventually(time.Second, func() bool { return modeEv.Load() == 2 && wc.n.Load() == 2 }) {
		t.Errorf("mode events %d, warns %d; want 2 each", modeEv.Load(), wc.n.Load())
	}
	p.set(atkBlackhole, 0)
	start = time.Now()
	err = f.Close()
	d := time.Since(start)
	t.Logf("close under blackhole: %v (%v)", d, err)
	if err == nil {
		t.Error("Close under blackhole returned no error")
	}
	if d > 4*timeout+200*time.Millisecond {
		t.Errorf("Close took %v, Timeout %v", d, timeout)
	}
}

// Redis refusing connections: one sync per interval, no retrying.
func TestAttackRefusedRoundTripRate(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 50 * time.Millisecond, Timeout: 40 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, h := range []string{"a", "b", "c"} {
		g, _ := f.Guards(h)
		g.Budget.Deposit()
	}
	p.set(atkCut, 0)
	if !atkEventually(time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("never local")
	}
	r0 := f.Stats().RoundTrips
	t0 := time.Now()
	time.Sleep(time.Second)
	n := f.Stats().RoundTrips - r0
	el := time.Since(t0)
	want := float64(el) / float64(50*time.Millisecond)
	t.Logf("%d round trips in %v (one per interval: %.1f)", n, el, want)
	if float64(n) > want*1.3+2 {
		t.Errorf("%d round trips in %v, one per interval is %.1f", n, el, want)
	}
	st := f.Stats()
	if st.LastError == nil || st.Failures == 0 {
		t.Errorf("stats %+v", st)
	}
}

// New during an outage: a Fleet in local mode, a Warn, and fleet mode
// once Redis answers.
func TestAttackNewDuringOutage(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	p.set(atkCut, 0)
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	wc := &atkWarnCounter{}
	var ev []observe.Event
	var mu sync.Mutex
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 50 * time.Millisecond,
		Logger: slog.New(wc), Observer: observe.Func(func(_ context.Context, e observe.Event) {
			mu.Lock()
			ev = append(ev, e)
			mu.Unlock()
		})})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Mode() != fleet.ModeLocal {
		t.Fatalf("mode %v", f.Mode())
	}
	if f.Stats().LastError == nil || wc.n.Load() != 1 {
		t.Fatalf("last error %v, warns %d", f.Stats().LastError, wc.n.Load())
	}
	mu.Lock()
	if len(ev) != 1 || ev[0].Kind != observe.FleetMode || ev[0].To != "local" {
		t.Errorf("events %+v", ev)
	}
	mu.Unlock()
	g, _ := f.Guards("h")
	g.Budget.Deposit()
	if !g.Budget.Withdraw() {
		t.Error("local budget refused its floor")
	}
	p.set(atkPass, 0)
	if !atkEventually(3*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatalf("never fleet: %v", f.Stats().LastError)
	}
}

// Slow Redis (under Timeout): a caller with less time left than the round
// trip is refused, the fleet stays in fleet mode and no failure counts.
func TestAttackSlowRedisShortDeadline(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 2 * time.Second,
		Budget: budget.Config{Window: 100 * time.Second, Slices: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	b := g.Budget.(*fleet.Budget)
	for range 10 {
		b.Deposit()
	}
	p.set(atkDelay, 100*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	fails := f.Stats().Failures
	// The fastest of three tries: a bound (the wait must end near the 5 ms
	// left, not at the 100 ms Timeout), read past a loaded machine's stalls.
	d := time.Hour
	for range 3 {
		s := time.Now()
		got := b.WithdrawWithin(5 * time.Millisecond)
		d = min(d, time.Since(s))
		if got {
			t.Error("granted a retry the fleet could not charge in time")
		}
	}
	if d > 60*time.Millisecond {
		t.Errorf("waited %v with 5ms left", d)
	}
	time.Sleep(300 * time.Millisecond)
	if f.Mode() != fleet.ModeFleet || f.Stats().Failures != fails {
		t.Errorf("mode %v failures %d -> %d (%v)", f.Mode(), fails, f.Stats().Failures, f.Stats().LastError)
	}
	// The lease request went on: the next caller takes its retry.
	if !b.WithdrawWithin(5 * time.Millisecond) {
		t.Errorf("the next caller found no retry in the lease: %+v", b.Stats())
	}
}

// A restarted Redis (script cache flushed): fleet mode comes back.
func TestAttackFleetFailureOpensAndOutageNoErrors(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 50 * time.Millisecond,
		Breaker:     breaker.Config{MinCalls: 5, OpenFor: time.Hour},
		LocalBudget: budget.Config{Ratio: -1, MinPerSecond: 0.3}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	p.set(atkCut, 0)
	if !atkEventually(time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("never local")
	}
	// Local budget: floor 3 per 10 s window, no ratio.
	n := 0
	for range 20 {
		g.Budget.Deposit()
		if g.Budget.Withdraw() {
			n++
		}
	}
	if n != 3 {
		t.Errorf("local mode granted %d, local floor 3", n)
	}
	// Local breaker trips on its own calls.
	for range 5 {
		pm, err := g.Breaker.Allow()
		if err != nil {
			break
		}
		g.Breaker.Done(pm, false)
	}
	if g.Breaker.State() == breaker.Closed {
		t.Error("local breaker did not trip in local mode")
	}
}

func atkBurst(g *limit.Limiter, b *breaker.Breaker, n int) (ok int) {
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		p, err := g.Acquire(ctx)
		cancel()
		if err == nil {
			ok++
			if b != nil {
				if bp, err := b.Allow(); err == nil {
					b.Done(bp, true)
				}
			}
			g.Release(p, false)
		}
	}
	return ok
}

// The rate gate: set once the fleet has a rate, lifted in local mode and
// by Close.
func TestAttackRateGateLiftedLocalAndClose(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 100 * time.Millisecond, Timeout: 100 * time.Millisecond,
		Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	if n := atkBurst(g.Limiter, g.Breaker, 50); n != 50 {
		t.Errorf("cold: %d of 50 went (no gate before the first rate)", n)
	}
	// A call every 100 ms until the fleet has a rate (the cold rate is the
	// demand of the second window of a second that carries any, so about 3
	// s in), checked by a burst of 50 once a second from 3 s: at most 10
	// may go through a gate.
	gated := -1
	start := time.Now()
	for next := start.Add(3 * time.Second); time.Since(start) < 10*time.Second; {
		atkBurst(g.Limiter, g.Breaker, 1)
		time.Sleep(100 * time.Millisecond)
		if time.Now().After(next) {
			next = next.Add(time.Second)
			if gated = atkBurst(g.Limiter, g.Breaker, 50); gated <= 10 {
				break
			}
		}
	}
	t.Logf("gated: %d of 50 after %v", gated, time.Since(start).Round(100*time.Millisecond))
	if gated > 10 {
		t.Fatalf("no gate within 10 s of a call every 100 ms (%d of 50 went): the fleet never set a rate", gated)
	}
	p.set(atkCut, 0)
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("never local")
	}
	if n := atkBurst(g.Limiter, g.Breaker, 50); n != 50 {
		t.Errorf("local mode: %d of 50 went (gate not lifted)", n)
	}
	p.set(atkPass, 0)
	if !atkEventually(3*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatal("never back")
	}
	time.Sleep(300 * time.Millisecond)
	regated := atkBurst(g.Limiter, g.Breaker, 50)
	t.Logf("after back: %d of 50", regated)
	if regated > 10 {
		t.Errorf("not gated again after fleet mode came back: %d of 50", regated)
	}
	f.Close()
	if n := atkBurst(g.Limiter, g.Breaker, 50); n != 50 {
		t.Errorf("after Close: %d of 50 went (gate not lifted)", n)
	}
}

// Gated: a call whose turn comes after its deadline fails fast with
// limit.ErrLimited.
func TestAttackGateFailsFast(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 100 * time.Millisecond, Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	// A call every 100 ms until the fleet has a rate (about 3 s in, more
	// under load: see TestAttackRateGateLiftedLocalAndClose), checked by a
	// burst of 50 once a second from 3 s.
	gated := -1
	start := time.Now()
	for next := start.Add(3 * time.Second); time.Since(start) < 10*time.Second; {
		atkBurst(g.Limiter, g.Breaker, 1)
		time.Sleep(100 * time.Millisecond)
		if time.Now().After(next) {
			next = next.Add(time.Second)
			if gated = atkBurst(g.Limiter, g.Breaker, 50); gated <= 10 {
				break
			}
		}
	}
	if gated > 10 {
		t.Fatalf("no gate within 10 s of a call every 100 ms (%d of 50 went): the fleet never set a rate", gated)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowFail, ok, other int
	for range 40 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			s := time.Now()
			p, err := g.Limiter.Acquire(ctx)
			d := time.Since(s)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
				g.Limiter.Release(p, false)
			case errors.Is(err, limit.ErrLimited):
				if d > 250*time.Millisecond { // the deadline is 300 ms: failing fast is far below
					slowFail++
				}
			default:
				other++
				t.Logf("err %v after %v", err, d)
			}
		})
	}
	wg.Wait()
	t.Logf("ok %d, limited after >250ms %d, other %d", ok, slowFail, other)
	if slowFail > 3 || other > 0 {
		t.Errorf("ok %d, limited late %d, other errors %d", ok, slowFail, other)
	}
}

// Exploratory: offered 30 calls/s for 4 s, then saturation for 2 s; logs
// what the gate lets through each half second.
func TestAttackRateExplore(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 100 * time.Millisecond, Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	start := time.Now()
	sent := 0
	for time.Since(start) < 4*time.Second {
		sent += atkBurst(g.Limiter, g.Breaker, 1)
		time.Sleep(33 * time.Millisecond)
	}
	t.Logf("offered phase: %d sent in %v", sent, time.Since(start))
	for k := range atkSatSeconds {
		s := time.Now()
		n := 0
		for time.Since(s) < time.Second {
			n += atkBurst(g.Limiter, g.Breaker, 1)
		}
		t.Logf("saturation second %d: %d", k, n)
	}
}

var atkSatSeconds = 2

// Defaults: SyncEvery 0 means 100 ms, Timeout 0 means 100 ms.
func TestAttackDefaults(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, atkClient(t, atkAddr(t)))
	f, err := fleet.New(c, fleet.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r0 := f.Stats().RoundTrips
	t0 := time.Now()
	time.Sleep(time.Second)
	n := f.Stats().RoundTrips - r0
	t.Logf("%d syncs in %v", n, time.Since(t0))
	if n < 8 || n > 12 {
		t.Errorf("%d syncs in a second, default interval 100 ms", n)
	}
	p.set(atkDelay, 60*time.Millisecond)
	time.Sleep(400 * time.Millisecond)
	if f.Mode() != fleet.ModeFleet {
		t.Errorf("60 ms round trips under the 100 ms default Timeout: local (%v)", f.Stats().LastError)
	}
	p.set(atkDelay, 150*time.Millisecond)
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Error("150 ms round trips over the 100 ms default Timeout: still fleet")
	}
}
