package idemtest

// The fault scenarios of the stores (RunFaults): found by a black-box
// attack, kept for both stores, which only build their clients.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// RunFaults runs the fault scenarios of a store against stores, which
// returns a store reaching the server through a FaultProxy it made with
// NewFaultProxy, a second store on the same data reaching it directly, and
// the proxy: the proxy cuts, mutes, holds or resets the first store's link
// at chosen moments (at Begin, at Complete, during renewals, at random)
// while requests with the same key run on both, and each scenario checks
// that the handler runs once, that no two runs of a key overlap, that no
// answer is lost or replayed wrong, and that no store call outlives the
// request. Each scenario is a subtest.
func RunFaults(t *testing.T, stores func(t *testing.T) (proxied, direct store.Store, p *FaultProxy)) {
	s := faultSuite{stores: stores}
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"CutCompleteReply", s.cutCompleteReply},
		{"BlackholeDuringComplete", s.blackholeDuringComplete},
		{"MuteDuringComplete", s.muteDuringComplete},
		{"HoldDuringComplete", s.holdDuringComplete},
		{"RefuseDuringComplete", s.refuseDuringComplete},
		{"BlipDuringRenewals", s.blipDuringRenewals},
		{"LockLostNoOverlap", s.lockLostNoOverlap},
		{"BlackholeBeforeBegin", s.blackholeBeforeBegin},
		{"CutBeginReply", s.cutBeginReply},
		{"MuteBeginReply", s.muteBeginReply},
		{"LostClaimReleased", s.lostClaimReleased},
		{"HeldBegin", s.heldBegin},
		{"Soak", s.soak},
		{"NoStoreCallOutlivesRun", s.noStoreCallOutlivesRun},
	} {
		t.Run(c.name, c.run)
	}
}

// faultSuite is the scenarios of RunFaults over one store's stores.
type faultSuite struct {
	stores func(t *testing.T) (proxied, direct store.Store, p *FaultProxy)
}

// ---- the scenarios (identical in pgstore and redisstore) -------------------

type fltCounts struct {
	runs, active, overlap, lost atomic.Int32
	inProgress, unavailable     atomic.Int32
	otherErr, badReplay         atomic.Int32
	completed                   atomic.Int32
	mu                          sync.Mutex
	errs                        []string
	causes                      []string
}

func (c *fltCounts) note(s string) {
	c.mu.Lock()
	if len(c.errs) < 20 {
		c.errs = append(c.errs, s)
	}
	c.mu.Unlock()
}

func fltRec(key string) store.Record {
	return store.Record{Status: 201, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("paid:" + key)}
}

func fltGuard(t *testing.T, s store.Store, lock, st time.Duration) *idempotency.Guard {
	g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(lock), idempotency.WithStoreTimeout(st))
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// fltFn returns the operation: it counts runs and overlaps, runs work with its
// context, and returns the payment's record.
func fltFn(c *fltCounts, key string, work func(ctx context.Context)) func(ctx context.Context) (store.Record, bool) {
	return func(ctx context.Context) (store.Record, bool) {
		c.runs.Add(1)
		if c.active.Add(1) > 1 {
			c.overlap.Add(1)
		}
		if work != nil {
			work(ctx)
		}
		if ctx.Err() != nil {
			c.lost.Add(1)
			c.mu.Lock()
			c.causes = append(c.causes, fmt.Sprint(context.Cause(ctx)))
			c.mu.Unlock()
		}
		c.active.Add(-1)
		return fltRec(key), true
	}
}

// fltRetry calls Run with key on g every pause until it gets a replay (or
// runs the operation itself), for at most d; it records what it saw.
func fltRetry(g *idempotency.Guard, c *fltCounts, key string, fp store.Fingerprint, fn func(context.Context) (store.Record, bool), pause, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		out, rec, err := g.Run(context.Background(), "flt-scope", key, fp, fn)
		switch {
		case err != nil:
			if errors.Is(err, idempotency.ErrStoreUnavailable) {
				c.unavailable.Add(1)
			} else {
				c.otherErr.Add(1)
				c.note("retry: " + err.Error())
			}
		case out == store.InProgress:
			c.inProgress.Add(1)
		case out == store.Completed:
			c.completed.Add(1)
			want := fltRec(key)
			if rec.Status != want.Status || !bytes.Equal(rec.Body, want.Body) || rec.Header.Get("Content-Type") != "text/plain" {
				c.badReplay.Add(1)
				c.note(fmt.Sprintf("bad replay %d %q %v", rec.Status, rec.Body, rec.Header))
			}
			return
		case out == store.Claimed:
			return
		default:
			c.otherErr.Add(1)
			c.note("retry outcome " + string(out))
		}
		time.Sleep(pause)
	}
	c.note("retrier gave up without a replay")
	c.otherErr.Add(1)
}

var fltKeySeq atomic.Int64

func fltKey(t *testing.T) string {
	return fmt.Sprintf("flt-idemfault-%s-%d-%d", t.Name(), time.Now().UnixNano(), fltKeySeq.Add(1))
}

var fltFP = store.NewFingerprint("POST", "/pay", [32]byte{1})

type fltScenario struct {
	lock, st time.Duration
	// during runs inside the leader's operation (on the leader's ctx),
	// after the retriers have seen it in progress; p is the leader's proxy.
	during func(ctx context.Context, p *FaultProxy)
	// before runs before the leader's Run.
	before     func(p *FaultProxy)
	retriers   int
	retryFor   time.Duration
	wantRuns   int32 // 0 means 1
	allowLost  bool
	maxLeader  time.Duration // 0: no bound checked
	leaderWant string        // "claimed" (default) or "unavailable"
}

func (s faultSuite) runScenario(t *testing.T, sc fltScenario) *fltCounts {
	ps, ds, p := s.stores(t)
	leaderG := fltGuard(t, ps, sc.lock, sc.st)
	otherG := fltGuard(t, ds, sc.lock, sc.st)
	key := fltKey(t)
	c := &fltCounts{}
	seen := make(chan struct{})
	var seenOnce sync.Once
	fn := fltFn(c, key, func(ctx context.Context) {
		// Let the retriers meet the key in progress first.
		select {
		case <-seen:
		case <-time.After(2 * time.Second):
		}
		if sc.during != nil {
			sc.during(ctx, p)
		}
	})
	otherFn := fltFn(c, key, nil)
	// Warm the proxied pool (one connection), so that the first store
	// call of the leader is not the dial.
	warm := fltGuard(t, ps, sc.lock, sc.st)
	if _, _, err := warm.Run(context.Background(), "flt-warm", fltKey(t), fltFP, func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	if sc.before != nil {
		sc.before(p)
	}
	var wg sync.WaitGroup
	var lout store.Outcome
	var lerr error
	var lElapsed time.Duration
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		lout, _, lerr = leaderG.Run(context.Background(), "flt-scope", key, fltFP, fn)
		lElapsed = time.Since(start)
	}()
	retryFor := sc.retryFor
	if retryFor == 0 {
		retryFor = 20 * time.Second
	}
	n := sc.retriers
	if n == 0 {
		n = 4
	}
	// Retriers start once the key is held (or the leader failed).
	go func() {
		for c.inProgress.Load() == 0 {
			time.Sleep(5 * time.Millisecond)
		}
		seenOnce.Do(func() { close(seen) })
	}()
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(20 * time.Millisecond)
			fltRetry(otherG, c, key, fltFP, otherFn, 15*time.Millisecond, retryFor)
		}()
	}
	wg.Wait()
	seenOnce.Do(func() { close(seen) })
	want := sc.wantRuns
	if want == 0 {
		want = 1
	}
	t.Logf("leader: %q err=%v in %v; runs=%d overlap=%d lost=%d; retriers: in-progress %d, unavailable %d, completed %d, other errors %d, bad replays %d; proxy chunks %d cuts %d; causes %q; notes %q",
		lout, lerr, lElapsed.Round(time.Millisecond), c.runs.Load(), c.overlap.Load(), c.lost.Load(), c.inProgress.Load(), c.unavailable.Load(), c.completed.Load(), c.otherErr.Load(), c.badReplay.Load(), p.chunks.Load(), p.cuts.Load(), c.causes, c.errs)
	if got := c.runs.Load(); got != want {
		t.Errorf("the operation ran %d times for one key, want %d", got, want)
	}
	if c.overlap.Load() != 0 {
		t.Errorf("two runs of the operation overlapped for one key (%d)", c.overlap.Load())
	}
	if !sc.allowLost && c.lost.Load() != 0 {
		t.Errorf("the operation's context was canceled (%q), want the lock kept", c.causes)
	}
	if c.badReplay.Load() != 0 || c.otherErr.Load() != 0 {
		t.Errorf("bad replays %d, other errors %d: %q", c.badReplay.Load(), c.otherErr.Load(), c.errs)
	}
	switch sc.leaderWant {
	case "", "claimed":
		if lerr != nil || lout != store.Claimed {
			t.Errorf("leader Run: %q, %v; want claimed, nil", lout, lerr)
		}
	case "unavailable":
		if !errors.Is(lerr, idempotency.ErrStoreUnavailable) {
			t.Errorf("leader Run: %q, %v; want an error wrapping ErrStoreUnavailable", lout, lerr)
		}
	}
	if sc.maxLeader > 0 && lElapsed > sc.maxLeader {
		t.Errorf("leader Run took %v, want at most %v", lElapsed, sc.maxLeader)
	}
	return c
}

// The link cut just as the answer is stored: the completion reaches the
// store, its reply is lost and the connection reset.
func (s faultSuite) cutCompleteReply(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 3 * time.Second, st: 500 * time.Millisecond,
		during: func(ctx context.Context, p *FaultProxy) { p.CutNext(1) }})
}

// The store blackholed (nothing answers, nothing closes) for 1.2 s from the
// moment the answer is stored.
func (s faultSuite) blackholeDuringComplete(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 3 * time.Second, st: 300 * time.Millisecond,
		during: func(ctx context.Context, p *FaultProxy) {
			p.Set(fltBlackhole)
			time.AfterFunc(1200*time.Millisecond, func() { p.Set(fltPass) })
		}})
}

// Replies muted for 1.2 s from the completion on: every try reaches the
// store and is executed, none of its answers come back.
func (s faultSuite) muteDuringComplete(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 3 * time.Second, st: 300 * time.Millisecond,
		during: func(ctx context.Context, p *FaultProxy) {
			p.Set(fltMuteReply)
			time.AfterFunc(1200*time.Millisecond, func() { p.Set(fltPass) })
		}})
}

// What the client sends held for 1.2 s from the completion on, then
// delivered: every timed-out try reaches the store late.
func (s faultSuite) holdDuringComplete(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 3 * time.Second, st: 300 * time.Millisecond,
		during: func(ctx context.Context, p *FaultProxy) {
			p.Set(fltHold)
			time.AfterFunc(1200*time.Millisecond, func() { p.Set(fltPass) })
		}})
}

// Refused (reset) for 1.2 s from the completion on.
func (s faultSuite) refuseDuringComplete(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 3 * time.Second, st: 300 * time.Millisecond,
		during: func(ctx context.Context, p *FaultProxy) {
			p.Set(fltRefuse)
			time.AfterFunc(1200*time.Millisecond, func() { p.Set(fltPass) })
		}})
}

// Renewals meet a blip shorter than the lock's margin (lock 1.5 s renewed
// every 0.5 s; the store blackholed, muted, held or refused for 0.8 s from
// the handler's start while it runs 2.2 s): the lock is kept, one run.
func (s faultSuite) blipDuringRenewals(t *testing.T) {
	for _, m := range []struct {
		name string
		mode fltMode
	}{{"blackhole", fltBlackhole}, {"mute", fltMuteReply}, {"hold", fltHold}, {"refuse", fltRefuse}} {
		t.Run(m.name, func(t *testing.T) {
			s.runScenario(t, fltScenario{lock: 1500 * time.Millisecond, st: 200 * time.Millisecond,
				during: func(ctx context.Context, p *FaultProxy) {
					p.Set(m.mode)
					time.Sleep(800 * time.Millisecond)
					p.Set(fltPass)
					select {
					case <-ctx.Done():
					case <-time.After(1400 * time.Millisecond):
					}
				}})
		})
	}
}

// The leader's link blackholed for good while it runs (lock 1.5 s): it
// must be told ErrLockLost before another server's retry can claim the
// key; the retry then runs (allowed) but never alongside the first.
func (s faultSuite) lockLostNoOverlap(t *testing.T) {
	for _, m := range []struct {
		name string
		mode fltMode
	}{{"blackhole", fltBlackhole}, {"mute", fltMuteReply}, {"hold", fltHold}, {"refuse", fltRefuse}} {
		t.Run(m.name, func(t *testing.T) {
			c := s.runScenario(t, fltScenario{lock: 1500 * time.Millisecond, st: 200 * time.Millisecond,
				wantRuns: 2, allowLost: true, maxLeader: 3 * time.Second,
				during: func(ctx context.Context, p *FaultProxy) {
					p.Set(m.mode)
					<-ctx.Done()
					if !errors.Is(context.Cause(ctx), idempotency.ErrLockLost) {
						t.Errorf("cause %v, want ErrLockLost", context.Cause(ctx))
					}
				}})
			if c.lost.Load() != 1 {
				t.Errorf("lost %d, want 1", c.lost.Load())
			}
		})
	}
}

// The store blackholed before the claim: ErrStoreUnavailable within about
// the store timeout, nothing run; the retriers (another server) run it once.
func (s faultSuite) blackholeBeforeBegin(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 3 * time.Second, st: 300 * time.Millisecond,
		leaderWant: "unavailable", maxLeader: 800 * time.Millisecond,
		before: func(p *FaultProxy) { p.Set(fltBlackhole) }})
}

// The claim's reply cut: the claim was made, its answer lost.
func (s faultSuite) cutBeginReply(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 2 * time.Second, st: 300 * time.Millisecond,
		leaderWant: "any",
		before:     func(p *FaultProxy) { p.CutNext(1) }})
}

// The claim's reply muted: the claim was made, its answer never comes.
func (s faultSuite) muteBeginReply(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 2 * time.Second, st: 300 * time.Millisecond,
		leaderWant: "any",
		before: func(p *FaultProxy) {
			p.Set(fltMuteReply)
			time.AfterFunc(time.Second, func() { p.Set(fltPass) })
		}})
}

// The claim's reply muted under a long lock (30 s): the claim was made, its
// answer lost; the store reports the claim's owner with its error, and the
// Guard releases it (the leader is answered "store unavailable" and does
// not run). The retriers must run the operation well before the lock
// timeout: within 10 s (they were answered "in progress" until the claim
// expired, 30 s).
func (s faultSuite) lostClaimReleased(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 30 * time.Second, st: 300 * time.Millisecond,
		leaderWant: "unavailable",
		retryFor:   10 * time.Second,
		before: func(p *FaultProxy) {
			p.Set(fltMuteReply)
			time.AfterFunc(time.Second, func() { p.Set(fltPass) })
		}})
}

// The claim held 0.7 s of a 1.5 s lock (store timeout 1 s): answered late
// (after a third of the lock timeout), confirmed, run once.
func (s faultSuite) heldBegin(t *testing.T) {
	s.runScenario(t, fltScenario{lock: 1500 * time.Millisecond, st: time.Second,
		leaderWant: "any",
		before: func(p *FaultProxy) {
			p.Set(fltHold)
			time.AfterFunc(700*time.Millisecond, func() { p.Set(fltPass) })
		}})
}

// A soak at the Guard level: 120 keys, for each three callers at once (two
// through a lossy link to the store: 4% of chunks reset, 4% cut after they
// reach the server; one direct), each retrying until it gets the replay.
// Lock 900 ms (renewals every 300 ms), operations of 0-700 ms. The
// operation of a key must run once, unless its lock was lost.
//
//stormguard:long one scenario: the link's faults, the callers and the checks share the run's counts
func (s faultSuite) soak(t *testing.T) {
	ps, ds, p := s.stores(t)
	lock, st := time.Duration(fltEnvF("ZZ_LOCK", 900))*time.Millisecond, 150*time.Millisecond
	zl := &fltLog{by: map[int][]string{}}
	mk := func(s store.Store, name string) *idempotency.Guard {
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(lock), idempotency.WithStoreTimeout(st),
			idempotency.WithLogger(slog.New(zl.with(name))))
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	gs := []*idempotency.Guard{mk(ps, "A"), mk(ps, "B"), mk(ds, "direct")}
	p.Random(fltEnvF("ZZ_RESET", 0.04), fltEnvF("ZZ_CUT", 0.04), 42)
	const keys = 120
	type perKey struct {
		runs, lost, active, overlap atomic.Int32
	}
	stats := make([]perKey, keys)
	var bad, gaveUp, unavailable, inprog atomic.Int32
	var notes sync.Mutex
	var msgs []string
	note := func(s string) {
		notes.Lock()
		if len(msgs) < 20 {
			msgs = append(msgs, s)
		}
		notes.Unlock()
	}
	sem := make(chan struct{}, 12)
	var wg sync.WaitGroup
	for k := 0; k < keys; k++ {
		key := fltKey(t)
		ks := &stats[k]
		work := time.Duration(k%8) * 100 * time.Millisecond
		kctx := context.WithValue(context.Background(), fltKeyIdx{}, k)
		fn := func(ctx context.Context) (store.Record, bool) {
			zl.add(ctx, "fn start")
			defer zl.add(ctx, "fn end")
			ks.runs.Add(1)
			if ks.active.Add(1) > 1 {
				ks.overlap.Add(1)
			}
			defer ks.active.Add(-1)
			select {
			case <-ctx.Done():
			case <-time.After(work):
			}
			if ctx.Err() != nil {
				ks.lost.Add(1)
			}
			return fltRec(key), true
		}
		for _, g := range gs {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; wg.Done() }()
				end := time.Now().Add(20 * time.Second)
				for time.Now().Before(end) {
					out, rec, err := g.Run(kctx, "flt-scope", key, fltFP, fn)
					zl.add(kctx, fmt.Sprintf("Run: %q %v", out, err))
					switch {
					case err != nil:
						if errors.Is(err, idempotency.ErrStoreUnavailable) {
							unavailable.Add(1)
						} else {
							note(err.Error())
							bad.Add(1)
						}
					case out == store.Claimed:
						return
					case out == store.Completed:
						if want := fltRec(key); rec.Status != want.Status || !bytes.Equal(rec.Body, want.Body) {
							bad.Add(1)
							note(fmt.Sprintf("bad replay %d %q", rec.Status, rec.Body))
						}
						return
					case out == store.InProgress:
						inprog.Add(1)
					default:
						bad.Add(1)
						note(string(out))
					}
					time.Sleep(20 * time.Millisecond)
				}
				gaveUp.Add(1)
			}()
		}
	}
	wg.Wait()
	var twice, overlaps, lostKeys, never int
	for k := range stats {
		s := &stats[k]
		if s.lost.Load() > 0 {
			lostKeys++
		}
		if s.runs.Load() == 0 {
			never++
		}
		explained := false
		zl.mu.Lock()
		for _, l := range zl.by[k] {
			if strings.Contains(l, "lock lost") || strings.Contains(l, "failed until the lock was lost") {
				explained = true
			}
		}
		zl.mu.Unlock()
		if s.runs.Load() > 1 && s.lost.Load() == 0 && !explained {
			twice++
			note(fmt.Sprintf("key %d ran %d times, lock never lost", k, s.runs.Load()))
			zl.mu.Lock()
			for _, l := range zl.by[k] {
				t.Logf("key %d: %s", k, l)
			}
			zl.mu.Unlock()
		}
		if s.overlap.Load() > 0 {
			overlaps++
		}
	}
	t.Logf("keys %d: ran twice without a lost lock %d, overlapping runs %d, keys with a lost lock %d, never ran %d; bad %d, gave up %d, unavailable %d, in-progress %d; proxy chunks %d cuts %d; %q",
		keys, twice, overlaps, lostKeys, never, bad.Load(), gaveUp.Load(), unavailable.Load(), inprog.Load(), p.chunks.Load(), p.cuts.Load(), msgs)
	if twice > 0 || overlaps > 0 || bad.Load() > 0 || gaveUp.Load() > 0 || never > 0 {
		t.Fail()
	}
}

// docs/idempotency.md: "Guard.Run (so the middleware's handler) returns once
// the record is stored ... no goroutine outlives the request". Replies muted
// for 1.2 s as the answer is stored (store timeout 300 ms), with the
// store's client as its stores function builds it: once Run has returned,
// are store calls of the request still running?
func (s faultSuite) noStoreCallOutlivesRun(t *testing.T) {
	ps, _, p := s.stores(t)
	g := fltGuard(t, ps, 3*time.Second, 300*time.Millisecond)
	key := fltKey(t)
	if _, _, err := g.Run(context.Background(), "flt-warm", fltKey(t), fltFP, func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }); err != nil {
		t.Fatal(err)
	}
	out, _, err := g.Run(context.Background(), "flt-scope", key, fltFP, func(context.Context) (store.Record, bool) {
		p.Set(fltMuteReply)
		time.AfterFunc(1200*time.Millisecond, func() { p.Set(fltPass) })
		return fltRec(key), true
	})
	if err != nil || out != store.Claimed {
		t.Fatalf("Run: %q %v", out, err)
	}
	returned := time.Now()
	count := func() int {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		var live int
		for _, gr := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(gr, "pgstore.(*Store).Complete") || strings.Contains(gr, "pgstore.(*Store).Extend") {
				live++
			}
		}
		return live
	}
	live := count()
	for count() > 0 && time.Since(returned) < 10*time.Second {
		time.Sleep(20 * time.Millisecond)
	}
	if live > 0 {
		t.Errorf("after Run returned, %d goroutines of the request were still in a store call (Complete/Extend); the last ended %v after Run returned (store timeout 300ms)", live, time.Since(returned).Round(10*time.Millisecond))
	}
}
