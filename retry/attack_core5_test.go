package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

type coreHint time.Duration

func (h coreHint) Error() string             { return "busy" }
func (h coreHint) RetryAfter() time.Duration { return time.Duration(h) }

type coreStatus struct{ code int }

func (s *coreStatus) Error() string   { return fmt.Sprintf("status %d", s.code) }
func (s *coreStatus) Temporary() bool { return s.code >= 500 }

// Do doc: "If ctx has already ended, op is not called and Do returns an
// *Error with Attempts 0"; package doc: "One deadline, the context's, covers
// attempts and sleeps"; Guards.Budget: "a call ... whose context ended
// before it started, sends nothing and deposits nothing". A call that
// starts when its context's deadline has passed (the context's timer not
// run yet, as happens with every context.WithTimeout for a moment) is sent
// by the default policy (and by any policy with no breaker, limiter,
// observer, attempt timeout or rate limit), while a guarded policy sends
// nothing. The deadline has passed in both cases: time.Now() is not before
// ctx.Deadline() when Do is called.
func TestAttackCore5SentAfterDeadlineOnBarePath(t *testing.T) {
	b, _ := budget.New(budget.Config{})
	bare, _ := retry.New(retry.WithGuards(retry.Guards{Budget: b}))
	guarded, _ := retry.New(retry.WithAttemptTimeout(time.Hour))
	policies := []struct {
		name string
		p    *retry.Policy
	}{{"nil (default)", nil}, {"budget only", bare}, {"attempt timeout", guarded}}
	for _, pc := range policies {
		sent, runs := 0, 64
		var example error
		for i := 0; i < runs; i++ {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				time.Sleep(time.Second)
				if dl, _ := ctx.Deadline(); time.Now().Before(dl) {
					t.Fatal("deadline not passed")
				}
				calls := 0
				err := pc.p.Do(ctx, func(ctx context.Context, attempt int) error {
					calls++
					return io.ErrUnexpectedEOF
				})
				if calls > 0 {
					sent++
					example = err
				}
			})
		}
		if sent > 0 {
			t.Errorf("%s: op sent in %d of %d calls made after the context's deadline had passed (e.g. %v); want 0, as the guarded policy does", pc.name, sent, runs, example)
		}
	}
}

// Error doc: the not-retryable message, exactly; and only for the default
// classifier and an error that matched none of its rules.
func TestAttackCore5NotRetryableMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const hint = " (the default classifier retries only timeouts, broken connections and errors that carry a server hint or say they are temporary; to retry others, use retry.WithClassifier)"
		def, _ := retry.New()
		custom, _ := retry.New(retry.WithClassifier(retry.IsRetryable))
		cases := []struct {
			p    *retry.Policy
			err  error
			want string
		}{
			{def, errors.New("boom"), "retry: not retryable after 1 attempt" + hint + ": boom"},
			{nil, fmt.Errorf("w: %w", errors.New("boom")), "retry: not retryable after 1 attempt" + hint + ": w: boom"},
			{def, coreHint(-time.Second), "retry: not retryable after 1 attempt" + hint + ": busy"},
			{def, coreHint(0), "retry: not retryable after 1 attempt" + hint + ": busy"},
			{custom, errors.New("boom"), "retry: not retryable after 1 attempt: boom"},
			{def, retry.Permanent(io.ErrUnexpectedEOF), "retry: not retryable after 1 attempt: unexpected EOF"},
			{def, &coreStatus{404}, "retry: not retryable after 1 attempt: status 404"},
			{def, context.Canceled, "retry: not retryable after 1 attempt: context canceled"},
		}
		for _, c := range cases {
			err := c.p.Do(context.Background(), func(context.Context, int) error { return c.err })
			if err == nil || err.Error() != c.want {
				t.Errorf("got %q\nwant %q", err, c.want)
			}
		}
		// After a retryable first attempt: "after 2 attempts".
		n := 0
		err := def.Do(context.Background(), func(context.Context, int) error {
			n++
			if n == 1 {
				return io.ErrUnexpectedEOF
			}
			return errors.New("plain")
		})
		if want := "retry: not retryable after 2 attempts" + hint + ": plain"; err == nil || err.Error() != want {
			t.Errorf("got %q, want %q", err, want)
		}
	})
}

// errors.Is / errors.As on every kind of give-up.
func TestAttackCore5ErrorsIsAs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithMaxAttempts(2))
		st := &coreStatus{503}
		err := p.Do(context.Background(), func(context.Context, int) error { return fmt.Errorf("call: %w", st) })
		var re *retry.Error
		var got *coreStatus
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 2 ||
			!errors.Is(err, retry.AttemptsExhausted) || errors.Is(err, retry.Deadline) ||
			!errors.As(err, &got) || got != st || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			t.Errorf("attempts exhausted: %v %+v", err, re)
		}
		// Deadline, with a cause.
		cause := errors.New("my cause")
		ctx, cancel := context.WithTimeoutCause(context.Background(), 150*time.Millisecond, cause)
		defer cancel()
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 100 * time.Millisecond})
		p2, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(10))
		err = p2.Do(ctx, func(ctx context.Context, a int) error {
			return io.ErrUnexpectedEOF
		})
		re = nil
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 2 ||
			!errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("deadline: %v %+v", err, re)
		}
		if d := retry.RetryAfter(err); d != 100*time.Millisecond {
			t.Errorf("deadline stop that refused a 100ms sleep: RetryAfter %v", d)
		}
		// Canceled with cause.
		cctx, ccancel := context.WithCancelCause(context.Background())
		err = p2.Do(cctx, func(ctx context.Context, a int) error {
			ccancel(cause)
			return io.ErrUnexpectedEOF
		})
		re = nil
		if !errors.As(err, &re) || re.Reason != retry.Canceled || re.Attempts != 1 ||
			!errors.Is(err, context.Canceled) || !errors.Is(err, cause) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("canceled: %v %+v", err, re)
		}
		// Nested: the outer loop does not retry an inner give-up; errors.As
		// finds the outer, errors.Is both reasons.
		err = p.Do(context.Background(), func(ctx context.Context, a int) error {
			return fmt.Errorf("inner: %w", p.Do(ctx, func(context.Context, int) error { return io.ErrUnexpectedEOF }))
		})
		re = nil
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 1 ||
			!errors.Is(err, retry.AttemptsExhausted) || !errors.Is(err, retry.NotRetryable) {
			t.Errorf("nested: %v %+v", err, re)
		}
		var r retry.Reason
		if !errors.As(err, &r) || r != retry.NotRetryable {
			t.Errorf("errors.As Reason = %v, want this call's (not retryable)", r)
		}
	})
}

// Constant and Linear schedules through Do, with a hint as a floor and the
// deadline.
func TestAttackCore5ConstantLinearThroughDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, c := range []struct {
			s    backoff.Strategy
			want []time.Duration
		}{
			{backoff.Constant, []time.Duration{300, 300, 300, 300, 300}},
			{backoff.Linear, []time.Duration{300, 600, 900, 1000, 1000}},
		} {
			bo, _ := backoff.New(backoff.Config{Strategy: c.s, Base: 300 * time.Millisecond, Cap: time.Second, Rand: func() float64 { return 0 }})
			p, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(6))
			var at []time.Time
			err := p.Do(context.Background(), func(context.Context, int) error {
				at = append(at, time.Now())
				return io.ErrUnexpectedEOF
			})
			if !errors.Is(err, retry.AttemptsExhausted) || len(at) != 6 {
				t.Fatalf("%v: %v, %d attempts", c.s, err, len(at))
			}
			for i := 1; i < len(at); i++ {
				if d := at[i].Sub(at[i-1]); d != c.want[i-1]*time.Millisecond {
					t.Errorf("%v: sleep before attempt %d = %v, want %v", c.s, i+1, d, c.want[i-1]*time.Millisecond)
				}
			}
		}
		// Constant 300ms, a hint of 1s (Rand 0: exactly the hint); a hint of
		// 100ms below the backoff: the backoff's 300ms.
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 300 * time.Millisecond, Rand: func() float64 { return 0 }})
		p, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(3))
		for _, h := range []struct{ hint, want time.Duration }{{time.Second, time.Second}, {100 * time.Millisecond, 300 * time.Millisecond}} {
			var at []time.Time
			_ = p.Do(context.Background(), func(context.Context, int) error {
				at = append(at, time.Now())
				return coreHint(h.hint)
			})
			if len(at) != 3 || at[1].Sub(at[0]) != h.want || at[2].Sub(at[1]) != h.want {
				t.Errorf("hint %v: attempts at %v, want %v apart", h.hint, at, h.want)
			}
		}
		// A hint that fits only without its spread: sleep < left, never past.
		bo1, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond, Rand: func() float64 { return 1 }})
		p1, _ := retry.New(retry.WithBackoff(bo1), retry.WithMaxAttempts(2))
		ctx, cancel := context.WithTimeout(context.Background(), 1100*time.Millisecond)
		defer cancel()
		start := time.Now()
		var second time.Time
		_ = p1.Do(ctx, func(ctx context.Context, a int) error {
			if a == 2 {
				second = time.Now()
				return nil
			}
			return coreHint(time.Second)
		})
		if second.IsZero() || second.Sub(start) < time.Second || second.Sub(start) >= 1100*time.Millisecond {
			t.Errorf("hint 1s, 1.1s left: second attempt after %v", second.Sub(start))
		}
	})
}

// DoValueIf: the predicate retries like a retryable error, whatever the
// classifier; the last value comes back with the give-up.
func TestAttackCore5DoValueIf(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		never := func(error) bool { return false }
		p, _ := retry.New(retry.WithClassifier(never), retry.WithMaxAttempts(4))
		asked := 0
		v, err := retry.DoValueIf(context.Background(), p, func(ctx context.Context, a int) (int, error) {
			return a, nil
		}, func(v int) bool { asked++; return v < 3 })
		if err != nil || v != 3 || asked != 3 {
			t.Errorf("got %d, %v, asked %d", v, err, asked)
		}
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, a int) (int, error) {
			return a * 10, nil
		}, func(int) bool { return true })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 4 || v != 40 ||
			re.Err == nil || re.Err.Error() != "retry: the result asked for another attempt" {
			t.Errorf("always again: %d, %v", v, err)
		}
		// An error is judged as DoValue judges it, the predicate not asked.
		asked = 0
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, a int) (int, error) {
			return 7, io.ErrUnexpectedEOF
		}, func(int) bool { asked++; return true })
		if !errors.Is(err, retry.NotRetryable) || v != 7 || asked != 0 {
			t.Errorf("error: %d, %v, asked %d", v, err, asked)
		}
	})
}

// WithRateLimit: every attempt waits, on the call's context, before it is
// sent; a refusal is Reason Deadline with the limiter's error reachable.
type coreLimiter struct {
	mu    sync.Mutex
	calls int
	ctxs  []context.Context
	err   func(n int) error
}

func (l *coreLimiter) Wait(ctx context.Context) error {
	l.mu.Lock()
	l.calls++
	n := l.calls
	l.ctxs = append(l.ctxs, ctx)
	l.mu.Unlock()
	if l.err != nil {
		return l.err(n)
	}
	return nil
}

func TestAttackCore5RateLimitHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errRate := errors.New("rate: would exceed deadline")
		l := &coreLimiter{err: func(n int) error {
			if n == 3 {
				return errRate
			}
			return nil
		}}
		b, _ := budget.New(budget.Config{})
		p, _ := retry.New(retry.WithRateLimit(l), retry.WithMaxAttempts(5), retry.WithGuards(retry.Guards{Budget: b}))
		type key struct{}
		ctx := context.WithValue(context.Background(), key{}, 1)
		v, err := retry.DoValue(ctx, p, func(ctx context.Context, a int) (int, error) {
			return a, io.ErrUnexpectedEOF
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 2 || v != 2 ||
			!errors.Is(err, errRate) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("refusal: %d, %v, %+v", v, err, re)
		}
		for _, c := range l.ctxs {
			if c.Value(key{}) != 1 {
				t.Errorf("Wait not given the call's context")
			}
		}
		if s := b.Stats(); s.Requests != 1 || s.Retries != 2 {
			t.Errorf("budget %+v, want 1 deposit and 2 retries withdrawn (the second spent before the refusal)", s)
		}
		// First attempt refused: Attempts 0, Err nil, nothing deposited.
		b2, _ := budget.New(budget.Config{})
		l2 := &coreLimiter{err: func(int) error { return errRate }}
		p2, _ := retry.New(retry.WithRateLimit(l2), retry.WithGuards(retry.Guards{Budget: b2}))
		calls := 0
		err = p2.Do(context.Background(), func(context.Context, int) error { calls++; return nil })
		re = nil
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 || re.Err != nil || calls != 0 || !errors.Is(err, errRate) {
			t.Errorf("first refused: %v %+v calls %d", err, re, calls)
		}
		if s := b2.Stats(); s.Requests != 0 {
			t.Errorf("deposit on a refused call: %+v", s)
		}
		// Canceled during the wait: Reason Canceled.
		cctx, cancel := context.WithCancel(context.Background())
		l3 := &coreLimiter{err: func(int) error { cancel(); return errors.New("ctx done") }}
		p3, _ := retry.New(retry.WithRateLimit(l3))
		err = p3.Do(cctx, func(context.Context, int) error { return nil })
		if !errors.Is(err, retry.Canceled) {
			t.Errorf("cancel in Wait: %v", err)
		}
	})
}

// A shared policy with a budget under -race: the retries never exceed the
// budget's allowance.
func TestAttackCore5SharedPolicyBudgetRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := budget.New(budget.Config{Ratio: 0.1, MinPerSecond: -1})
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.Linear, Base: time.Millisecond})
		p, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(3), retry.WithGuards(retry.Guards{Budget: b}))
		var sends atomic.Int64
		var wg sync.WaitGroup
		for i := 0; i < 200; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = retry.DoValueIf(context.Background(), p, func(context.Context, int) (int, error) {
					sends.Add(1)
					return 0, nil
				}, func(int) bool { return true })
			}()
		}
		wg.Wait()
		if s := sends.Load(); s != 220 {
			t.Errorf("%d sends for 200 calls, want exactly 220 (10%% retries)", s)
		}
	})
}
