package retry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// countingBudget wraps a retry.Budget and counts what the loop asks of it.
type countingBudget struct {
	inner               retry.Budget
	deposits, withdraws atomic.Int64 // withdraws counts admitted ones
	refused             atomic.Int64
}

func (b *countingBudget) Deposit() { b.deposits.Add(1); b.inner.Deposit() }
func (b *countingBudget) Withdraw() bool {
	ok := b.inner.Withdraw()
	if ok {
		b.withdraws.Add(1)
	} else {
		b.refused.Add(1)
	}
	return ok
}

// mustBudget builds a budget with the default 10 s window, or fails the
// test. A ratio or perSecond of 0 means none (budget.Config spells that with
// a negative value; its zero fields take the defaults).
func mustBudget(t testing.TB, ratio, perSecond float64) *budget.Budget {
	t.Helper()
	none := func(v float64) float64 {
		if v == 0 {
			return -1
		}
		return v
	}
	b, err := budget.New(budget.Config{Ratio: none(ratio), MinPerSecond: none(perSecond)})
	if err != nil {
		t.Fatalf("budget.New: %v", err)
	}
	return b
}

// half pins a breaker's or a backoff's U at 0.5: a breaker's open periods
// are then exactly OpenFor.
func half() float64 { return 0.5 }

// mustBreaker builds a breaker that trips on the first failure (MinCalls 1,
// ratio 0.5), stays open exactly 30 s and closes after one good probe, or
// fails the test.
func mustBreaker(t testing.TB) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, OpenFor: 30 * time.Second, Rand: half})
	if err != nil {
		t.Fatalf("breaker.New: %v", err)
	}
	return b
}

// trip records one failure on b, which trips a mustBreaker breaker.
func trip(t *testing.T, b *breaker.Breaker) {
	t.Helper()
	pm, err := b.Allow()
	if err != nil {
		t.Fatalf("Allow before trip: %v", err)
	}
	b.Done(pm, false)
	if s := b.State(); s != breaker.Open {
		t.Fatalf("State after a failure = %v, want open", s)
	}
}

func TestBudgetRefusalEndsWithLastError(t *testing.T) {
	last := &statusErr{Code: 502}
	tests := []struct {
		name         string
		ratio, floor float64
		earlier      int // successful calls made first (deposits)
		errs         []error
		wantReason   retry.Reason // 0: success
		wantAttempts int
		wantErr      error
		wantSleeps   int
	}{
		{"empty budget refuses the first retry", 0, 0, 0, []error{err503, err503}, retry.BudgetExhausted, 1, err503, 0},
		{"last real error, not the first", 0.5, 0, 1, []error{err503, last, err503}, retry.BudgetExhausted, 2, last, 1},
		{"floor admits the retry", 0, 1, 0, []error{err503}, 0, 2, nil, 1},
		{"ratio admits two retries", 1, 0, 1, []error{err503, err503}, 0, 3, nil, 2},
		{"not retryable: no withdrawal asked", 0, 0, 0, []error{err404}, retry.NotRetryable, 1, err404, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newTimeline()
				b := &countingBudget{inner: mustBudget(t, tt.ratio, tt.floor)}
				p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Budget: b}), retry.WithMaxAttempts(5))
				for range tt.earlier {
					if err := p.Do(context.Background(), succeed); err != nil {
						t.Fatalf("earlier Do = %v", err)
					}
				}
				calls := 0
				err := p.Do(context.Background(), script(&calls, tt.errs...))
				if calls != tt.wantAttempts {
					t.Errorf("calls = %d, want %d", calls, tt.wantAttempts)
				}
				if got := len(clock.Sleeps()); got != tt.wantSleeps {
					t.Errorf("sleeps = %d, want %d (a refused retry must not sleep)", got, tt.wantSleeps)
				}
				if d := b.deposits.Load(); d != int64(tt.earlier+1) {
					t.Errorf("deposits = %d, want one per call: %d", d, tt.earlier+1)
				}
				if w := b.withdraws.Load(); w != int64(calls-1) {
					t.Errorf("admitted withdrawals = %d, want one per retry: %d", w, calls-1)
				}
				if tt.wantReason == 0 {
					if err != nil {
						t.Fatalf("Do = %v, want nil", err)
					}
					return
				}
				re := checkStop(t, err, tt.wantReason, tt.wantAttempts)
				if re.Err != tt.wantErr {
					t.Errorf("Do = %v: Err = %v, want the last real error %v", err, re.Err, tt.wantErr)
				}
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("errors.Is(%v, %v) = false", err, tt.wantErr)
				}
			})
		})
	}
}

// TestBudgetSystemClock runs the budget on the system clock without a
// breaker (the loop's short first-attempt path) inside a synctest bubble.
func TestBudgetSystemClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &countingBudget{inner: mustBudget(t, 0, 1)} // 10 retries per 10 s
		p := mustNew(t, retry.WithGuards(retry.Guards{Budget: b}), retry.WithMaxAttempts(2))
		for i := range 12 {
			calls := 0
			err := p.Do(context.Background(), script(&calls, err503))
			switch {
			case i < 10 && (err != nil || calls != 2):
				t.Errorf("call %d: Do = %v after %d calls, want nil after 2", i, err, calls)
			case i >= 10:
				if re := checkStop(t, err, retry.BudgetExhausted, 1); re.Err != err503 {
					t.Errorf("call %d: Err = %v, want the 503", i, re.Err)
				}
			}
		}
		if d, w := b.deposits.Load(), b.withdraws.Load(); d != 12 || w != 10 {
			t.Errorf("deposits, withdrawals = %d, %d; want 12, 10", d, w)
		}
	})
}

func TestBreakerOpenRejectsWithoutCalling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		brk := mustBreaker(t)
		b := &countingBudget{inner: mustBudget(t, 0.1, 1)}
		p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Budget: b, Breaker: brk}))
		trip(t, brk)
		time.Sleep(10 * time.Second)

		calls := 0
		err := p.Do(context.Background(), script(&calls))
		if calls != 0 {
			t.Errorf("op called %d times through an open breaker, want 0", calls)
		}
		re := checkStop(t, err, retry.CircuitOpen, 0)
		var oe *breaker.OpenError
		if !errors.As(re.Err, &oe) || oe.State != breaker.Open {
			t.Fatalf("Do = %v: Err = %#v, want the *breaker.OpenError", err, re.Err)
		}
		if !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("errors.Is(%v, breaker.ErrOpen) = false", err)
		}
		if got := retry.RetryAfter(err); got != 20*time.Second {
			t.Errorf("RetryAfter(%v) = %v, want the 20s until half-open", err, got)
		}
		if d := b.deposits.Load(); d != 0 {
			t.Errorf("deposits = %d, want 0: a rejected call sends nothing", d)
		}
	})
}

func TestBreakerTrippedMidCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// This failure trips the breaker: stop before sleeping.
		{
			clock := newTimeline()
			brk := mustBreaker(t)
			b := &countingBudget{inner: mustBudget(t, 0.1, 1)}
			p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Budget: b, Breaker: brk}))
			calls := 0
			err := p.Do(context.Background(), script(&calls, err503, err503))
			re := checkStop(t, err, retry.CircuitOpen, 1)
			if calls != 1 || re.Err != err503 {
				t.Errorf("Do = %v after %d calls, want Err %v after 1", err, calls, err503)
			}
			if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, err503) {
				t.Errorf("Do = %v: want both breaker.ErrOpen and the 503 reachable", err)
			}
			if s := clock.Sleeps(); len(s) != 0 {
				t.Errorf("sleeps = %v, want none", s)
			}
			if n := b.withdraws.Load() + b.refused.Load(); n != 0 {
				t.Errorf("withdrawals asked = %d, want 0", n)
			}
		}
	})
}

func TestBreakerRejectsLaterAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		// Trips on the 2nd failure in a row.
		brk, err := breaker.New(breaker.Config{MinCalls: 2, FailureRatio: 1, Rand: half})
		if err != nil {
			t.Fatal(err)
		}
		clock.next = observe.Func(func(ctx context.Context, e observe.Event) {
			if e.Kind != observe.Retry {
				return
			}
			// Another caller's failure trips the breaker during our sleep.
			if pm, err := brk.Allow(); err == nil {
				brk.Done(pm, false)
			}
		})
		p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Breaker: brk}))
		calls := 0
		err = p.Do(context.Background(), script(&calls, err503, err503))
		re := checkStop(t, err, retry.CircuitOpen, 1)
		if calls != 1 || re.Err != err503 {
			t.Errorf("Do = %v after %d calls, want Err %v after 1", err, calls, err503)
		}
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || !errors.Is(err, err503) {
			t.Errorf("Do = %v: want both the *breaker.OpenError and the 503 reachable", err)
		}
		if s := clock.Sleeps(); len(s) != 1 {
			t.Errorf("sleeps = %v, want the one before the rejected attempt", s)
		}
	})
}

// TestSleepOutlastsOpenPeriod: a failure trips the breaker, but the sleep
// the server asked for is at least as long as the open period, so the loop
// sleeps and its next attempt is the half-open probe. The breaker opens for
// the 2 s hint spread by U·hint/2 (2.5 s), longer than its 1 s OpenFor, and
// the loop, with the same U, sleeps the same 2.5 s.
func TestSleepOutlastsOpenPeriod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		brk, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Second, Rand: half})
		if err != nil {
			t.Fatal(err)
		}
		p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Breaker: brk}),
			retry.WithBackoff(mustBackoff(t, backoff.FullJitter, 100*time.Millisecond, 10*time.Second, 0.5)))
		calls := 0
		var probe bool
		err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			calls++
			if attempt == 1 {
				return &statusErr{Code: 503, After: 2 * time.Second}
			}
			probe = brk.State() == breaker.HalfOpen
			return nil
		})
		if err != nil || calls != 2 || !probe {
			t.Errorf("Do = %v after %d calls (probe %v), want nil after 2, the second a probe", err, calls, probe)
		}
		if s := clock.Sleeps(); !slices.Equal(s, []time.Duration{2500 * time.Millisecond}) {
			t.Errorf("sleeps = %v, want [2.5s]", s)
		}
		if s := brk.State(); s != breaker.Closed {
			t.Errorf("State = %v, want closed after the good probe", s)
		}
	})
}

func TestHalfOpenProbeThroughTheLoop(t *testing.T) {
	tests := []struct {
		name       string
		errs       []error
		wantState  breaker.State
		wantReason retry.Reason // 0: success
		wantCalls  int
	}{
		{"probe succeeds: closes", nil, breaker.Closed, 0, 1},
		{"probe gets a 404: the dependency answered, closes", []error{err404}, breaker.Closed, retry.NotRetryable, 1},
		{"probe gets a 503: reopens, no retry into the open breaker", []error{err503, err503}, breaker.Open, retry.CircuitOpen, 1},
		{"probe gets a permanent 404: closes", []error{retry.Permanent(err404)}, breaker.Closed, retry.NotRetryable, 1},
		{"probe gets a permanent 503: reopens, no retry", []error{retry.Permanent(err503)}, breaker.Open, retry.NotRetryable, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newTimeline()
				brk := mustBreaker(t)
				p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Breaker: brk}))
				trip(t, brk)
				time.Sleep(30 * time.Second) // the open period is over
				var probe []bool
				calls := 0
				err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
					probe = append(probe, brk.State() == breaker.HalfOpen)
					return script(&calls, tt.errs...)(ctx, attempt)
				})
				if calls != tt.wantCalls || !slices.Equal(probe, []bool{true}) {
					t.Errorf("calls = %d (half-open: %v), want %d probe", calls, probe, tt.wantCalls)
				}
				if s := brk.State(); s != tt.wantState {
					t.Errorf("State after the probe = %v, want %v", s, tt.wantState)
				}
				if tt.wantReason == 0 {
					if err != nil {
						t.Errorf("Do = %v, want nil", err)
					}
					return
				}
				checkStop(t, err, tt.wantReason, tt.wantCalls)
			})
		})
	}
}

func TestProbesTakenRejectsFirstAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		brk := mustBreaker(t)
		p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Breaker: brk}))
		trip(t, brk)
		time.Sleep(30 * time.Second)
		held, err := brk.Allow() // another caller's probe, still in flight
		if err != nil || !held.Probe() {
			t.Fatalf("Allow = %v, %v; want a probe", held, err)
		}
		calls := 0
		err = p.Do(context.Background(), script(&calls))
		checkStop(t, err, retry.CircuitOpen, 0)
		var oe *breaker.OpenError
		if calls != 0 || !errors.As(err, &oe) || oe.State != breaker.HalfOpen {
			t.Errorf("Do = %v after %d calls, want a half-open rejection (all probes taken) after 0", err, calls)
		}
		brk.Done(held, true)
		if err := p.Do(context.Background(), script(&calls)); err != nil || calls != 1 {
			t.Errorf("Do after the breaker closed = %v after %d calls, want nil after 1", err, calls)
		}
	})
}

func TestNotDependencyFailures(t *testing.T) {
	tests := []struct {
		name string
		err  error
	}{
		{"404", err404},
		{"400", &statusErr{Code: 400}},
		{"permanent 404", retry.Permanent(err404)},
		{"plain error", errors.New("bad input")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			brk := mustBreaker(t)
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
			for range 50 {
				calls := 0
				err := p.Do(context.Background(), script(&calls, tt.err))
				checkStop(t, err, retry.NotRetryable, 1)
			}
			s := brk.Snapshot()
			if s.State != breaker.Closed || s.Calls != 50 || s.Failures != 0 {
				t.Errorf("Snapshot after 50 %v = %+v, want closed with 50 calls, 0 failures", tt.err, s)
			}
		})
	}
}

func TestParentEndIsNoOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk := mustBreaker(t)
		p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
		ctx, cancel := context.WithCancel(context.Background())
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			cancel()
			return context.Canceled
		})
		checkStop(t, err, retry.Canceled, 1)

		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		err = p.Do(dctx, func(ctx context.Context, attempt int) error {
			<-ctx.Done() // hangs until the parent's deadline
			return ctx.Err()
		})
		checkStop(t, err, retry.Deadline, 1)
		if s := brk.Snapshot(); s.State != breaker.Closed || s.Calls != 0 {
			t.Errorf("Snapshot = %+v, want closed with no outcome recorded", s)
		}

		// The policy's own attempt timeout is the owner's verdict: a hang
		// counts, and the breaker it opens ends the call.
		pt := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithAttemptTimeout(time.Second))
		err = pt.Do(context.Background(), func(ctx context.Context, attempt int) error {
			<-ctx.Done()
			return ctx.Err()
		})
		checkStop(t, err, retry.CircuitOpen, 1)
		if s := brk.State(); s != breaker.Open {
			t.Errorf("State after a call cut off by the policy's attempt timeout = %v, want open", s)
		}
	})
}

func TestCanceledProbeFreesItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		brk := mustBreaker(t)
		p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Breaker: brk}))
		trip(t, brk)
		time.Sleep(30 * time.Second)
		ctx, cancel := context.WithCancel(context.Background())
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			cancel()
			return ctx.Err()
		})
		checkStop(t, err, retry.Canceled, 1)
		calls := 0
		if err := p.Do(context.Background(), script(&calls)); err != nil || calls != 1 {
			t.Errorf("Do after a canceled probe = %v after %d calls, want nil after 1 (slot freed)", err, calls)
		}
		if s := brk.State(); s != breaker.Closed {
			t.Errorf("State = %v, want closed", s)
		}
	})
}

func TestPanicIsAFailure(t *testing.T) {
	brk := mustBreaker(t)
	p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recover() = %v, want the op's panic", r)
			}
		}()
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { panic("boom") })
	}()
	if s := brk.State(); s != breaker.Open {
		t.Errorf("State after a panicking attempt = %v, want open", s)
	}
}

func TestNilBudgetAndBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var nilBudget *budget.Budget
		for _, opt := range []retry.Option{retry.WithGuards(retry.Guards{}), retry.WithGuards(retry.Guards{Budget: nilBudget})} {
			p := mustNew(t, opt)
			calls := 0
			if err := p.Do(context.Background(), script(&calls, err503)); err != nil || calls != 2 {
				t.Errorf("Do = %v after %d calls, want nil after 2", err, calls)
			}
		}
	})
}

// TestConcurrentBudgetBreaker shares one policy, budget and breaker between
// many goroutines: every call deposits once, every retry is one admitted
// withdrawal, and every failure is a known reason (run with -race).
func TestConcurrentBudgetBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &countingBudget{inner: mustBudget(t, 0.1, 1)}
		brk, err := breaker.New(breaker.Config{MinCalls: 40})
		if err != nil {
			t.Fatal(err)
		}
		p := mustNew(t, retry.WithGuards(retry.Guards{Budget: b, Breaker: brk}), retry.WithMaxAttempts(3))
		const n = 200
		var attempts atomic.Int64
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				errs[i] = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
					attempts.Add(1)
					if i%2 == 0 { // half of the callers see a failing dependency: it trips
						return err503
					}
					return nil
				})
			})
		}
		wg.Wait()
		reasons := map[retry.Reason]int{}
		for i, err := range errs {
			if err == nil {
				continue
			}
			var re *retry.Error
			if !errors.As(err, &re) {
				t.Fatalf("goroutine %d: Do = %v, want nil or *retry.Error", i, err)
			}
			reasons[re.Reason]++
			switch re.Reason {
			case retry.AttemptsExhausted, retry.BudgetExhausted, retry.CircuitOpen:
			default:
				t.Errorf("goroutine %d: unexpected reason %v", i, re.Reason)
			}
		}
		rejected, openLater := 0, 0
		for _, err := range errs {
			if re := (*retry.Error)(nil); errors.As(err, &re) && re.Reason == retry.CircuitOpen {
				if re.Attempts == 0 {
					rejected++
				} else {
					openLater++
				}
			}
		}
		if got, want := b.deposits.Load(), int64(n-rejected); got != want {
			t.Errorf("deposits = %d, want one per call that ran: %d", got, want)
		}
		// One admitted withdrawal per retry, plus at most one per call
		// whose retry the breaker rejected after the sleep.
		retries := attempts.Load() - b.deposits.Load()
		if got := b.withdraws.Load(); got < retries || got > retries+int64(openLater) {
			t.Errorf("admitted withdrawals = %d, want %d retries (+ up to %d rejected by the breaker)", got, retries, openLater)
		}
		if limit := int64(0.1*float64(b.deposits.Load()) + 10); b.withdraws.Load() > limit {
			t.Errorf("retries = %d, above the budget's %d", b.withdraws.Load(), limit)
		}
		t.Logf("reasons: %v, withdrawals %d, rejected %d", reasons, b.withdraws.Load(), rejected)
	})
}

// TestPermanentCountsAsTheClassifierSays: a Permanent mark stops the loop
// at once; the breaker counts the attempt as the classifier judges the
// error inside the mark: a failure of the dependency for a 503, an answer
// for a 404. The mark is removed from the returned Err, and errors.Is sees
// through it.
func TestPermanentCountsAsTheClassifierSays(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		wantState breaker.State
	}{
		{"503", retry.Permanent(err503), breaker.Open},
		{"wrapped 503", fmt.Errorf("call: %w", retry.Permanent(err503)), breaker.Open},
		{"404", retry.Permanent(err404), breaker.Closed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			brk := mustBreaker(t)
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
			calls := 0
			err := p.Do(context.Background(), script(&calls, tt.err, tt.err, tt.err))
			checkStop(t, err, retry.NotRetryable, 1)
			if calls != 1 {
				t.Errorf("Do with %v made %d calls, want 1", tt.err, calls)
			}
			if s := brk.State(); s != tt.wantState {
				t.Errorf("breaker after one %v is %v, want %v (MinCalls 1)", tt.err, s, tt.wantState)
			}
		})
	}
	p := mustNew(t)
	calls := 0
	err := p.Do(context.Background(), script(&calls, retry.Permanent(err503)))
	var re *retry.Error
	if !errors.As(err, &re) || re.Err != err503 || !errors.Is(err, err503) {
		t.Errorf("Do(Permanent(503)) = %v; want *Error with Err == the 503", err)
	}
}

// withinBudget records the time left each WithdrawWithin was given.
type withinBudget struct {
	lefts []time.Duration
	plain int
}

func (b *withinBudget) Deposit()       {}
func (b *withinBudget) Withdraw() bool { b.plain++; return true }
func (b *withinBudget) WithdrawWithin(left time.Duration) bool {
	b.lefts = append(b.lefts, left)
	return true
}

// A budget that may wait is asked with the time left before the deadline
// (0 without one), never with plain Withdraw.
func TestBudgetWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		b := &withinBudget{}
		p := mustNew(t, retry.WithObserver(clock), retry.WithGuards(retry.Guards{Budget: b}),
			retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 100*time.Millisecond, time.Second, 0)))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		calls := 0
		_ = p.Do(ctx, script(&calls, err503, err503, nil))
		if len(b.lefts) != 2 || b.plain != 0 {
			t.Fatalf("WithdrawWithin called %d times (plain Withdraw %d), want 2 and 0", len(b.lefts), b.plain)
		}
		// 10 s at the start; the first sleep (200 ms) is taken after the
		// first withdrawal.
		if b.lefts[0] <= 9*time.Second || b.lefts[1] >= b.lefts[0] {
			t.Errorf("time left per withdrawal %v, want about 10s then less", b.lefts)
		}
		b.lefts = nil
		calls = 0
		_ = p.Do(context.Background(), script(&calls, err503, nil))
		if len(b.lefts) != 1 || b.lefts[0] != 0 {
			t.Errorf("without a deadline: lefts %v, want [0]", b.lefts)
		}
	})
}

// strictBudget is a caller's Budget type whose methods read their
// receiver: a nil one panics in them.
type strictBudget struct{ deposits, withdrawals int }

func (b *strictBudget) Deposit()       { b.deposits++ }
func (b *strictBudget) Withdraw() bool { b.withdrawals++; return true }

// nilSafeBudget is a caller's Budget type whose nil value works: it
// grants every retry.
type nilSafeBudget struct{}

var nilSafeAsked atomic.Int64

func (*nilSafeBudget) Deposit()       {}
func (*nilSafeBudget) Withdraw() bool { nilSafeAsked.Add(1); return true }

// TestTypedNilBudgetOfAnotherType: a nil pointer of a type other than
// *budget.Budget is a budget like any other value (no reflection tells it
// apart): its methods are called. One that reads its receiver panics on
// the caller's goroutine at the call's first deposit, before the operation
// runs; one whose nil value works is used.
func TestTypedNilBudgetOfAnotherType(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustNew(t, retry.WithGuards(retry.Guards{Budget: (*strictBudget)(nil)}))
		calls := 0
		func() {
			defer func() {
				if recover() == nil {
					t.Error("Do with a nil *strictBudget did not panic")
				}
			}()
			_ = p.Do(context.Background(), script(&calls, err503))
		}()
		if calls != 0 {
			t.Errorf("the operation ran %d times before the panic, want 0 (the deposit comes first)", calls)
		}

		p = mustNew(t, retry.WithGuards(retry.Guards{Budget: (*nilSafeBudget)(nil)}))
		nilSafeAsked.Store(0)
		if err := p.Do(context.Background(), script(&calls, err503)); err != nil || nilSafeAsked.Load() != 1 {
			t.Errorf("Do with a nil *nilSafeBudget = %v after %d withdrawals, want nil after 1 (its methods are called)", err, nilSafeAsked.Load())
		}
	})
}
