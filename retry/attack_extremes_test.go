package retry_test

import (
	"context"
	"errors"
	"io"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// extHintErr is a retryable error carrying a server hint.
type extHintErr struct{ d time.Duration }

func (e extHintErr) Error() string             { return "ext hint " + e.d.String() }
func (e extHintErr) RetryAfter() time.Duration { return e.d }

const extYear = 365 * 24 * time.Hour

var extYear9999 = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)

func extPolicy(t *testing.T, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// New: "A bad option value (attempts below 1, a negative duration, a
// MaxRetryAfter that is not positive, a nil backoff or classifier) makes New
// return an error that says which; New never panics."
func TestAttackExtremesNewRejectsExactlyTheDocumentedValues(t *testing.T) {
	bad := map[string]retry.Option{
		"attempts 0":              retry.WithMaxAttempts(0),
		"attempts -1":             retry.WithMaxAttempts(-1),
		"attempts MinInt":         retry.WithMaxAttempts(math.MinInt),
		"maxRetryAfter 0":         retry.WithMaxRetryAfter(0),
		"maxRetryAfter -1":        retry.WithMaxRetryAfter(-1),
		"maxRetryAfter MinInt64":  retry.WithMaxRetryAfter(math.MinInt64),
		"attemptTimeout -1":       retry.WithAttemptTimeout(-1),
		"attemptTimeout MinInt64": retry.WithAttemptTimeout(math.MinInt64),
		"nil backoff":             retry.WithBackoff(nil),
		"nil classifier":          retry.WithClassifier(nil),
	}
	for name, o := range bad {
		if p, err := retry.New(o); err == nil || p != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, p, err)
		}
	}
	good := map[string]retry.Option{
		"attempts 1":              retry.WithMaxAttempts(1),
		"attempts MaxInt":         retry.WithMaxAttempts(math.MaxInt),
		"maxRetryAfter 1ns":       retry.WithMaxRetryAfter(1),
		"maxRetryAfter MaxInt64":  retry.WithMaxRetryAfter(math.MaxInt64),
		"attemptTimeout 0":        retry.WithAttemptTimeout(0),
		"attemptTimeout 1ns":      retry.WithAttemptTimeout(1),
		"attemptTimeout MaxInt64": retry.WithAttemptTimeout(math.MaxInt64),
		"nil option":              nil,
	}
	for name, o := range good {
		if _, err := retry.New(o); err != nil {
			t.Errorf("%s: New: %v; want success", name, err)
		}
	}
}

// Do: "when the error carries a longer server hint (RetryAfter), a random
// time in [hint, 1.5·hint) that never passes the deadline". A hint of 100
// years, honoured (WithMaxRetryAfter of the largest Duration), under a
// deadline in year 9999 (beyond a Duration from now): the loop sleeps within
// [hint, 1.5·hint) and retries.
func TestAttackExtremesHintOfCenturyDeadlineYear9999(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hint := 100 * extYear
		p := extPolicy(t, retry.WithMaxRetryAfter(math.MaxInt64))
		ctx, cancel := context.WithDeadline(context.Background(), extYear9999)
		defer cancel()
		var at []time.Time
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			at = append(at, time.Now())
			if attempt == 1 {
				return extHintErr{hint}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Do: %v", err)
		}
		if len(at) != 2 {
			t.Fatalf("%d attempts, want 2", len(at))
		}
		gap := at[1].Sub(at[0])
		if gap < hint || gap >= hint+hint/2 {
			t.Errorf("slept %v, want in [%v, %v)", gap, hint, hint+hint/2)
		}
	})
}

// The largest hint, honoured, under a deadline in year 9999: the sleep
// would end past the deadline (or at it): Reason Deadline at once, with
// RetryAfter(err) the hint, not a sleep of overflowed length.
func TestAttackExtremesHintMaxDurationStopsAtOnce(t *testing.T) {
	for _, hint := range []time.Duration{math.MaxInt64} {
		synctest.Test(t, func(t *testing.T) {
			p := extPolicy(t, retry.WithMaxRetryAfter(math.MaxInt64))
			ctx, cancel := context.WithDeadline(context.Background(), extYear9999)
			defer cancel()
			start := time.Now()
			n := 0
			err := p.Do(ctx, func(ctx context.Context, attempt int) error {
				n++
				return extHintErr{hint}
			})
			var re *retry.Error
			if !errors.As(err, &re) {
				t.Fatalf("hint %v: Do = %v, want *retry.Error", hint, err)
			}
			el := time.Since(start)
			// With a deadline beyond the Duration range the hint may
			// fit: then it must be honoured (slept at least the hint).
			if re.Reason == retry.Deadline {
				if el != 0 {
					t.Errorf("hint %v: Deadline stop after sleeping %v, want no sleep", hint, el)
				}
				if got := retry.RetryAfter(err); got < hint {
					t.Errorf("hint %v: RetryAfter(err) = %v, want at least the hint", hint, got)
				}
			} else if n > 1 && el < hint {
				t.Errorf("hint %v: retried after %v (%v, %d attempts), before the hint", hint, el, re.Reason, n)
			}
		})
	}
}

// FINDING: the floor of a hint of centuries (honoured: WithMaxRetryAfter of
// the largest Duration, no deadline). Policy.Do: "the hint is a floor that jitter never
// undercuts"; "the loop never retries sooner than the server asked"
// (WithMaxRetryAfter). sleepFor's time.NewTimer(d) fires at the runtime's
// nanotime()+d, which saturates at 2^63-1: the sleep is cut short by
// nanotime() (the bubble's clock, 30 years past the Unix epoch; a real
// process's uptime), and once the clock is that far, every later sleep is 0.
func TestAttackExtremesHintOfCenturiesFloorHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hint := 280 * extYear
		p := extPolicy(t, retry.WithMaxRetryAfter(math.MaxInt64), retry.WithMaxAttempts(3),
			retry.WithBackoff(extBackoff(t, backoff.Config{Rand: func() float64 { return 0 }})))
		// No deadline: the call may wait as long as the server asks (a
		// context deadline in year 9999 would itself fire early, in the
		// same way, on the runtime's saturated timer).
		var at []time.Time
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			at = append(at, time.Now())
			return extHintErr{hint}
		})
		t.Logf("Do = %v, %d attempts", err, len(at))
		for i := 1; i < len(at); i++ {
			if gap := at[i].Sub(at[i-1]); gap < hint {
				t.Errorf("attempt %d came %v (%.1f years) after attempt %d, before the server's hint of %v (%.0f years); Do = %v",
					i+1, gap, gap.Hours()/24/365, i, hint, hint.Hours()/24/365, err)
			}
		}
	})
}

// A hint just under the time left: the sleep is at least the hint and ends
// before the deadline ("never passes the deadline").
func TestAttackExtremesHintJustUnderDeadline(t *testing.T) {
	for _, left := range []time.Duration{time.Second, 10 * time.Second, 100 * extYear} {
		for _, hint := range []time.Duration{left - 2, left / 2, left - time.Millisecond, left / 10 * 9} {
			synctest.Test(t, func(t *testing.T) {
				p := extPolicy(t, retry.WithMaxRetryAfter(math.MaxInt64),
					retry.WithBackoff(extBackoff(t, backoff.Config{Rand: func() float64 { return 0.999999999 }})))
				start := time.Now()
				ctx, cancel := context.WithDeadline(context.Background(), start.Add(left))
				defer cancel()
				var at []time.Duration
				err := p.Do(ctx, func(ctx context.Context, attempt int) error {
					at = append(at, time.Since(start))
					if attempt == 1 {
						return extHintErr{hint}
					}
					return nil
				})
				if err != nil {
					t.Fatalf("left %v hint %v: %v", left, hint, err)
				}
				if at[1] < hint || at[1] >= left {
					t.Errorf("left %v hint %v: second attempt at %v, want in [hint, deadline)", left, hint, at[1])
				}
			})
		}
	}
}

func extBackoff(t *testing.T, c backoff.Config) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A deadline in the past (year 1, Unix epoch): op is not called, Attempts 0,
// Reason Deadline.
func TestAttackExtremesDeadlineInThePast(t *testing.T) {
	for _, dl := range []time.Time{{}, time.Unix(0, 0), time.Unix(-1<<40, 0)} {
		ctx, cancel := context.WithDeadline(context.Background(), dl)
		n := 0
		err := extPolicy(t).Do(ctx, func(context.Context, int) error { n++; return nil })
		cancel()
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 || n != 0 {
			t.Errorf("deadline %v: Do = %v (ran %d), want Reason Deadline, Attempts 0", dl, err, n)
		}
	}
}

// WithAttemptTimeout of the largest Duration with a deadline in year 9999:
// the attempt's context ends at the call's deadline (never before now).
func TestAttackExtremesAttemptTimeoutMaxDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := extPolicy(t, retry.WithAttemptTimeout(math.MaxInt64))
		for _, withDL := range []bool{false, true} {
			ctx := context.Background()
			cancel := func() {}
			if withDL {
				ctx, cancel = context.WithDeadline(ctx, extYear9999)
			}
			err := p.Do(ctx, func(ctx context.Context, attempt int) error {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				dl, ok := ctx.Deadline()
				if ok && !dl.After(time.Now().Add(time.Hour)) {
					t.Errorf("deadline %v: attempt deadline %v is not far away", withDL, dl)
				}
				return nil
			})
			cancel()
			if err != nil {
				t.Errorf("deadline %v: %v", withDL, err)
			}
		}
	})
}

// WithAttemptTimeout(1ns): every attempt times out, the loop retries (up to
// MaxAttempts) and the call ends with AttemptsExhausted; never a hang or a
// negative sleep.
func TestAttackExtremesAttemptTimeout1ns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := extPolicy(t, retry.WithAttemptTimeout(1), retry.WithMaxAttempts(5))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		n := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			n++
			<-ctx.Done()
			return ctx.Err()
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || n != 5 {
			t.Errorf("Do = %v after %d attempts, want AttemptsExhausted after 5", err, n)
		}
	})
}

// Hints that are not positive (negative, MinInt64) are not hints: the
// backoff's delay is the sleep.
func TestAttackExtremesNegativeHintIgnored(t *testing.T) {
	for _, hint := range []time.Duration{-1, math.MinInt64, -time.Hour} {
		synctest.Test(t, func(t *testing.T) {
			p := extPolicy(t, retry.WithBackoff(extBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Second})),
				retry.WithClassifier(func(error) bool { return true }))
			start := time.Now()
			var at []time.Duration
			err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				at = append(at, time.Since(start))
				if attempt == 1 {
					return extHintErr{hint}
				}
				return nil
			})
			if err != nil || len(at) != 2 || at[1] != time.Second {
				t.Errorf("hint %v: Do = %v, attempts at %v; want the backoff's 1 s", hint, err, at)
			}
		})
	}
}

// A hint of exactly WithMaxRetryAfter is honoured; one ns above is a
// Deadline stop without sleeping.
func TestAttackExtremesHintAtMaxRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		max := 3 * time.Second
		p := extPolicy(t, retry.WithMaxRetryAfter(max))
		start := time.Now()
		n := 0
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			n++
			if attempt == 1 {
				return extHintErr{max}
			}
			return nil
		})
		if err != nil || time.Since(start) < max {
			t.Errorf("hint = max: Do = %v after %v", err, time.Since(start))
		}
		start = time.Now()
		err = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return extHintErr{max + 1} })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || time.Since(start) != 0 || retry.RetryAfter(err) != max+1 {
			t.Errorf("hint = max+1ns: Do = %v after %v, RetryAfter %v", err, time.Since(start), retry.RetryAfter(err))
		}
	})
}

// Backoff with Base of the largest Duration, under a deadline: the first
// sleep can never fit, so the loop stops at once with Deadline.
func TestAttackExtremesBackoffMaxBaseStopsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, s := range []backoff.Strategy{backoff.NoJitter, backoff.Constant, backoff.Linear, backoff.Decorrelated, backoff.EqualJitter} {
			p := extPolicy(t, retry.WithBackoff(extBackoff(t, backoff.Config{Strategy: s, Base: math.MaxInt64})))
			ctx, cancel := context.WithTimeout(context.Background(), 100*extYear)
			start := time.Now()
			err := p.Do(ctx, func(ctx context.Context, attempt int) error { return io.ErrUnexpectedEOF })
			cancel()
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 1 || time.Since(start) != 0 {
				t.Errorf("%v: Do = %v after %v; want Deadline after 1 attempt, no sleep", s, err, time.Since(start))
			}
		}
	})
}

// Plan: left of 0 or less means no deadline, MinInt64 included.
func TestAttackExtremesPlanLeftExtremes(t *testing.T) {
	p := extPolicy(t, retry.WithBackoff(extBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Second})))
	for _, left := range []time.Duration{0, -1, math.MinInt64} {
		next := p.Plan()
		if sleep, stop := next(io.ErrUnexpectedEOF, left); stop != 0 || sleep != time.Second {
			t.Errorf("left %v: next = %v, %v; want 1s, no stop", left, sleep, stop)
		}
	}
	for _, left := range []time.Duration{1, time.Second} {
		next := p.Plan()
		if _, stop := next(io.ErrUnexpectedEOF, left); stop != retry.Deadline {
			t.Errorf("left %v: stop %v, want Deadline", left, stop)
		}
	}
	next := p.Plan()
	if sleep, stop := next(io.ErrUnexpectedEOF, math.MaxInt64); stop != 0 || sleep != time.Second {
		t.Errorf("left MaxInt64: next = %v, %v; want 1s, no stop", sleep, stop)
	}
}

// MaxAttempts of MaxInt with a tiny constant backoff: the loop retries until
// the deadline and stops with Deadline, never sleeping past it.
func TestAttackExtremesMaxAttemptsHugeTinyBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := extPolicy(t, retry.WithMaxAttempts(math.MaxInt),
			retry.WithBackoff(extBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Microsecond, Cap: time.Microsecond})))
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		defer cancel()
		n := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error { n++; return io.ErrUnexpectedEOF })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline {
			t.Errorf("Do = %v, want Deadline", err)
		}
		if el := time.Since(start); el > 5*time.Millisecond {
			t.Errorf("ended %v after start, past the 5ms deadline", el)
		}
		if n < 4000 || n > 5001 {
			t.Errorf("%d attempts in 5 ms with 1 µs sleeps", n)
		}
	})
}

// A breaker with an open period of 200 years and a call whose deadline is
// in year 9999: the call waits for the probe round (which comes before the
// deadline) instead of failing, and succeeds.
func TestAttackExtremesBreakerOpenForCenturiesCallWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br, err := breaker.New(breaker.Config{OpenFor: 200 * extYear, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		br.Trip(0)
		p := extPolicy(t, retry.WithGuards(retry.Guards{Breaker: br}))
		ctx, cancel := context.WithDeadline(context.Background(), extYear9999)
		defer cancel()
		start := time.Now()
		err = p.Do(ctx, func(ctx context.Context, attempt int) error { return nil })
		if err != nil {
			t.Fatalf("Do = %v, want success after the wait", err)
		}
		if el := time.Since(start); el < 200*extYear-time.Second {
			t.Errorf("admitted after %v, before the open period", el)
		}
	})
}

// A budget with the largest Window and huge floor, a limiter with Max 2^30:
// the loop works as with defaults.
func TestAttackExtremesGuardsExtremeConfigs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bu, err := budget.New(budget.Config{MinPerSecond: math.MaxFloat64, Ratio: 1})
		if err != nil {
			t.Fatal(err)
		}
		li, err := limit.New(limit.Config{Max: 1 << 30, Timeout: math.MaxInt64})
		if err != nil {
			t.Fatal(err)
		}
		br, err := breaker.New(breaker.Config{OpenFor: math.MaxInt64, MinCalls: math.MaxInt, SlowCall: 1})
		if err != nil {
			t.Fatal(err)
		}
		p := extPolicy(t, retry.WithGuards(retry.Guards{Budget: bu, Limiter: li, Breaker: br}), retry.WithMaxAttempts(10),
			retry.WithBackoff(extBackoff(t, backoff.Config{Base: 1, Cap: 1})))
		ctx, cancel := context.WithDeadline(context.Background(), extYear9999)
		defer cancel()
		n := 0
		err = p.Do(ctx, func(ctx context.Context, attempt int) error { n++; return io.ErrUnexpectedEOF })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || n != 10 {
			t.Errorf("Do = %v after %d attempts, want AttemptsExhausted after 10", err, n)
		}
	})
}
