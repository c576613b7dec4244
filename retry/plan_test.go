package retry_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// step is one failed attempt told to a plan, and what it must answer.
type step struct {
	err       error
	left      time.Duration // before the deadline; 0: none
	wantSleep time.Duration
	wantStop  retry.Reason
}

// stopText names a stop, "none" for 0.
func stopText(r retry.Reason) string {
	if r == 0 {
		return "none"
	}
	return r.Error()
}

// TestPlanNext walks plans through each stop reason and checks that the
// checks come in the documented order: not retryable, attempts exhausted,
// deadline (hint above the maximum, or a sleep that would end at or after
// the deadline), circuit open, budget exhausted. NoJitter base 100 ms: the
// backoff delays are 200 ms, 400 ms, 800 ms.
func TestPlanNext(t *testing.T) {
	const ms = time.Millisecond
	hint := func(d time.Duration) error { return &statusErr{Code: 503, After: d} }
	tests := []struct {
		name   string
		opts   []retry.Option
		budget *countingBudget // nil: none
		open   bool            // the policy has a breaker, open for 30 s
		steps  []step
		// withdrawals the budget must have been asked for
		wantAsked int64
	}{
		{"retryable until the attempts run out", nil, nil, false, []step{
			{err503, 0, 200 * ms, 0},
			{err503, 0, 400 * ms, 0},
			{err503, 0, 0, retry.AttemptsExhausted},
		}, 0},
		{"not retryable", nil, nil, false, []step{{err404, 0, 0, retry.NotRetryable}}, 0},
		{"not retryable after a retry", nil, nil, false, []step{
			{err503, 0, 200 * ms, 0},
			{errors.New("bad request"), 0, 0, retry.NotRetryable},
		}, 0},
		{"Permanent beats the classifier", []retry.Option{retry.WithClassifier(func(error) bool { return true })}, nil, false,
			[]step{{retry.Permanent(err503), 0, 0, retry.NotRetryable}}, 0},
		{"not retryable before attempts exhausted", []retry.Option{retry.WithMaxAttempts(1)}, nil, false,
			[]step{{err404, 0, 0, retry.NotRetryable}}, 0},
		{"attempts exhausted before the deadline", []retry.Option{retry.WithMaxAttempts(1)}, nil, false,
			[]step{{hint(time.Hour), time.Second, 0, retry.AttemptsExhausted}}, 0},
		{"hint above the maximum: deadline, even without one", []retry.Option{retry.WithMaxRetryAfter(time.Second)}, nil, false,
			[]step{{hint(time.Second + 1), 0, time.Second + 1, retry.Deadline}}, 0},
		{"hint at the maximum: slept, spread", []retry.Option{retry.WithMaxRetryAfter(time.Second)}, nil, false,
			[]step{{hint(time.Second), 0, 1250 * ms, 0}}, 0},
		{"hint shorter than the backoff: the backoff", nil, nil, false,
			[]step{{hint(50 * ms), 0, 200 * ms, 0}}, 0},
		{"sleep fits before the deadline", nil, nil, false, []step{{err503, 200*ms + 1, 200 * ms, 0}}, 0},
		{"sleep ending at the deadline", nil, nil, false, []step{{err503, 200 * ms, 200 * ms, retry.Deadline}}, 0},
		{"sleep past the deadline", nil, nil, false, []step{
			{err503, time.Second, 200 * ms, 0},
			{err503, 300 * ms, 400 * ms, retry.Deadline},
		}, 0},
		{"hint past the deadline: the hint, unspread", nil, nil, false,
			[]step{{hint(2 * time.Second), time.Second, 2 * time.Second, retry.Deadline}}, 0},
		{"spread cut to the deadline", nil, nil, false,
			[]step{{hint(2 * time.Second), 2100 * ms, 2*time.Second + 50*ms - 1, 0}}, 0},
		{"deadline before circuit open and budget", nil, &countingBudget{inner: mustBudget(t, 0, 0)}, true,
			[]step{{err503, 100 * ms, 200 * ms, retry.Deadline}}, 0},
		{"open breaker, no deadline: circuit open", nil, &countingBudget{inner: mustBudget(t, 0, 0)}, true,
			[]step{{err503, 0, 0, retry.CircuitOpen}}, 0},
		{"open breaker, deadline before its round: circuit open", nil, nil, true,
			[]step{{err503, 20 * time.Second, 0, retry.CircuitOpen}}, 0},
		{"open breaker, deadline after its round: wait for it", nil, &countingBudget{inner: mustBudget(t, 0, 1)}, true,
			[]step{{err503, time.Minute, 200 * ms, 0}}, 1},
		{"open breaker, deadline after its round, empty budget", nil, &countingBudget{inner: mustBudget(t, 0, 0)}, true,
			[]step{{err503, time.Minute, 0, retry.BudgetExhausted}}, 1},
		{"budget refuses", nil, &countingBudget{inner: mustBudget(t, 0, 0)}, false,
			[]step{{err503, 0, 0, retry.BudgetExhausted}}, 1},
		{"budget admits, then refuses", []retry.Option{retry.WithMaxAttempts(5)}, &countingBudget{inner: mustBudget(t, 0, 0.1)}, false, []step{
			{err503, 0, 200 * ms, 0},
			{err503, 0, 0, retry.BudgetExhausted},
		}, 2},
		{"no withdrawal for a stop before it", []retry.Option{retry.WithMaxAttempts(2)}, &countingBudget{inner: mustBudget(t, 0, 1)}, false, []step{
			{err503, 0, 200 * ms, 0},
			{err503, 0, 0, retry.AttemptsExhausted},
		}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []retry.Option{retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 100*time.Millisecond, time.Minute, 0.5))}
			var g retry.Guards
			if tt.budget != nil {
				g.Budget = tt.budget
			}
			if tt.open {
				g.Breaker = mustBreaker(t)
				trip(t, g.Breaker)
			}
			opts = append(opts, retry.WithGuards(g))
			p := mustNew(t, append(opts, tt.opts...)...)
			plan := p.Plan()
			for i, s := range tt.steps {
				sleep, stop := plan(s.err, s.left)
				if sleep != s.wantSleep || stop != s.wantStop {
					t.Errorf("step %d: next(%v, %v) = %v, %s; want %v, %s", i+1, s.err, s.left, sleep, stopText(stop), s.wantSleep, stopText(s.wantStop))
				}
			}
			if tt.budget != nil {
				if got := tt.budget.withdraws.Load() + tt.budget.refused.Load(); got != tt.wantAsked {
					t.Errorf("withdrawals asked = %d, want %d", got, tt.wantAsked)
				}
			}
		})
	}
}

// TestPlanIndependent: every plan starts afresh (its own backoff sequence
// and attempt count), and a nil Policy plans like New().
func TestPlanIndependent(t *testing.T) {
	p := mustNew(t, retry.WithMaxAttempts(2), retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 100*time.Millisecond, time.Minute, 0)))
	a, b := p.Plan(), p.Plan()
	if s, stop := a(err503, 0); s != 200*time.Millisecond || stop != 0 {
		t.Errorf("a(503) = %v, %v; want 200ms, 0", s, stop)
	}
	if s, stop := b(err503, 0); s != 200*time.Millisecond || stop != 0 {
		t.Errorf("b(503) after a's = %v, %v; want b's own first delay 200ms", s, stop)
	}
	if _, stop := a(err503, 0); stop != retry.AttemptsExhausted {
		t.Errorf("a's second step = %v, want attempts exhausted", stop)
	}

	var nilPolicy *retry.Policy
	plan := nilPolicy.Plan()
	for i := 1; i <= 3; i++ { // the default: 3 attempts
		s, stop := plan(err503, 0)
		if i < 3 && (stop != 0 || s < 0 || s >= 100*time.Millisecond<<i) {
			t.Errorf("nil Policy, step %d = %v, %v; want a full-jitter delay below %v", i, s, stop, 100*time.Millisecond<<i)
		}
		if i == 3 && stop != retry.AttemptsExhausted {
			t.Errorf("nil Policy, step %d = %v, want attempts exhausted", i, stop)
		}
	}
}

// TestDoMatchesPlan: Do makes the decisions of a plan run by hand. For each
// script of attempt outcomes, one policy runs it with Do on a synctest
// bubble's clock, and a twin policy (same options, its own generator with
// the same seed) is walked through the same outcomes with its Plan; the
// sleeps, the attempts and the stop reason must agree.
func TestDoMatchesPlan(t *testing.T) {
	const ms = time.Millisecond
	hint := func(d time.Duration) error { return &statusErr{Code: 429, After: d} }
	tests := []struct {
		name    string
		timeout time.Duration
		opTime  time.Duration // time each attempt takes
		errs    []error       // attempt outcomes; past the end: success
	}{
		{"success after retries", 30 * time.Second, 10 * ms, []error{err503, hint(1500 * ms), err503}},
		{"attempts exhausted", 0, 0, []error{err503, err503, err503, err503, err503}},
		{"not retryable midway", 30 * time.Second, 0, []error{err503, err404}},
		{"deadline", 3 * time.Second, 100 * ms, []error{err503, hint(2 * time.Second), err503, err503, err503}},
		{"hint above the maximum", 0, 0, []error{err503, hint(2 * time.Minute)}},
		{"permanent", 0, 0, []error{err503, retry.Permanent(err503)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			newPolicy := func(obs observe.Observer) *retry.Policy {
				b, err := backoff.New(backoff.Config{Strategy: backoff.Decorrelated, Rand: rand.New(rand.NewPCG(42, 0)).Float64})
				if err != nil {
					t.Fatal(err)
				}
				return mustNew(t, retry.WithBackoff(b), retry.WithMaxAttempts(5), retry.WithObserver(obs))
			}

			// Do.
			clock := newTimeline()
			calls := 0
			var err error
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				if tt.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.timeout)
					defer cancel()
				}
				err = newPolicy(clock).Do(ctx, func(ctx context.Context, attempt int) error {
					calls++
					time.Sleep(tt.opTime)
					if attempt <= len(tt.errs) {
						return tt.errs[attempt-1]
					}
					return nil
				})
			})
			var doStop retry.Reason
			if err != nil {
				doStop = asError(t, err).Reason
			}

			// The plan, by hand.
			plan := newPolicy(nil).Plan()
			var sleeps []time.Duration
			var planStop retry.Reason
			attempts, elapsed := 0, time.Duration(0)
			for attempts < len(tt.errs) {
				attempts++
				elapsed += tt.opTime
				var left time.Duration
				if tt.timeout > 0 {
					if left = tt.timeout - elapsed; left <= 0 {
						planStop = retry.Deadline
						break
					}
				}
				sleep, stop := plan(tt.errs[attempts-1], left)
				if stop != 0 {
					planStop = stop
					break
				}
				sleeps = append(sleeps, sleep)
				elapsed += sleep
			}
			if planStop == 0 && attempts == len(tt.errs) {
				attempts++ // the attempt that succeeds
			}

			if got := clock.Sleeps(); !slices.Equal(got, sleeps) {
				t.Errorf("Do slept %v, the plan %v", got, sleeps)
			}
			if calls != attempts || doStop != planStop {
				t.Errorf("Do: %d attempts, stop %v; plan: %d attempts, stop %v", calls, stopText(doStop), attempts, stopText(planStop))
			}
			t.Logf("sleeps %v, %d attempts, stop %s", sleeps, attempts, stopText(planStop))
		})
	}
}

// TestPlanBreakerOpenBeyondSleep: the plan's circuit-open check compares
// the breaker's next probe round with the coming sleep: a breaker that
// half-opens before the sleep ends does not stop the call.
func TestPlanBreakerOpenBeyondSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Second, Rand: half})
		if err != nil {
			t.Fatal(err)
		}
		trip(t, brk)
		for _, tt := range []struct {
			hint     time.Duration
			wantStop retry.Reason
		}{
			{999 * time.Millisecond, retry.CircuitOpen},
			{time.Second, 0},
			{2 * time.Second, 0},
		} {
			// U 0: the sleep is the hint itself.
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithBackoff(mustBackoff(t, backoff.FullJitter, 100*time.Millisecond, 10*time.Second, 0)))
			sleep, stop := p.Plan()(&statusErr{Code: 503, After: tt.hint}, 0)
			if stop != tt.wantStop {
				t.Errorf("breaker half-opens in 1s, sleep %v: stop = %v, want %v", sleep, stopText(stop), stopText(tt.wantStop))
			}
		}
	})
}
