// Black-box attack (AREA=loop2): the retry loop with its guards (a
// breaker, a limiter, a budget, an observer) after the fixes of the
// released-after-cancel call, the stale probe given back, the panicking
// Deposit and observer. Every test runs in a testing/synctest bubble.

package retry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// lp2Err is a transient failure of the dependency (the default classifier
// retries it: Temporary true).
type lp2Err struct{ code int }

func (e *lp2Err) Error() string   { return fmt.Sprintf("status %d", e.code) }
func (e *lp2Err) Temporary() bool { return e.code >= 500 }

var (
	lp2503 = &lp2Err{503}
	lp2404 = &lp2Err{404}
)

func lp2Half() float64 { return 0.5 }

// lp2LimInFlight reads the limiter's attempts in flight and calls waiting.
func lp2LimInFlight(l *limit.Limiter) (int, int) { return l.SetCap(-1) }

// lp2CountBudget counts deposits and withdrawals; it grants every retry.
type lp2CountBudget struct{ dep, wd atomic.Int64 }

func (b *lp2CountBudget) Deposit()       { b.dep.Add(1) }
func (b *lp2CountBudget) Withdraw() bool { b.wd.Add(1); return true }

// lp2CallKey tags a call's context with its number, for the observer.
type lp2CallKey struct{}

// lp2Rec records the events of each call (by the number its context
// carries).
type lp2Rec struct {
	mu sync.Mutex
	ev map[int][]observe.Event
}

func (r *lp2Rec) Observe(ctx context.Context, e observe.Event) {
	id, _ := ctx.Value(lp2CallKey{}).(int)
	r.mu.Lock()
	if r.ev == nil {
		r.ev = map[int][]observe.Event{}
	}
	r.ev[id] = append(r.ev[id], e)
	r.mu.Unlock()
}

func (r *lp2Rec) events(id int) []observe.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]observe.Event(nil), r.ev[id]...)
}

// lp2CheckEvents checks one call's events against the observe contract:
// AttemptStart and AttemptEnd alternate with the same number, numbered
// 1, 2, ...; a Retry only after an AttemptEnd; at most one GiveUp, the
// last event, present iff the call failed, its Attempt the attempts
// sent. It returns the number of Retry events.
func lp2CheckEvents(t *testing.T, id int, evs []observe.Event, sent int, err error) int {
	t.Helper()
	open := false
	next := 1
	retries, giveUps := 0, 0
	for i, e := range evs {
		switch e.Kind {
		case observe.AttemptStart:
			if open || e.Attempt != next {
				t.Errorf("call %d: event %d AttemptStart %d (open %v, want attempt %d): %v", id, i, e.Attempt, open, next, evs)
				return retries
			}
			open = true
		case observe.AttemptEnd:
			if !open || e.Attempt != next {
				t.Errorf("call %d: event %d AttemptEnd %d without its start: %v", id, i, e.Attempt, evs)
				return retries
			}
			open = false
			next++
		case observe.Retry:
			if open {
				t.Errorf("call %d: Retry inside an attempt: %v", id, evs)
			}
			retries++
		case observe.GiveUp:
			giveUps++
			if i != len(evs)-1 {
				t.Errorf("call %d: GiveUp is not the last event: %v", id, evs)
			}
			var re *retry.Error
			if errors.As(err, &re) && e.Attempt != re.Attempts {
				t.Errorf("call %d: GiveUp.Attempt %d, Error.Attempts %d", id, e.Attempt, re.Attempts)
			}
		case observe.BreakerWait:
			if open {
				t.Errorf("call %d: BreakerWait inside an attempt: %v", id, evs)
			}
		}
	}
	if open {
		t.Errorf("call %d: an attempt never ended: %v", id, evs)
	}
	if next-1 != sent {
		t.Errorf("call %d: %d AttemptStart/End pairs, %d attempts sent", id, next-1, sent)
	}
	if (err != nil) != (giveUps == 1) || giveUps > 1 {
		t.Errorf("call %d: err %v with %d GiveUp events", id, err, giveUps)
	}
	return retries
}

// lp2ProbeFree brings an idle breaker to a state that admits a call (it
// waits out an open period) and reports whether it does: a probe held by
// nobody and never given back would make a half-open breaker refuse for
// ever.
func lp2ProbeFree(t *testing.T, brk *breaker.Breaker) {
	t.Helper()
	for range 3 {
		if s := brk.Snapshot(); s.State == breaker.Open {
			time.Sleep(s.HalfOpenIn + time.Millisecond)
		}
		if p, err := brk.Allow(); err == nil {
			brk.Cancel(p)
			return
		}
		time.Sleep(time.Minute)
	}
	t.Errorf("the idle breaker admits nothing (state %v, snapshot %+v): a permit was never given back", brk.State(), brk.Snapshot())
}

// TestAttackLoop2ReleasedAtDeadlineIsCircuitOpen: a call waits behind an open
// breaker for its whole deadline, and the breaker closes (Reset, every
// waiting call released at once) at the very instant the deadline comes.
// Nothing is sent. Policy.Do: "otherwise, or if the wait ends at the
// deadline, the loop stops with Reason CircuitOpen"; Reason CircuitOpen:
// "or gave up waiting at the deadline". The same wait ends with
// CircuitOpen or Deadline depending on which timer of the same instant
// runs first.
func TestAttackLoop2ReleasedAtDeadlineIsCircuitOpen(t *testing.T) {
	reasons := map[retry.Reason]int{}
	for range 40 {
		synctest.Test(t, func(t *testing.T) {
			brk, _ := breaker.New(breaker.Config{OpenFor: time.Hour, Probes: 1, Rand: lp2Half, ReleaseRate: -1})
			lim, _ := limit.New(limit.Config{Max: 1})
			b := &lp2CountBudget{}
			p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim, Budget: b}))
			brk.Trip(0)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tm := time.AfterFunc(10*time.Second, brk.Reset)
			defer tm.Stop()
			sent := 0
			err := p.Do(ctx, func(context.Context, int) error { sent++; return nil })
			var re *retry.Error
			if !errors.As(err, &re) {
				if sent == 0 {
					t.Fatalf("err %v with nothing sent", err)
				}
				return
			}
			if sent != 0 || re.Attempts != 0 || b.dep.Load() != 0 {
				t.Errorf("sent %d, attempts %d, deposits %d; want 0", sent, re.Attempts, b.dep.Load())
			}
			reasons[re.Reason]++
			synctest.Wait()
			if in, w := lp2LimInFlight(lim); in != 0 || w != 0 {
				t.Errorf("limiter in flight %d, waiting %d", in, w)
			}
			if s := brk.Snapshot(); s.Waiters != 0 {
				t.Errorf("breaker waiters %d", s.Waiters)
			}
		})
	}
	t.Logf("reasons %v", reasons)
	if reasons[retry.Deadline] > 0 {
		t.Errorf("a call that waited behind the breaker until its deadline and sent nothing ended with Reason Deadline %d times of %d (CircuitOpen %d); want CircuitOpen every time (Policy.Do: \"if the wait ends at the deadline, the loop stops with Reason CircuitOpen\")",
			reasons[retry.Deadline], 40, reasons[retry.CircuitOpen])
	}
}

// TestAttackLoop2StaleRoundProbeSentInNextRound: a call is handed round 1's only
// probe (Probes 1) and waits for the limiter's one slot. Meanwhile round 1
// ends (Trip reopens the half-open breaker) and round 2 starts and hands
// its only probe to a second call. When the slot comes, the first call's
// probe, whose round ended, is sent anyway (the breaker is half-open
// again), so round 2 sends two probes. Guards.Limiter: "If the breaker
// opened while the attempt waited for its slot (... or a probe's, the
// breaker no longer half-open: its round ended), nothing is sent"; package
// breaker: "a probe round admits Probes calls".
func TestAttackLoop2StaleRoundProbeSentInNextRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1, Rand: lp2Half, ReleaseRate: -1})
		lim, _ := limit.New(limit.Config{Max: 1})
		p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}), retry.WithMaxAttempts(1))
		hold, err := lim.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		brk.Trip(0)
		t0 := time.Now()
		type send struct {
			call  int
			at    time.Duration
			probe bool
			state breaker.State
		}
		var mu sync.Mutex
		var sends []send
		var wg sync.WaitGroup
		call := func(id int, dl time.Duration) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), dl)
			defer cancel()
			_ = p.Do(ctx, func(actx context.Context, _ int) error {
				mu.Lock()
				sends = append(sends, send{id, time.Since(t0), retry.IsProbe(actx), brk.State()})
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				return nil
			})
		}
		wg.Add(1)
		go call(1, 20*time.Second) // the earlier deadline: first in line for the slot
		time.Sleep(1100 * time.Millisecond)
		// Round 1 at 1 s handed call 1 the probe; it waits for the slot.
		if s := brk.Snapshot(); s.State != breaker.HalfOpen {
			t.Fatalf("at 1.1 s the breaker is %v, want half-open", s.State)
		}
		brk.Trip(0) // round 1 ends: open until 2.1 s
		wg.Add(1)
		go call(2, 30*time.Second)
		time.Sleep(1100 * time.Millisecond) // round 2 at 2.1 s hands call 2 its probe
		if s := brk.Snapshot(); s.State != breaker.HalfOpen {
			t.Fatalf("at 2.2 s the breaker is %v, want half-open", s.State)
		}
		lim.Release(hold, false)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		inRound2 := 0
		for _, s := range sends {
			if s.at < 2200*time.Millisecond+50*time.Millisecond && s.state != breaker.Closed {
				inRound2++
			}
		}
		if inRound2 > 1 {
			desc := ""
			for _, s := range sends {
				desc += fmt.Sprintf(" [call %d at %v probe %v breaker %v]", s.call, s.at, s.probe, s.state)
			}
			t.Errorf("round 2 (Probes 1) sent %d attempts while half-open:%s; want 1 (call 1's probe belongs to the round that ended)", inRound2, desc)
		}
		synctest.Wait()
		if in, w := lp2LimInFlight(lim); in != 0 || w != 0 {
			t.Errorf("limiter in flight %d, waiting %d", in, w)
		}
	})
}

// TestAttackLoop2StormTripResetLimiterOne: 40 calls with deadlines go through a
// breaker that a storm trips and resets on a 100 ms grid, a limiter of one
// slot, a counting budget and an observer; a third of the calls are
// canceled, on the same grid (so at the instants the breaker changes).
// For every call: the events pair up and end with one GiveUp iff it
// failed, retries (Retry events, withdrawals) stay within MaxAttempts−1,
// a Canceled reason only for a canceled call and a canceled call that
// returned after its cancel says Canceled; one deposit per call that sent
// anything. At the end nothing is in flight, nobody waits, and the idle
// breaker admits a call.
func TestAttackLoop2StormTripResetLimiterOne(t *testing.T) {
	for seed := range uint64(24) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { lp2Storm(t, seed) })
		})
	}
}

func lp2Storm(t *testing.T, seed uint64) {
	var rmu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 99))
	rnd := func() float64 { rmu.Lock(); defer rmu.Unlock(); return rng.Float64() }
	rint := func(n int) int { rmu.Lock(); defer rmu.Unlock(); return rng.IntN(n) }
	rel := -1.0
	if seed%2 == 1 {
		rel = 0
	}
	var slow time.Duration
	opts := []retry.Option{}
	if seed%3 == 2 { // an attempt timeout, and slow calls count as failures
		slow = 120 * time.Millisecond
		opts = append(opts, retry.WithAttemptTimeout(150*time.Millisecond))
	}
	brk, err := breaker.New(breaker.Config{OpenFor: 300 * time.Millisecond, Probes: 2, MinCalls: 4, Window: time.Second, Buckets: 10, Rand: rnd, ReleaseRate: rel, SlowCall: slow})
	if err != nil {
		t.Fatal(err)
	}
	lim, _ := limit.New(limit.Config{Max: 1})
	b := &lp2CountBudget{}
	rec := &lp2Rec{}
	const maxAtt = 3
	p, _ := retry.New(append(opts, retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim, Budget: b}),
		retry.WithObserver(rec), retry.WithMaxAttempts(maxAtt))...)
	var up atomic.Bool
	up.Store(true)
	t0 := time.Now()
	grid := 100 * time.Millisecond

	stop := make(chan struct{})
	var sg sync.WaitGroup
	sg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(grid):
			}
			switch rint(5) {
			case 0:
				brk.Trip(time.Duration(rint(3)) * grid)
			case 1:
				brk.Reset()
			case 2:
				up.Store(!up.Load())
			}
		}
	})

	const n = 60
	type result struct {
		err        error
		sent       int
		probes     int
		canceledAt time.Duration // -1: not canceled
		endedAt    time.Duration
	}
	res := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			time.Sleep(time.Duration(rint(30)) * grid)
			base := context.WithValue(context.Background(), lp2CallKey{}, i)
			ctx, cancel := context.WithTimeout(base, time.Duration(1+rint(40))*grid)
			defer cancel()
			res[i].canceledAt = -1
			if rint(3) == 0 {
				d := time.Duration(rint(20)) * grid
				at := time.Since(t0) + d
				tm := time.AfterFunc(d, func() { res[i].canceledAt = at; cancel() })
				defer tm.Stop()
			}
			res[i].err = p.Do(ctx, func(actx context.Context, _ int) error {
				res[i].sent++
				if retry.IsProbe(actx) {
					res[i].probes++
				}
				select {
				case <-time.After(time.Duration(rint(4)) * grid / 2):
				case <-actx.Done():
					return actx.Err()
				}
				switch {
				case !up.Load():
					return lp2503
				case rint(10) == 0:
					return lp2404
				}
				return nil
			})
			res[i].endedAt = time.Since(t0)
		})
	}
	wg.Wait()
	close(stop)
	sg.Wait()
	synctest.Wait()

	callsSent := 0
	for i, r := range res {
		if r.sent > 0 {
			callsSent++
		}
		retries := lp2CheckEvents(t, i, rec.events(i), r.sent, r.err)
		if retries > maxAtt-1 {
			t.Errorf("call %d: %d retries, want at most %d", i, retries, maxAtt-1)
		}
		if r.sent-r.probes > maxAtt {
			t.Errorf("call %d: %d attempts not marked as probes (of %d), want at most %d", i, r.sent-r.probes, r.sent, maxAtt)
		}
		var re *retry.Error
		if r.err != nil && !errors.As(r.err, &re) {
			t.Errorf("call %d: %v is not an *Error", i, r.err)
			continue
		}
		if re == nil {
			continue
		}
		if re.Attempts != r.sent {
			t.Errorf("call %d: Attempts %d, sent %d", i, re.Attempts, r.sent)
		}
		if re.Reason == retry.Canceled && (r.canceledAt < 0 || r.canceledAt > r.endedAt) {
			t.Errorf("call %d: Reason Canceled, canceled at %v, ended at %v", i, r.canceledAt, r.endedAt)
		}
		if r.canceledAt >= 0 && r.endedAt > r.canceledAt && re.Reason != retry.Canceled {
			t.Errorf("call %d: canceled at %v, returned at %v with Reason %v (attempts %d)", i, r.canceledAt, r.endedAt, re.Reason, re.Attempts)
		}
	}
	stats := map[string]int{}
	for _, r := range res {
		stats["sent"] += r.sent
		stats["probes"] += r.probes
		var re *retry.Error
		if errors.As(r.err, &re) {
			stats[re.Reason.Error()]++
		} else {
			stats["ok"]++
		}
	}
	t.Logf("seed %d: %v", seed, stats)
	if d := b.dep.Load(); d != int64(callsSent) {
		t.Errorf("%d deposits, %d calls sent something", d, callsSent)
	}
	if w := b.wd.Load(); w > int64((maxAtt-1)*n) {
		t.Errorf("%d withdrawals for %d calls", w, n)
	}
	if in, w := lp2LimInFlight(lim); in != 0 || w != 0 {
		t.Errorf("limiter in flight %d, waiting %d", in, w)
	}
	if s := brk.Snapshot(); s.Waiters != 0 {
		t.Errorf("breaker waiters %d", s.Waiters)
	}
	lp2ProbeFree(t, brk)
}

// lp2GoexitRun runs fn (a call that may panic or exit its goroutine) on a
// goroutine of its own and reports how it ended.
func lp2GoexitRun(fn func()) (exited bool, v any) {
	done := make(chan struct{})
	exited = true
	go func() {
		defer close(done)
		defer func() { v = recover() }()
		fn()
		exited = false
	}()
	<-done
	return exited, v
}

// TestAttackLoop2GoexitEverywhere: runtime.Goexit in op, in the observer at each
// event kind, and in the budget's Deposit, on a half-open breaker with one
// probe and a limiter of one slot: each time the probe and the slot come
// back, the events of the attempt pair up, and the next call goes through.
func TestAttackLoop2GoexitEverywhere(t *testing.T) {
	places := []string{"op", "deposit", string(observe.BreakerWait), string(observe.AttemptStart), string(observe.AttemptEnd), string(observe.Retry), string(observe.GiveUp)}
	for _, where := range places {
		for _, how := range []string{"goexit", "panic"} {
			t.Run(where+"/"+how, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) { lp2GoexitCase(t, where, how) })
			})
		}
	}
}

type lp2FnObs func(ctx context.Context, e observe.Event)

func (f lp2FnObs) Observe(ctx context.Context, e observe.Event) { f(ctx, e) }

type lp2DieBudget struct {
	die func()
	on  atomic.Bool
}

func (b *lp2DieBudget) Deposit() {
	if b.on.Load() {
		b.die()
	}
}
func (b *lp2DieBudget) Withdraw() bool { return true }

func lp2GoexitCase(t *testing.T, where, how string) {
	die := func() {
		if how == "goexit" {
			runtime.Goexit()
		}
		panic("lp2 " + where)
	}
	brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1, Rand: lp2Half, ReleaseRate: -1})
	lim, _ := limit.New(limit.Config{Max: 1})
	bud := &lp2DieBudget{die: die}
	var armed atomic.Bool
	var mu sync.Mutex
	var evs []observe.Event
	obs := lp2FnObs(func(ctx context.Context, e observe.Event) {
		mu.Lock()
		evs = append(evs, e)
		mu.Unlock()
		if armed.Load() && string(e.Kind) == where {
			armed.Store(false)
			die()
		}
	})
	p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim, Budget: bud}), retry.WithObserver(obs), retry.WithMaxAttempts(2))
	brk.Trip(0) // the call waits for the round at 1 s and is handed its probe
	armed.Store(true)
	bud.on.Store(where == "deposit")
	sent := 0
	exited, v := lp2GoexitRun(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Do(ctx, func(context.Context, int) error {
			sent++
			if where == "op" {
				die()
			}
			return lp2404 // not retryable: a success for the breaker; for Retry, see below
		})
	})
	if where == string(observe.Retry) && !exited {
		// lp2404 makes no Retry: run again with a retryable error on a closed breaker.
		armed.Store(true)
		exited, v = lp2GoexitRun(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = p.Do(ctx, func(context.Context, int) error { sent++; return lp2503 })
		})
	}
	bud.on.Store(false)
	if !exited {
		t.Fatalf("%s %s: the call returned (events %v)", where, how, evs)
	}
	if how == "panic" && v == nil {
		t.Errorf("the panic was swallowed")
	}
	if how == "goexit" && v != nil {
		t.Errorf("Goexit came back as a panic: %v", v)
	}
	synctest.Wait()
	if in, w := lp2LimInFlight(lim); in != 0 || w != 0 {
		t.Errorf("after %s in %s: limiter in flight %d, waiting %d", how, where, in, w)
	}
	mu.Lock()
	starts, ends, giveups := 0, 0, 0
	for _, e := range evs {
		switch e.Kind {
		case observe.AttemptStart:
			starts++
		case observe.AttemptEnd:
			ends++
		case observe.GiveUp:
			giveups++
		}
	}
	mu.Unlock()
	if starts != ends {
		t.Errorf("after %s in %s: %d AttemptStart, %d AttemptEnd: %v", how, where, starts, ends, evs)
	}
	if giveups > 1 {
		t.Errorf("after %s in %s: %d GiveUp: %v", how, where, giveups, evs)
	}
	// The breaker: whatever state the exit left, an idle breaker admits
	// a call (no probe held for ever).
	lp2ProbeFree(t, brk)
	// And a fresh call goes through.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ok := 0
	if err := p.Do(ctx, func(context.Context, int) error { ok++; return nil }); err != nil || ok != 1 {
		t.Errorf("after %s in %s: the next call: %v (sent %d)", how, where, err, ok)
	}
}

// lp2Hint is a transient error with a server hint.
type lp2Hint struct{ d time.Duration }

func (e *lp2Hint) Error() string             { return "hint " + e.d.String() }
func (e *lp2Hint) RetryAfter() time.Duration { return e.d }

// TestAttackLoop2MaxRetryAfter150Years: WithMaxRetryAfter above 150 years counts
// as 150 years: a hint of exactly 150 years is honoured (the retry comes
// no sooner, within half again), one a nanosecond longer stops at once
// with Reason Deadline and the hint as the give-up's RetryAfter; Plan
// decides the same.
func TestAttackLoop2MaxRetryAfter150Years(t *testing.T) {
	const year = 365 * 24 * time.Hour
	max150 := 150 * year
	for _, d := range []time.Duration{max150 + 1, max150 + max150/2, 1<<63 - 1} {
		for _, hint := range []time.Duration{max150, max150 + 1, 200 * year} {
			t.Run(fmt.Sprint(d/year, "y/", hint), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p, err := retry.New(retry.WithMaxRetryAfter(d), retry.WithMaxAttempts(2))
					if err != nil {
						t.Fatal(err)
					}
					t0 := time.Now()
					var at []time.Duration
					err = p.Do(context.Background(), func(context.Context, int) error {
						at = append(at, time.Since(t0))
						return &lp2Hint{hint}
					})
					var re *retry.Error
					if !errors.As(err, &re) {
						t.Fatalf("err %v", err)
					}
					if hint > max150 {
						if len(at) != 1 || re.Reason != retry.Deadline || retry.RetryAfter(err) != hint {
							t.Errorf("hint %v above 150 years: %d attempts at %v, reason %v, RetryAfter %v; want 1, Deadline, the hint", hint, len(at), at, re.Reason, retry.RetryAfter(err))
						}
						next := p.Plan()
						if sl, r := next(&lp2Hint{hint}, 0); r != retry.Deadline {
							t.Errorf("Plan: %v %v, want Deadline", sl, r)
						}
						return
					}
					if len(at) != 2 || re.Reason != retry.AttemptsExhausted {
						t.Fatalf("hint of 150 years: %d attempts at %v, reason %v; want 2, AttemptsExhausted", len(at), at, re.Reason)
					}
					if gap := at[1] - at[0]; gap < hint || gap >= hint+hint/2 {
						t.Errorf("slept %v for a hint of %v; want in [hint, 1.5 hint)", gap, hint)
					}
				})
			})
		}
	}
}
