// Black-box attacks (AREA breaker9) on how the retry loop drives the
// circuit breaker: the re-ask after a limiter wait, the probe rounds.

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
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

func b9Half() float64 { return 0.5 }

type b9Budget struct{ deposits, withdrawals atomic.Int32 }

func (b *b9Budget) Deposit()       { b.deposits.Add(1) }
func (b *b9Budget) Withdraw() bool { b.withdrawals.Add(1); return true }

// Guards: "If the breaker opened while the attempt waited for its slot (a
// closed-state permit, the breaker no longer closed), nothing is sent: the
// slot goes back as a cancelled attempt's (a drop) and the attempt asks the
// breaker again (it may wait behind it)." WithGuards: "A call without a
// deadline ... is rejected at once (fails fast) ... On the first attempt
// the error's Err is the *breaker.OpenError". Budget: "a call the breaker
// rejects ... deposits nothing".
func TestAttackBreaker9ReaskNoDeadlineFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: b9Half})
		bud := &b9Budget{}
		p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim, Budget: bud}))
		hold, _ := lim.Acquire(context.Background())
		var sent atomic.Int32
		errc := make(chan error, 1)
		go func() {
			errc <- p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				sent.Add(1)
				return nil
			})
		}()
		synctest.Wait()
		brk.Trip(0)
		lim.Release(hold, false)
		synctest.Wait()
		err := <-errc
		var re *retry.Error
		var oe *breaker.OpenError
		if !errors.As(err, &re) || re.Reason != retry.CircuitOpen || re.Attempts != 0 {
			t.Fatalf("err %v; want CircuitOpen after 0 attempts", err)
		}
		if !errors.As(re.Err, &oe) || oe.State != breaker.Open {
			t.Errorf("Err %v (%T); want the *breaker.OpenError", re.Err, re.Err)
		}
		if got := retry.RetryAfter(err); got <= 0 || got > 10*time.Second {
			t.Errorf("RetryAfter %v", got)
		}
		if sent.Load() != 0 || bud.deposits.Load() != 0 {
			t.Errorf("sent %d, deposits %d; want 0, 0", sent.Load(), bud.deposits.Load())
		}
		// The slot went back: another acquire gets it at once.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		if s, err := lim.Acquire(ctx); err != nil {
			t.Errorf("the slot was not given back: %v", err)
		} else {
			lim.Release(s, false)
		}
	})
}

// The same, with a deadline: the attempt waits behind the breaker, is
// handed the probe of the round at 10 s, and that is attempt 1 (nothing
// was sent before), marked as a probe; the budget gets one deposit.
func TestAttackBreaker9ReaskWithDeadlineWaitsForProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: b9Half, Probes: 1})
		bud := &b9Budget{}
		p, _ := retry.New(retry.WithMaxAttempts(1), retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim, Budget: bud}))
		hold, _ := lim.Acquire(context.Background())
		type send struct {
			at      time.Duration
			attempt int
			probe   bool
			state   breaker.State
		}
		var mu sync.Mutex
		var sends []send
		start := time.Now()
		errc := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errc <- p.Do(ctx, func(ctx context.Context, attempt int) error {
				mu.Lock()
				sends = append(sends, send{time.Since(start), attempt, retry.IsProbe(ctx), brk.State()})
				mu.Unlock()
				return nil
			})
		}()
		synctest.Wait()
		brk.Trip(0)
		time.Sleep(time.Second)
		lim.Release(hold, false)
		err := <-errc
		mu.Lock()
		defer mu.Unlock()
		t.Logf("err %v; sends %+v; state %v; deposits %d", err, sends, brk.State(), bud.deposits.Load())
		if err != nil || len(sends) != 1 || sends[0].attempt != 1 || !sends[0].probe || sends[0].at != 10*time.Second {
			t.Errorf("want one send, attempt 1, a probe, at 10s")
		}
		if brk.State() != breaker.Closed || bud.deposits.Load() != 1 {
			t.Errorf("state %v deposits %d", brk.State(), bud.deposits.Load())
		}
	})
}

// The re-ask on a later attempt: attempt 1 fails (a closed breaker counts
// it), attempt 2 waits for the slot while a fleet trips the breaker, and
// the call has no deadline: CircuitOpen with Attempts 1, Err the last
// error, the OpenError reachable.
func TestAttackBreaker9ReaskLaterAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: b9Half})
		p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}))
		var n atomic.Int32
		errc := make(chan error, 1)
		go func() {
			errc <- p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				n.Add(1)
				return b9Hint{time.Second} // retryable, sleeps [1 s, 1.5 s)
			})
		}()
		synctest.Wait() // attempt 1 done, the loop sleeps
		hold, err := lim.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // attempt 2: admitted by the closed breaker, waits for the slot
		synctest.Wait()
		brk.Trip(0)
		lim.Release(hold, false)
		err = <-errc
		var re *retry.Error
		var oe *breaker.OpenError
		t.Logf("err %v; sends %d", err, n.Load())
		if !errors.As(err, &re) || re.Reason != retry.CircuitOpen {
			t.Fatalf("err %v; want CircuitOpen", err)
		}
		if re.Attempts != 1 || n.Load() != 1 || !errors.As(re.Err, new(b9Hint)) || !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("Attempts %d (sent %d), Err %v, OpenError reachable %v", re.Attempts, n.Load(), re.Err, errors.As(err, &oe))
		}
	})
}

type b9Hint struct{ d time.Duration }

func (h b9Hint) Error() string             { return "busy" }
func (h b9Hint) RetryAfter() time.Duration { return h.d }

// WithGuards: "An open one makes a call with a deadline wait ... when its
// next probe round comes before the deadline: the call ... may be handed a
// probe". A fleet first opens the breaker for a server's Retry-After of an
// hour while a call waits, then Resets it (the dependency is back); it
// fails again and the fleet trips it for the usual OpenFor (1 s). Calls
// with 20 s deadlines that meet the open breaker now must be handed the
// round's probe at 1 s and succeed (the dependency is back by then).
func TestAttackBreaker9RoundAfterFleetResetThroughRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Rand: b9Half, Probes: 1})
		p, _ := retry.New(retry.WithMaxAttempts(1), retry.WithGuards(retry.Guards{Breaker: brk}))
		brk.Trip(time.Hour)
		first := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Hour)
			defer cancel()
			first <- p.Do(ctx, func(ctx context.Context, attempt int) error { return nil })
		}()
		synctest.Wait()
		time.Sleep(time.Minute)
		brk.Reset()
		if err := <-first; err != nil {
			t.Fatalf("first call: %v", err)
		}
		brk.Trip(0)
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		var errs []error
		var served []time.Duration
		for range 5 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err := p.Do(ctx, func(ctx context.Context, attempt int) error {
					mu.Lock()
					served = append(served, time.Since(start))
					mu.Unlock()
					return nil
				})
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			})
		}
		wg.Wait()
		failed := 0
		for _, e := range errs {
			if e != nil {
				failed++
			}
		}
		t.Logf("served at %v; %d of 5 failed, e.g. %v", served, failed, errs[0])
		if failed > 0 {
			t.Errorf("%d of 5 calls failed (waited their 20 s deadline out) behind a breaker whose round was due at 1 s", failed)
		}
	})
}
