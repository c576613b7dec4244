// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package retry_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

type ratkHintErr struct{ d time.Duration }

func (e ratkHintErr) Error() string             { return "503 with hint" }
func (e ratkHintErr) RetryAfter() time.Duration { return e.d }
func (e ratkHintErr) Timeout() bool             { return true }

type ratkRec struct {
	mu sync.Mutex
	ev []observe.Event
}

func (r *ratkRec) Observe(ctx context.Context, e observe.Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

// A hint above WithMaxRetryAfter "counts as a wait that ends past the
// deadline"; Plan calls it the refused sleep; observe says a deadline
// GiveUp's Delay is the refused sleep.
func TestReattackHintOverGiveUpDelay(t *testing.T) {
	rec := &ratkRec{}
	p, err := retry.New(retry.WithMaxRetryAfter(time.Second), retry.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	hint := 2 * time.Minute
	e := p.Do(context.Background(), func(context.Context, int) error { return ratkHintErr{hint} })
	var re *retry.Error
	if !errors.As(e, &re) || re.Reason != retry.Deadline {
		t.Fatalf("got %v", e)
	}
	if got := retry.RetryAfter(e); got != hint {
		t.Errorf("RetryAfter = %v, want %v", got, hint)
	}
	next := p.Plan()
	sleep, stop := next(ratkHintErr{hint}, 0)
	if stop != retry.Deadline || sleep != hint {
		t.Errorf("Plan: %v %v", sleep, stop)
	}
	for _, ev := range rec.ev {
		if ev.Kind == observe.GiveUp {
			if ev.Delay != sleep {
				t.Errorf("GiveUp event Delay = %v; Plan's refused sleep %v (observe: a deadline GiveUp's Delay is the refused sleep)", ev.Delay, sleep)
			}
		}
	}
}

// An attempt that fails exactly at the call's deadline, its timer maybe
// not yet run: late (breaker Cancel, "canceled", classifier not asked).
func TestReattackLateAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var asked atomic.Int32
		b, err := breaker.New(breaker.Config{MinCalls: 1, ConsecutiveFailures: 1})
		if err != nil {
			t.Fatal(err)
		}
		rec := &ratkRec{}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: b}), retry.WithObserver(rec),
			retry.WithClassifier(func(err error) bool { asked.Add(1); return true }))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		dl, _ := ctx.Deadline()
		e := p.Do(ctx, func(context.Context, int) error {
			time.Sleep(time.Until(dl))
			return errors.New("boom")
		})
		var re *retry.Error
		if !errors.As(e, &re) || re.Reason != retry.Deadline || re.Attempts != 1 {
			t.Fatalf("got %v", e)
		}
		if n := asked.Load(); n != 0 {
			t.Errorf("classifier asked %d times", n)
		}
		if s := b.Snapshot(); s.State != breaker.Closed || s.Failures != 0 || s.Calls != 0 {
			t.Errorf("breaker counted the late attempt: %+v", s)
		}
		for _, ev := range rec.ev {
			if ev.Kind == observe.AttemptEnd && ev.Outcome != "canceled" {
				t.Errorf("AttemptEnd outcome %q", ev.Outcome)
			}
		}
	})
}

// The same late attempt under an attempt timeout equal to the rest of the
// call (the attempt's own context ends with the call's deadline).
func TestReattackLateAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var asked atomic.Int32
		b, _ := breaker.New(breaker.Config{MinCalls: 1, ConsecutiveFailures: 1})
		rec := &ratkRec{}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: b}), retry.WithObserver(rec),
			retry.WithAttemptTimeout(time.Hour),
			retry.WithClassifier(func(err error) bool { asked.Add(1); return true }))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		e := p.Do(ctx, func(actx context.Context, _ int) error {
			<-actx.Done()
			return actx.Err()
		})
		var re *retry.Error
		if !errors.As(e, &re) || re.Reason != retry.Deadline {
			t.Fatalf("got %v", e)
		}
		if n := asked.Load(); n != 0 {
			t.Errorf("classifier asked %d times", n)
		}
		if s := b.Snapshot(); s.Failures != 0 || s.State != breaker.Closed {
			t.Errorf("breaker counted: %+v", s)
		}
		for _, ev := range rec.ev {
			if ev.Kind == observe.AttemptEnd && ev.Outcome != "canceled" {
				t.Errorf("AttemptEnd outcome %q", ev.Outcome)
			}
		}
	})
}

// A limiter that admits a wait its caller canceled: nothing is sent.
type ratkLateLimiter struct{}

func (ratkLateLimiter) Wait(ctx context.Context) error { <-ctx.Done(); return nil }

func TestReattackRateCancelSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithRateLimit(ratkLateLimiter{}))
		ctx, cancel := context.WithCancel(context.Background())
		var sent atomic.Int32
		go func() { time.Sleep(time.Second); cancel() }()
		e := p.Do(ctx, func(context.Context, int) error { sent.Add(1); return nil })
		var re *retry.Error
		if !errors.As(e, &re) || re.Reason != retry.Canceled || re.Attempts != 0 {
			t.Fatalf("got %v", e)
		}
		if sent.Load() != 0 {
			t.Fatal("sent")
		}
	})
}

// A limiter that returns nil exactly at the deadline (ctx timer maybe not run).
type ratkDLLimiter struct{}

func (ratkDLLimiter) Wait(ctx context.Context) error {
	dl, _ := ctx.Deadline()
	time.Sleep(time.Until(dl))
	return nil
}

func TestReattackRateAtDeadlineSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithRateLimit(ratkDLLimiter{}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var sent atomic.Int32
		e := p.Do(ctx, func(context.Context, int) error { sent.Add(1); return nil })
		if e == nil || sent.Load() != 0 {
			t.Fatalf("got %v sent %d", e, sent.Load())
		}
	})
}

// A breaker with every waiting place taken: the loop gives up before the
// sleep and the budget withdrawal.
func TestReattackWaitersFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{MaxWaiters: 1, OpenFor: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		bud, err := budget.New(budget.Config{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: b, Budget: bud}), retry.WithMaxAttempts(5))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		wctx, wcancel := context.WithCancel(context.Background())
		defer wcancel()
		start := time.Now()
		var slept time.Duration
		e := p.Do(ctx, func(context.Context, int) error {
			b.Trip(0)
			go func() {
				pm, err := b.Wait(wctx, 50*time.Second)
				if err == nil {
					b.Cancel(pm)
				}
			}()
			synctest.Wait()
			if w := b.Snapshot().Waiters; w != 1 {
				t.Errorf("waiters %d", w)
			}
			return context.DeadlineExceeded
		})
		slept = time.Since(start)
		var re *retry.Error
		if !errors.As(e, &re) || re.Reason != retry.CircuitOpen || re.Attempts != 1 {
			t.Fatalf("got %v", e)
		}
		if slept != 0 {
			t.Errorf("slept %v", slept)
		}
		if s := bud.Stats(); s.Retries != 0 {
			t.Errorf("budget withdrawn: %+v", s)
		}
		wcancel()
	})
}

// "A Permanent mark is removed from Err at every stop": a marked error
// returned as the caller cancels, or at the deadline.
func TestReattackPermanentUnmarkedAtCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := errors.New("base")
		for _, guarded := range []bool{false, true} {
			var opts []retry.Option
			if guarded {
				opts = append(opts, retry.WithObserver(&ratkRec{}))
			}
			p, _ := retry.New(opts...)
			ctx, cancel := context.WithCancel(context.Background())
			e := p.Do(ctx, func(context.Context, int) error { cancel(); return retry.Permanent(base) })
			var re *retry.Error
			if !errors.As(e, &re) || re.Reason != retry.Canceled || re.Err != base {
				t.Errorf("guarded=%v: %#v", guarded, e)
			}
			ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
			e = p.Do(ctx2, func(context.Context, int) error { time.Sleep(time.Second); return retry.Permanent(base) })
			cancel2()
			if !errors.As(e, &re) || re.Reason != retry.Deadline || re.Err != base {
				t.Errorf("guarded=%v deadline: %#v", guarded, e)
			}
		}
	})
}
