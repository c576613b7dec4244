// Black-box attacks on the retry loop (AREA loop): boundaries, errors,
// values, sharing. Each test names the sentence it checks.

package retry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// loopTimeout is a retryable error (rule 3 of IsRetryable).
type loopTimeout struct{ id int }

func (e *loopTimeout) Error() string { return fmt.Sprintf("loop timeout %d", e.id) }
func (e *loopTimeout) Timeout() bool { return true }

// loopHint carries a server hint (rule 2).
type loopHint struct{ d time.Duration }

func (e *loopHint) Error() string             { return "loop hint " + e.d.String() }
func (e *loopHint) RetryAfter() time.Duration { return e.d }

func loopNew(t testing.TB, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func loopConst(t testing.TB, d time.Duration, u float64) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: d, Rand: func() float64 { return u }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func loopErr(t *testing.T, err error, r retry.Reason, attempts int) *retry.Error {
	t.Helper()
	var re *retry.Error
	if !errors.As(err, &re) {
		t.Fatalf("err %v (%T) is not a *retry.Error", err, err)
	}
	if re.Reason != r || re.Attempts != attempts {
		t.Fatalf("got %v (reason %v, %d attempts), want reason %v after %d", err, re.Reason, re.Attempts, r, attempts)
	}
	if !errors.Is(err, r) {
		t.Errorf("errors.Is(err, %v) = false", r)
	}
	return re
}

// doc.go: "Options are values: one Option may be passed to many New calls."
// and policy.go: "Build a Policy once with New and share it". A program that
// keeps its options in a shared slice and builds policies from several
// goroutines (one per destination) must not race. Run with -race.
func TestAttackLoopSharedOptionConcurrentNew(t *testing.T) {
	opts := []retry.Option{
		retry.WithMaxAttempts(2),
		retry.WithGuards(retry.Guards{Budget: (*budget.Budget)(nil)}),
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				if _, err := retry.New(opts...); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// do.go: "the next sleep would end at or after the deadline ...: Reason
// Deadline, without sleeping." A sleep that ends 1 ns before the deadline
// is started, and the next attempt runs with 1 ns left.
func TestAttackLoopSleepOneNanoBeforeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := loopNew(t, retry.WithBackoff(loopConst(t, time.Second, 0.5)), retry.WithMaxAttempts(5))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second+time.Nanosecond)
		defer cancel()
		dl, _ := ctx.Deadline()
		start := time.Now()
		var at []time.Duration
		var left []time.Duration
		err := p.Do(ctx, func(actx context.Context, n int) error {
			at = append(at, time.Since(start))
			d, _ := actx.Deadline()
			left = append(left, time.Until(d))
			if !d.Equal(dl) {
				t.Errorf("attempt %d deadline %v, want the call's %v", n, d, dl)
			}
			return &loopTimeout{n}
		})
		re := loopErr(t, err, retry.Deadline, 2)
		if len(at) != 2 || at[1] != time.Second || left[1] != time.Nanosecond {
			t.Errorf("attempts at %v with %v left, want [0 1s] with 1ns left on the second", at, left)
		}
		// The refused sleep (1 s, 1 ns left) is the give-up's RetryAfter.
		if got := retry.RetryAfter(err); got != time.Second {
			t.Errorf("RetryAfter = %v, want the refused 1s", got)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Error("errors.Is(err, DeadlineExceeded) = false")
		}
		var lt *loopTimeout
		if !errors.As(err, &lt) || lt.id != 2 || re.Err != error(lt) {
			t.Errorf("Err = %v, want the second attempt's error", re.Err)
		}
	})
}

// Exactly equal: a sleep that would end at the deadline is not started.
func TestAttackLoopSleepExactlyLeftGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := loopNew(t, retry.WithBackoff(loopConst(t, time.Second, 0.5)), retry.WithMaxAttempts(5))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		err := p.Do(ctx, func(context.Context, int) error { return &loopTimeout{} })
		loopErr(t, err, retry.Deadline, 1)
		if el := time.Since(start); el != 0 {
			t.Errorf("slept %v before giving up, want 0", el)
		}
	})
}

// doc.go: "At most MaxAttempts tries, the first included"; guard.go: "each
// call deposits once ... the loop withdraws before each retry". A call
// that uses all N attempts withdraws exactly N-1 retries, and none for the
// last attempt.
func TestAttackLoopMaxAttemptsBudgetExact(t *testing.T) {
	for _, n := range []int{1, 2, 4, 7} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: 100})
				if err != nil {
					t.Fatal(err)
				}
				p := loopNew(t, retry.WithMaxAttempts(n), retry.WithGuards(retry.Guards{Budget: b}),
					retry.WithBackoff(loopConst(t, time.Millisecond, 0)))
				calls := 0
				err = p.Do(t.Context(), func(context.Context, int) error { calls++; return &loopTimeout{calls} })
				loopErr(t, err, retry.AttemptsExhausted, n)
				if s := b.Stats(); s.Requests != 1 || s.Retries != n-1 {
					t.Errorf("budget %+v after %d attempts, want 1 request and %d retries", s, n, n-1)
				}
			})
		})
	}
}

// policy.go: "A Policy is immutable and safe for concurrent use by any
// number of goroutines"; budget: exact accounting. 64 concurrent calls of
// one policy (budget, observer, attempt timeout), each failing 3 times.
func TestAttackLoopSharedPolicyConcurrentExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var starts, ends, retries, giveUps atomic.Int64
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			switch e.Kind {
			case observe.AttemptStart:
				starts.Add(1)
			case observe.AttemptEnd:
				ends.Add(1)
			case observe.Retry:
				retries.Add(1)
			case observe.GiveUp:
				giveUps.Add(1)
			}
		})
		bo, err := backoff.New(backoff.Config{Rand: lockedRand(7)})
		if err != nil {
			t.Fatal(err)
		}
		p := loopNew(t, retry.WithGuards(retry.Guards{Budget: b}), retry.WithObserver(obs),
			retry.WithAttemptTimeout(time.Second), retry.WithBackoff(bo))
		const calls = 64
		var wg sync.WaitGroup
		errs := make([]error, calls)
		vals := make([]int, calls)
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				vals[i], errs[i] = retry.DoValue(ctx, p, func(ctx context.Context, n int) (int, error) {
					time.Sleep(time.Millisecond)
					return i*10 + n, &loopTimeout{n}
				})
			}()
		}
		wg.Wait()
		for i, err := range errs {
			loopErr(t, err, retry.AttemptsExhausted, 3)
			if vals[i] != i*10+3 {
				t.Errorf("call %d value %d, want %d", i, vals[i], i*10+3)
			}
		}
		if s := b.Stats(); s.Requests != calls || s.Retries != 2*calls {
			t.Errorf("budget %+v, want %d requests and %d retries", s, calls, 2*calls)
		}
		if starts.Load() != 3*calls || ends.Load() != 3*calls || retries.Load() != 2*calls || giveUps.Load() != calls {
			t.Errorf("events: %d starts %d ends %d retries %d give-ups", starts.Load(), ends.Load(), retries.Load(), giveUps.Load())
		}
	})
}

// errors.go, Error.Unwrap: "the parent context had a custom cause ...
// errors.Is and errors.As reach all of them", for a cancel cause during the
// sleep, and a deadline cause during an attempt.
func TestAttackLoopCausesReachable(t *testing.T) {
	causeC := errors.New("loop: user left")
	causeD := errors.New("loop: too slow")
	t.Run("cancel-cause-mid-sleep", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := loopNew(t, retry.WithBackoff(loopConst(t, time.Second, 0)))
			ctx, cancel := context.WithCancelCause(t.Context())
			time.AfterFunc(500*time.Millisecond, func() { cancel(causeC) })
			err := p.Do(ctx, func(context.Context, int) error { return &loopTimeout{1} })
			loopErr(t, err, retry.Canceled, 1)
			var lt *loopTimeout
			for _, target := range []error{context.Canceled, causeC} {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(err, %v) = false; err = %v", target, err)
				}
			}
			if !errors.As(err, &lt) {
				t.Error("errors.As(last error) = false")
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Error("a cancel is DeadlineExceeded")
			}
		})
	})
	t.Run("deadline-cause-mid-attempt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := loopNew(t, retry.WithBackoff(loopConst(t, time.Second, 0)))
			ctx, cancel := context.WithTimeoutCause(t.Context(), 1500*time.Millisecond, causeD)
			defer cancel()
			err := p.Do(ctx, func(actx context.Context, n int) error {
				if n == 1 {
					return &loopTimeout{1}
				}
				<-actx.Done()
				return fmt.Errorf("attempt 2: %w", actx.Err())
			})
			loopErr(t, err, retry.Deadline, 2)
			for _, target := range []error{context.DeadlineExceeded, causeD} {
				if !errors.Is(err, target) {
					t.Errorf("errors.Is(err, %v) = false; err = %v", target, err)
				}
			}
		})
	})
}

// do.go: "the retry budget refuses the retry: Reason BudgetExhausted, with
// the last error, without sleeping"; DoValue returns the last value.
func TestAttackLoopBudgetRefusalKeepsLastErrorAndValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: 0.1}) // floor: 1 retry per 10 s window
		if err != nil {
			t.Fatal(err)
		}
		p := loopNew(t, retry.WithGuards(retry.Guards{Budget: b}), retry.WithMaxAttempts(5),
			retry.WithBackoff(loopConst(t, time.Millisecond, 0)))
		hint := &loopHint{3 * time.Millisecond}
		start := time.Now()
		v, err := retry.DoValue(t.Context(), p, func(_ context.Context, n int) (string, error) {
			return fmt.Sprint("v", n), fmt.Errorf("attempt %d: %w", n, hint)
		})
		re := loopErr(t, err, retry.BudgetExhausted, 2)
		if v != "v2" {
			t.Errorf("value %q, want v2", v)
		}
		if !errors.Is(err, hint) || !strings.HasPrefix(re.Err.Error(), "attempt 2") {
			t.Errorf("Err = %v, want the second attempt's error", re.Err)
		}
		if got := retry.RetryAfter(err); got != 3*time.Millisecond {
			t.Errorf("RetryAfter = %v, want the last error's hint 3ms", got)
		}
		// Slept once (the admitted retry), in [hint, 1.5 hint), not after the refusal.
		if el := time.Since(start); el < 3*time.Millisecond || el >= 4500*time.Microsecond {
			t.Errorf("elapsed %v, want one sleep in [3ms, 4.5ms)", el)
		}
	})
}

// Reason CircuitOpen: "later, Err is the operation's last error and the
// OpenError is reachable with errors.Is and errors.As. Either way RetryAfter
// of the error reads how long until the breaker probes again"; DoValue
// returns the value of the last attempt that ran.
func TestAttackLoopCircuitOpenLaterAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second, MaxWaiters: -1})
		if err != nil {
			t.Fatal(err)
		}
		p := loopNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithBackoff(loopConst(t, time.Millisecond, 0)))
		v, err := retry.DoValue(t.Context(), p, func(context.Context, int) (int, error) { return 41, &loopTimeout{1} })
		re := loopErr(t, err, retry.CircuitOpen, 1)
		if v != 41 {
			t.Errorf("value %d, want 41", v)
		}
		var lt *loopTimeout
		if !errors.As(re.Err, &lt) {
			t.Errorf("Err = %v, want the operation's error", re.Err)
		}
		var oe *breaker.OpenError
		if !errors.Is(err, breaker.ErrOpen) || !errors.As(err, &oe) {
			t.Errorf("OpenError not reachable from %v", err)
		}
		if ra := retry.RetryAfter(err); ra < 8*time.Second || ra > 12*time.Second {
			t.Errorf("RetryAfter = %v, want about 10s (OpenFor ±20%%)", ra)
		}
	})
}

// Permanent: "a mark wrapped deeper stays in the chain. errors.Is and
// errors.As see through the mark either way"; NotRetryable on attempt 1;
// the message does not advertise WithClassifier for a marked error.
func TestAttackLoopPermanentDeepMark(t *testing.T) {
	inner := errors.New("loop: bad request")
	p := loopNew(t)
	op := func(context.Context, int) error {
		return fmt.Errorf("layer: %w", retry.Permanent(&loopTimeout{9}))
	}
	err := p.Do(context.Background(), op)
	loopErr(t, err, retry.NotRetryable, 1)
	var lt *loopTimeout
	if !errors.As(err, &lt) || lt.id != 9 {
		t.Errorf("errors.As through the deep mark failed: %v", err)
	}
	if strings.Contains(err.Error(), "WithClassifier") {
		t.Errorf("message advertises WithClassifier for a Permanent error: %q", err)
	}
	err = p.Do(context.Background(), func(context.Context, int) error { return retry.Permanent(inner) })
	re := loopErr(t, err, retry.NotRetryable, 1)
	if re.Err != inner {
		t.Errorf("Err = %#v, want the unmarked error itself", re.Err)
	}
}

// errors.go: the not-retryable message names retry.WithClassifier "when the
// default classifier stopped the loop at an error that matched none of its
// rules", whatever the attempt, wrapped or joined; never with a
// classifier of the caller's own.
func TestAttackLoopNotRetryableMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		plain := errors.New("plain")
		p := loopNew(t, retry.WithBackoff(loopConst(t, time.Millisecond, 0)))
		cases := []struct {
			name string
			last error
		}{
			{"plain", plain},
			{"wrapped", fmt.Errorf("w: %w", plain)},
			{"joined", errors.Join(plain, errors.New("other"))},
		}
		for _, c := range cases {
			err := p.Do(t.Context(), func(_ context.Context, n int) error {
				if n == 1 {
					return &loopTimeout{1}
				}
				return c.last
			})
			loopErr(t, err, retry.NotRetryable, 2)
			want := "retry: not retryable after 2 attempts (the default classifier retries only timeouts, broken connections and errors that carry a server hint or say they are temporary; to retry others, use retry.WithClassifier): " + c.last.Error()
			if err.Error() != want {
				t.Errorf("%s: message\n%q\nwant\n%q", c.name, err.Error(), want)
			}
			if !errors.Is(err, plain) {
				t.Errorf("%s: errors.Is(err, plain) = false", c.name)
			}
		}
		own := loopNew(t, retry.WithClassifier(func(error) bool { return false }))
		err := own.Do(t.Context(), func(context.Context, int) error { return plain })
		if got, want := err.Error(), "retry: not retryable after 1 attempt: plain"; got != want {
			t.Errorf("own classifier: %q, want %q", got, want)
		}
	})
}

// doc.go: the hint sleep is "a random time in [hint, 1.5·hint)"; do.go: "that
// never passes the deadline"; a hint exactly at the time left gives up.
func TestAttackLoopHintBoundaries(t *testing.T) {
	const hint = time.Second
	cases := []struct {
		name      string
		u         float64
		timeout   time.Duration // 0: no deadline
		wantSleep time.Duration // -1: gives up, Deadline
	}{
		{"u-max-no-deadline", 1, 0, hint + hint/2 - 1},
		{"u-zero", 0, 0, hint},
		{"left-hint+1", 1, hint + 1, hint},
		{"left-hint+2", 1, hint + 2, hint},
		{"left-hint", 0, hint, -1},
		{"left-1.2hint", 1, hint + hint/5, hint + hint/5 - 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				bo, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond, Strategy: backoff.NoJitter,
					Rand: func() float64 { return c.u }})
				if err != nil {
					t.Fatal(err)
				}
				p := loopNew(t, retry.WithBackoff(bo), retry.WithMaxAttempts(2))
				ctx := t.Context()
				if c.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.timeout)
					defer cancel()
				}
				start := time.Now()
				var second time.Duration = -1
				err = p.Do(ctx, func(_ context.Context, n int) error {
					if n == 2 {
						second = time.Since(start)
						return nil
					}
					return &loopHint{hint}
				})
				if c.wantSleep < 0 {
					loopErr(t, err, retry.Deadline, 1)
					if ra := retry.RetryAfter(err); ra != hint {
						t.Errorf("RetryAfter = %v, want the refused hint", ra)
					}
					return
				}
				if err != nil {
					t.Fatalf("Do = %v", err)
				}
				if second < hint || second >= hint+hint/2 || (c.timeout > 0 && second >= c.timeout) {
					t.Errorf("slept %v: outside [hint, 1.5 hint) or past the deadline", second)
				}
				if second != c.wantSleep {
					t.Logf("slept %v (expected about %v)", second, c.wantSleep)
				}
			})
		})
	}
}

// WithMaxRetryAfter: a hint exactly at the maximum is honoured (the maximum
// is "the longest server hint the policy honours"); one above gives up at
// once.
func TestAttackLoopHintAtMaxRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := loopNew(t, retry.WithMaxRetryAfter(2*time.Second), retry.WithMaxAttempts(2))
		start := time.Now()
		err := p.Do(t.Context(), func(_ context.Context, n int) error {
			if n == 2 {
				return nil
			}
			return &loopHint{2 * time.Second}
		})
		if err != nil {
			t.Fatalf("hint == max: %v", err)
		}
		if el := time.Since(start); el < 2*time.Second || el >= 3*time.Second {
			t.Errorf("slept %v, want [2s, 3s)", el)
		}
		start = time.Now()
		err = p.Do(t.Context(), func(context.Context, int) error { return &loopHint{2*time.Second + 1} })
		loopErr(t, err, retry.Deadline, 1)
		if el := time.Since(start); el != 0 {
			t.Errorf("slept %v for a hint above the max", el)
		}
		if ra := retry.RetryAfter(err); ra != 2*time.Second+1 {
			t.Errorf("RetryAfter = %v, want the hint", ra)
		}
	})
}

// DoValue: "When it gives up it returns the *Error together with the value
// the last attempt returned ..., or the zero value if no attempt ran."
func TestAttackLoopDoValueValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := loopNew(t, retry.WithBackoff(loopConst(t, time.Second, 0)), retry.WithMaxAttempts(3))
		// Canceled mid-sleep after attempt 2.
		ctx, cancel := context.WithCancel(t.Context())
		v, err := retry.DoValue(ctx, p, func(_ context.Context, n int) (*int, error) {
			if n == 2 {
				time.AfterFunc(100*time.Millisecond, cancel)
			}
			return &n, &loopTimeout{n}
		})
		loopErr(t, err, retry.Canceled, 2)
		if v == nil || *v != 2 {
			t.Errorf("canceled: value %v, want the second attempt's", v)
		}
		// Pre-canceled: zero value.
		v, err = retry.DoValue(ctx, p, func(_ context.Context, n int) (*int, error) { return &n, nil })
		loopErr(t, err, retry.Canceled, 0)
		if v != nil {
			t.Errorf("no attempt ran, value %v", v)
		}
		// Deadline before a sleep.
		dctx, dcancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
		defer dcancel()
		v, err = retry.DoValue(dctx, p, func(_ context.Context, n int) (*int, error) { return &n, &loopTimeout{n} })
		loopErr(t, err, retry.Deadline, 2)
		if v == nil || *v != 2 {
			t.Errorf("deadline: value %v, want the second attempt's", v)
		}
		// DoValueIf: the value that asked again comes back, its Err says so.
		w, err := retry.DoValueIf(t.Context(), p, func(_ context.Context, n int) (int, error) { return n * 100, nil },
			func(x int) bool { return true })
		re := loopErr(t, err, retry.AttemptsExhausted, 3)
		if w != 300 {
			t.Errorf("DoValueIf value %d, want 300", w)
		}
		if re.Err == nil || re.Err.Error() != "retry: the result asked for another attempt" {
			t.Errorf("DoValueIf Err = %v", re.Err)
		}
	})
}

// policy.go: "A nil *Policy is valid and behaves like the one New() returns
// without options", shared by many goroutines.
func TestAttackLoopNilPolicyConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p *retry.Policy
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				calls := 0
				err := p.Do(context.Background(), func(context.Context, int) error { calls++; return &loopTimeout{calls} })
				var re *retry.Error
				if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 3 || calls != 3 {
					t.Errorf("nil policy: %v after %d calls", err, calls)
				}
			}()
		}
		wg.Wait()
	})
}

// WithBackoff: "Retry n (n = 1 before the second attempt) sleeps b's n-th
// delay of a fresh backoff.Sequence". Compared with the same Backoff's
// Sequence, for every strategy, with U pinned.
func TestAttackLoopSleepsAreTheSequence(t *testing.T) {
	for s := backoff.FullJitter; s <= backoff.Linear; s++ {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				bo, err := backoff.New(backoff.Config{Strategy: s, Base: 10 * time.Millisecond, Cap: 300 * time.Millisecond,
					Rand: func() float64 { return 0.7 }})
				if err != nil {
					t.Fatal(err)
				}
				seq := bo.Sequence()
				p := loopNew(t, retry.WithBackoff(bo), retry.WithMaxAttempts(8))
				last := time.Now()
				err = p.Do(t.Context(), func(_ context.Context, n int) error {
					now := time.Now()
					if n > 1 {
						if got, want := now.Sub(last), seq.Next(); got != want {
							t.Errorf("sleep before attempt %d = %v, want %v", n, got, want)
						}
					}
					last = now
					return &loopTimeout{n}
				})
				loopErr(t, err, retry.AttemptsExhausted, 8)
			})
		})
	}
}

// atkLoopWithinBudget records what the loop asks of it.
type atkLoopWithinBudget struct {
	mu        sync.Mutex
	deposits  int
	withdraws int
	lefts     []time.Duration
	grant     bool
}

func (b *atkLoopWithinBudget) Deposit() { b.mu.Lock(); b.deposits++; b.mu.Unlock() }
func (b *atkLoopWithinBudget) Withdraw() bool {
	b.mu.Lock()
	b.withdraws++
	b.mu.Unlock()
	return b.grant
}
func (b *atkLoopWithinBudget) WithdrawWithin(left time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lefts = append(b.lefts, left)
	return b.grant
}

// guard.go, Budget: "the loop then calls it instead of Withdraw, with the
// time left before the call's deadline (0 when the call has none)".
func TestAttackLoopWithdrawWithinLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &atkLoopWithinBudget{grant: true}
		p := loopNew(t, retry.WithGuards(retry.Guards{Budget: b}), retry.WithBackoff(loopConst(t, time.Second, 0)))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		err := p.Do(ctx, func(context.Context, int) error { time.Sleep(500 * time.Millisecond); return &loopTimeout{} })
		loopErr(t, err, retry.AttemptsExhausted, 3)
		want := []time.Duration{9500 * time.Millisecond, 8 * time.Second}
		if fmt.Sprint(b.lefts) != fmt.Sprint(want) || b.withdraws != 0 || b.deposits != 1 {
			t.Errorf("WithdrawWithin(%v), %d Withdraw, %d Deposit; want %v, 0, 1", b.lefts, b.withdraws, b.deposits, want)
		}
		b2 := &atkLoopWithinBudget{grant: false}
		p2 := loopNew(t, retry.WithGuards(retry.Guards{Budget: b2}))
		err = p2.Do(t.Context(), func(context.Context, int) error { return &loopTimeout{} })
		loopErr(t, err, retry.BudgetExhausted, 1)
		if fmt.Sprint(b2.lefts) != "[0s]" {
			t.Errorf("no deadline: WithdrawWithin(%v), want [0s]", b2.lefts)
		}
	})
}

// observe: "Retry: ... the loop will sleep Delay before the next one.
// Outcome says why that long"; "For Reason "deadline" when the loop stopped
// before a sleep that would have ended past the deadline, Delay is that
// sleep."
func TestAttackLoopObserverDelaysAreTheSleeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var evs []observe.Event
		obs := observe.Func(func(_ context.Context, e observe.Event) { mu.Lock(); evs = append(evs, e); mu.Unlock() })
		bo, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 100 * time.Millisecond, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		p := loopNew(t, retry.WithBackoff(bo), retry.WithObserver(obs), retry.WithMaxAttempts(10))
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		var starts []time.Time
		err = p.Do(ctx, func(_ context.Context, n int) error {
			starts = append(starts, time.Now())
			if n == 2 {
				return &loopHint{time.Second} // above the 400 ms backoff: hint, sleeps 1.25 s
			}
			return &loopTimeout{n}
		})
		// sleeps: 200ms, hint 1.25s, 800ms (t = 2.25 s), next 1.6 s > 0.75 s left.
		loopErr(t, err, retry.Deadline, 4)
		var sleeps []time.Duration
		var why []string
		var give observe.Event
		for _, e := range evs {
			switch e.Kind {
			case observe.Retry:
				sleeps = append(sleeps, e.Delay)
				why = append(why, e.Outcome)
			case observe.GiveUp:
				give = e
			}
		}
		for i := 1; i < len(starts); i++ {
			if i-1 >= len(sleeps) || starts[i].Sub(starts[i-1]) != sleeps[i-1] {
				t.Errorf("retry %d: slept %v, events say %v", i, starts[i].Sub(starts[i-1]), sleeps)
			}
		}
		if fmt.Sprint(why) != "[backoff hint backoff]" {
			t.Errorf("Retry outcomes %v", why)
		}
		if give.Reason != "deadline" || give.Delay != 1600*time.Millisecond || give.Attempt != 4 {
			t.Errorf("GiveUp %+v, want deadline, Delay 1.6s, Attempt 4", give)
		}
		if ra := retry.RetryAfter(err); ra != 1600*time.Millisecond {
			t.Errorf("RetryAfter = %v, want 1.6s", ra)
		}
	})
}

// WithAttemptTimeout: "an attempt still never runs past the call's
// deadline. An attempt that fails because its own timeout fired, while
// the call still has time, is retried". Boundaries: cap = left, cap =
// left-1.
func TestAttackLoopAttemptTimeoutBoundaries(t *testing.T) {
	cases := []struct {
		name     string
		cap      time.Duration
		reason   retry.Reason
		attempts int
	}{
		{"cap-equals-left", 2 * time.Second, retry.Deadline, 1},
		{"cap-above-left", 3 * time.Second, retry.Deadline, 1},
		{"cap-left-minus-1", 2*time.Second - 1, retry.Deadline, 1}, // 1 ns left, next sleep 1 ms does not fit
		{"cap-half", time.Second - time.Millisecond, retry.Deadline, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := loopNew(t, retry.WithAttemptTimeout(c.cap), retry.WithBackoff(loopConst(t, time.Millisecond, 0)),
					retry.WithMaxAttempts(5))
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				defer cancel()
				dl, _ := ctx.Deadline()
				err := p.Do(ctx, func(actx context.Context, n int) error {
					ad, ok := actx.Deadline()
					if !ok || ad.After(dl) {
						t.Errorf("attempt %d deadline %v past the call's %v", n, ad, dl)
					}
					<-actx.Done()
					return actx.Err()
				})
				loopErr(t, err, c.reason, c.attempts)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Error("not DeadlineExceeded")
				}
			})
		})
	}
}

// WithGuards: "Every admitted attempt is reported back to the breaker,
// exactly once"; Guards.Limiter: "Every slot is released exactly once, when
// the attempt ends, panics included". A classifier that panics (a bug of the
// caller's) must not leave the breaker's probe or the limiter's slot held.
func TestAttackLoopClassifierPanicReleasesGuards(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limitNew(1)
		if err != nil {
			t.Fatal(err)
		}
		p := loopNew(t, retry.WithGuards(retry.Guards{Limiter: lim}),
			retry.WithClassifier(func(error) bool { panic("classifier bug") }))
		func() {
			defer func() {
				if r := recover(); r != "classifier bug" {
					t.Errorf("recovered %v", r)
				}
			}()
			_ = p.Do(t.Context(), func(context.Context, int) error { return errors.New("x") })
		}()
		ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
		defer cancel()
		perm, err := lim.Acquire(ctx)
		if err != nil {
			t.Fatalf("slot still held after the classifier panicked: %v", err)
		}
		lim.Release(perm, false)
	})
}

// DoValueIf: after a nil error "again is asked about its value; true makes
// the attempt a retryable failure ... counted by the breaker as a failure of
// the dependency", whatever the classifier.
func TestAttackLoopDoValueIfBreakerFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Hour, MaxWaiters: -1})
		if err != nil {
			t.Fatal(err)
		}
		p := loopNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithMaxAttempts(2),
			retry.WithClassifier(func(error) bool { return false }), retry.WithBackoff(loopConst(t, time.Millisecond, 0)))
		v, err := retry.DoValueIf(t.Context(), p, func(_ context.Context, n int) (int, error) { return n, nil },
			func(int) bool { return true })
		loopErr(t, err, retry.AttemptsExhausted, 2)
		if v != 2 {
			t.Errorf("value %d, want 2", v)
		}
		if st := brk.State(); st != breaker.Open {
			t.Errorf("breaker %v after two 'again' attempts with ConsecutiveFailures 2, want open", st)
		}
	})
}

func limitNew(max int) (*limit.Limiter, error) {
	return limit.New(limit.Config{Max: max, Waiting: -1})
}

// slowWithin is a fleet-like budget whose WithdrawWithin makes a round trip
// of rtt (shorter than the time left, as guard.go asks) and grants.
type slowWithin struct {
	rtt  time.Duration
	left []time.Duration
}

func (b *slowWithin) Deposit()       {}
func (b *slowWithin) Withdraw() bool { return true }
func (b *slowWithin) WithdrawWithin(left time.Duration) bool {
	b.left = append(b.left, left)
	time.Sleep(b.rtt)
	return true
}

// doc.go: "If the next sleep would end at or after the deadline, the loop
// gives up now instead of sleeping past it"; do.go: "the next sleep would
// end at or after the deadline ...: Reason Deadline, without sleeping. The
// loop never sleeps past the deadline." guard.go allows a budget's
// WithdrawWithin one round trip within the time left. After a 600 ms round
// trip of a 1 s budget, a 900 ms sleep would end 500 ms past the deadline:
// the loop must give up then (at 600 ms), not start the sleep and sit in it
// until the deadline cuts it.
func TestAttackLoopSleepStartedPastDeadlineAfterWithdraw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &slowWithin{rtt: 600 * time.Millisecond}
		var retryAt time.Duration = -1
		start := time.Now()
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.Retry {
				retryAt = time.Since(start)
			}
		})
		p := loopNew(t, retry.WithGuards(retry.Guards{Budget: b}), retry.WithBackoff(loopConst(t, 900*time.Millisecond, 0)),
			retry.WithObserver(obs))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		calls := 0
		err := p.Do(ctx, func(context.Context, int) error { calls++; return &loopTimeout{calls} })
		el := time.Since(start)
		var re *retry.Error
		errors.As(err, &re)
		if calls != 1 || re == nil || re.Reason != retry.Deadline {
			t.Fatalf("Do = %v after %d calls", err, calls)
		}
		if el != 600*time.Millisecond {
			t.Errorf("gave up at %v (a %v sleep was started at %v, with %v left; left given to the budget %v), want at 600ms, without sleeping",
				el, 900*time.Millisecond, retryAt, time.Second-retryAt, b.left)
		}
	})
}

// Do: "If op panics ..., the attempt is a failure for the breaker, and the
// observer hears of the attempt's end (Outcome "failure" ...) and of the
// call's (GiveUp with Reason "panic")". DoValueIf's predicate runs as part
// of the attempt: a predicate that panics ends it the same way (passes).
func TestAttackLoopDoValueIfPredicatePanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Hour, MaxWaiters: -1})
		if err != nil {
			t.Fatal(err)
		}
		var kinds []string
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			kinds = append(kinds, string(e.Kind)+":"+e.Outcome+e.Reason)
		})
		p := loopNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithObserver(obs))
		func() {
			defer func() {
				if r := recover(); r != "pred" {
					t.Errorf("recovered %v, want the predicate's panic", r)
				}
			}()
			_, _ = retry.DoValueIf(t.Context(), p, func(context.Context, int) (int, error) { return 1, nil },
				func(int) bool { panic("pred") })
		}()
		if got := fmt.Sprint(kinds); got != "[attempt-start: attempt-end:failure give-up:panic]" {
			t.Errorf("events %s", got)
		}
		if brk.State() != breaker.Open {
			t.Errorf("breaker %v, want open (the attempt is a failure)", brk.State())
		}
	})
}
