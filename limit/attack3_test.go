// Black-box attacks on limit's waiting rules (the turn rule, the low
// reference) from outside, against limit/doc.go and docs/limit.md.

package limit_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// atk3Warm runs workers goroutines that each do rounds calls of service
// time svc (no deadline), so that the limiter learns a latency of svc.
func atk3Warm(l *limit.Limiter, workers, rounds int, svc time.Duration) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range rounds {
				p, err := l.Acquire(context.Background())
				if err != nil {
					continue
				}
				time.Sleep(svc)
				l.Release(p, false)
			}
		})
	}
	wg.Wait()
}

// atk3Drain takes slots with a done context up to Limit() and releases
// them: it reports how many it got.
func atk3Drain(l *limit.Limiter) int {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var ps []limit.Permit
	for range l.Limit() + 5 {
		p, err := l.Acquire(ctx)
		if err != nil {
			break
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		l.Release(p, true)
	}
	return len(ps)
}

type atk3Result struct {
	p   limit.Permit
	err error
}

func atk3AcquireAsync(l *limit.Limiter, ctx context.Context) <-chan atk3Result {
	ch := make(chan atk3Result, 1)
	go func() {
		p, err := l.Acquire(ctx)
		ch <- atk3Result{p, err}
	}()
	return ch
}

// doc.go "Waiting": "a call whose slot comes with less time left than
// twice the destination's latency ... fails then, when another call waits
// after it, and the slot goes to that call". When a cap is raised (or the
// limit grows) with enough free slots for every waiter, the slot does not
// "go to" the later call (it gets one of its own anyway): the short call
// is refused while a slot stays free and nobody waits.
func TestAttack3TurnRuleRefusesWithFreeSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const svc = 100 * time.Millisecond
		l := atk2New(t, limit.Config{Max: 4})
		atk3Warm(l, 4, 20, svc)
		if l.Limit() != 4 {
			t.Fatalf("limit %d after warm-up, want 4", l.Limit())
		}
		l.SetCap(1)
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// A: 150 ms left (more than the latency, less than twice it).
		ctxA, cancelA := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancelA()
		a := atk3AcquireAsync(l, ctxA)
		synctest.Wait()
		ctxB, cancelB := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancelB()
		b := atk3AcquireAsync(l, ctxB)
		synctest.Wait()
		if in, w := l.SetCap(1); in != 1 || w != 2 {
			t.Fatalf("in flight %d, waiting %d; want 1, 2", in, w)
		}
		// The cap goes: 3 free slots for 2 waiters.
		l.SetCap(-1)
		ra, rb := <-a, <-b
		if rb.err != nil {
			t.Fatalf("B: %v", rb.err)
		}
		in, w := l.SetCap(-1)
		t.Logf("A: %v; after the grants: in flight %d of limit %d, waiting %d", ra.err, in, l.Limit(), w)
		if ra.err != nil {
			t.Errorf("A refused (%v) although %d of %d slots stay free and nobody waits: the slot did not go to a later call", ra.err, l.Limit()-in, l.Limit())
		} else {
			l.Release(ra.p, false)
		}
		l.Release(rb.p, false)
		l.Release(p, false)
		if n := atk3Drain(l); n != l.Limit() {
			t.Errorf("drain got %d, want %d", n, l.Limit())
		}
	})
}

// doc.go "Waiting": "A call whose context ends while it waits leaves then,
// with an error wrapping ErrLimited and the context's error." The
// context's error is ctx.Err() (context.Canceled / DeadlineExceeded).
func TestAttack3CancelCauseWrapsContextError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 1})
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		cause := errors.New("client went away")
		ctx, cancel := context.WithCancelCause(context.Background())
		r := atk3AcquireAsync(l, ctx)
		synctest.Wait()
		cancel(cause)
		res := <-r
		if !errors.Is(res.err, limit.ErrLimited) {
			t.Errorf("err %v, want ErrLimited", res.err)
		}
		if !errors.Is(res.err, ctx.Err()) {
			t.Errorf("canceled with a cause: err %q does not wrap the context's error %v", res.err, ctx.Err())
		}
		ctx2, cancel2 := context.WithTimeoutCause(context.Background(), time.Second, cause)
		defer cancel2()
		r2 := atk3AcquireAsync(l, ctx2)
		res2 := <-r2
		if !errors.Is(res2.err, limit.ErrLimited) || !errors.Is(res2.err, ctx2.Err()) {
			t.Errorf("deadline with a cause: err %q, want it to wrap ErrLimited and %v", res2.err, ctx2.Err())
		}
		l.Release(p, false)
		if n := atk3Drain(l); n != 1 {
			t.Errorf("drain %d, want 1", n)
		}
	})
}

// The last call waiting gets its slot whatever its time left; a short call
// ahead of a later one fails with a reason naming the turn rule.
func TestAttack3TurnRuleBasics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const svc = 100 * time.Millisecond
		// short is less than twice the latency (200 ms) but more than
		// what the check on arrival asks of a call with none ahead: one
		// turn at twice the rate a limit of 1 serves (50 ms) plus the
		// baseline (100 ms). At 150 ms it would be refused on arrival.
		const short = 160 * time.Millisecond
		l := atk2New(t, limit.Config{Max: 1})
		atk3Warm(l, 1, 30, svc)
		p, _ := l.Acquire(context.Background())
		ctxA, cA := context.WithTimeout(context.Background(), short)
		defer cA()
		a := atk3AcquireAsync(l, ctxA)
		synctest.Wait()
		l.Release(p, false) // A alone: it gets the slot
		ra := <-a
		if ra.err != nil {
			t.Fatalf("last waiter refused: %v", ra.err)
		}
		// A holds; B short, C open (no deadline): B fails at its turn, C gets it.
		ctxB, cB := context.WithTimeout(context.Background(), short)
		defer cB()
		b := atk3AcquireAsync(l, ctxB)
		synctest.Wait()
		c := atk3AcquireAsync(l, context.Background())
		synctest.Wait()
		l.Release(ra.p, false)
		rb := <-b
		rc := <-c
		if !errors.Is(rb.err, limit.ErrLimited) || rc.err != nil {
			t.Fatalf("B %v, C %v: want B refused, C granted", rb.err, rc.err)
		}
		t.Logf("B: %v", rb.err)
		if !strings.Contains(rb.err.Error(), "latency") {
			t.Errorf("reason %q does not name the latency", rb.err)
		}
		l.Release(rc.p, false)
		if n := atk3Drain(l); n != 1 {
			t.Errorf("drain %d, want 1", n)
		}
	})
}

// Many concurrent waiters, deadlines and none, cancellations, a rate gate,
// caps moving: no slot lost, no goroutine per waiter.
func TestAttack3StressNoSlotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 20, Throttle: 2, Waiting: 300})
		atk3Warm(l, 20, 10, 10*time.Millisecond)
		var wg sync.WaitGroup
		var inflight, maxIn atomic.Int64
		var okN, refused atomic.Int64
		for i := range 600 {
			wg.Go(func() {
				var ctx context.Context = context.Background()
				var cancel context.CancelFunc = func() {}
				switch i % 4 {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(5+i%50)*time.Millisecond)
				case 1:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(100+i%300)*time.Millisecond)
				case 2:
					ctx, cancel = context.WithCancel(ctx)
					go func() { time.Sleep(time.Duration(i%70) * time.Millisecond); cancel() }()
				}
				defer cancel()
				time.Sleep(time.Duration(i%37) * time.Millisecond)
				p, err := l.Acquire(ctx)
				if err != nil {
					if !errors.Is(err, limit.ErrLimited) {
						t.Errorf("refusal %v does not wrap ErrLimited", err)
					}
					refused.Add(1)
					return
				}
				n := inflight.Add(1)
				for {
					m := maxIn.Load()
					if n <= m || maxIn.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(time.Duration(5+i%20) * time.Millisecond)
				inflight.Add(-1)
				okN.Add(1)
				l.Release(p, i%11 == 0)
			})
		}
		wg.Go(func() {
			for k := range 20 {
				time.Sleep(7 * time.Millisecond)
				switch k % 4 {
				case 0:
					l.SetCap(3)
				case 1:
					l.SetRate(500, 2)
				case 2:
					l.SetCap(-1)
				case 3:
					l.SetRate(0, 0)
				}
			}
			l.SetCap(-1)
			l.SetRate(0, 0)
		})
		time.Sleep(15 * time.Millisecond)
		synctest.Wait()
		waitingG := runtime.NumGoroutine()
		wg.Wait()
		in, w := l.SetCap(-1)
		t.Logf("ok %d refused %d max in flight %d; goroutines mid-run %d; end: in flight %d waiting %d limit %d", okN.Load(), refused.Load(), maxIn.Load(), waitingG, in, w, l.Limit())
		if in != 0 || w != 0 {
			t.Errorf("after everything: in flight %d, waiting %d; want 0, 0", in, w)
		}
		if n := atk3Drain(l); n != l.Limit() {
			t.Errorf("drain got %d, want Limit() %d", n, l.Limit())
		}
	})
}

// doc.go "The limit", Gradient: "The reference is the baseline, or, when
// higher, the latency the destination showed in the last window run at a
// low limit (at most 5, or an eighth of the last healthy limit ...):
// latency that stays high while this client sends little is the
// destination's (a slower service ...), not this client's queue, so the
// limit settles at what the slower destination serves instead of
// collapsing". Limit() is "the current limit ... or lower under a cap".
// Under SetCap(3) every window runs at a limit of 3 (<= 5) and shows the
// slower service's latency; the learned limit, which "goes on learning
// underneath", should not collapse toward 4.
func TestAttack3ReferenceUnderCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 40})
		var svc atomic.Int64
		svc.Store(int64(10 * time.Millisecond))
		var stop atomic.Bool
		var wg sync.WaitGroup
		run := func(workers int) {
			for range workers {
				wg.Go(func() {
					for !stop.Load() {
						p, err := l.Acquire(context.Background())
						if err != nil {
							t.Error(err)
							return
						}
						time.Sleep(time.Duration(svc.Load()))
						l.Release(p, false)
					}
				})
			}
		}
		run(40)
		time.Sleep(2 * time.Second)
		stop.Store(true)
		wg.Wait()
		stop.Store(false)
		if l.Limit() != 40 {
			t.Fatalf("limit %d after warm-up, want 40", l.Limit())
		}
		// The service becomes 5 times slower (infinite servers: the
		// destination serves any number in flight at 50 ms); the owner caps
		// the limit at 3 and 3 callers loop.
		svc.Store(int64(50 * time.Millisecond))
		l.SetCap(3)
		run(3)
		lo := 1 << 30
		for range 60 {
			time.Sleep(50 * time.Millisecond)
			synctest.Wait()
			l.SetCap(-1) // nobody waits: nothing granted
			lo = min(lo, l.Limit())
			l.SetCap(3)
		}
		stop.Store(true)
		wg.Wait()
		t.Logf("learned limit under the cap: lowest %d, at the end %d", lo, func() int { l.SetCap(-1); return l.Limit() }())
		if lo < 20 {
			t.Errorf("learned limit fell to %d while every window ran at a cap of 3 (a low limit) with the slower service's latency: the low window did not become the reference", lo)
		}
	})
}

// doc.go "Waiting": "And at its turn: a call whose slot comes with less
// time left than twice the destination's latency ... fails then, when
// another call waits after it ... The last call waiting gets its slot
// whatever its time left." With the rate gate (SetRate) a call's turn is
// when its token comes; a release before then fails it as if its slot had
// come ("a slot came ..."), although no slot could go to anyone, and when
// the later call leaves before the token, the call would have been the
// last waiter at its turn.
func TestAttack3TurnRuleBeforeTokenUnderRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const svc = 100 * time.Millisecond
		l := atk2New(t, limit.Config{Max: 1})
		atk3Warm(l, 1, 30, svc)
		t0 := time.Now()
		l.SetRate(20, 1) // a token every 50 ms; the first goes to p
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		// A's token comes in [50 ms, 100 ms) (a waiting call's token at a
		// drawn point of its token's time), 145-195 ms before its deadline
		// (more than the baseline, less than twice the latency).
		ctxA, cA := context.WithDeadline(context.Background(), t0.Add(245*time.Millisecond))
		defer cA()
		a := atk3AcquireAsync(l, ctxA)
		synctest.Wait()
		ctxB, cB := context.WithCancel(context.Background())
		b := atk3AcquireAsync(l, ctxB)
		synctest.Wait()
		if _, w := l.SetCap(-1); w != 2 {
			t.Fatalf("waiting %d, want 2", w)
		}
		time.Sleep(40 * time.Millisecond)
		l.Release(p, true) // a slot is free, but no token until 50 ms or later
		synctest.Wait()
		cB() // B leaves before the token: A is the last waiter at its turn
		rb := <-b
		var ra atk3Result
		select {
		case ra = <-a:
			t.Logf("A ended at +%v: %v", time.Since(t0), ra.err)
		default:
			ra = <-a
			t.Logf("A ended at +%v: %v", time.Since(t0), ra.err)
		}
		t.Logf("B: %v", rb.err)
		if ra.err != nil {
			t.Errorf("A refused (%v) at +%v, before its token (due in [+50ms, +100ms)) came; B left at +40ms, so at A's turn no later call waited", ra.err, time.Since(t0))
		} else {
			l.Release(ra.p, false)
		}
		l.SetRate(0, 0)
		if n := atk3Drain(l); n != l.Limit() {
			t.Errorf("drain %d, want %d", n, l.Limit())
		}
	})
}

// doc.go "Waiting": "A waiting call holds no lock and starts no goroutine
// (one timer, for a call with a deadline once a latency is known)";
// SetRate: "one timer per Limiter wakes the list".
func TestAttack3NoGoroutinePerWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 2})
		atk3Warm(l, 2, 20, 10*time.Millisecond)
		l.SetRate(1000, 1)
		ps := []limit.Permit{}
		for range l.Limit() {
			p, err := l.Acquire(context.Background())
			if err == nil {
				ps = append(ps, p)
			}
		}
		base := runtime.NumGoroutine()
		const n = 1000
		var wg sync.WaitGroup
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		for i := range n {
			wg.Go(func() {
				c := ctx
				if i%2 == 0 {
					c = context.Background()
				}
				p, err := l.Acquire(c)
				if err == nil {
					time.Sleep(time.Millisecond)
					l.Release(p, false)
				}
			})
		}
		synctest.Wait()
		got := runtime.NumGoroutine() - base
		if _, w := l.SetCap(-1); w != n {
			t.Fatalf("waiting %d, want %d", w, n)
		}
		if got > n+2 {
			t.Errorf("%d goroutines for %d waiters", got, n)
		}
		for _, p := range ps {
			l.Release(p, false)
		}
		wg.Wait()
		cancel()
		l.SetRate(0, 0)
		if n := atk3Drain(l); n != l.Limit() {
			t.Errorf("drain %d, want %d", n, l.Limit())
		}
	})
}
