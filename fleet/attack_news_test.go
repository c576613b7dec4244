// Black-box tests of the fleet's channel of openings (package
// documentation, News on a channel; docs/fleet.md), written against the
// documentation only, from outside the package: the message's form,
// messages the fleet must ignore, local mode, Close on a Redis that does
// not answer, goroutines after Close, many fleets on one client.
package fleet_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

func atkNewsNew(t *testing.T, c redis.UniversalClient, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

var errZN = errors.New("zn: dependency failed")

var atkNewsClassify = retry.WithClassifier(func(err error) bool { return errors.Is(err, errZN) || retry.IsRetryable(err) })

// atkNewsTripFleet makes the fleet's breaker of host open through failures in f
// (f's own breaker should have a high MinCalls), until the opening is heard
// on the channel by a subscriber of the test's own.
func atkNewsTripFleet(t *testing.T, f *fleet.Fleet, host string) {
	t.Helper()
	g, err := f.Guards(host)
	if err != nil {
		t.Fatal(err)
	}
	p, err := retry.New(retry.WithGuards(g), retry.WithMaxAttempts(1), atkNewsClassify)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: atkAddr(t)})
	defer c.Close()
	sub := c.PSubscribe(context.Background(), "stormguard:fleet:*/open")
	defer sub.Close()
	if _, err := sub.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	ch := sub.Channel()
	for i := 0; i < 2000; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		_ = p.Do(ctx, func(context.Context, int) error { return errZN })
		cancel()
		select {
		case m := <-ch:
			if strings.HasSuffix(m.Payload, ":"+host) {
				t.Logf("trip: opening heard after %d failures; breaker %v", i+1, g.Breaker.State())
				return
			}
		case <-time.After(2 * time.Millisecond):
		}
	}
	t.Fatalf("trip: no opening after 2000 failures")
}

// The doc: an opening is published on "stormguard:fleet:{Name}/open" as
// "<epoch> <server time, µs> <host's key>".
func TestAttackNewsOpeningMessageFormat(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, atkClient(t, atkAddr(t)))
	sub := c.Subscribe(context.Background(), "stormguard:fleet:{"+name+"}/open")
	defer sub.Close()
	if _, err := sub.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	f := atkNewsNew(t, c, fleet.Config{Name: name, MinCalls: 5, Breaker: breaker.Config{MinCalls: 100000}})
	atkNewsTripFleet(t, f, "h1")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("channel %q payload %q", m.Channel, m.Payload)
	fs := strings.Fields(m.Payload)
	if len(fs) != 3 || fs[2] != "stormguard:fleet:{"+name+"}:h1" {
		t.Errorf("payload %q: not <epoch> <time> <key>", m.Payload)
	}
}

var _ = limit.Config{}

// atkNewsProxy is a TCP proxy to Redis that can blackhole: it then reads and
// drops everything and sends nothing back, on old and new connections.
type atkNewsProxy struct {
	ln    net.Listener
	black atomic.Bool
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func atkNewsNewProxy(t *testing.T, target string) *atkNewsProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &atkNewsProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				u, err := net.Dial("tcp", target)
				if err != nil {
					c.Close()
					return
				}
				p.mu.Lock()
				p.conns = append(p.conns, u)
				p.mu.Unlock()
				pipe := func(dst, src net.Conn) {
					buf := make([]byte, 32<<10)
					for {
						n, err := src.Read(buf)
						if n > 0 && !p.black.Load() {
							if _, err := dst.Write(buf[:n]); err != nil {
								return
							}
						}
						if err != nil {
							return
						}
					}
				}
				p.wg.Add(1)
				go func() { defer p.wg.Done(); pipe(u, c); u.Close() }()
				pipe(c, u)
				c.Close()
			}()
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *atkNewsProxy) addr() string { return p.ln.Addr().String() }

func (p *atkNewsProxy) stop() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

var _ = io.EOF

// The doc (Close): "flushes the counts and returns the unused leases in one
// last sync (bounded by Timeout), and waits for every round trip to end";
// New: "Fleet.Close ends [the subscription]". With Redis blackholed (after
// New), Close must return in about Timeout.
func TestAttackNewsCloseWhileBlackholed(t *testing.T) {
	for _, mode := range []string{"fleet", "local"} {
		t.Run(mode, func(t *testing.T) {
			px := atkNewsNewProxy(t, atkAddr(t))
			c := atkClient(t, px.addr())
			name := atkName(t, atkClient(t, atkAddr(t)))
			lc := &limit.Config{Timeout: 2 * time.Second}
			f, err := fleet.New(c, fleet.Config{Name: name, Timeout: 100 * time.Millisecond, Limit: lc})
			if err != nil {
				t.Fatal(err)
			}
			g, _ := f.Guards("h")
			p, _ := retry.New(retry.WithGuards(g))
			_ = p.Do(context.Background(), func(context.Context, int) error { return nil })
			time.Sleep(300 * time.Millisecond)
			px.black.Store(true)
			if mode == "local" {
				if !atkEventually(3*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
					t.Fatal("never local")
				}
			}
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- f.Close() }()
			select {
			case err := <-done:
				t.Logf("Close took %v, err %v", time.Since(start), err)
				if d := time.Since(start); d > 600*time.Millisecond {
					t.Errorf("Close took %v with Timeout 100ms", d)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Close did not return within 10 s with Redis blackholed")
			}
		})
	}
}

// The doc: New starts the background sync and the subscription, Close ends
// them. After Close (and the client's Close) no goroutine of the Fleet is left.
func TestAttackNewsNoGoroutineLeak(t *testing.T) {
	nc := atkClient(t, atkAddr(t)) // for the names, before the count
	before := runtime.NumGoroutine()
	for i := 0; i < 20; i++ {
		c := redis.NewClient(&redis.Options{Addr: atkAddr(t), ContextTimeoutEnabled: true})
		name := atkName(t, nc)
		f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 5 * time.Millisecond, Limit: &limit.Config{}})
		if err != nil {
			t.Fatal(err)
		}
		g, _ := f.Guards("h")
		p, _ := retry.New(retry.WithGuards(g))
		_ = p.Do(context.Background(), func(context.Context, int) error { return nil })
		time.Sleep(20 * time.Millisecond)
		if err := f.Close(); err != nil {
			t.Log(err)
		}
		c.Close()
	}
	var after int
	ok := atkEventually(3*time.Second, func() bool { after = runtime.NumGoroutine(); return after <= before+2 })
	if !ok {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("goroutines %d before, %d after 20 New/Close\n%s", before, after, buf[:n])
	}
}

func atkNewsTrack(t *testing.T, f *fleet.Fleet, host string) retry.Guards {
	t.Helper()
	g, err := f.Guards(host)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := retry.New(retry.WithGuards(g))
	for i := 0; i < 3; i++ {
		_ = p.Do(context.Background(), func(context.Context, int) error { return nil })
	}
	return g
}

func atkNewsServerMicros(t *testing.T, c *redis.Client) int64 {
	tm, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// Messages others publish on the channel: garbage, huge, another fleet's
// key, an untracked host's key. The doc promises a Fleet trips "the breaker
// of a host it tracks when it hears its opening": none of these is one.
func TestAttackNewsForeignMessagesIgnored(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, atkClient(t, atkAddr(t)))
	f := atkNewsNew(t, c, fleet.Config{Name: name, SyncEvery: time.Second})
	g := atkNewsTrack(t, f, "h")
	time.Sleep(100 * time.Millisecond)
	if f.Mode() != fleet.ModeFleet {
		t.Fatal("not fleet mode")
	}
	ch := "stormguard:fleet:{" + name + "}/open"
	now := atkNewsServerMicros(t, c)
	key := "stormguard:fleet:{" + name + "}:h"
	msgs := []string{
		"", " ", "garbage", strings.Repeat("x", 1<<20), "1 2 3",
		"x y " + key, "1 y " + key, "y 1 " + key,
		"1 " + itoa(now) + " stormguard:fleet:{other}:h",
		"1 " + itoa(now) + " stormguard:fleet:{" + name + "}:other",
		"1 " + itoa(now) + " " + key + "x",
		"1 " + itoa(now) + " " + key + " extra",
		"99999999999999999999999 " + itoa(now) + " stormguard:fleet:{" + name + "}:nothost",
		"1 " + itoa(now) + " stormguard:fleet:{" + name + "}/r:h",
		"\x00\xff\xfe " + key,
		strings.Repeat("1 ", 1<<16) + key,
	}
	for _, m := range msgs {
		if err := c.Publish(context.Background(), ch, m).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
		if st := g.Breaker.State(); st != breaker.Closed {
			short := m
			if len(short) > 80 {
				short = short[:80] + "..."
			}
			t.Errorf("message %q tripped the breaker of h: %v", short, st)
			g.Breaker.Reset()
		}
	}
	if f.Mode() != fleet.ModeFleet {
		t.Errorf("mode %v after the messages", f.Mode())
	}
	// The fleet still hears a real opening (subscription alive).
	c2 := atkClient(t, atkAddr(t))
	f2 := atkNewsNew(t, c2, fleet.Config{Name: name, MinCalls: 5, Breaker: breaker.Config{MinCalls: 100000}})
	_ = f2
	start := time.Now()
	f1sync := f.Stats().RoundTrips
	atkNewsTripFleet(t, f2, "h")
	if !atkEventually(2*time.Second, func() bool { return g.Breaker.State() != breaker.Closed }) {
		t.Errorf("the subscription no longer trips after foreign messages")
	}
	t.Logf("tripped after %v (round trips of f during it: %d)", time.Since(start), f.Stats().RoundTrips-f1sync)
}

func itoa(v int64) string {
	return strconv.FormatInt(v, 10)
}

// A forged opening with a server time far in the future (about another
// host, one this process does not even track): the doc says "a reply whose
// server time is older than the last news it acted on is ignored". If that
// "news" is a forged future time, is the process deaf to real openings?
func TestAttackNewsFutureNewsDoesNotDeafen(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, atkClient(t, atkAddr(t)))
	f := atkNewsNew(t, c, fleet.Config{Name: name, SyncEvery: 50 * time.Millisecond})
	g := atkNewsTrack(t, f, "h")
	atkNewsTrack(t, f, "h2")
	if os.Getenv("ZN_SAMEHOST") != "" {
		_ = 0
	}
	time.Sleep(100 * time.Millisecond)
	ch := "stormguard:fleet:{" + name + "}/open"
	fut := atkNewsServerMicros(t, c) + int64(time.Hour/time.Microsecond)
	if err := c.Publish(context.Background(), ch, "1 "+itoa(fut)+" stormguard:fleet:{"+name+"}:h2").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	t.Logf("h2 after forged future opening: %v", func() breaker.State { g2, _ := f.Guards("h2"); return g2.Breaker.State() }())
	c2 := atkClient(t, atkAddr(t))
	f2 := atkNewsNew(t, c2, fleet.Config{Name: name, MinCalls: 5, Breaker: breaker.Config{MinCalls: 100000}})
	atkNewsTripFleet(t, f2, "h")
	if !atkEventually(3*time.Second, func() bool { return g.Breaker.State() != breaker.Closed }) {
		t.Errorf("after a forged opening of h2 with a future server time, the real opening of h never tripped this process (channel nor syncs, 3 s)")
	}
}

// atkNewsFailHook fails every command but the subscription's while on.
type atkNewsFailHook struct{ on atomic.Bool }

func (h *atkNewsFailHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *atkNewsFailHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.on.Load() {
			n := strings.ToLower(cmd.Name())
			if !strings.Contains(n, "subscribe") && n != "ping" {
				err := errors.New("zn: redis failing")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}
func (h *atkNewsFailHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.on.Load() {
			err := errors.New("zn: redis failing")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// The doc: a Fleet "trips the breaker of a host it tracks when it hears its
// opening, in fleet mode". In local mode (its syncs fail, its subscription
// still up) an opening must not trip it.
func TestAttackNewsLocalModeIgnoresChannel(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	h := &atkNewsFailHook{}
	c.AddHook(h)
	name := atkName(t, atkClient(t, atkAddr(t)))
	f := atkNewsNew(t, c, fleet.Config{Name: name, SyncEvery: 20 * time.Millisecond})
	g := atkNewsTrack(t, f, "h")
	time.Sleep(100 * time.Millisecond)
	h.on.Store(true)
	if !atkEventually(2*time.Second, func() bool { return f.Mode() == fleet.ModeLocal }) {
		t.Fatal("not local")
	}
	c2 := atkClient(t, atkAddr(t))
	f2 := atkNewsNew(t, c2, fleet.Config{Name: name, MinCalls: 5, Breaker: breaker.Config{MinCalls: 100000}})
	// A subscriber of our own to check the opening went out.
	sub := c2.Subscribe(context.Background(), "stormguard:fleet:{"+name+"}/open")
	defer sub.Close()
	_, _ = sub.Receive(context.Background())
	atkNewsTripFleet(t, f2, "h")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal("no opening published", err)
	}
	t.Logf("published %q", m.Payload)
	time.Sleep(300 * time.Millisecond)
	if f.Mode() != fleet.ModeLocal {
		t.Fatalf("mode %v", f.Mode())
	}
	if st := g.Breaker.State(); st != breaker.Closed {
		t.Errorf("in local mode, the channel's opening tripped the breaker: %v", st)
	}
}

// The doc (No lock): "the success path (Deposit, the breaker's Allow and
// Done, Outcome) ... no allocation (with Config.Limit, a call's first
// attempt also reads the clock)". Through retry.Policy: fleet guards with
// Limit add no allocation to a call's cost without guards.
func TestAttackNewsSuccessPathAllocs(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	for _, lim := range []*limit.Config{nil, {}, {Timeout: time.Second}} {
		name := atkName(t, atkClient(t, atkAddr(t)))
		f := atkNewsNew(t, c, fleet.Config{Name: name, Limit: lim})
		g, _ := f.Guards("h")
		p, _ := retry.New(retry.WithGuards(g))
		bare, _ := retry.New()
		op := func(context.Context, int) error { return nil }
		ctx := context.Background()
		for i := 0; i < 1000; i++ {
			_ = p.Do(ctx, op)
		}
		time.Sleep(300 * time.Millisecond) // a sync with a baseline
		for i := 0; i < 1000; i++ {
			_ = p.Do(ctx, op)
		}
		a0 := testing.AllocsPerRun(2000, func() { _ = bare.Do(ctx, op) })
		a1 := testing.AllocsPerRun(2000, func() { _ = p.Do(ctx, op) })
		t.Logf("limit %v: allocs per call %v bare, %v with fleet guards", lim != nil, a0, a1)
		if a1 > a0 {
			t.Errorf("limit %+v: fleet guards add %v allocations per successful call", lim, a1-a0)
		}
	}
}

// Bad Config values: New wraps ErrInvalidConfig.
func TestAttackNewsBadConfig(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	for i, cfg := range []fleet.Config{
		{}, {Name: "a{b"}, {Name: "a}b"}, {Name: "x", SyncEvery: -1}, {Name: "x", SyncEvery: time.Microsecond},
		{Name: "x", Timeout: -1}, {Name: "x", MinCalls: -1}, {Name: "x", ProbeRounds: -1}, {Name: "x", MaxHosts: -1},
		{Name: "x", Limit: &limit.Config{Timeout: -1}}, {Name: "x", Limit: &limit.Config{Max: -1}},
		{Name: "x", Limit: &limit.Config{Max: 1 << 31}}, {Name: "x", Limit: &limit.Config{Throttle: 0.5}},
		{Name: "x", Breaker: breaker.Config{Shared: nil, FailureRatio: 2}},
	} {
		f, err := fleet.New(c, cfg)
		if err == nil {
			f.Close()
			t.Errorf("%d: %+v accepted", i, cfg)
		} else if !errors.Is(err, fleet.ErrInvalidConfig) {
			t.Errorf("%d: %v does not wrap ErrInvalidConfig", i, err)
		}
	}
}

// Many Fleets on one client (PoolSize 4): each holds a subscription; every
// one of them must still sync and hear an opening.
func TestAttackNewsManyFleetsOneClient(t *testing.T) {
	for _, tc := range [][2]int{{4, 40}, {4, 3}, {4, 8}, {100, 40}} {
		t.Run(strconv.Itoa(tc[0])+"x"+strconv.Itoa(tc[1]), func(t *testing.T) { atkNewsManyFleets(t, tc[0], tc[1]) })
	}
}

func atkNewsManyFleets(t *testing.T, ps, nf int) {
	c := redis.NewClient(&redis.Options{Addr: atkAddr(t), ContextTimeoutEnabled: true, PoolSize: ps})
	defer c.Close()
	name := atkName(t, atkClient(t, atkAddr(t)))
	var fs []*fleet.Fleet
	var gs []retry.Guards
	for i := 0; i < nf; i++ {
		f := atkNewsNew(t, c, fleet.Config{Name: name, SyncEvery: time.Second})
		fs = append(fs, f)
		gs = append(gs, atkNewsTrack(t, f, "h"))
	}
	time.Sleep(1500 * time.Millisecond)
	local := 0
	for _, f := range fs {
		if f.Mode() != fleet.ModeFleet {
			local++
		}
	}
	if local > 0 {
		t.Errorf("%d of %d Fleets on one client in local mode", local, nf)
	}
	c2 := atkClient(t, atkAddr(t))
	f2 := atkNewsNew(t, c2, fleet.Config{Name: name, MinCalls: 5, Breaker: breaker.Config{MinCalls: 100000}})
	start := time.Now()
	atkNewsTripFleet(t, f2, "h")
	ok := atkEventually(3*time.Second, func() bool {
		for _, g := range gs {
			if g.Breaker.State() == breaker.Closed {
				return false
			}
		}
		return true
	})
	t.Logf("all tripped: %v after %v", ok, time.Since(start))
	if !ok {
		n := 0
		for i, g := range gs {
			if g.Breaker.State() == breaker.Closed {
				n++
				if n <= 3 {
					st := fs[i].Stats()
					t.Logf("fleet %d closed: mode %v, stats %+v", i, fs[i].Mode(), st)
				}
			}
		}
		t.Errorf("%d of %d Fleets on one client (PoolSize %d) still closed 3 s after the fleet's breaker opened (SyncEvery 1 s)", n, nf, ps)
	}
	st := time.Now()
	for _, f := range fs {
		f.Close()
	}
	t.Logf("Close all: %v", time.Since(st))
}

// Close with Redis blackholed leaves no goroutine behind (the subscription
// included) once the client is closed.
func TestAttackNewsNoLeakBlackholed(t *testing.T) {
	nc := atkClient(t, atkAddr(t)) // for the names, before the count
	before := runtime.NumGoroutine()
	for i := 0; i < 5; i++ {
		px := atkNewsNewProxy(t, atkAddr(t))
		c := redis.NewClient(&redis.Options{Addr: px.addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		f, err := fleet.New(c, fleet.Config{Name: atkName(t, nc), Limit: &limit.Config{}})
		if err != nil {
			t.Fatal(err)
		}
		atkNewsTrack(t, f, "h")
		time.Sleep(150 * time.Millisecond)
		px.black.Store(true)
		st := time.Now()
		_ = f.Close()
		if d := time.Since(st); d > time.Second {
			t.Errorf("Close took %v", d)
		}
		c.Close()
		px.stop()
	}
	var after int
	if !atkEventually(5*time.Second, func() bool { after = runtime.NumGoroutine(); return after <= before+2 }) {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("goroutines %d before, %d after\n%s", before, after, buf[:n])
	}
}
