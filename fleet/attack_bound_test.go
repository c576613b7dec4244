package fleet_test

// Black-box attacks on the fleet-wide retry bound, a slow Redis, and
// processes that join while the fleet's breaker is open.
// Needs Redis at STORMGUARD_REDIS_ADDR (127.0.0.1:6379).
//
// These tests run against a real Redis whose clock is the real one, so
// their phases use real time (no synctest is possible across the network):
// they measure counts over windows, not the length of a delay.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
)

func fbAddr(t *testing.T) string {
	t.Helper()
	return atkAddr(t) // the local Redis by default: a missing one fails the test
}

func fbName() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "fbattack-" + hex.EncodeToString(b[:])
}

func fbClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		ReadTimeout: 20 * time.Second, WriteTimeout: 20 * time.Second, PoolSize: 8,
		Protocol: 2, DisableIdentity: true, MinIdleConns: 3})
	t.Cleanup(func() { c.Close() })
	return c
}

func fbCleanup(t *testing.T, addr, name string) {
	t.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := c.Keys(ctx, "stormguard:fleet:{"+name+"}*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
}

// events records, per real-time bucket of 10 ms since start, the deposits
// and the retries granted by the whole fleet.
type events struct {
	start   time.Time
	mu      sync.Mutex
	req     map[int64]int64
	granted map[int64]int64
}

const evBucket = 10 * time.Millisecond

func newEvents() *events {
	return &events{start: time.Now(), req: map[int64]int64{}, granted: map[int64]int64{}}
}

func (e *events) add(m map[int64]int64, at time.Time) {
	b := int64(at.Sub(e.start) / evBucket)
	e.mu.Lock()
	m[b]++
	e.mu.Unlock()
}

// sum returns the events of m in [from, to) (since start).
func (e *events) sum(m map[int64]int64, from, to time.Duration) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var n int64
	for b := int64(from / evBucket); b < int64(to/evBucket); b++ {
		n += m[b]
	}
	return n
}

// worst returns, over every real-time span [s, s+w) in [0, end), the most
// retries granted beyond the bound Config.Budget documents in real time:
// Ratio·(requests of the span and of the lookback before it: the Window,
// SyncEvery and round trip) + floors·floor. It returns the excess and the
// span's start.
func (e *events) worst(w, lookback, end time.Duration, ratio, floor, floors float64) (excess float64, at time.Duration, got, req int64) {
	excess = -1e18
	for s := time.Duration(0); s+w <= end; s += evBucket {
		g := e.sum(e.granted, s, s+w)
		q := e.sum(e.req, max(s-lookback, 0), s+w)
		x := float64(g) - (ratio*float64(q) + floors*floor)
		if x > excess {
			excess, at, got, req = x, s, g, q
		}
	}
	return
}

// delayProxy forwards TCP to target, delivering every chunk, in each
// direction, delay after it arrived (pipelined: a slow Redis, not a slow
// link).
type delayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	mu     sync.Mutex
	conns  []net.Conn
}

func newDelayProxy(t *testing.T, target string, delay time.Duration) *delayProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &delayProxy{ln: ln, target: target, delay: delay}
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *delayProxy) addr() string { return p.ln.Addr().String() }

func (p *delayProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
}

func (p *delayProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

type chunk struct {
	at time.Time
	b  []byte
}

func (p *delayProxy) pipe(from, to net.Conn) {
	ch := make(chan chunk, 4096)
	go func() {
		for c := range ch {
			if d := time.Until(c.at); d > 0 {
				time.Sleep(d)
			}
			if _, err := to.Write(c.b); err != nil {
				for range ch {
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			b := make([]byte, n)
			copy(b, buf[:n])
			ch <- chunk{time.Now().Add(p.delay), b}
		}
		if err != nil {
			close(ch)
			if err != io.EOF {
				to.Close()
			}
			return
		}
	}
}

// TestAttackBoundSlowRedisRetriesOutliveRequests: Redis answers
// slowly but within Timeout (fleet mode throughout). The fleet counts a
// request when the sync that carries it reaches Redis, and a lease's kept
// retry is sent when the reply comes back, after the slice it was counted
// in: once the fleet's requests stop, it keeps granting retries for about
// a round trip plus a window. An attack found that the docs said "every
// retry is counted in the slice it is sent in"; Config.Budget now gives
// the bound in real time, which this checks: requests of the span and of
// the Window, SyncEvery and round trip before it, three floors (a round
// trip longer than half a window).
func TestAttackBoundSlowRedisRetriesOutliveRequests(t *testing.T) {
	addr := fbAddr(t)
	const (
		procs   = 100
		oneWay  = 500 * time.Millisecond // per direction: a round trip of 1 s
		window  = time.Second
		deposit = 40 // requests per process per second while they flow
	)
	p := newDelayProxy(t, addr, oneWay)
	name := fbName()
	fbCleanup(t, addr, name)
	cfg := fleet.Config{Name: name, SyncEvery: 200 * time.Millisecond, Timeout: 5 * time.Second,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: window, Slices: 10}}
	ratio, floor := 0.1, 1.0*window.Seconds()

	fleets := make([]*fleet.Fleet, procs)
	budgets := make([]*fleet.Budget, procs)
	var wg sync.WaitGroup
	for i := range fleets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := fleet.New(fbClient(t, p.addr()), cfg)
			if err != nil {
				t.Error(err)
				return
			}
			fleets[i] = f
			g, err := f.Guards("api.example")
			if err != nil {
				t.Error(err)
				return
			}
			budgets[i] = g.Budget.(*fleet.Budget)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	defer func() {
		var cw sync.WaitGroup
		for _, f := range fleets {
			cw.Add(1)
			go func() { defer cw.Done(); f.Close() }()
		}
		cw.Wait()
	}()

	// Warm up: every client's pool connected and the script cached, then
	// count the failures from here on.
	time.Sleep(4 * time.Second)
	base := make([]int64, procs)
	for i, f := range fleets {
		base[i] = f.Stats().Failures
	}
	ev := newEvents()
	stopReq := make(chan struct{})
	stopAll := make(chan struct{})
	var lw sync.WaitGroup
	var localGrants atomic.Int64
	for i := range budgets {
		b, f := budgets[i], fleets[i]
		lw.Add(1)
		go func() { // deposits, deposit a second, until stopReq
			defer lw.Done()
			tk := time.NewTicker(time.Second / deposit)
			defer tk.Stop()
			for {
				select {
				case <-stopReq:
					return
				case <-tk.C:
					b.Deposit()
					ev.add(ev.req, time.Now())
				}
			}
		}()
		for range 1 { // retries wanted all the time (one caller per process: see TestAttackBoundSlowRedisQueuedLeaseWaitGoesLocal)
			lw.Add(1)
			go func() {
				defer lw.Done()
				for {
					select {
					case <-stopAll:
						return
					default:
					}
					if b.Withdraw() {
						if f.Mode() != fleet.ModeFleet {
							localGrants.Add(1)
						}
						ev.add(ev.granted, time.Now())
					} else {
						time.Sleep(5 * time.Millisecond)
					}
				}
			}()
		}
	}
	time.Sleep(4 * time.Second)
	stopAt := time.Since(ev.start)
	close(stopReq)
	time.Sleep(4 * time.Second)
	close(stopAll)
	lw.Wait()
	end := time.Since(ev.start)

	nf := 0
	for i, f := range fleets {
		if f.Stats().Failures != base[i] {
			nf++
			t.Logf("process %d: %+v", i, f.Stats())
		}
	}
	t.Logf("%d processes with failures", nf)
	for i, f := range fleets {
		if f.Mode() != fleet.ModeFleet || f.Stats().Failures != base[i] {
			t.Fatalf("process %d left fleet mode (%v, %+v, %d failures before): the test wants a slow Redis, not a failing one", i, f.Mode(), f.Stats(), base[i])
		}
	}
	if n := localGrants.Load(); n != 0 {
		t.Fatalf("%d grants in local mode", n)
	}
	totalQ, totalG := ev.sum(ev.req, 0, end), ev.sum(ev.granted, 0, end)
	t.Logf("requests %d, retries granted %d, requests stopped at %v", totalQ, totalG, stopAt)
	// The bound Config.Budget gives in real time: the requests of the span
	// and of the Window, the interval (a sync waits for the one before it,
	// so a round trip longer than SyncEvery is the interval) and the round
	// trip before it, as long as the round trips took here (the race
	// detector and a loaded machine stretch them past the proxy's 1 s).
	var rt time.Duration
	for _, f := range fleets {
		rt = max(rt, f.Stats().MaxRoundTrip)
	}
	lookback := window + max(cfg.SyncEvery, rt) + rt + 50*time.Millisecond
	x, at, got, req := ev.worst(window, lookback, end, ratio, floor, 3)
	t.Logf("longest round trip %v; worst span of one window: [%v, %v): %d granted, %d requests in it and the %v before, excess %.1f over Ratio·requests + 3·floor",
		rt, at, at+window, got, req, lookback, x)
	if x > 0 {
		t.Errorf("fleet granted %d retries in the real-time window [%v, %v) against %d requests in it and the %v before: documented bound %.1f·%d + 3·%.0f = %.1f (excess %.1f)",
			got, at, at+window, req, lookback, ratio, req, floor, ratio*float64(req)+3*floor, x)
	}
}

// TestAttackBoundSyncEveryLongerThanWindow: a fast Redis, SyncEvery
// longer than the budget's window. The requests of an interval reach the
// fleet's window at the next sync, in one slice, and stay there a whole
// window: the fleet grants retries against requests a window or more
// older than the retries. An attack found the docs saying that late
// requests "only make it stricter"; the bound Config.Budget gives in real
// time counts the requests of the Window and SyncEvery before the span.
func TestAttackBoundSyncEveryLongerThanWindow(t *testing.T) {
	addr := fbAddr(t)
	const (
		procs  = 20
		window = time.Second
		every  = 3 * time.Second
	)
	name := fbName()
	fbCleanup(t, addr, name)
	cfg := fleet.Config{Name: name, SyncEvery: every, Timeout: time.Second,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: window, Slices: 10}}
	ratio, floor := 0.1, 1.0*window.Seconds()
	ev := newEvents()
	fleets := make([]*fleet.Fleet, procs)
	budgets := make([]*fleet.Budget, procs)
	for i := range fleets {
		f, err := fleet.New(fbClient(t, addr), cfg)
		if err != nil {
			t.Fatal(err)
		}
		fleets[i] = f
		g, err := f.Guards("api.example")
		if err != nil {
			t.Fatal(err)
		}
		budgets[i] = g.Budget.(*fleet.Budget)
	}
	defer func() {
		for _, f := range fleets {
			f.Close()
		}
	}()
	// Requests for 1.5 s (from 0.3 s), 50 a second per process: 1500 in all.
	time.Sleep(300 * time.Millisecond)
	var wg sync.WaitGroup
	for _, b := range budgets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 75 {
				b.Deposit()
				ev.add(ev.req, time.Now())
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	stopAt := time.Since(ev.start)
	// Retries wanted from then on, for 5 s.
	stop := make(chan struct{})
	var local atomic.Int64
	for i, b := range budgets {
		f := fleets[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if b.Withdraw() {
					if f.Mode() != fleet.ModeFleet {
						local.Add(1)
					}
					ev.add(ev.granted, time.Now())
				} else {
					time.Sleep(2 * time.Millisecond)
				}
			}
		}()
	}
	time.Sleep(5 * time.Second)
	close(stop)
	wg.Wait()
	end := time.Since(ev.start)
	for i, f := range fleets {
		if f.Mode() != fleet.ModeFleet || f.Stats().Failures != 0 {
			t.Fatalf("process %d left fleet mode (%v, %+v)", i, f.Mode(), f.Stats())
		}
	}
	if local.Load() != 0 {
		t.Fatalf("%d grants in local mode", local.Load())
	}
	t.Logf("requests %d (stopped at %v), retries granted %d", ev.sum(ev.req, 0, end), stopAt, ev.sum(ev.granted, 0, end))
	x, at, got, req := ev.worst(window, window+every+50*time.Millisecond, end, ratio, floor, 2)
	t.Logf("worst span of one window: [%v, %v): %d granted, %d requests in it and the window before", at, at+window, got, req)
	if x > 0 {
		t.Errorf("fleet granted %d retries in the real-time window [%v, %v) against %d requests in it and the window before: documented bound %.1f·%d + 2·%.0f = %.1f (excess %.1f)",
			got, at, at+window, req, ratio, req, floor, ratio*float64(req)+2*floor, x)
	}
}

// TestAttackBoundManyProcessesChurn: 120 processes on a fast Redis
// with the default SyncEvery, processes closed and started while 4
// goroutines each withdraw: every real-time span of one window stays within
// Ratio·(requests of it and the window, SyncEvery and round trip before) +
// 2·floor, for the retries granted in fleet mode (those granted while a
// process was in local mode, after a sync that failed, are counted apart:
// the test used to skip when there were any).
func TestAttackBoundManyProcessesChurn(t *testing.T) {
	addr := fbAddr(t)
	const (
		procs  = 120
		window = 2 * time.Second
	)
	name := fbName()
	fbCleanup(t, addr, name)
	cfg := fleet.Config{Name: name, Timeout: time.Second,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: 2, Window: window, Slices: 10}}
	ratio, floor := 0.1, 2*window.Seconds()
	ev := newEvents()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var local atomic.Int64
	run := func(i int, life time.Duration) {
		defer wg.Done()
		f, err := fleet.New(fbClient(t, addr), cfg)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		g, _ := f.Guards("api.example")
		b := g.Budget.(*fleet.Budget)
		deadline := time.Now().Add(life)
		var iw sync.WaitGroup
		for k := range 4 {
			iw.Add(1)
			go func() {
				defer iw.Done()
				n := 0
				for time.Now().Before(deadline) {
					select {
					case <-stop:
						return
					default:
					}
					n++
					if (n+i+k)%3 == 0 {
						b.Deposit()
						ev.add(ev.req, time.Now())
					}
					if b.Withdraw() {
						// The bound is the fleet's: a grant in local mode
						// (a sync that failed on a loaded machine) is
						// counted apart, not checked against it.
						if f.Mode() != fleet.ModeFleet {
							local.Add(1)
						} else {
							ev.add(ev.granted, time.Now())
						}
					}
					time.Sleep(time.Duration(5+(i*7+n)%20) * time.Millisecond)
				}
			}()
		}
		iw.Wait()
	}
	for i := range procs {
		wg.Add(1)
		// Lives of 1-6 s, started over the first 4 s.
		go func() {
			time.Sleep(time.Duration(i%40) * 100 * time.Millisecond)
			run(i, time.Duration(1000+(i*337)%5000)*time.Millisecond)
		}()
	}
	wg.Wait()
	close(stop)
	end := time.Since(ev.start)
	t.Logf("requests %d, retries granted in fleet mode %d (and %d in local mode, not checked)", ev.sum(ev.req, 0, end), ev.sum(ev.granted, 0, end), local.Load())
	if ev.sum(ev.granted, 0, end) == 0 {
		t.Fatalf("no retry granted in fleet mode (%d in local mode): nothing to check", local.Load())
	}
	x, at, got, req := ev.worst(window, window+150*time.Millisecond, end, ratio, floor, 2)
	t.Logf("worst span: [%v, %v): %d granted, %d requests, excess %.1f", at, at+window, got, req, x)
	if x > 0 {
		t.Errorf("fleet granted %d retries in [%v, %v) against %d requests: bound %.1f", got, at, at+window, req, ratio*float64(req)+2*floor)
	}
}

// TestAttackBoundJoinMidOutage: the fleet's breaker is open (a
// dependency that fails); then 50 processes join. Doc (ProbeRounds, doc.go
// "Probes are fleet-wide"): while the fleet's breaker is open the whole
// fleet gets ProbeRounds rounds of Breaker.Probes calls per probe interval,
// "so a thousand processes send a handful of probes, not a thousand".
// Count the calls the joiners let through to the dependency in the first
// probe interval after they join.
func TestAttackBoundJoinMidOutage(t *testing.T) {
	addr := fbAddr(t)
	name := fbName()
	fbCleanup(t, addr, name)
	cfg := fleet.Config{Name: name, Timeout: time.Second, MinCalls: 10,
		Breaker: breaker.Config{OpenFor: 2 * time.Second, MinCalls: 10}}
	// The first process opens the fleet's breaker.
	f0, err := fleet.New(fbClient(t, addr), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f0.Close()
	g0, _ := f0.Guards("down.example")
	for i := 0; i < 50 && g0.Breaker.State() == breaker.Closed; i++ {
		if p, err := g0.Breaker.Allow(); err == nil {
			g0.Breaker.Done(p, false)
		}
		time.Sleep(10 * time.Millisecond)
	}
	ok := false
	for range 100 {
		if g0.Breaker.State() != breaker.Closed {
			ok = true
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !ok {
		t.Fatal("the first process's breaker did not open")
	}
	time.Sleep(300 * time.Millisecond) // the fleet's state is on Redis
	const joiners = 50
	var sent, refused atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range joiners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := fleet.New(fbClient(t, addr), cfg)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			g, _ := f.Guards("down.example")
			// One call every 20 ms, each failing, for the rest of the probe interval.
			for time.Since(start) < 1500*time.Millisecond {
				p, err := g.Breaker.Allow()
				if err != nil {
					refused.Add(1)
				} else {
					sent.Add(1)
					g.Breaker.Done(p, false)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	bound := cfg.ProbeRounds
	if bound == 0 {
		bound = 3
	}
	t.Logf("%d joiners mid-outage: %d calls let through, %d refused, in about one probe interval (ProbeRounds·Probes = %d)",
		joiners, sent.Load(), refused.Load(), bound)
	if sent.Load() > int64(bound) {
		t.Errorf("joining processes let %d calls through to a host the fleet's breaker holds open, in less than one probe interval; documented: the whole fleet gets ProbeRounds·Probes = %d per interval",
			sent.Load(), bound)
	}
}

// TestAttackBoundSlowRedisQueuedLeaseWaitGoesLocal: every round trip
// takes 300 ms against a Timeout of 1 s (a slow Redis, not a failing one),
// and 30 callers of one process want retries at once, with budget to spare.
// The lease request brings a few retries; the callers it did not serve
// start the next request and keep waiting on one timer started at their
// first request. After 1 s in all, they count a round trip of 300 ms as a
// Redis failure and switch the fleet to local mode.
func TestAttackBoundSlowRedisQueuedLeaseWaitGoesLocal(t *testing.T) {
	addr := fbAddr(t)
	p := newDelayProxy(t, addr, 150*time.Millisecond)
	name := fbName()
	fbCleanup(t, addr, name)
	f, err := fleet.New(fbClient(t, p.addr()), fleet.Config{Name: name, SyncEvery: time.Second, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, _ := f.Guards("api.example")
	b := g.Budget.(*fleet.Budget)
	for range 5000 {
		b.Deposit()
	}
	time.Sleep(2500 * time.Millisecond) // the deposits reach the fleet's window; connections warm
	before := f.Stats()
	if f.Mode() != fleet.ModeFleet || before.Failures != 0 {
		t.Fatalf("not a clean start: %v %+v", f.Mode(), before)
	}
	var wg sync.WaitGroup
	var granted, refused atomic.Int64
	for range 30 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b.Withdraw() {
				granted.Add(1)
			} else {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	st := f.Stats()
	t.Logf("granted %d, refused %d; mode %v; stats %+v; budget %+v", granted.Load(), refused.Load(), f.Mode(), st, b.Stats())
	if st.Failures != 0 || f.Mode() != fleet.ModeFleet {
		t.Errorf("no round trip took longer than Timeout 1s (longest %v), yet the fleet counted %d failed round trips (%v) and is in %v mode; documented: a round trip that fails, or takes longer than Config.Timeout, switches it to ModeLocal",
			st.MaxRoundTrip, st.Failures, st.LastError, f.Mode())
	}
}
