package retry_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// mustLimiter builds a limiter or fails the test.
func mustLimiter(t testing.TB, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatalf("limit.New: %v", err)
	}
	return l
}

// TestLimiterSlotReleased: whatever way an attempt ends, its slot is given
// back: with a limit of one, the next call (no deadline, so it cannot
// wait) gets a slot at once.
func TestLimiterSlotReleased(t *testing.T) {
	tests := []struct {
		name string
		opts []retry.Option
		op   func(context.Context, int) error
		want retry.Reason // 0: success
	}{
		{"success", nil, succeed, 0},
		{"404", nil, func(context.Context, int) error { return err404 }, retry.NotRetryable},
		{"503 three times", []retry.Option{retry.WithBackoff(mustBackoff(t, 0, time.Millisecond, time.Millisecond, 0))},
			func(context.Context, int) error { return err503 }, retry.AttemptsExhausted},
		{"attempt timeout", []retry.Option{retry.WithMaxAttempts(1), retry.WithAttemptTimeout(time.Millisecond)},
			func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() }, retry.AttemptsExhausted},
		{"panic", nil, func(context.Context, int) error { panic("boom") }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := mustLimiter(t, limit.Config{Max: 1})
			p := mustNew(t, append([]retry.Option{retry.WithGuards(retry.Guards{Limiter: lim})}, tt.opts...)...)
			for i := range 3 {
				err := func() (err error) {
					defer func() {
						if v := recover(); v != nil {
							err = nil
						}
					}()
					return p.Do(context.Background(), tt.op)
				}()
				if tt.want == 0 && err != nil {
					t.Fatalf("call %d = %v, want success", i, err)
				}
				if tt.want != 0 {
					checkStop(t, err, tt.want, asError(t, err).Attempts)
				}
			}
			if err := p.Do(context.Background(), succeed); err != nil {
				t.Errorf("a call after the others = %v: a slot was not given back", err)
			}
		})
	}
}

// TestLimiterFullFailsFast: a call that meets a full limit and cannot
// wait (waiting off) sends nothing, deposits nothing, leaves no outcome
// with the breaker, and stops with Reason Limited (the limiter's error as
// Err).
func TestLimiterFullFailsFast(t *testing.T) {
	lim := mustLimiter(t, limit.Config{Max: 1, Waiting: -1})
	brk, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bud := &countingBudget{inner: mustBudget(t, 0.1, 1)}
	p := mustNew(t, retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk, Limiter: lim}))
	held, err := lim.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	err = p.Do(context.Background(), script(&calls))
	re := checkStop(t, err, retry.Limited, 0)
	if !errors.Is(err, limit.ErrLimited) || !errors.Is(re.Err, limit.ErrLimited) {
		t.Errorf("Do = %v (Err %v), want it to wrap limit.ErrLimited", err, re.Err)
	}
	if calls != 0 || bud.deposits.Load() != 0 {
		t.Errorf("a refused call ran op %d times and deposited %d times, want 0 and 0", calls, bud.deposits.Load())
	}
	if s := brk.Snapshot(); s.Calls != 0 {
		t.Errorf("breaker counted %d calls, want none: a refused attempt has no outcome", s.Calls)
	}
	lim.Release(held, false)
	if err := p.Do(context.Background(), script(&calls)); err != nil || calls != 1 {
		t.Errorf("Do after the release = %v after %d calls, want success after 1", err, calls)
	}
}

// TestLimiterWaits: a call with a deadline waits for a slot within it (on
// synctest's clock), a call without one until a slot comes, and its
// attempt timeout starts when it gets one; it stops with Reason Limited
// when its deadline passes first, Canceled when its caller cancels.
func TestLimiterWaits(t *testing.T) {
	tests := []struct {
		name     string
		deadline time.Duration // 0: none
		cancelAt time.Duration // 0: never
		want     retry.Reason  // 0: success
		wantAt   time.Duration // when Do returns
	}{
		{"slot before the deadline", 5 * time.Second, 0, 0, time.Second + 100*time.Millisecond},
		{"deadline before the slot", 500 * time.Millisecond, 0, retry.Limited, 500 * time.Millisecond},
		{"canceled while waiting", 5 * time.Second, 200 * time.Millisecond, retry.Canceled, 200 * time.Millisecond},
		{"no deadline: slot", 0, 0, 0, time.Second + 100*time.Millisecond},
		{"no deadline: canceled while waiting", 0, 200 * time.Millisecond, retry.Canceled, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := mustLimiter(t, limit.Config{Max: 1})
				p := mustNew(t, retry.WithGuards(retry.Guards{Limiter: lim}), retry.WithAttemptTimeout(300*time.Millisecond))
				held, err := lim.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				time.AfterFunc(time.Second, func() { lim.Release(held, false) })
				ctx, cancel := context.WithCancel(context.Background())
				if tt.deadline > 0 {
					ctx, cancel = context.WithTimeout(context.Background(), tt.deadline)
				}
				defer cancel()
				if tt.cancelAt > 0 {
					time.AfterFunc(tt.cancelAt, cancel)
				}
				start := time.Now()
				var capLeft time.Duration
				err = p.Do(ctx, func(ctx context.Context, _ int) error {
					dl, _ := ctx.Deadline()
					capLeft = time.Until(dl)
					time.Sleep(100 * time.Millisecond)
					return nil
				})
				if got := time.Since(start); got != tt.wantAt {
					t.Errorf("Do returned after %v, want %v", got, tt.wantAt)
				}
				if tt.want == 0 {
					if err != nil {
						t.Fatalf("Do = %v, want success", err)
					}
					if capLeft != 300*time.Millisecond {
						t.Errorf("attempt had %v left at its start, want its whole 300ms cap", capLeft)
					}
					return
				}
				checkStop(t, err, tt.want, 0)
				if tt.want == retry.Limited && !errors.Is(err, limit.ErrLimited) {
					t.Errorf("Do = %v, want it to wrap limit.ErrLimited", err)
				}
			})
		})
	}
}

// TestLimiterRefusesRetry: a retry the limiter refuses (waiting off, the
// slot taken) ends the call with Reason Limited, the operation's last
// error as Err and the limiter's refusal reachable with errors.Is.
func TestLimiterRefusesRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := mustLimiter(t, limit.Config{Max: 1, Waiting: -1})
		p := mustNew(t, retry.WithGuards(retry.Guards{Limiter: lim}),
			retry.WithBackoff(mustBackoff(t, 0, 10*time.Millisecond, 10*time.Millisecond, 0.5)))
		grabbed := make(chan limit.Permit, 1)
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			if attempt > 1 {
				t.Errorf("attempt %d ran without a slot", attempt)
				return nil
			}
			go func() { // takes the slot as soon as this attempt gives it back
				for {
					if s, err := lim.Acquire(context.Background()); err == nil {
						grabbed <- s
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
			return err503
		})
		re := checkStop(t, err, retry.Limited, 1)
		if re.Err != err503 || !errors.Is(err, limit.ErrLimited) {
			t.Errorf("Do = %v: want Err the 503 and limit.ErrLimited reachable", err)
		}
		lim.Release(<-grabbed, false)
	})
}

// TestSlowCallThroughLoop: a breaker with SlowCall counts the loop's slow
// successes as failures, also when the loop reads the clock once per call
// for its budget and breaker (the default clocks); a call that waited
// behind the open breaker is timed from its admission, not from its start.
// Run on synctest's clock.
func TestSlowCallThroughLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{MinCalls: 2, SlowCall: 100 * time.Millisecond, OpenFor: time.Second, Probes: 1,
			Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		p := mustNew(t, retry.WithGuards(retry.Guards{Budget: mustBudget(t, 0.1, 1), Breaker: brk}))
		took := func(d time.Duration) func(context.Context, int) error {
			return func(context.Context, int) error { time.Sleep(d); return nil }
		}
		for range 2 {
			if err := p.Do(context.Background(), took(150*time.Millisecond)); err != nil {
				t.Fatalf("slow call = %v, want success (slow calls are the breaker's failures, not the caller's)", err)
			}
		}
		if s := brk.State(); s != breaker.Open {
			t.Fatalf("breaker after 2 slow successes = %v, want open", s)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := p.Do(ctx, took(10*time.Millisecond)); err != nil {
			t.Fatalf("call waiting for the probe round = %v, want success", err)
		}
		if waited := time.Since(start); waited < time.Second {
			t.Errorf("call returned after %v, want it to have waited for the round, 1s", waited)
		}
		if s := brk.State(); s != breaker.Closed {
			t.Errorf("breaker after a fast probe that waited = %v, want closed", s)
		}
	})
}
