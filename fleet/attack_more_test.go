// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
)

func atkFreePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func atkStartRedis(t *testing.T, port int) *exec.Cmd {
	cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
			t.Fatalf("no redis-server and STORMGUARD_REQUIRE_SERVICES=1: %v", err)
		}
		t.Skip("no redis-server:", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if !atkEventually(5*time.Second, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		t.Fatal("redis-server did not start")
	}
	return cmd
}

// A Redis killed and started again (empty, no scripts loaded): local mode,
// then fleet mode back, and leases work against the new server.
func TestAttackRedisRestart(t *testing.T) {
	port := atkFreePort(t)
	srv := atkStartRedis(t, port)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	c := atkClient(t, addr)
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	g.Budget.Deposit()
	if f.Mode() != fleet.ModeFleet || !g.Budget.Withdraw() {
		t.Fatal("fleet mode withdraw")
	}
	_ = srv.Process.Kill()
	_ = srv.Wait()
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("never local")
	}
	atkStartRedis(t, port)
	if !atkEventually(5*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatalf("never back: %v", f.Stats().LastError)
	}
	for range 3 {
		g.Budget.Deposit()
	}
	// Retries in fleet mode are counted on the new server.
	n := 0
	for range 3 {
		if g.Budget.Withdraw() {
			n++
		}
	}
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("went local: %v", f.Stats().LastError)
	}
	if !atkEventually(time.Second, func() bool { return g.Budget.(*fleet.Budget).Stats().Retries >= n }) {
		t.Errorf("granted %d, fleet counted %+v", n, g.Budget.(*fleet.Budget).Stats())
	}
}

// Everything at once, and Close in the middle: no race, no panic, no
// error from the guards.
func TestAttackConcurrentClose(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 2 * time.Millisecond, Timeout: 200 * time.Millisecond,
		Limit: &limit.Config{}, Breaker: breaker.Config{MinCalls: 5, OpenFor: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 8 {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				g, err := f.Guards(fmt.Sprint("h", (i+k)%5))
				if err != nil {
					t.Error(err)
					return
				}
				g.Budget.Deposit()
				g.Budget.(*fleet.Budget).WithdrawWithin(time.Duration(k%3) * time.Millisecond)
				if pm, err := g.Breaker.Allow(); err == nil {
					g.Breaker.Done(pm, k%3 == 0)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				if p, err := g.Limiter.Acquire(ctx); err == nil {
					g.Limiter.Release(p, false)
				}
				cancel()
				_ = f.Stats()
				_ = f.Mode()
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	var cw sync.WaitGroup
	for range 3 {
		cw.Go(func() { _ = f.Close() })
	}
	cw.Wait()
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	if f.Mode() != fleet.ModeLocal {
		t.Errorf("mode after close %v", f.Mode())
	}
}

// Limit is copied at New.
func TestAttackLimitCopied(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	lc := &limit.Config{Max: 7}
	f, err := fleet.New(c, fleet.Config{Name: name, Limit: lc})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lc.Max = -5
	g, err := f.Guards("h")
	if err != nil || g.Limiter == nil {
		t.Fatalf("%v %v", g.Limiter, err)
	}
}

// Huge but valid durations: the fleet still works in fleet mode.
func TestAttackHugeDurations(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	big := time.Duration(math.MaxInt64/int64(time.Second)) * time.Second
	cases := map[string]fleet.Config{
		"budget window 1 slice": {Budget: budget.Config{Window: big, Slices: 1}},
		"budget window":         {Budget: budget.Config{Window: big, Slices: 1000 / 8 * 8}},
		"breaker window":        {Breaker: breaker.Config{Window: big, Buckets: 1}},
		"openfor":               {Breaker: breaker.Config{OpenFor: big}},
		"openfor maxopen":       {Breaker: breaker.Config{OpenFor: time.Second, MaxOpenFor: big}},
		"sync":                  {SyncEvery: big},
		"timeout":               {Timeout: big},
		"rounds":                {ProbeRounds: math.MaxInt},
		"mincalls":              {MinCalls: math.MaxInt},
	}
	for n, cfg := range cases {
		t.Run(n, func(t *testing.T) {
			cfg.Name = atkName(t, c)
			if cfg.Budget.Window == big && cfg.Budget.Slices != 1 {
				cfg.Budget.Window = big / time.Duration(cfg.Budget.Slices) / time.Microsecond * time.Microsecond * time.Duration(cfg.Budget.Slices)
			}
			f, err := fleet.New(c, cfg)
			if err != nil {
				if errors.Is(err, fleet.ErrInvalidConfig) {
					t.Skipf("refused: %v", err)
				}
				t.Fatal(err)
			}
			defer f.Close()
			g, _ := f.Guards("h")
			g.Budget.Deposit()
			if !g.Budget.Withdraw() {
				t.Errorf("refused a retry within the floor: %+v", g.Budget.(*fleet.Budget).Stats())
			}
			if f.Mode() != fleet.ModeFleet {
				t.Errorf("local: %v", f.Stats().LastError)
			}
			if err := f.Close(); err != nil {
				t.Errorf("close: %v", err)
			}
		})
	}
}

// Probes are fleet-wide, and one process's successful probe closes every
// process's breaker.
func TestAttackFleetProbesAndClose(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	const openFor = 200 * time.Millisecond
	cfg := fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: time.Second, MinCalls: 4, ProbeRounds: 2,
		Breaker: breaker.Config{MinCalls: 1000, OpenFor: openFor, MaxWaiters: -1}}
	var brks []*breaker.Breaker
	for range 8 {
		f, err := fleet.New(atkClient(t, atkAddr(t)), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		g, _ := f.Guards("h")
		brks = append(brks, g.Breaker)
	}
	for _, b := range brks[:4] {
		p, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		b.Done(p, false)
	}
	if !atkEventually(3*time.Second, func() bool {
		for _, b := range brks {
			if b.State() == breaker.Closed {
				return false
			}
		}
		return true
	}) {
		t.Fatal("fleet did not open")
	}
	// Dependency stays down: count probes admitted fleet-wide.
	var mu sync.Mutex
	probes := 0
	var wg sync.WaitGroup
	start := time.Now()
	const span = 1200 * time.Millisecond
	for _, b := range brks {
		wg.Go(func() {
			for time.Since(start) < span {
				if p, err := b.Allow(); err == nil {
					mu.Lock()
					probes++
					mu.Unlock()
					b.Done(p, false)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	bound := int(float64(el)/float64(openFor)*2) + 2
	t.Logf("%d probes in %v (bound about %d)", probes, el, bound)
	if probes > bound {
		t.Errorf("%d probes in %v, fleet allows %d rounds per %v", probes, el, 2, openFor)
	}
	// Dependency back: process 0 probes until it closes; every other closes.
	if !atkEventually(3*time.Second, func() bool {
		if p, err := brks[0].Allow(); err == nil {
			brks[0].Done(p, true)
		}
		return brks[0].State() == breaker.Closed
	}) {
		t.Fatal("process 0 never closed")
	}
	if !atkEventually(2*time.Second, func() bool {
		for _, b := range brks {
			if b.State() != breaker.Closed {
				return false
			}
		}
		return true
	}) {
		for i, b := range brks {
			t.Logf("%d: %v", i, b.State())
		}
		t.Fatal("fleet's close did not reach every process")
	}
}

// Close gives back the unused leases: the fleet counts only the retries
// spent.
func TestAttackCloseReturnsLeases(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: time.Hour, Timeout: time.Second,
		Budget: budget.Config{Window: 100 * time.Second, Slices: 1}}
	a, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ga, _ := a.Guards("h")
	for range 100 {
		ga.Budget.Deposit()
	}
	spent := 0
	for range 4 {
		if ga.Budget.Withdraw() {
			spent++
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.SyncEvery = 10 * time.Millisecond
	b, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	gb, _ := b.Guards("h")
	var st budget.Stats
	ok := atkEventually(2*time.Second, func() bool {
		st = gb.Budget.(*fleet.Budget).Stats()
		return st.Requests == 100 && st.Retries == spent
	})
	if !ok {
		t.Fatalf("spent %d; fleet sees %+v", spent, st)
	}
}

type atkPanicClient struct {
	*redis.Client
	panics atomic.Bool
}

func (c *atkPanicClient) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	if c.panics.Load() {
		panic("attack boom")
	}
	return c.Client.EvalSha(ctx, sha1, keys, args...)
}

func (c *atkPanicClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	if c.panics.Load() {
		panic("attack boom")
	}
	return c.Client.Eval(ctx, script, keys, args...)
}

func TestAttackPanickingClient(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	pc := &atkPanicClient{Client: c}
	var changes atomic.Int64
	f, err := fleet.New(pc, fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond,
		Breaker: breaker.Config{OnStateChange: func(from, to breaker.State) { changes.Add(1) }}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	g.Budget.Deposit()
	if f.Mode() != fleet.ModeFleet || !g.Budget.Withdraw() {
		t.Fatal("fleet mode")
	}
	pc.panics.Store(true)
	g.Budget.Withdraw()
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("never local")
	}
	if err := f.Stats().LastError; err == nil {
		t.Fatal("no last error")
	} else {
		t.Log(err)
	}
	g.Breaker.Trip(0)
	if changes.Load() == 0 {
		t.Error("Breaker.OnStateChange not called")
	}
	pc.panics.Store(false)
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatal("never back")
	}
}

// After Close the fleet is in local mode for good ("Budgets and breakers
// keep working afterwards, in local mode"), even when Close races a sync.
func TestAttackCloseRacesSync(t *testing.T) {
	if testing.Short() {
		t.Skip()
	}
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	var bad atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(5 * time.Second)
	var iters atomic.Int64
	for w := range 6 {
		wg.Go(func() {
			for k := 0; time.Now().Before(deadline) && bad.Load() == 0; k++ {
				f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: time.Millisecond, Timeout: time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				g, _ := f.Guards("h")
				for range (w + k) % 7 {
					g.Budget.Deposit()
				}
				time.Sleep(time.Duration((w*131+k*37)%1500) * time.Microsecond)
				f.Close()
				iters.Add(1)
				if m := f.Mode(); m != fleet.ModeLocal {
					bad.Add(1)
					t.Errorf("mode %v after Close", m)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d closes", iters.Load())
}

// Each host is one hash named as documented, expiring twice the longest
// window plus 10 s after the last sync; with Limit, a registry
// "{Name}/r:" + host with the same expiry.
func TestAttackKeysAndExpiry(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Limit: &limit.Config{},
		Budget: budget.Config{Window: 7 * time.Second}, Breaker: breaker.Config{OpenFor: 2 * time.Second, MaxOpenFor: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := f.Guards("my.host:443")
	for range 20 {
		atkBurst(g.Limiter, g.Breaker, 1)
		g.Budget.Deposit()
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond)
	atkBurst(g.Limiter, g.Breaker, 1)
	time.Sleep(100 * time.Millisecond)
	key := "stormguard:fleet:{" + name + "}:my.host:443"
	ctx := context.Background()
	for _, k := range []string{key, "stormguard:fleet:{" + name + "}/r:my.host:443"} {
		d, err := c.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		want := 2*10*time.Second + 10*time.Second // breaker window 10 s by default is the longest
		t.Logf("%s: %v", k, d)
		if d <= 0 || d > want || d < want-time.Second {
			t.Errorf("%s expires in %v, want about %v", k, d, want)
		}
	}
	f.Close()
}

// A lease request whose reply shows the fleet's breaker open opens this
// process's breaker, and the retry is granted (the breaker holds it); with
// the breaker open, retries are granted even with no budget at all.
func TestAttackLeaseSeesOpenFleet(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: time.Second, MinCalls: 3,
		Budget:  budget.Config{Ratio: -1, MinPerSecond: 0.5},
		Breaker: breaker.Config{MinCalls: 1000, OpenFor: time.Hour}}
	a, err := fleet.New(atkClient(t, atkAddr(t)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg.SyncEvery = time.Hour
	// b hears no news (its subscription is to a channel nobody publishes
	// on): only the lease reply can tell it the fleet opened.
	b, err := fleet.New(deafClient{atkClient(t, atkAddr(t))}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ga, _ := a.Guards("h")
	gb, _ := b.Guards("h")
	gb.Budget.Deposit()
	for range 3 {
		p, err := ga.Breaker.Allow()
		if err != nil {
			t.Fatal(err)
		}
		ga.Breaker.Done(p, false)
	}
	if !atkEventually(2*time.Second, func() bool { return ga.Breaker.State() != breaker.Closed }) {
		t.Fatal("a never opened")
	}
	if gb.Breaker.State() != breaker.Closed {
		t.Fatal("b heard already")
	}
	if !gb.Budget.Withdraw() {
		t.Error("retry refused: the fleet's breaker is open and holds it")
	}
	if gb.Breaker.State() == breaker.Closed {
		t.Error("lease reply showing the fleet open did not open b's breaker")
	}
	for range 50 {
		if !gb.Budget.Withdraw() {
			t.Fatal("retry refused while the breaker is open")
		}
	}
}

// deafClient is a Redis client whose subscriptions hear nothing: a fleet
// built on it gets no news of openings.
type deafClient struct{ *redis.Client }

func (c deafClient) Subscribe(ctx context.Context, _ ...string) *redis.PubSub {
	return c.Client.Subscribe(ctx, "stormguard-test:deaf")
}

// No budget at all: the fleet refuses every retry while closed, in fleet
// mode and when the caller's deadline is short (no local fallback).
func TestAttackNoBudgetAtAll(t *testing.T) {
	p := atkNewProxy(t, atkAddr(t))
	c := atkClient(t, p.addr())
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: 2 * time.Second,
		Budget: budget.Config{Ratio: -1, MinPerSecond: -1}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	b := g.Budget.(*fleet.Budget)
	for range 100 {
		b.Deposit()
	}
	p.set(atkDelay, 30*time.Millisecond)
	for i := range 10 {
		if b.WithdrawWithin(time.Duration(i+1) * time.Millisecond) {
			t.Fatalf("granted a retry with no fleet budget (left %dms)", i+1)
		}
	}
	if b.Withdraw() {
		t.Fatal("granted a retry with no fleet budget")
	}
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("went local: %v", f.Stats().LastError)
	}
}

// A process that closes leaves the host's registry at once.
func TestAttackCloseLeavesRegistry(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: 100 * time.Millisecond, Limit: &limit.Config{}}
	a, err := fleet.New(atkClient(t, atkAddr(t)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := fleet.New(atkClient(t, atkAddr(t)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ga, _ := a.Guards("h")
	gb, _ := b.Guards("h")
	end := time.Now().Add(2500 * time.Millisecond)
	for time.Now().Before(end) {
		atkBurst(ga.Limiter, ga.Breaker, 1)
		atkBurst(gb.Limiter, gb.Breaker, 1)
		time.Sleep(50 * time.Millisecond)
	}
	key := "stormguard:fleet:{" + name + "}/r:h"
	ctx := context.Background()
	n0 := c.HLen(ctx, key).Val()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	n1 := c.HLen(ctx, key).Val()
	t.Logf("registry fields %d -> %d: %v", n0, n1, c.HKeys(ctx, key).Val())
	// Per process: its rate report's three fields (:g, :d, :t) and its
	// count of attempts in flight's two (:f, :u).
	if n0 != 10 || n1 != 5 {
		t.Errorf("registry fields %d before, %d after a's Close; want 10, 5", n0, n1)
	}
}

// "A lease asks for one retry at first, doubles its ask (up to 8 retries)
// each time a whole lease is spent": 100 retries in a row need 15 lease
// requests (1+2+4, then 8 each). A black-box attack found the cap of 8,
// which the doc did not say.
func TestAttackLeaseDoubles(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: time.Hour, Timeout: time.Second,
		Budget: budget.Config{Ratio: -1, MinPerSecond: 10, Window: 100 * time.Second, Slices: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("h")
	r0 := f.Stats().RoundTrips
	for i := range 100 {
		if !g.Budget.Withdraw() {
			t.Fatalf("retry %d refused", i)
		}
	}
	n := f.Stats().RoundTrips - r0
	t.Logf("%d round trips for 100 retries", n)
	if n > 15 {
		t.Errorf("%d lease round trips for 100 retries; asks doubling up to 8 need 15", n)
	}
}

// MaxHosts 0 means 1024.
func TestAttackDefaultMaxHosts(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range 1024 {
		if _, err := f.Guards(fmt.Sprint("host-", i)); err != nil {
			t.Fatalf("host %d: %v", i, err)
		}
	}
	if _, err := f.Guards("one-more"); !errors.Is(err, fleet.ErrTooManyHosts) {
		t.Fatalf("host 1025: %v", err)
	}
	if _, err := f.Guards(""); !errors.Is(err, fleet.ErrTooManyHosts) {
		t.Fatalf("empty host 1025: %v", err)
	}
}
