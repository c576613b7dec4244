// Black-box attack (AREA=slots): leaks and bounds of the limiter's slots
// and the breaker's permits under concurrency, alone and together through
// the retry loop (retry.WithGuards). Every test runs in a testing/synctest
// bubble; tests of things that held are kept as regression tests.

package retry_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// sltHalf pins a breaker's jitter: every open period is exactly OpenFor.
func sltHalf() float64 { return 0.5 }

// sltInFlight returns the limiter's attempts in flight and calls waiting,
// the cap left as it is (SetCap(-1) on a limiter without a cap reads
// them).
func sltInFlight(l *limit.Limiter) (int, int) { return l.SetCap(-1) }

// sltBubbleGoroutines returns the goroutines of the calling goroutine's
// synctest bubble (runtime.NumGoroutine counts the whole process, whose
// own goroutines, outside the bubble, come and go) and their stacks.
func sltBubbleGoroutines() (int, string) {
	buf := make([]byte, 1<<20)
	all := string(buf[:runtime.Stack(buf, true)])
	n := 0
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(strings.SplitN(g, "\n", 2)[0], "synctest bubble") {
			n++
		}
	}
	return n, all
}

// sltHalfOpen builds a breaker with one probe per round and brings it to
// half-open with its round not started: the next Allow takes the probe.
func sltHalfOpen(t *testing.T, extra breaker.Config) *breaker.Breaker {
	t.Helper()
	extra.OpenFor = time.Second
	extra.Probes = 1
	extra.Rand = sltHalf
	brk, err := breaker.New(extra)
	if err != nil {
		t.Fatal(err)
	}
	brk.Trip(0)
	time.Sleep(time.Second) // the open period is over: the next call starts the round
	return brk
}

// sltProbeFree reports whether the breaker, half-open with nobody holding
// a probe, still has one to give: a probe taken and never given back
// holds its slot forever (package breaker's doc).
func sltProbeFree(brk *breaker.Breaker) (bool, error) {
	p, err := brk.Allow()
	if err != nil {
		return false, err
	}
	brk.Cancel(p)
	return true, nil
}

// sltPanicBudget is a retry budget whose Deposit panics: the documented
// case of a nil pointer of the caller's own type whose methods read their
// receiver (Guards.Budget: "panics on the call's goroutine, at the call's
// first deposit, before anything is sent").
type sltPanicBudget struct{ n int }

func (b *sltPanicBudget) Deposit()       { b.n++ }
func (b *sltPanicBudget) Withdraw() bool { return b.n > 0 }

// TestAttackSlotsBudgetPanicLeaksSlotAndProbe: a Budget whose Deposit panics (a nil
// *sltPanicBudget, the case Guards.Budget describes) panics after the
// breaker admitted the attempt and the limiter gave it a slot. Neither is
// given back: the limiter keeps an attempt in flight for good, and a
// half-open breaker's probe is held for ever (no later call is admitted).
func TestAttackSlotsBudgetPanicLeaksSlotAndProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		brk := sltHalfOpen(t, breaker.Config{})
		var nilBudget *sltPanicBudget
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: nilBudget, Breaker: brk, Limiter: lim}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		sent := 0
		var v any
		func() {
			defer func() { v = recover() }()
			_ = p.Do(ctx, func(context.Context, int) error { sent++; return nil })
		}()
		if v == nil {
			t.Fatal("the nil budget's Deposit did not panic")
		}
		if sent != 0 {
			t.Errorf("sent %d attempts, want 0 (the panic is at the first deposit, before anything is sent)", sent)
		}
		if in, w := sltInFlight(lim); in != 0 || w != 0 {
			t.Errorf("after the panic: limiter in flight %d, waiting %d; want 0 and 0 (every slot is released exactly once, panics included)", in, w)
		}
		if ok, err := sltProbeFree(brk); !ok {
			t.Errorf("after the panic the half-open breaker admits nothing (%v, state %v): its probe was never given back", err, brk.State())
		}
		// And an hour later: the round never ends.
		time.Sleep(time.Hour)
		if ok, err := sltProbeFree(brk); !ok {
			t.Errorf("an hour later the breaker still admits nothing (%v, state %v)", err, brk.State())
		}
	})
}

// sltWaitPanicObs panics when the loop reports a call admitted after a
// wait behind the breaker.
type sltWaitPanicObs struct{}

func (sltWaitPanicObs) Observe(_ context.Context, e observe.Event) {
	if e.Kind == observe.BreakerWait && e.Outcome == "admitted" {
		panic("observer: breaker-wait")
	}
}

// TestAttackSlotsObserverPanicAtBreakerWaitLeaksProbe: a call waits behind an open
// breaker, is handed the round's probe, and the observer panics while the
// loop reports the wait (before the attempt's start). The probe is never
// given back: the breaker stays half-open, admitting nothing, for ever.
// WithGuards: "Every admitted attempt is reported back to the breaker,
// exactly once"; package breaker: "a probe that is never given back holds
// its slot forever". The loop covers panics of the observer from the
// attempt's start on (its AttemptStart included), not this one.
func TestAttackSlotsObserverPanicAtBreakerWaitLeaksProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1, Rand: sltHalf})
		lim, _ := limit.New(limit.Config{Max: 4})
		brk.Trip(0)
		p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}), retry.WithObserver(sltWaitPanicObs{}))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var v any
		func() {
			defer func() { v = recover() }()
			_ = p.Do(ctx, func(context.Context, int) error { return nil })
		}()
		if v == nil {
			t.Fatal("the observer did not panic (the call was not admitted after a wait)")
		}
		if in, w := sltInFlight(lim); in != 0 || w != 0 {
			t.Errorf("limiter in flight %d, waiting %d; want 0, 0", in, w)
		}
		time.Sleep(time.Hour)
		if ok, err := sltProbeFree(brk); !ok {
			t.Errorf("an hour after the panic the breaker admits nothing (%v, state %v): the probe handed to the call was never given back", err, brk.State())
		}
	})
}

// sltCountBudget counts deposits and withdrawals (always granted).
type sltCountBudget struct{ dep, wd atomic.Int64 }

func (b *sltCountBudget) Deposit()       { b.dep.Add(1) }
func (b *sltCountBudget) Withdraw() bool { b.wd.Add(1); return true }

// sltCancelAtRelease runs n calls that wait behind a tripped breaker (its
// release all at once) and cancels every one at the instant the breaker is
// reset. retryN: the breaker trips on the calls' first attempt, so that
// the wait is before their second. It returns how many attempts ran on a
// context already canceled when op was called, how many ran at all after
// the trip, and the deposits.
//
// The instant is made exact by running on one P: the goroutine that
// resets the breaker cancels every caller before any waiter runs again, as
// a release and a cancel that meet at one instant do on a busy machine.
func sltCancelAtRelease(t *testing.T, n int, retryN bool) (canceledAtStart, after int, deposits int64) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: sltHalf, ReleaseRate: -1})
	lim, _ := limit.New(limit.Config{Max: 1 << 20})
	bud := &sltCountBudget{}
	p, err := retry.New(retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk, Limiter: lim}),
		retry.WithMaxAttempts(5), retry.WithBackoff(mustBackoff(t, 0, time.Millisecond, time.Millisecond, 0.5)))
	if err != nil {
		t.Fatal(err)
	}
	if !retryN {
		brk.Trip(0)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, n)
	gate := make(chan struct{})
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cancels[i] = cancel
		wg.Go(func() {
			defer cancel()
			_ = p.Do(ctx, func(actx context.Context, attempt int) error {
				if retryN && attempt == 1 {
					<-gate // every call's first attempt runs; the breaker trips; they fail
					return err503
				}
				mu.Lock()
				defer mu.Unlock()
				after++
				if ctx.Err() != nil {
					canceledAtStart++
				}
				return nil
			})
		})
	}
	if retryN {
		synctest.Wait()
		brk.Trip(0)
		close(gate)
	}
	// At one instant: the breaker closes, and every caller cancels.
	time.Sleep(5 * time.Second)
	brk.Reset()
	for _, cancel := range cancels {
		cancel()
	}
	wg.Wait()
	if retryN {
		deposits = bud.dep.Load() - int64(n) // the first attempts' own
	} else {
		deposits = bud.dep.Load()
	}
	return canceledAtStart, after, deposits
}

// TestAttackSlotsCanceledAtReleaseFirstAttemptSent: calls that waited behind an
// open breaker are canceled at the very instant it closes (its release all
// at once). A call whose context ended before its attempt started must
// send nothing and deposit nothing (Guards.Budget: "a call the breaker
// rejects or the limiter refuses, or whose context ended before it
// started, sends nothing and deposits nothing"; package limit: "a call
// that waited never gets a slot it has no time to use"). The loop does
// not look at the context after the breaker's wait: the breaker's Wait
// may return its permit to a canceled caller (its select finds the
// release and the cancel both ready), and the limiter then gives a done
// context a free slot, so op runs on a canceled context and the budget
// gets a deposit.
func TestAttackSlotsCanceledAtReleaseFirstAttemptSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, after, dep := sltCancelAtRelease(t, 200, false)
		t.Logf("attempts after the release: %d, on a canceled context: %d, deposits: %d", after, c, dep)
		if c > 0 {
			t.Errorf("%d of 200 first attempts ran on a context canceled before they started (deposits %d); want 0", c, dep)
		}
	})
}

// TestAttackSlotsCanceledAtReleaseRetried: the same before a second attempt: the
// first attempt failed (503) and tripped the breaker, the call waits for
// it, and is canceled at the instant it closes. Policy.Do: "A canceled
// call is never retried".
func TestAttackSlotsCanceledAtReleaseRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, after, _ := sltCancelAtRelease(t, 200, true)
		t.Logf("retries after the release: %d, on a canceled context: %d", after, c)
		if c > 0 {
			t.Errorf("%d of 200 canceled calls were retried (their second attempt ran on the canceled context); want 0", c)
		}
	})
}

// sltStormObs counts the loop's events, and checks that no call reports an
// attempt's end without its start.
type sltStormObs struct {
	mu     sync.Mutex
	starts int
	ends   int
	kinds  map[string]int
}

func (o *sltStormObs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch e.Kind {
	case observe.AttemptStart:
		o.starts++
	case observe.AttemptEnd:
		o.ends++
	}
	k := string(e.Kind)
	if e.Kind == observe.GiveUp {
		k += ":" + e.Reason
	}
	o.kinds[k]++
}

// TestAttackSlotsStormGuardsTogether: 48 callers through one policy with a budget,
// a breaker and a limiter, for 20 s of bubble time: contexts canceled
// before the call, while it waits for a slot or behind the open breaker,
// during the attempt, at its deadline; attempts that succeed, fail (503),
// answer 404, hang to their timeout or panic; meanwhile the breaker is
// tripped and reset, the limiter's cap and rate changed, and other
// goroutines use the limiter and the breaker directly (zero permits
// included). After the storm: nothing in flight, no call waiting in
// either, no goroutine left, the limit within [1, Max], a half-open
// breaker with a probe to give, and never more attempts in flight than
// Max.
func TestAttackSlotsStormGuardsTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const max = 16
		base, _ := sltBubbleGoroutines()
		lim, _ := limit.New(limit.Config{Max: max, Timeout: 200 * time.Millisecond, Waiting: 24})
		brk, _ := breaker.New(breaker.Config{OpenFor: 150 * time.Millisecond, Probes: 2, MaxWaiters: 20,
			Window: time.Second, MinCalls: 10, SlowCall: 120 * time.Millisecond})
		bud, _ := budget.New(budget.Config{})
		obs := &sltStormObs{kinds: map[string]int{}}
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk, Limiter: lim}),
			retry.WithMaxAttempts(4), retry.WithAttemptTimeout(80*time.Millisecond),
			retry.WithBackoff(mustBackoff(t, 0, 5*time.Millisecond, 40*time.Millisecond, 0.5)),
			retry.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		var inOp, peak atomic.Int64
		var panics, calls, ops atomic.Int64
		stop := make(chan struct{})
		stopped := func() bool {
			select {
			case <-stop:
				return true
			default:
				return false
			}
		}
		var wg sync.WaitGroup
		for g := range 48 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 7))
				for !stopped() {
					calls.Add(1)
					var ctx context.Context
					var cancel context.CancelFunc
					switch r.IntN(5) {
					case 0: // canceled before the call
						ctx, cancel = context.WithCancel(context.Background())
						cancel()
					case 1: // no deadline, canceled at some point
						ctx, cancel = context.WithCancel(context.Background())
						time.AfterFunc(time.Duration(r.IntN(300))*time.Millisecond, cancel)
					default:
						ctx, cancel = context.WithTimeout(context.Background(), time.Duration(1+r.IntN(600))*time.Millisecond)
					}
					kind := r.IntN(24)
					d := time.Duration(r.IntN(60)) * time.Millisecond
					func() {
						defer func() {
							if v := recover(); v != nil {
								panics.Add(1)
							}
						}()
						_ = p.Do(ctx, func(actx context.Context, attempt int) error {
							ops.Add(1)
							n := inOp.Add(1)
							defer inOp.Add(-1)
							for {
								pk := peak.Load()
								if n <= pk || peak.CompareAndSwap(pk, n) {
									break
								}
							}
							t := time.NewTimer(d)
							defer t.Stop()
							switch kind {
							case 0: // hangs until its context ends
								<-actx.Done()
								return actx.Err()
							case 1:
								panic("op panics")
							}
							select {
							case <-t.C:
							case <-actx.Done():
								return actx.Err()
							}
							switch kind {
							case 2, 3:
								return err503
							case 4:
								return err404
							}
							return nil
						})
					}()
					cancel()
					time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
				}
			})
		}
		// Direct users of the limiter and the breaker beside the loop.
		for g := range 6 {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 99))
				for !stopped() {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.IntN(200))*time.Millisecond)
					if r.IntN(2) == 0 {
						if pm, err := lim.Acquire(ctx); err == nil {
							time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
							lim.Release(pm, r.IntN(3) == 0)
						}
						lim.Release(limit.Permit{}, r.IntN(2) == 0) // zero permits: nothing
					} else {
						if bp, err := brk.Wait(ctx, time.Duration(r.IntN(400))*time.Millisecond); err == nil {
							time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
							switch r.IntN(10) {
							case 0:
								brk.Fail(bp, time.Duration(r.IntN(100))*time.Millisecond)
							case 1, 2:
								brk.Cancel(bp)
							default:
								brk.Done(bp, true)
							}
						}
						brk.Done(breaker.Permit{}, false)
						brk.Cancel(breaker.Permit{})
					}
					cancel()
					time.Sleep(time.Duration(r.IntN(10)) * time.Millisecond)
				}
			})
		}
		// The chaos: trips, resets, caps and rates.
		wg.Go(func() {
			r := rand.New(rand.NewPCG(1, 2))
			for !stopped() {
				switch r.IntN(12) {
				case 0:
					brk.Trip(time.Duration(r.IntN(200)) * time.Millisecond)
				case 1:
					brk.Reset()
				case 2:
					lim.SetCap(r.IntN(20) - 1)
				case 3:
					lim.SetCap(-1)
				case 4:
					lim.SetRate(float64(50+r.IntN(500)), float64(r.IntN(8)))
				case 5, 6, 7:
					lim.SetRate(0, 0)
				}
				if l := lim.Limit(); l < 0 || l > max {
					t.Errorf("Limit() = %d during the storm, want within [0 (a cap of 0), %d]", l, max)
				}
				if s := brk.Snapshot(); s.Waiters > 20 {
					t.Errorf("breaker: %d waiters, MaxWaiters 20", s.Waiters)
				}
				if _, w := lim.SetCap(-2); w > 24 {
					t.Errorf("limiter: %d waiting, Waiting 24", w)
				}
				time.Sleep(time.Duration(1+r.IntN(100)) * time.Millisecond)
			}
		})
		time.Sleep(20 * time.Second)
		close(stop)
		wg.Wait()
		lim.SetRate(0, 0)
		in, w := lim.SetCap(-1)
		t.Logf("calls %d, ops %d, panics %d, peak in op %d; events %v", calls.Load(), ops.Load(), panics.Load(), peak.Load(), obs.kinds)
		if in != 0 || w != 0 {
			t.Errorf("after the storm: limiter in flight %d, waiting %d; want 0, 0", in, w)
		}
		if pk := peak.Load(); pk > max {
			t.Errorf("peak attempts in op %d > Max %d", pk, max)
		}
		if l := lim.Limit(); l < 1 || l > max {
			t.Errorf("Limit() = %d, want within [1, %d]", l, max)
		}
		if s := brk.Snapshot(); s.Waiters != 0 {
			t.Errorf("breaker waiters after the storm: %d", s.Waiters)
		}
		if brk.State() == breaker.HalfOpen {
			if ok, err := sltProbeFree(brk); !ok {
				t.Errorf("half-open after the storm with nobody calling, and no probe to give: %v", err)
			}
		}
		if obs.starts != obs.ends {
			t.Errorf("observer: %d attempt starts, %d ends", obs.starts, obs.ends)
		}
		// Every slot is back: Max slots can be taken at once with a done
		// context (which takes only free slots), once the limit is Max.
		synctest.Wait()
		if n, stacks := sltBubbleGoroutines(); n != base {
			t.Errorf("goroutines in the bubble after the storm: %d, before: %d\n%s", n, base, stacks)
		}
	})
}

// TestAttackSlotsStaleProbeSentWhileOpen: two calls wait behind an open breaker
// (Probes 2) and are handed the round's probes; the limiter's one slot is
// taken, so both wait for it. The first probe gets the slot and fails: the
// breaker reopens. The second probe's round is over, yet when the slot
// comes it is sent to the dependency the breaker has just judged down, its
// outcome thrown away (Done drops a permit of an older generation).
// Package breaker: "Open: calls are not made"; Guards.Limiter: "If the
// breaker opened while the attempt waited for its slot ... nothing is
// sent" (the loop checks it for a closed-state permit only).
func TestAttackSlotsStaleProbeSentWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 2, Rand: sltHalf})
		lim, _ := limit.New(limit.Config{Max: 1})
		p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}), retry.WithMaxAttempts(1))
		brk.Trip(0)
		hold, _ := lim.Acquire(context.Background())
		var sent, sentOpen atomic.Int64
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = p.Do(ctx, func(actx context.Context, _ int) error {
					sent.Add(1)
					if brk.State() == breaker.Open {
						sentOpen.Add(1)
					}
					time.Sleep(100 * time.Millisecond)
					return err503
				})
			})
		}
		time.Sleep(1500 * time.Millisecond) // the round at 1 s hands both calls a probe
		if s := brk.Snapshot(); s.State != breaker.HalfOpen {
			t.Fatalf("breaker %v, want half-open with both probes handed out", s.State)
		}
		lim.Release(hold, false) // the first probe goes, fails, reopens the breaker
		wg.Wait()
		if n := sentOpen.Load(); n > 0 {
			t.Errorf("%d of %d attempts (all probes) were sent while the breaker was open; want 0", n, sent.Load())
		}
	})
}

// TestAttackSlotsLimiterEDFWithCancelsAndCapChanges: 60 calls with distinct
// deadlines (seconds away, arriving in shuffled order) wait for a limiter
// whose slots are all held; a third of them are canceled at random
// instants, some at the very instant a slot is released, while the cap
// goes up and down. Every grant must go to the waiting call with the
// earliest deadline (Acquire: "calls with a deadline earliest deadline
// first"), a canceled call must get no slot, and at the end nothing is in
// flight and nobody waits.
func TestAttackSlotsLimiterEDFWithCancelsAndCapChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, _ := sltBubbleGoroutines()
		lim, _ := limit.New(limit.Config{Max: 4})
		var holds []limit.Permit
		for range 4 {
			h, err := lim.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			holds = append(holds, h)
		}
		r := rand.New(rand.NewPCG(3, 4))
		const n = 60
		order := r.Perm(n)
		var mu sync.Mutex
		waiting := map[int]bool{} // deadline index -> still waiting: whether it is canceled at some point
		var bad []string
		grantedAt := map[int]time.Duration{}
		canceledK := map[int]bool{}
		var wg sync.WaitGroup
		grants := make(chan limit.Permit, n)
		start := time.Now()
		for _, k := range order {
			ctx, cancel := context.WithDeadline(context.Background(), start.Add(time.Minute+time.Duration(k)*time.Second))
			canceled := r.IntN(3) == 0
			cancelAt := time.Duration(r.IntN(40)) * 10 * time.Millisecond // on the 10 ms grid of the releases
			mu.Lock()
			waiting[k] = canceled
			canceledK[k] = canceled
			mu.Unlock()
			wg.Go(func() {
				defer cancel()
				if canceled {
					time.AfterFunc(cancelAt, cancel)
				}
				p, err := lim.Acquire(ctx)
				mu.Lock()
				defer mu.Unlock()
				delete(waiting, k)
				if err != nil {
					if !canceled {
						bad = append(bad, fmt.Sprintf("call %d refused: %v", k, err))
					}
					return
				}
				grantedAt[k] = time.Since(start)
				grants <- p
			})
		}
		synctest.Wait()
		// One slot every 10 ms; the cap drops and rises meanwhile.
		for i := 0; ; i++ {
			mu.Lock()
			left := len(waiting)
			mu.Unlock()
			if left == 0 {
				break
			}
			if len(holds) > 0 {
				lim.Release(holds[0], false)
				holds = holds[1:]
			}
			if i%7 == 3 {
				lim.SetCap(0)
				lim.SetCap(-1)
			}
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
			for len(grants) > 0 {
				holds = append(holds, <-grants)
			}
		}
		wg.Wait()
		for _, h := range holds {
			lim.Release(h, false)
		}
		for j := range n {
			for k := j + 1; k < n; k++ {
				tj, okj := grantedAt[j]
				tk, okk := grantedAt[k]
				if okj && okk && !canceledK[j] && tj > tk {
					bad = append(bad, fmt.Sprintf("call %d granted at %v, before call %d (earlier deadline, not canceled) at %v", k, tk, j, tj))
				}
			}
		}
		for _, b := range bad {
			t.Error(b)
		}
		if in, w := sltInFlight(lim); in != 0 || w != 0 {
			t.Errorf("at the end: in flight %d, waiting %d", in, w)
		}
		time.Sleep(time.Second) // the cancels still armed run out
		synctest.Wait()
		if g, stacks := sltBubbleGoroutines(); g != base {
			t.Errorf("goroutines in the bubble: %d, before %d\n%s", g, base, stacks)
		}
	})
}

// TestAttackSlotsHopelessFailFastThroughLoop: through the loop, calls that cannot
// make their deadline fail at once with their documented reason, not at
// their deadline: behind a breaker whose next round comes after the
// deadline (Reason CircuitOpen), and behind the limiter's rate gate with
// more calls ahead than tokens before the deadline (Reason Limited, "no
// token"), 60 callers at once.
func TestAttackSlotsHopelessFailFastThroughLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: sltHalf})
		lim, _ := limit.New(limit.Config{Max: 1000})
		lim.SetRate(10, 1)
		p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}), retry.WithMaxAttempts(1))
		var mu sync.Mutex
		count := map[string]int{}
		var wg sync.WaitGroup
		start := time.Now()
		for range 60 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				err := p.Do(ctx, func(context.Context, int) error { return nil })
				k := "ok"
				if err != nil {
					var re *retry.Error
					if !errors.As(err, &re) {
						t.Errorf("not a *retry.Error: %v", err)
						return
					}
					k = "other: " + err.Error()
					if re.Reason == retry.Limited {
						k = "limited"
					}
					if el := time.Since(start); el > 0 {
						t.Errorf("refused after %v (%v), want at once", el, err)
					}
					if !errors.Is(err, limit.ErrLimited) {
						t.Errorf("refusal %v does not wrap limit.ErrLimited", err)
					}
				}
				mu.Lock()
				count[k]++
				mu.Unlock()
			})
		}
		wg.Wait()
		if count["ok"] != 10 || count["limited"] != 50 {
			t.Errorf("outcomes %v, want 10 ok (one token per 100 ms in 1 s) and 50 limited at once", count)
		}
		brk.Trip(0)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		t0 := time.Now()
		err := p.Do(ctx, func(context.Context, int) error { return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.CircuitOpen || time.Since(t0) != 0 || !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("behind a breaker open for 10 s with 5 s left: %v after %v; want CircuitOpen at once", err, time.Since(t0))
		}
	})
}
