// Black-box attacks on the fleet's hold on new attempts (area fleethold):
// "The fleet's attempts in flight" and the hold's news in "News on a
// channel" (fleet/doc.go), and docs/fleet.md ("The fleet's attempts in
// flight: a hold on a hang"). Every test drives real fleets on the real
// Redis through the public API; a process's hold is read from outside as
// its limiter's limit in force (0 under the hold's cap).
package fleet_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

const fhHost = "api"

func fhAddr(t *testing.T) string {
	if a := os.Getenv("STORMGUARD_REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

func fhClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: 50,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func fhName(t *testing.T, rc *redis.Client) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "fhold-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := rc.Keys(ctx, "stormguard:fleet:{"+name+"}*").Result()
		if len(keys) > 0 {
			rc.Del(ctx, keys...)
		}
	})
	return name
}

func fhKey(name string) string { return "stormguard:fleet:{" + name + "}:" + fhHost }

// fhProxy is a TCP proxy the test controls: cut closes every connection
// and refuses new ones until restore.
type fhProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	down   bool
}

func fhNewProxy(t *testing.T, target string) *fhProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &fhProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				continue
			}
			p.mu.Unlock()
			go p.serve(c)
		}
	}()
	t.Cleanup(func() { ln.Close(); p.cut() })
	return p
}

func (p *fhProxy) addr() string { return p.ln.Addr().String() }

func (p *fhProxy) serve(c net.Conn) {
	u, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(u, c); u.Close(); c.Close() }()
	_, _ = io.Copy(c, u)
	u.Close()
	c.Close()
}

func (p *fhProxy) cut() {
	p.mu.Lock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
}

// fhRig is n processes (fleets with Config.Limit on the real Redis), each
// starting a call every `every` while on, each attempt answered after the
// rig's delay or, while the rig hangs, when released or at the call's
// deadline.
type fhRig struct {
	name    string
	rc      *redis.Client
	fs      []*fleet.Fleet
	gs      []retry.Guards
	on      []atomic.Bool
	busy    []atomic.Int64 // per process, its calls not yet returned
	delay   atomic.Int64
	hung    atomic.Pointer[chan struct{}]
	started atomic.Int64
	served  atomic.Int64
	failed  atomic.Int64
	errMu   sync.Mutex
	errs    map[string]int
	stop    chan struct{}
	wg      sync.WaitGroup
}

type fhOpts struct {
	n        int
	every    time.Duration
	deadline time.Duration
	delay    time.Duration
	clients  []redis.UniversalClient // per process (nil: the shared one)
	cold     bool                    // do not wait for the rate and the baseline
}

func fhStart(t *testing.T, o fhOpts) *fhRig {
	t.Helper()
	rc := fhClient(t, fhAddr(t))
	r := &fhRig{rc: rc, name: fhName(t, rc), stop: make(chan struct{}), errs: map[string]int{}}
	r.delay.Store(int64(o.delay))
	r.on = make([]atomic.Bool, o.n)
	r.busy = make([]atomic.Int64, o.n)
	shared := fhClient(t, fhAddr(t))
	for i := 0; i < o.n; i++ {
		var c redis.UniversalClient = shared
		if i < len(o.clients) && o.clients[i] != nil {
			c = o.clients[i]
		}
		f, err := fleet.New(c, fleet.Config{Name: r.name, SyncEvery: 100 * time.Millisecond, Timeout: 300 * time.Millisecond, Limit: &limit.Config{}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		g, err := f.Guards(fhHost)
		if err != nil {
			t.Fatal(err)
		}
		r.fs = append(r.fs, f)
		r.gs = append(r.gs, g)
		r.on[i].Store(true)
	}
	for i := range r.fs {
		p, err := retry.New(retry.WithGuards(r.gs[i]), retry.WithMaxAttempts(1))
		if err != nil {
			t.Fatal(err)
		}
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			tick := time.NewTicker(o.every)
			defer tick.Stop()
			for {
				select {
				case <-r.stop:
					return
				case <-tick.C:
				}
				if !r.on[i].Load() {
					continue
				}
				r.wg.Add(1)
				r.busy[i].Add(1)
				go func() {
					defer r.wg.Done()
					defer r.busy[i].Add(-1)
					ctx, cancel := context.WithTimeout(context.Background(), o.deadline)
					defer cancel()
					err := p.Do(ctx, func(ctx context.Context, _ int) error {
						r.started.Add(1)
						if h := r.hung.Load(); h != nil {
							select {
							case <-*h:
							case <-ctx.Done():
								return ctx.Err()
							}
						}
						tm := time.NewTimer(time.Duration(r.delay.Load()))
						defer tm.Stop()
						select {
						case <-tm.C:
							return nil
						case <-ctx.Done():
							return ctx.Err()
						}
					})
					if err != nil {
						r.failed.Add(1)
						r.errMu.Lock()
						r.errs[fhShort(err)]++
						r.errMu.Unlock()
						return
					}
					r.served.Add(1)
				}()
			}
		}()
	}
	t.Cleanup(func() {
		close(r.stop)
		if h := r.hung.Swap(nil); h != nil {
			close(*h)
		}
		r.wg.Wait()
	})
	if !o.cold {
		// Warm: a baseline, and a rate that serves the calls offered (a
		// hang that begins in slow start, at half of them, left the rate's
		// gates to refuse the backlog it held: under -race on a loaded
		// machine the slow start took longer than a second and a half).
		offered := float64(o.n) * float64(time.Second) / float64(o.every)
		warm := func() bool {
			v, _ := rc.HMGet(context.Background(), fhKey(r.name), "rr", "rb").Result()
			for i, x := range v {
				s, _ := x.(string)
				f, err := strconv.ParseFloat(s, 64)
				if err != nil || f <= 0 || (i == 0 && f < 0.9*offered) {
					return false
				}
			}
			return true
		}
		if !atkEventually(20*time.Second, warm) {
			t.Fatalf("the fleet's rate and baseline never learned (the rate below 0.9 of the %.0f calls a second offered)", offered)
		}
		time.Sleep(1500 * time.Millisecond)
	}
	return r
}

func fhShort(err error) string {
	s := err.Error()
	if len(s) > 90 {
		s = s[:90]
	}
	return s
}

// held returns the processes whose limiter is capped at 0 (the hold).
func (r *fhRig) held() int {
	n := 0
	for _, g := range r.gs {
		if g.Limiter.Limit() == 0 {
			n++
		}
	}
	return n
}

// quiet turns processes from..n-1 off and waits until none of their
// calls is left (the calls that waited at their limiters included), so
// that a hang that follows finds no attempt of theirs to hold.
func (r *fhRig) quiet(t *testing.T, from int) {
	t.Helper()
	for i := from; i < len(r.on); i++ {
		r.on[i].Store(false)
	}
	if !atkEventually(25*time.Second, func() bool {
		for i := from; i < len(r.busy); i++ {
			if r.busy[i].Load() != 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the processes turned off still have calls 25 s later")
	}
}

func (r *fhRig) hang() chan struct{} {
	c := make(chan struct{})
	r.hung.Store(&c)
	return c
}

func (r *fhRig) release(c chan struct{}) {
	r.hung.Store(nil)
	close(c)
}

func (r *fhRig) errors() map[string]int {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	m := map[string]int{}
	for k, v := range r.errs {
		m[k] = v
	}
	return m
}

// fhNews subscribes to the fleet's channel and collects the hold's news.
type fhNews struct {
	mu   sync.Mutex
	msgs []string
}

func fhListen(t *testing.T, rc *redis.Client, name string) *fhNews {
	ps := rc.Subscribe(context.Background(), "stormguard:fleet:{"+name+"}/open")
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := &fhNews{}
	ch := ps.Channel()
	go func() {
		for m := range ch {
			if strings.HasPrefix(m.Payload, "h ") {
				n.mu.Lock()
				n.msgs = append(n.msgs, m.Payload)
				n.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { _ = ps.Close() })
	return n
}

func (n *fhNews) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// TestAttackFleetholdHangCost: the hold's main promise. A hang costs the
// host about B = max(8, 3·R·b) attempts plus one round trip's starts; the
// hold does not fail calls by itself; once the host answers again the
// hold ends and calls are served.
func TestAttackFleethold1HangCost(t *testing.T) {
	r := fhStart(t, fhOpts{n: 10, every: 25 * time.Millisecond, deadline: 3 * time.Second, delay: 5 * time.Millisecond})
	s0, f0 := r.served.Load(), r.failed.Load()
	rel := r.hang()
	before := r.started.Load()
	time.Sleep(800 * time.Millisecond)
	during, held := r.started.Load()-before, r.held()
	rr, _ := r.rc.HGet(context.Background(), fhKey(r.name), "rr").Float64()
	rb, _ := r.rc.HGet(context.Background(), fhKey(r.name), "rb").Float64()
	B := max(8, 3*rr*rb/1e6)
	t.Logf("R %.0f/s, b %.1f ms, B %.1f: %d attempts in the hang's first 0.8 s; %d/10 held", rr, rb/1e3, B, during, held)
	if float64(during) > B+40 {
		t.Errorf("%d attempts started into the hang, bound B %.1f (+ a round trip's starts)", during, B)
	}
	if held != 10 {
		t.Errorf("%d of 10 processes held during a hang", held)
	}
	r.release(rel)
	if !atkEventually(3*time.Second, func() bool { return r.held() == 0 }) {
		t.Errorf("%d processes still held 3 s after the release", r.held())
	}
	time.Sleep(500 * time.Millisecond)
	t.Logf("served %d failed %d, errors %v", r.served.Load()-s0, r.failed.Load()-f0, r.errors())
	if fl := r.failed.Load() - f0; fl > 0 {
		// Calls that waited 0.8 s with 3 s deadlines: the hold must not fail them.
		t.Errorf("%d calls failed across a 0.8 s hang with 3 s deadlines: %v", fl, r.errors())
	}
}

// TestAttackFleetholdSlowHost: "a host that answers, however slowly, is
// not hung: the rate's rules judge a slow one" and "a host that keeps
// answering ... ends it at its next answer". The latency jumps from 5 ms
// to 1 s and the host answers every call; the calls have 6 s deadlines.
// The fleet should keep sending (the rate's rules may cut R, by at most
// half a window), not sit in a hold most of the time.
func TestAttackFleethold1SlowHost(t *testing.T) {
	r := fhStart(t, fhOpts{n: 10, every: 25 * time.Millisecond, deadline: 6 * time.Second, delay: 5 * time.Millisecond})
	r.delay.Store(int64(time.Second))
	s0, f0, st0 := r.served.Load(), r.failed.Load(), r.started.Load()
	var samples, heldSamples int
	var rSum float64 // the rate in force, summed over the samples
	var trace []string
	end := time.Now().Add(6 * time.Second)
	for time.Now().Before(end) {
		samples++
		h := r.held()
		if h > 0 {
			heldSamples++
		}
		rr, _ := r.rc.HGet(context.Background(), fhKey(r.name), "rr").Float64()
		rSum += rr
		if samples%25 == 0 {
			lims := 0
			for _, g := range r.gs {
				lims += g.Limiter.Limit()
			}
			trace = append(trace, strconv.Itoa(h)+"held/R="+strconv.Itoa(int(rr))+"/lims="+strconv.Itoa(lims))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("trace every 0.25 s (processes held / R / sum of limits in force): %v", trace)
	t.Logf("the rate in force allowed about %.0f attempts in 6 s", rSum/float64(samples)*6)
	served, failed, started := r.served.Load()-s0, r.failed.Load()-f0, r.started.Load()-st0
	frac := float64(heldSamples) / float64(samples)
	t.Logf("latency 1 s, 6 s: %d attempts started, %d served, %d failed; some process held %.0f%% of the time; errors %v",
		started, served, failed, 100*frac, r.errors())
	if frac > 0.5 {
		t.Errorf("a host answering every call in 1 s held the fleet %.0f%% of 6 s", 100*frac)
	}
	// The calls that fail are the rate's and the limiters' own hopeless
	// refusals (a latency 200 times the baseline is a queue to their
	// rules): 608 failed and 360 served in a run with the hold turned
	// off; 675-734 failed and 262-308 served while the hold came back
	// after every burst of answers (held 91-93% of the time: it then
	// waited for four baselines without a success only); 265-279 failed
	// and 570 served with the wait for twice the last hold a success
	// ended, 526 and 405 in a CI run under -race (the limiters' own limits
	// lower there). Which of them the hold causes is not told apart from
	// outside: the test holds it to the time it holds.
}

// TestAttackFleetholdCloseTakesCount: one process alone holds the fleet's
// sum (its attempts hang); when it closes, its count goes with it and the
// others are no longer held.
func TestAttackFleethold1CloseTakesCount(t *testing.T) {
	r := fhStart(t, fhOpts{n: 4, every: 10 * time.Millisecond, deadline: 20 * time.Second, delay: 5 * time.Millisecond})
	r.quiet(t, 1)
	rel := r.hang()
	defer r.release(rel)
	if !atkEventually(3*time.Second, func() bool { return r.held() == 4 }) {
		t.Fatalf("the hang of process 0 never held the fleet: %d of 4 held", r.held())
	}
	if err := r.fs[0].Close(); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	ok := atkEventually(3*time.Second, func() bool {
		for i := 1; i < 4; i++ {
			if r.gs[i].Limiter.Limit() == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("after Close of the hung process: others free after %v (%v)", time.Since(t0), ok)
	if !ok || time.Since(t0) > time.Second {
		t.Errorf("the others were still held %v after the only process with attempts in flight closed", time.Since(t0))
	}
}

// TestAttackFleetholdDeadForgotten: the process whose attempts hang loses
// Redis for good (its proxy cut: it cannot report again, as if it died);
// "a count not refreshed for two windows is forgotten": the others are
// free again within about two windows (1 s each here) plus one.
func TestAttackFleethold1DeadForgotten(t *testing.T) {
	px := fhNewProxy(t, fhAddr(t))
	dead := fhClient(t, px.addr())
	r := fhStart(t, fhOpts{n: 4, every: 10 * time.Millisecond, deadline: 20 * time.Second, delay: 5 * time.Millisecond,
		clients: []redis.UniversalClient{dead}})
	r.quiet(t, 1)
	rel := r.hang()
	defer r.release(rel)
	if !atkEventually(3*time.Second, func() bool { return r.held() == 4 }) {
		t.Fatalf("the hang of process 0 never held the fleet: %d of 4 held", r.held())
	}
	px.cut()
	// The dead process goes local: its own hold lifts with its gates.
	if !atkEventually(2*time.Second, func() bool { return r.gs[0].Limiter.Limit() > 0 }) {
		t.Errorf("the process cut from Redis is still held (local mode lifts the hold)")
	}
	t0 := time.Now()
	ok := atkEventually(6*time.Second, func() bool {
		for i := 1; i < 4; i++ {
			if r.gs[i].Limiter.Limit() == 0 {
				return false
			}
		}
		return true
	})
	el := time.Since(t0)
	t.Logf("the others free %v after the cut (%v); fi %v", el, ok, r.rc.HGet(context.Background(), fhKey(r.name), "fi").Val())
	if !ok || el > 3500*time.Millisecond {
		t.Errorf("the others were held %v after the only process with attempts in flight died (two windows: 2 s)", el)
	}
}

// TestAttackFleetholdLocalLifts: every process loses Redis during a held
// hang: "In local mode the hold is lifted with the gates".
func TestAttackFleethold1LocalLifts(t *testing.T) {
	px := fhNewProxy(t, fhAddr(t))
	var cs []redis.UniversalClient
	for i := 0; i < 5; i++ {
		cs = append(cs, fhClient(t, px.addr()))
	}
	r := fhStart(t, fhOpts{n: 5, every: 12 * time.Millisecond, deadline: 20 * time.Second, delay: 5 * time.Millisecond, clients: cs})
	rel := r.hang()
	defer r.release(rel)
	if !atkEventually(3*time.Second, func() bool { return r.held() == 5 }) {
		t.Fatalf("the hang never held the fleet: %d of 5 held", r.held())
	}
	px.cut()
	t0 := time.Now()
	ok := atkEventually(3*time.Second, func() bool { return r.held() == 0 })
	t.Logf("after the cut: %d held, free after %v", r.held(), time.Since(t0))
	if !ok {
		t.Errorf("%d of 5 processes still held 3 s after Redis was cut", r.held())
	}
	for i, f := range r.fs {
		if f.Mode() != fleet.ModeLocal {
			t.Errorf("process %d in mode %v after the cut", i, f.Mode())
		}
	}
}

// TestAttackFleetholdColdNoHold: a fleet whose host hangs from its first
// call (no rate, no baseline) never holds.
func TestAttackFleethold1ColdNoHold(t *testing.T) {
	r := fhStart(t, fhOpts{n: 5, every: 12 * time.Millisecond, deadline: 2 * time.Second, delay: 5 * time.Millisecond, cold: true})
	rel := r.hang()
	defer r.release(rel)
	end := time.Now().Add(2500 * time.Millisecond)
	maxHeld := 0
	for time.Now().Before(end) {
		maxHeld = max(maxHeld, r.held())
		time.Sleep(5 * time.Millisecond)
	}
	if maxHeld > 0 {
		t.Errorf("%d processes held while the rate was cold and the baseline unknown", maxHeld)
	}
}

// TestAttackFleetholdStaleNews: news of a hold that is not the newest of
// the key's incarnation must be ignored ("a process applies the newest
// sequence of the key's incarnation only"); so must another fleet's key.
func TestAttackFleethold1StaleNews(t *testing.T) {
	r := fhStart(t, fhOpts{n: 3, every: 8 * time.Millisecond, deadline: 5 * time.Second, delay: 5 * time.Millisecond})
	news := fhListen(t, r.rc, r.name)
	rel := r.hang()
	if !atkEventually(3*time.Second, func() bool { return r.held() == 3 }) {
		r.release(rel)
		t.Fatalf("the hang never held the fleet: %d of 3 held", r.held())
	}
	r.release(rel)
	if !atkEventually(3*time.Second, func() bool { return r.held() == 0 }) {
		t.Fatalf("still held after the release")
	}
	// Stop the calls: no round trip of the flight counts meanwhile (only syncs).
	for i := range r.on {
		r.on[i].Store(false)
	}
	time.Sleep(300 * time.Millisecond)
	msgs := news.all()
	t.Logf("news heard: %v", msgs)
	var on []string
	for _, m := range msgs {
		if p := strings.SplitN(m, " ", 5); len(p) == 5 && p[3] == "1" {
			on = append(on, m)
		}
	}
	if len(on) == 0 {
		t.Fatalf("no hold news heard")
	}
	p := strings.SplitN(on[0], " ", 5) // h inc seq 1 key
	inc, _ := strconv.ParseFloat(p[1], 64)
	ch := "stormguard:fleet:{" + r.name + "}/open"
	pub := func(msg string) {
		if err := r.rc.Publish(context.Background(), ch, msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	heldFor := func(d time.Duration) bool {
		return atkEventually(d, func() bool { return r.held() > 0 })
	}
	// 1. The same hold again (a stale sequence of the current incarnation).
	pub(on[0])
	if heldFor(60 * time.Millisecond) {
		t.Errorf("a stale hold (%q, older sequence) was applied: %d held", on[0], r.held())
		atkEventually(time.Second, func() bool { return r.held() == 0 })
	}
	// 2. Another fleet's key on this fleet's channel.
	other := "h " + p[1] + " 999999 1 stormguard:fleet:{" + r.name + "x}:" + fhHost
	pub(other)
	if heldFor(60 * time.Millisecond) {
		t.Errorf("another fleet's key (%q) was applied: %d held", other, r.held())
		atkEventually(time.Second, func() bool { return r.held() == 0 })
	}
	// 3. A hold of an older incarnation of the key (news from before the
	// key was lost and created again): not the key's incarnation.
	old := "h " + strconv.FormatFloat(inc-1e6, 'f', -1, 64) + " 999999 1 " + p[4]
	pub(old)
	if heldFor(60 * time.Millisecond) {
		t0 := time.Now()
		atkEventually(2*time.Second, func() bool { return r.held() == 0 })
		t.Errorf("a hold from an older incarnation of the key (%q) was applied: processes held for %v", old, time.Since(t0))
	}
}

// TestAttackFleetholdSuccessAllocs: "the success path ... no lock, no
// allocation" with Config.Limit on, in fleet mode: Deposit, the breaker's
// Allow and Done, the limiter's Acquire and Release.
func TestAttackFleethold1SuccessAllocs(t *testing.T) {
	rc := fhClient(t, fhAddr(t))
	name := fhName(t, rc)
	f, err := fleet.New(rc, fleet.Config{Name: name, SyncEvery: 100 * time.Millisecond, Timeout: 300 * time.Millisecond, Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g, err := f.Guards(fhHost)
	if err != nil {
		t.Fatal(err)
	}
	// Fleet mode needs the first sync: wait for it (a skip here let the
	// test pass without its check on a loaded machine).
	if !atkEventually(5*time.Second, func() bool { return f.Mode() == fleet.ModeFleet }) {
		t.Fatalf("not in fleet mode after 5s (mode %v)", f.Mode())
	}
	ctx := context.Background()
	one := func() {
		g.Budget.Deposit()
		bp, err := g.Breaker.Allow()
		if err != nil {
			t.Fatal(err)
		}
		lp, err := g.Limiter.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.Limiter.Release(lp, false)
		g.Breaker.Done(bp, true)
	}
	for i := 0; i < 200; i++ {
		one()
	}
	a := testing.AllocsPerRun(500, one)
	t.Logf("allocs per success: %v", a)
	if a > 0 {
		t.Errorf("the success path allocates %v per call with Config.Limit", a)
	}
}
