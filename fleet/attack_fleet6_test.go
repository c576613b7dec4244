package fleet_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
)

// ---- helpers (own, external package) ----

func z26Addr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("STORMGUARD_REDIS_ADDR")
	if addr == "" {
		if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
			t.Fatal("STORMGUARD_REDIS_ADDR not set")
		}
		t.Skip("no Redis (STORMGUARD_REDIS_ADDR)")
	}
	return addr
}

func z26Client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	return c
}

// z26Name returns a fresh fleet name whose keys are deleted when t ends.
func z26Name(t *testing.T) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "z26-" + hex.EncodeToString(b[:])
	c := z26Client(t, z26Addr(t))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := c.Keys(ctx, "stormguard:fleet:{"+name+"}*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
	return name
}

func z26New(t *testing.T, c redis.UniversalClient, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func z26Eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}

func z26Budget(t *testing.T, f *fleet.Fleet, host string) *fleet.Budget {
	t.Helper()
	g, err := f.Guards(host)
	if err != nil {
		t.Fatal(err)
	}
	return g.Budget.(*fleet.Budget)
}

// z26Proxy forwards TCP to a target, delaying every chunk from the client
// by delay; in blackhole mode it swallows the client's bytes.
type z26Proxy struct {
	ln        net.Listener
	target    string
	delay     atomic.Int64
	blackhole atomic.Bool
	mu        sync.Mutex
	conns     []net.Conn
	closed    bool
}

func z26NewProxy(t *testing.T, target string) *z26Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &z26Proxy{ln: ln, target: target}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *z26Proxy) addr() string { return p.ln.Addr().String() }

func (p *z26Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *z26Proxy) close() {
	p.mu.Lock()
	p.closed = true
	cs := p.conns
	p.conns = nil
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range cs {
		c.Close()
	}
}

func (p *z26Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		go p.serve(c)
	}
}

func (p *z26Proxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	if !p.track(s) {
		c.Close()
		return
	}
	go func() { _, _ = io.Copy(c, s); c.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 && !p.blackhole.Load() {
			if d := time.Duration(p.delay.Load()); d > 0 {
				time.Sleep(d)
			}
			if _, werr := s.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	s.Close()
	c.Close()
}

// ---- findings ----

// FINDING: Budget's rule is "retries + k <= Ratio·requests + floor"
// (doc.go: "retries + k <= Ratio·requests + MinPerSecond·Window.Seconds()").
// With Ratio 0.29 and 100 requests the limit is 29 retries (0.29·100 is
// 28.999999999999996 in float64: the script allows for the rounding since
// 6ddef87). Once a sync's reply shows 28 retries, the process's own check
// (settings.available, without the allowance) says the fleet's budget is
// spent and refuses the 29th without asking, though the fleet would grant it.
func TestAttackFleetRoundedLimitAfterSync(t *testing.T) {
	c := z26Client(t, z26Addr(t))
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 20 * time.Millisecond, Timeout: 2 * time.Second,
		Budget: budget.Config{Ratio: 0.29, MinPerSecond: -1, Window: 20 * time.Second, Slices: 40}}
	f := z26New(t, c, cfg)
	b := z26Budget(t, f, "api")
	for range 100 {
		b.Deposit()
	}
	if !z26Eventually(5*time.Second, func() bool { return b.Stats().Requests == 100 }) {
		t.Fatalf("requests never synced: %+v", b.Stats())
	}
	for i := range 28 {
		if !b.Withdraw() {
			t.Fatalf("retry %d of 28 refused (0.29·100 admits 29): %+v", i+1, b.Stats())
		}
	}
	// The lease's leftovers (if any) expire with their slice (500 ms) and
	// go back: the fleet's window then holds the 28 retries spent.
	if !z26Eventually(5*time.Second, func() bool { return b.Stats().Retries == 28 }) {
		t.Fatalf("the fleet's window never showed 28 retries: %+v", b.Stats())
	}
	time.Sleep(3 * cfg.SyncEvery) // a few syncs more, each showing 28 of 100
	st := b.Stats()
	if !b.Withdraw() {
		t.Fatalf("the 29th retry refused with %d requests and %d retries in the fleet's window at Ratio 0.29 (doc: retries + k <= Ratio·requests + floor; 28+1 <= 29); Stats.Limit %v, mode %v",
			st.Requests, st.Retries, st.Limit, f.Mode())
	}
}

// FINDING: Fleet.Guards doc: "The first call for a host (in fleet mode)
// starts a sync and waits for it, at most Timeout, so that the host's
// breaker and limiter know the fleet's state of it ... before its first
// call"; doc.go: "a process that starts calling a host, joining
// mid-outage, learns the fleet's state before its first call". A process
// whose callers ask for a new host concurrently (a direct user of Guards,
// or grpcretry targets resolved per call) gets the guards at once for every
// call but the first: the breaker is closed and lets the calls through
// while the fleet's breaker of that host is open.
func TestAttackFleetConcurrentFirstGuardsWait(t *testing.T) {
	addr := z26Addr(t)
	name := z26Name(t)
	cfg := fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: 2 * time.Second, MinCalls: 5,
		Breaker: breaker.Config{MinCalls: 1000, OpenFor: 30 * time.Second, MaxOpenFor: 30 * time.Second}}
	a := z26New(t, z26Client(t, addr), cfg)
	ga, err := a.Guards("api")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		p, err := ga.Breaker.Allow()
		if err != nil {
			t.Fatal(err)
		}
		ga.Breaker.Done(p, false)
	}
	if !z26Eventually(5*time.Second, func() bool { return ga.Breaker.State() == breaker.Open }) {
		t.Fatal("the fleet's breaker did not open")
	}
	// A new process, 100 ms from Redis, syncing every second.
	px := z26NewProxy(t, addr)
	cfgB := cfg
	cfgB.SyncEvery = 5 * time.Second
	b := z26New(t, z26Client(t, px.addr()), cfgB)
	px.delay.Store(int64(100 * time.Millisecond))
	const n = 20
	var wg sync.WaitGroup
	var through atomic.Int64
	firstDone := make(chan struct{})
	wg.Add(1)
	go func() { // the first caller: waits for the sync
		defer wg.Done()
		defer close(firstDone)
		g, err := b.Guards("api")
		if err != nil {
			t.Error(err)
			return
		}
		if p, err := g.Breaker.Allow(); err == nil {
			through.Add(1)
			g.Breaker.Done(p, true)
		}
	}()
	time.Sleep(20 * time.Millisecond)
	for range n - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := b.Guards("api")
			if err != nil {
				t.Error(err)
				return
			}
			if p, err := g.Breaker.Allow(); err == nil {
				through.Add(1)
				g.Breaker.Done(p, true)
			}
		}()
	}
	wg.Wait()
	if got := through.Load(); got != 0 {
		t.Fatalf("%d of %d calls of a new process went through a closed breaker while the fleet's breaker of the host was open (the first Guards call waited for the sync, the %d concurrent ones did not)",
			got, n, n-1)
	}
}

// ---- passing: leases ----

// A burst of callers on a Redis 100 ms away (Timeout 1 s) is served by a
// round trip or two, all granted, in fleet mode, with no failure.
func TestAttackFleet6LeaseBurstOnSlowRedis(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: time.Second,
		Budget: budget.Config{MinPerSecond: 100, Window: time.Minute}}
	f := z26New(t, z26Client(t, px.addr()), cfg)
	b := z26Budget(t, f, "api")
	px.delay.Store(int64(100 * time.Millisecond))
	before := f.Stats().RoundTrips
	const n = 40
	var wg sync.WaitGroup
	var granted atomic.Int64
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.WithdrawWithin(0) {
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	st := f.Stats()
	if granted.Load() != n || f.Mode() != fleet.ModeFleet || st.Failures != 0 {
		t.Fatalf("granted %d of %d, mode %v, stats %+v", granted.Load(), n, f.Mode(), st)
	}
	if trips := st.RoundTrips - before; trips > 4 {
		t.Errorf("%d round trips for a burst of %d callers", trips, n)
	}
}

// Callers with little time left (1 ns, 5 ms) on a Redis 100 ms away are
// refused, the fleet stays in fleet mode with no failure, and the retries
// their request brings serve the next callers without a round trip.
func TestAttackFleet6LeaseShortCallersRefusedNotFailure(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: time.Second,
		Budget: budget.Config{MinPerSecond: 100, Window: time.Minute, Slices: 6}}
	// A lease ends with the budget's slice (10 s here, on Redis's
	// clock): start early in one, so that the lease the request brings
	// is still there for the next caller.
	rstAwaitSliceStart(t, addr, 10*time.Second, 3*time.Second)
	f := z26New(t, z26Client(t, px.addr()), cfg)
	b := z26Budget(t, f, "api")
	px.delay.Store(int64(100 * time.Millisecond))
	const n = 30
	var wg sync.WaitGroup
	var granted atomic.Int64
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			left := 5 * time.Millisecond
			if i%2 == 0 {
				left = time.Nanosecond
			}
			if b.WithdrawWithin(left) {
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 90*time.Millisecond {
		t.Errorf("callers with at most 5 ms left took %v", d)
	}
	if granted.Load() != 0 {
		t.Errorf("%d of %d granted before a reply could come", granted.Load(), n)
	}
	// The request goes on; its retries are for the next callers.
	time.Sleep(400 * time.Millisecond)
	px.delay.Store(int64(time.Hour)) // any round trip now would hang
	trips := f.Stats().RoundTrips
	if !b.WithdrawWithin(time.Millisecond) {
		t.Errorf("no retry kept in the lease for the next caller")
	}
	st := f.Stats()
	if st.RoundTrips != trips || st.Failures != 0 || f.Mode() != fleet.ModeFleet {
		t.Errorf("round trips %d -> %d, stats %+v, mode %v", trips, st.RoundTrips, st, f.Mode())
	}
	px.close()
}

// Negative and huge time left mean no deadline: the caller waits for the
// reply (up to Timeout), and is granted.
func TestAttackFleet6LeaseNegativeAndHugeLeft(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: time.Second,
		Budget: budget.Config{MinPerSecond: 100, Window: time.Minute}}
	f := z26New(t, z26Client(t, px.addr()), cfg)
	b := z26Budget(t, f, "api")
	px.delay.Store(int64(50 * time.Millisecond))
	for _, left := range []time.Duration{-1, math.MinInt64, math.MaxInt64, 0, time.Hour} {
		start := time.Now()
		ok := b.WithdrawWithin(left)
		if d := time.Since(start); !ok || d > 900*time.Millisecond {
			t.Errorf("WithdrawWithin(%v): %v after %v", left, ok, d)
		}
	}
	if f.Mode() != fleet.ModeFleet || f.Stats().Failures != 0 {
		t.Errorf("mode %v stats %+v", f.Mode(), f.Stats())
	}
}

// A Redis that swallows the lease request: the caller waits at most
// Timeout, the fleet goes local, and the answer is the local budget's.
func TestAttackFleet6LeaseBlackholeGoesLocalWithinTimeout(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: 300 * time.Millisecond,
		LocalBudget: budget.Config{MinPerSecond: 100}}
	f := z26New(t, z26Client(t, px.addr()), cfg)
	b := z26Budget(t, f, "api")
	px.blackhole.Store(true)
	const n = 10
	var wg sync.WaitGroup
	var granted atomic.Int64
	start := time.Now()
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.WithdrawWithin(0) {
				granted.Add(1)
			}
		}()
	}
	wg.Wait()
	if d := time.Since(start); d > 900*time.Millisecond {
		t.Errorf("callers waited %v with Timeout 300ms", d)
	}
	if f.Mode() != fleet.ModeLocal || f.Stats().Failures == 0 {
		t.Errorf("mode %v, stats %+v", f.Mode(), f.Stats())
	}
	if granted.Load() != n {
		t.Errorf("local budget (floor 1000) granted %d of %d", granted.Load(), n)
	}
}

// Close while callers wait for a lease on a slow Redis: every caller
// returns, Close returns, and nothing panics.
func TestAttackFleet6LeaseCloseDuringWaits(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: 500 * time.Millisecond,
		Budget: budget.Config{MinPerSecond: 100, Window: time.Minute}}
	f, err := fleet.New(z26Client(t, px.addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := z26Budget(t, f, "api")
	px.delay.Store(int64(200 * time.Millisecond))
	var wg sync.WaitGroup
	for i := range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.WithdrawWithin(time.Duration(i) * 20 * time.Millisecond)
		}()
	}
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	_ = f.Close()
	wg.Wait()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Close and the waiting callers took %v", d)
	}
	if f.Mode() != fleet.ModeLocal {
		t.Errorf("mode %v after Close", f.Mode())
	}
	// After Close: local, no wait.
	start = time.Now()
	b.Withdraw()
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("Withdraw after Close took %v", d)
	}
}

// The fleet-wide bound, as Redis counts it: five processes (some 30 ms
// from Redis), callers with every kind of time left; the retries granted
// stay within Ratio·requests + floor.
func TestAttackFleet6LeaseFleetWideBound(t *testing.T) {
	addr := z26Addr(t)
	name := z26Name(t)
	cfg := fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond, Timeout: time.Second,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 20 * time.Second}}
	var bs []*fleet.Budget
	var fs []*fleet.Fleet
	for i := range 5 {
		a := addr
		if i%2 == 1 {
			px := z26NewProxy(t, addr)
			px.delay.Store(int64(30 * time.Millisecond))
			a = px.addr()
		}
		f := z26New(t, z26Client(t, a), cfg)
		fs = append(fs, f)
		bs = append(bs, z26Budget(t, f, "api"))
	}
	for _, b := range bs {
		for range 40 {
			b.Deposit()
		}
	}
	if !z26Eventually(5*time.Second, func() bool { return bs[0].Stats().Requests == 200 }) {
		t.Fatalf("requests never synced: %+v", bs[0].Stats())
	}
	lefts := []time.Duration{0, -1, time.Nanosecond, time.Millisecond, 40 * time.Millisecond, math.MaxInt64}
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i, b := range bs {
		for j := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if b.WithdrawWithin(lefts[(i+j)%len(lefts)]) {
					granted.Add(1)
				}
			}()
		}
	}
	wg.Wait()
	// 0.1·200 + 1·20 = 40.
	if g := granted.Load(); g > 40 {
		t.Fatalf("%d retries granted, fleet bound 40", g)
	}
	for _, f := range fs {
		if f.Mode() != fleet.ModeFleet {
			t.Fatalf("a process went local: %+v", f.Stats())
		}
	}
	t.Logf("granted %d of 200 asked (bound 40)", granted.Load())
}

// ---- passing: a new host's first Guards call ----

// A Redis that swallows the sync: the first Guards call returns within
// about Timeout, without an error.
func TestAttackFleet6FirstGuardsBlackholeWithinTimeout(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: 300 * time.Millisecond}
	f := z26New(t, z26Client(t, px.addr()), cfg)
	px.blackhole.Store(true)
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := f.Guards("host-" + string(rune('a'+i)))
			if d := time.Since(start); err != nil || d > 700*time.Millisecond {
				t.Errorf("Guards: %v after %v (Timeout 300ms)", err, d)
			}
		}()
	}
	wg.Wait()
}

// A dead Redis (connection refused): Guards returns at once with no error.
func TestAttackFleet6FirstGuardsDeadRedis(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: 2 * time.Second}
	f := z26New(t, z26Client(t, px.addr()), cfg)
	px.close()
	start := time.Now()
	if _, err := f.Guards("api"); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Guards on a dead Redis took %v", d)
	}
}

// Close during the first Guards call's wait ends the wait.
func TestAttackFleet6FirstGuardsCloseEndsWait(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: 3 * time.Second}
	f, err := fleet.New(z26Client(t, px.addr()), cfg)
	if err != nil {
		t.Fatal(err)
	}
	px.blackhole.Store(true)
	done := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		_, _ = f.Guards("api")
		done <- time.Since(start)
	}()
	time.Sleep(100 * time.Millisecond)
	go f.Close()
	select {
	case d := <-done:
		if d > 2*time.Second {
			t.Errorf("Guards returned %v after start", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Guards still waiting 5s after Close")
	}
}

// MaxHosts: the host beyond it is refused at once with ErrTooManyHosts,
// even on a slow Redis; hosts already tracked still come back.
func TestAttackFleet6FirstGuardsMaxHosts(t *testing.T) {
	addr := z26Addr(t)
	px := z26NewProxy(t, addr)
	cfg := fleet.Config{Name: z26Name(t), SyncEvery: 5 * time.Second, Timeout: time.Second, MaxHosts: 3}
	f := z26New(t, z26Client(t, px.addr()), cfg)
	px.delay.Store(int64(50 * time.Millisecond))
	var wg sync.WaitGroup
	var tooMany, ok atomic.Int64
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := f.Guards("h" + string(rune('a'+i)))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, fleet.ErrTooManyHosts):
				tooMany.Add(1)
				if d := time.Since(start); d > 40*time.Millisecond {
					t.Errorf("refused host waited %v", d)
				}
			default:
				t.Errorf("Guards: %v", err)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 3 || tooMany.Load() != 7 {
		t.Fatalf("%d hosts given, %d refused, want 3 and 7", ok.Load(), tooMany.Load())
	}
}

// ---- passing: the breaker's ratio in the script ----

// failures exactly at FailureRatio trip the fleet's breaker, whatever the
// product's rounding (0.28·25 is 7.000000000000001), across two processes;
// one failure fewer does not.
func TestAttackFleet6BreakerRatioExact(t *testing.T) {
	addr := z26Addr(t)
	for _, tc := range []struct {
		ratio      float64
		calls, bad int
		trip       bool
	}{
		{0.28, 25, 7, true},
		{0.28, 25, 6, false},
		{0.07, 100, 7, true},
		{0.07, 100, 6, false},
		{0.29, 100, 29, true},
		{0.29, 100, 28, false},
	} {
		cfg := fleet.Config{Name: z26Name(t), SyncEvery: 20 * time.Millisecond, Timeout: 2 * time.Second, MinCalls: tc.calls,
			Breaker: breaker.Config{FailureRatio: tc.ratio, MinCalls: 100000, Window: 20 * time.Second, OpenFor: 30 * time.Second}}
		a := z26New(t, z26Client(t, addr), cfg)
		bb := z26New(t, z26Client(t, addr), cfg)
		ga, _ := a.Guards("api")
		gb, _ := bb.Guards("api")
		for range tc.calls - tc.bad {
			p, err := ga.Breaker.Allow()
			if err != nil {
				t.Fatal(err)
			}
			ga.Breaker.Done(p, true)
		}
		// Successes first, so that the failures find the calls there.
		time.Sleep(100 * time.Millisecond)
		for range tc.bad {
			p, err := gb.Breaker.Allow()
			if err != nil {
				t.Fatal(err)
			}
			gb.Breaker.Done(p, false)
		}
		opened := z26Eventually(time.Second, func() bool {
			return ga.Breaker.State() == breaker.Open && gb.Breaker.State() == breaker.Open
		})
		if opened != tc.trip {
			t.Errorf("ratio %v: %d failures of %d: opened %v, want %v", tc.ratio, tc.bad, tc.calls, opened, tc.trip)
		}
	}
}
