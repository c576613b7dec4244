// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package retry_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

var errAtkSentinel = errors.New("attack: sentinel")

type atkTimeout struct{ t bool }

func (e atkTimeout) Error() string { return "attack timeout" }
func (e atkTimeout) Timeout() bool { return e.t }

type atkHint struct{ d time.Duration }

func (e atkHint) Error() string             { return "attack hint" }
func (e atkHint) RetryAfter() time.Duration { return e.d }

// IsRetryable rule 3: "any error whose Timeout() reports true ... retryable",
// searched "along their whole Unwrap chain (single and multiple unwraps)".
func TestAttackIsRetryableTimeoutAnyInChain(t *testing.T) {
	err := errors.Join(atkTimeout{false}, atkTimeout{true})
	if !retry.IsRetryable(err) {
		t.Errorf("IsRetryable(Join(Timeout()=false, Timeout()=true)) = false; the chain holds an error whose Timeout() reports true")
	}
	// The same through the *url.Error the doc names: its Timeout() only
	// asks its direct Err, so a timeout wrapped once more is hidden.
	uerr := &url.Error{Op: "Get", URL: "http://x", Err: fmt.Errorf("dial: %w", atkTimeout{true})}
	if !retry.IsRetryable(uerr) {
		t.Errorf("IsRetryable(&url.Error{Err: fmt.Errorf(\"dial: %%w\", timeout)}) = false; the chain holds an error whose Timeout() reports true")
	}
}

// Error.Err: "the last error the operation returned, with a Permanent marker
// removed"; Permanent: "When op returns the marked error itself, the
// *Error's Err is err (the mark is removed)".
func TestAttackPermanentMarkRemovedOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, _ := retry.New()
	err := p.Do(ctx, func(ctx context.Context, attempt int) error {
		cancel()
		return retry.Permanent(errAtkSentinel)
	})
	var re *retry.Error
	if !errors.As(err, &re) {
		t.Fatalf("err %v not *Error", err)
	}
	if re.Reason != retry.Canceled {
		t.Fatalf("Reason %v, want Canceled", re.Reason)
	}
	if re.Err != errAtkSentinel {
		t.Errorf("Err = %#v (%T), want the sentinel itself (the Permanent mark removed)", re.Err, re.Err)
	}
}

func TestAttackPermanentMarkRemovedAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p, _ := retry.New()
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			time.Sleep(2 * time.Second)
			return retry.Permanent(errAtkSentinel)
		})
		var re *retry.Error
		if !errors.As(err, &re) {
			t.Fatalf("err %v not *Error", err)
		}
		t.Logf("reason %v err %v", re.Reason, err)
		if re.Err != errAtkSentinel {
			t.Errorf("Err = %#v (%T), want the sentinel itself (the Permanent mark removed)", re.Err, re.Err)
		}
	})
}

// WithMaxRetryAfter: a hint above d "counts as a wait that ends past the
// deadline: the loop gives up at once with Reason Deadline, the give-up's
// RetryAfter the hint".
func TestAttackMaxRetryAfterGiveUpRetryAfterIsHint(t *testing.T) {
	bo, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 5 * time.Second, Cap: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	p, err := retry.New(retry.WithBackoff(bo), retry.WithMaxRetryAfter(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hint := 2 * time.Second
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		return atkHint{hint}
	})
	var re *retry.Error
	if !errors.As(err, &re) || re.Reason != retry.Deadline {
		t.Fatalf("err %v, want Deadline give-up", err)
	}
	if got := retry.RetryAfter(err); got != hint {
		t.Errorf("RetryAfter(give-up) = %v, want the hint %v (err: %v)", got, hint, err)
	}
}

func atkFixedBackoff(t *testing.T, d time.Duration) *backoff.Backoff {
	t.Helper()
	bo, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: d, Cap: d})
	if err != nil {
		t.Fatal(err)
	}
	return bo
}

var atkTransient = atkTimeout{true}

// "If the next sleep would end at or after the deadline, the loop gives up
// now instead of sleeping past it."
func TestAttackSleepEndsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Second)))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		start := time.Now()
		n := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			n++
			time.Sleep(time.Second)
			return atkTransient
		})
		if !errors.Is(err, retry.Deadline) || n != 1 || time.Since(start) != time.Second {
			t.Errorf("err %v n %d elapsed %v; want Deadline after 1 attempt at 1s", err, n, time.Since(start))
		}
		if d := retry.RetryAfter(err); d != time.Second {
			t.Errorf("RetryAfter %v, want the refused sleep 1s", d)
		}
	})
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Second-1)))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			n++
			if n == 1 {
				time.Sleep(time.Second)
			}
			return atkTransient
		})
		if n != 2 {
			t.Errorf("n %d err %v; want 2 attempts (sleep ends 1ns before deadline)", n, err)
		}
	})
}

// Hint spread never passes the deadline; the hint is a floor.
func TestAttackHintSpreadWithinDeadline(t *testing.T) {
	for _, u := range []float64{0, 0.5, 0.999999999} {
		synctest.Test(t, func(t *testing.T) {
			bo, _ := backoff.New(backoff.Config{Rand: func() float64 { return u }})
			p, _ := retry.New(retry.WithBackoff(bo))
			ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
			defer cancel()
			var times []time.Time
			start := time.Now()
			err := p.Do(ctx, func(ctx context.Context, attempt int) error {
				times = append(times, time.Now())
				return atkHint{time.Second}
			})
			if len(times) != 2 {
				t.Fatalf("u=%v attempts %d err %v", u, len(times), err)
			}
			d := times[1].Sub(start)
			if d < time.Second || d >= 1500*time.Millisecond {
				t.Errorf("u=%v slept %v, want in [1s, 1.5s) and before deadline", u, d)
			}
		})
	}
}

// Canceling mid-sleep ends the loop at once.
func TestAttackCancelMidSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Hour)))
		ctx, cancel := context.WithCancelCause(context.Background())
		cause := errors.New("attack cause")
		time.AfterFunc(time.Minute, func() { cancel(cause) })
		start := time.Now()
		err := p.Do(ctx, func(ctx context.Context, attempt int) error { return atkTransient })
		if time.Since(start) != time.Minute || !errors.Is(err, retry.Canceled) || !errors.Is(err, context.Canceled) || !errors.Is(err, cause) || !errors.Is(err, atkTransient) {
			t.Errorf("err %v after %v", err, time.Since(start))
		}
		var re *retry.Error
		if errors.As(err, &re) && re.Attempts != 1 {
			t.Errorf("attempts %d", re.Attempts)
		}
	})
}

type atkLimiter struct {
	err   error
	calls int
	hook  func()
}

func (l *atkLimiter) Wait(ctx context.Context) error {
	l.calls++
	if l.hook != nil {
		l.hook()
	}
	return l.err
}

// WithRateLimit: any other error stops with Reason Deadline, the limiter's
// error reachable, Err the last error of the operation, nil if none ran.
func TestAttackRateLimitRefusal(t *testing.T) {
	lerr := errors.New("attack rate")
	l := &atkLimiter{err: lerr}
	p, _ := retry.New(retry.WithRateLimit(l))
	n := 0
	err := p.Do(context.Background(), func(ctx context.Context, attempt int) error { n++; return nil })
	var re *retry.Error
	if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 || re.Err != nil || !errors.Is(err, lerr) || !errors.Is(err, context.DeadlineExceeded) || n != 0 {
		t.Errorf("err %v (%+v) n %d", err, re, n)
	}
}

// "Canceling the context stops the loop at once ... and is never retried":
// a cancel that lands while the rate limiter lets the attempt go.
func TestAttackRateLimitCancelDuringWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := &atkLimiter{}
	l.hook = func() {
		if l.calls == 2 {
			cancel()
		}
	}
	p, _ := retry.New(retry.WithRateLimit(l), retry.WithBackoff(atkFixedBackoff(t, time.Nanosecond)))
	n := 0
	err := p.Do(ctx, func(ctx context.Context, attempt int) error { n++; return atkTransient })
	if n != 1 {
		t.Errorf("op ran %d times after the caller canceled during the rate wait; err %v", n, err)
	}
}

type atkBudget struct {
	deposits, withdrawals int
	lefts                 []time.Duration
	allow                 bool
}

func (b *atkBudget) Deposit()       { b.deposits++ }
func (b *atkBudget) Withdraw() bool { b.withdrawals++; return b.allow }
func (b *atkBudget) WithdrawWithin(left time.Duration) bool {
	b.lefts = append(b.lefts, left)
	return b.Withdraw()
}

func TestAttackBudgetWithinLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bg := &atkBudget{allow: true}
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Second)), retry.WithGuards(retry.Guards{Budget: bg}), retry.WithMaxAttempts(3))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			time.Sleep(time.Second)
			return atkTransient
		})
		if !errors.Is(err, retry.AttemptsExhausted) || bg.deposits != 1 || bg.withdrawals != 2 {
			t.Fatalf("err %v deposits %d withdrawals %d", err, bg.deposits, bg.withdrawals)
		}
		if len(bg.lefts) != 2 || bg.lefts[0] != 9*time.Second || bg.lefts[1] != 7*time.Second {
			t.Errorf("lefts %v, want [9s 7s]", bg.lefts)
		}
		bg2 := &atkBudget{allow: false}
		p2, _ := retry.New(retry.WithGuards(retry.Guards{Budget: bg2}))
		start := time.Now()
		err = p2.Do(context.Background(), func(ctx context.Context, attempt int) error { return atkTransient })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.BudgetExhausted || re.Attempts != 1 || re.Err != atkTransient || time.Since(start) != 0 || bg2.lefts[0] != 0 {
			t.Errorf("err %v %+v elapsed %v lefts %v", err, re, time.Since(start), bg2.lefts)
		}
	})
}

func TestAttackBreakerOpenNoDepositNoWithdraw(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		bg := &atkBudget{allow: true}
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Millisecond)), retry.WithGuards(retry.Guards{Budget: bg, Breaker: brk}))
		err = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return atkTransient })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.CircuitOpen || re.Attempts != 1 || re.Err != atkTransient || !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("err %v %+v", err, re)
		}
		if bg.deposits != 1 || bg.withdrawals != 0 {
			t.Errorf("deposits %d withdrawals %d", bg.deposits, bg.withdrawals)
		}
		if ra := retry.RetryAfter(err); ra < 8*time.Second || ra > 12*time.Second {
			t.Errorf("RetryAfter %v", ra)
		}
		// second call: rejected at once, no deposit, Err is *OpenError
		n := 0
		err = p.Do(context.Background(), func(ctx context.Context, attempt int) error { n++; return nil })
		var oe *breaker.OpenError
		if !errors.As(err, &re) || re.Reason != retry.CircuitOpen || re.Attempts != 0 || !errors.As(re.Err, &oe) || n != 0 || bg.deposits != 1 {
			t.Errorf("second call err %v %+v n %d deposits %d", err, re, n, bg.deposits)
		}
		// a call with a deadline before the next round: rejected
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = p.Do(ctx, func(ctx context.Context, attempt int) error { n++; return nil })
		if !errors.Is(err, retry.CircuitOpen) || n != 0 {
			t.Errorf("deadline call err %v", err)
		}
		// a call with a deadline past the round: waits and gets a probe
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Minute)
		defer cancel2()
		probe := false
		err = p.Do(ctx2, func(ctx context.Context, attempt int) error { n++; probe = retry.IsProbe(ctx); return nil })
		if err != nil || n != 1 || !probe {
			t.Errorf("waiting call err %v n %d probe %v", err, n, probe)
		}
	})
}

// DoValue returns the last attempt's value with the give-up; zero if none ran.
func TestAttackDoValueLastValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Millisecond)))
		v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (int, error) {
			return attempt * 10, atkTransient
		})
		if v != 30 || !errors.Is(err, retry.AttemptsExhausted) {
			t.Errorf("v %d err %v", v, err)
		}
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, attempt int) (int, error) {
			return attempt, nil
		}, func(v int) bool { return v < 5 })
		var re *retry.Error
		if v != 3 || !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Err == nil || re.Err.Error() != "retry: the result asked for another attempt" {
			t.Errorf("DoValueIf v %d err %v", v, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		v, err = retry.DoValue(ctx, p, func(ctx context.Context, attempt int) (int, error) { return 7, nil })
		if v != 0 || !errors.As(err, &re) || re.Attempts != 0 || re.Reason != retry.Canceled {
			t.Errorf("canceled v %d err %v", v, err)
		}
	})
}

type atkObs struct{ evs []observe.Event }

func (o *atkObs) Observe(ctx context.Context, e observe.Event) { o.evs = append(o.evs, e) }

func TestAttackObserverSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &atkObs{}
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return 0 }})
		p, _ := retry.New(retry.WithBackoff(bo), retry.WithObserver(o), retry.WithName("attack"))
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			if attempt == 2 {
				return atkHint{time.Second}
			}
			return atkTransient
		})
		if !errors.Is(err, retry.AttemptsExhausted) {
			t.Fatal(err)
		}
		var got []string
		for _, e := range o.evs {
			got = append(got, string(e.Kind)+"/"+e.Outcome+"/"+e.Reason)
			if e.Name != "attack" {
				t.Errorf("name %q", e.Name)
			}
		}
		want := []string{
			"attempt-start//", "attempt-end/failure/", "retry/backoff/",
			"attempt-start//", "attempt-end/failure/", "retry/hint/",
			"attempt-start//", "attempt-end/failure/", "give-up//attempts-exhausted",
		}
		if len(got) != len(want) {
			t.Fatalf("events %v", got)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("event %d %q want %q", i, got[i], want[i])
			}
		}
		if d := o.evs[5].Delay; d != time.Second {
			t.Errorf("hint retry delay %v (rand 0 => exactly the hint)", d)
		}
		if o.evs[8].Attempt != 3 || o.evs[8].Err != atkTransient {
			t.Errorf("give-up %+v", o.evs[8])
		}
	})
}

// WithAttemptTimeout: an attempt cut off by its own timeout while the call has
// time is retried, and the breaker counts it a failure.
func TestAttackAttemptTimeoutRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithAttemptTimeout(time.Second), retry.WithBackoff(atkFixedBackoff(t, time.Millisecond)))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var lefts []time.Duration
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			dl, _ := ctx.Deadline()
			lefts = append(lefts, time.Until(dl))
			<-ctx.Done()
			return ctx.Err()
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 3 {
			t.Errorf("err %v", err)
		}
		for _, l := range lefts {
			if l != time.Second {
				t.Errorf("attempt deadline left %v", l)
			}
		}
		// attempt timeout larger than the call's remaining time: capped at the deadline
		ctx2, cancel2 := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel2()
		lefts = nil
		err = p.Do(ctx2, func(ctx context.Context, attempt int) error {
			dl, _ := ctx.Deadline()
			lefts = append(lefts, time.Until(dl))
			<-ctx.Done()
			return ctx.Err()
		})
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 2 || len(lefts) != 2 || lefts[1] != 499*time.Millisecond {
			t.Errorf("err %v lefts %v", err, lefts)
		}
	})
}

// Package doc, "The rules": "At most MaxAttempts tries, the first included
// (default 3), besides the probes a circuit breaker hands to a call that
// waits for it (at most one per probe round while the call's deadline
// lasts)". A black-box attack found op run 61 times with
// WithMaxAttempts(2) and a one-minute deadline, against a rule that did
// not name the probes: the probes are the breaker's by design (see
// TestWaitOutTheOutage), and the rule now says so and what bounds them.
func TestAttackProbeLoopBeyondMaxAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1, Rand: func() float64 { return 0.5 }})
		p, _ := retry.New(retry.WithMaxAttempts(2), retry.WithBackoff(atkFixedBackoff(t, time.Millisecond)), retry.WithGuards(retry.Guards{Breaker: brk}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		own, probes := 0, 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			if retry.IsProbe(ctx) {
				probes++
			} else {
				own++
			}
			return atkTransient
		})
		t.Logf("op ran %d times of its own and %d probes, err %v", own, probes, err)
		// One probe round a second (OpenFor, no jitter) for a minute.
		if own > 2 || probes > 60 {
			t.Errorf("op ran %d times of its own and %d probes with WithMaxAttempts(2), OpenFor 1s, a 1m deadline; want at most 2 and 60", own, probes)
		}
	})
}

// WithClassifier: "Once the call's deadline has passed the loop stops
// whatever it says; it is then asked only if the policy has a breaker".
// The op returns exactly at the call's deadline; the race with the context's
// own timer decides, so the test runs many times and counts.
func TestAttackClassifierNotAskedPastDeadline(t *testing.T) {
	bad, runs := 0, 200
	for i := 0; i < runs; i++ {
		synctest.Test(t, func(t *testing.T) {
			asked := 0
			p, _ := retry.New(retry.WithObserver(&atkObs{}), retry.WithClassifier(func(error) bool { asked++; return true }))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_ = p.Do(ctx, func(ctx context.Context, attempt int) error {
				time.Sleep(time.Second)
				return errAtkSentinel
			})
			if asked != 0 {
				bad++
			}
		})
	}
	if bad > 0 {
		t.Errorf("classifier asked about an error returned at the deadline in %d of %d runs", bad, runs)
	}
}

// WithGuards: "an attempt that ends after the parent context has ended
// (canceled, or past its own deadline) is given back with
// breaker.Breaker.Cancel and counts neither way".
func TestAttackBreakerCountsAttemptEndingAtDeadline(t *testing.T) {
	bad, runs := 0, 200
	for i := 0; i < runs; i++ {
		synctest.Test(t, func(t *testing.T) {
			brk, _ := breaker.New(breaker.Config{ConsecutiveFailures: 1})
			p, _ := retry.New(retry.WithGuards(retry.Guards{Breaker: brk}))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err := p.Do(ctx, func(ctx context.Context, attempt int) error {
				time.Sleep(time.Second)
				return atkTransient
			})
			if !errors.Is(err, retry.Deadline) {
				t.Fatalf("err %v", err)
			}
			if brk.State() != breaker.Closed {
				bad++
			}
		})
	}
	if bad > 0 {
		t.Errorf("an attempt that ended at the call's deadline was counted as a failure (breaker opened) in %d of %d runs", bad, runs)
	}
}

func TestAttackPanicReleasesSlot(t *testing.T) {
	lim, err := limit.New(limit.Config{Max: 1, Waiting: -1})
	if err != nil {
		t.Fatal(err)
	}
	brk, _ := breaker.New(breaker.Config{ConsecutiveFailures: 1})
	p, _ := retry.New(retry.WithGuards(retry.Guards{Limiter: lim, Breaker: brk}), retry.WithAttemptTimeout(time.Second))
	func() {
		defer func() {
			if r := recover(); r != "attack boom" {
				t.Errorf("recovered %v", r)
			}
		}()
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { panic("attack boom") })
	}()
	if brk.State() != breaker.Open {
		t.Errorf("breaker %v after a panic, want the failure counted", brk.State())
	}
	brk.Reset()
	n := 0
	for i := 0; i < 5; i++ {
		if err := p.Do(context.Background(), func(ctx context.Context, attempt int) error { n++; return nil }); err != nil {
			t.Errorf("after panic: %v", err)
		}
	}
	// limiter refusal: hold the one slot
	hold := make(chan struct{})
	started := make(chan struct{})
	go p.Do(context.Background(), func(ctx context.Context, attempt int) error { close(started); <-hold; return nil })
	<-started
	bg := &atkBudget{allow: true}
	p2, _ := retry.New(retry.WithGuards(retry.Guards{Limiter: lim, Budget: bg}))
	err = p2.Do(context.Background(), func(ctx context.Context, attempt int) error { n++; return nil })
	var re *retry.Error
	if !errors.As(err, &re) || re.Reason != retry.Limited || re.Attempts != 0 || !errors.Is(err, limit.ErrLimited) || bg.deposits != 0 {
		t.Errorf("limited: err %v deposits %d", err, bg.deposits)
	}
	close(hold)
}

func TestAttackErrorMessages(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Millisecond)))
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error { return atkTransient })
		if got, want := err.Error(), "retry: attempts exhausted after 3 attempts: attack timeout"; got != want {
			t.Errorf("%q want %q", got, want)
		}
		err = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return errAtkSentinel })
		want := "retry: not retryable after 1 attempt (the default classifier retries only timeouts, broken connections and errors that carry a server hint or say they are temporary; to retry others, use retry.WithClassifier): attack: sentinel"
		if got := err.Error(); got != want {
			t.Errorf("%q want %q", got, want)
		}
		for r, w := range map[retry.Reason]string{retry.NotRetryable: "retry: not retryable", retry.Limited: "retry: limited", retry.Reason(0): "retry: Reason(0)", retry.Reason(200): "retry: Reason(200)"} {
			if r.Error() != w {
				t.Errorf("%d: %q want %q", r, r.Error(), w)
			}
		}
	})
}

// WithGuards: "If a failure leaves the breaker open for longer than the
// coming sleep and the call cannot wait for it, the loop gives up at once in
// the same way, without sleeping and without spending the budget on a retry
// that could only be rejected." Reason CircuitOpen lists "too many calls
// waiting" among the ways a call cannot wait.
func TestAttackOpenBeyondWaitersFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second, MaxWaiters: 1})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()

		// B: its first attempt is admitted while the breaker is closed, and
		// fails after the breaker has opened and its one waiter slot is taken.
		bg := &atkBudget{allow: true}
		pB, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, 100*time.Millisecond)), retry.WithGuards(retry.Guards{Breaker: brk, Budget: bg}))
		release := make(chan struct{})
		bStarted := make(chan struct{})
		var errB error
		var bDone time.Time
		done := make(chan struct{})
		go func() {
			errB = pB.Do(ctx, func(ctx context.Context, attempt int) error {
				if attempt == 1 {
					close(bStarted)
					<-release
				}
				return atkTransient
			})
			bDone = time.Now()
			close(done)
		}()
		<-bStarted

		// A: fails, opens the breaker, then waits for the probe round (the one waiter).
		pA, _ := retry.New(retry.WithBackoff(atkFixedBackoff(t, time.Millisecond)), retry.WithGuards(retry.Guards{Breaker: brk}))
		go pA.Do(ctx, func(ctx context.Context, attempt int) error { return atkTransient })
		time.Sleep(time.Second) // A failed at once, slept 1ms and is now waiting
		synctest.Wait()
		if brk.State() != breaker.Open {
			t.Fatalf("breaker %v", brk.State())
		}
		start := time.Now()
		close(release)
		<-done
		var re *retry.Error
		if !errors.As(errB, &re) || re.Reason != retry.CircuitOpen {
			t.Fatalf("B err %v", errB)
		}
		if bg.withdrawals != 0 || bDone.Sub(start) != 0 {
			t.Errorf("B could not wait (waiters full) yet withdrew %d retries and slept %v before giving up: %v", bg.withdrawals, bDone.Sub(start), errB)
		}
		cancel()
	})
}
