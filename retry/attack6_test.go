package retry_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

type c6Hint struct{ d time.Duration }

func (e c6Hint) Error() string             { return fmt.Sprintf("hint %v", e.d) }
func (e c6Hint) RetryAfter() time.Duration { return e.d }

type c6Temp struct{}

func (c6Temp) Error() string   { return "temp" }
func (c6Temp) Temporary() bool { return true }

// Policy.Plan: "Policy.Do makes exactly these decisions." Random
// schedules (seeded), random deadlines, hints and attempt durations: Do's
// sleeps and stop must be the plan's.
func TestAttack6PlanMatchesDoRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(66, 1))
	for trial := 0; trial < 200; trial++ {
		st := backoff.Strategy(r.IntN(6))
		base := time.Duration(1 + r.Int64N(int64(time.Second)))
		cp := base + time.Duration(r.Int64N(int64(20*time.Second)))
		maxAtt := 1 + r.IntN(8)
		maxRA := time.Duration(1 + r.Int64N(int64(10*time.Second)))
		var timeout time.Duration
		if r.IntN(3) > 0 {
			timeout = time.Duration(1 + r.Int64N(int64(40*time.Second)))
		}
		seed := r.Uint64()
		n := 12
		errs := make([]error, n)
		durs := make([]time.Duration, n)
		for i := range errs {
			durs[i] = time.Duration(r.Int64N(int64(2 * time.Second)))
			switch r.IntN(6) {
			case 0:
				errs[i] = c6Hint{time.Duration(1 + r.Int64N(int64(12*time.Second)))}
			case 1:
				errs[i] = errors.New("plain")
			case 2:
				errs[i] = retry.Permanent(c6Temp{})
			default:
				errs[i] = c6Temp{}
			}
		}
		newPolicy := func() *retry.Policy {
			b, err := backoff.New(backoff.Config{Strategy: st, Base: base, Cap: cp, Rand: rand.New(rand.NewPCG(seed, 3)).Float64})
			if err != nil {
				t.Fatal(err)
			}
			p, err := retry.New(retry.WithBackoff(b), retry.WithMaxAttempts(maxAtt), retry.WithMaxRetryAfter(maxRA))
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		// Do.
		var doSleeps []time.Duration
		var doStop retry.Reason
		var doAttempts int
		synctest.Test(t, func(t *testing.T) {
			ctx := context.Background()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			var lastEnd time.Time
			err := newPolicy().Do(ctx, func(ctx context.Context, attempt int) error {
				now := time.Now()
				if attempt > 1 {
					doSleeps = append(doSleeps, now.Sub(lastEnd))
				}
				doAttempts = attempt
				select {
				case <-time.After(durs[attempt-1]):
				case <-ctx.Done():
					lastEnd = time.Now()
					return ctx.Err()
				}
				lastEnd = time.Now()
				return errs[attempt-1]
			})
			var re *retry.Error
			if errors.As(err, &re) {
				doStop = re.Reason
			}
		})
		// Plan.
		next := newPolicy().Plan()
		var planSleeps []time.Duration
		var planStop retry.Reason
		elapsed := time.Duration(0)
		planAttempts := 0
		for i := 0; i < n; i++ {
			planAttempts++
			if timeout > 0 && elapsed+durs[i] >= timeout {
				planStop = retry.Deadline // the attempt ran into the deadline
				break
			}
			elapsed += durs[i]
			left := time.Duration(0)
			if timeout > 0 {
				left = timeout - elapsed
			}
			sleep, stop := next(errs[i], left)
			if stop != 0 {
				planStop = stop
				break
			}
			planSleeps = append(planSleeps, sleep)
			elapsed += sleep
		}
		if doStop != planStop || doAttempts != planAttempts || fmt.Sprint(doSleeps) != fmt.Sprint(planSleeps) {
			t.Fatalf("trial %d (%v base %v cap %v max %d maxRA %v timeout %v):\n Do:   %v after %d, sleeps %v\n Plan: %v after %d, sleeps %v",
				trial, st, base, cp, maxAtt, maxRA, timeout, doStop, doAttempts, doSleeps, planStop, planAttempts, planSleeps)
		}
	}
}

// Extreme hints and deadlines: a hint of years honoured (WithMaxRetryAfter
// of the largest), the sleep in [hint, 1.5·hint) and before a deadline
// years ahead; a hint of the largest Duration with no deadline must give a
// sleep >= hint, never wrap.
func TestAttack6YearsHints(t *testing.T) {
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		hint, timeout time.Duration
	}{
		{3 * year, 10 * year},
		{3 * year, 3*year + 2},
		{100 * year, 200 * year},
		{150 * year, 250 * year}, // (beyond ~262 years from 2000 a synctest bubble's timers saturate)
	} {
		synctest.Test(t, func(t *testing.T) {
			b, _ := backoff.New(backoff.Config{Rand: func() float64 { return 1 }})
			p, err := retry.New(retry.WithMaxRetryAfter(math.MaxInt64), retry.WithBackoff(b))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			start := time.Now()
			var second time.Duration
			err = p.Do(ctx, func(ctx context.Context, attempt int) error {
				if attempt == 2 {
					second = time.Since(start)
					return nil
				}
				return c6Hint{tc.hint}
			})
			if err != nil {
				t.Fatalf("hint %v timeout %v: %v", tc.hint, tc.timeout, err)
			}
			if second < tc.hint || second >= tc.timeout || second >= tc.hint+tc.hint/2 {
				t.Fatalf("hint %v timeout %v: slept %v", tc.hint, tc.timeout, second)
			}
		})
	}
}

type c6Limiter struct {
	wait func(ctx context.Context, n int) error
	n    int
}

func (l *c6Limiter) Wait(ctx context.Context) error { l.n++; return l.wait(ctx, l.n) }

type c6Budget struct{ dep, wd int }

func (b *c6Budget) Deposit()       { b.dep++ }
func (b *c6Budget) Withdraw() bool { b.wd++; return true }

func TestAttack6RateLimiterEdges(t *testing.T) {
	limErr := errors.New("limiter says no")
	// A limiter that refuses the second attempt while the call is live.
	synctest.Test(t, func(t *testing.T) {
		bud := &c6Budget{}
		l := &c6Limiter{wait: func(ctx context.Context, n int) error {
			if n == 2 {
				return limErr
			}
			return nil
		}}
		p, _ := retry.New(retry.WithRateLimit(l), retry.WithGuards(retry.Guards{Budget: bud}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		calls := 0
		v, err := retry.DoValue(ctx, p, func(ctx context.Context, attempt int) (int, error) {
			calls++
			return 7, c6Temp{}
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 1 || calls != 1 || v != 7 {
			t.Fatalf("refusal: v=%d err=%v calls=%d", v, err, calls)
		}
		if !errors.Is(err, limErr) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, new(c6Temp)) {
			t.Fatalf("refusal chain: %v", err)
		}
		if _, ok := re.Err.(c6Temp); !ok {
			t.Fatalf("Err = %#v, want the op's last error", re.Err)
		}
		if bud.dep != 1 || bud.wd != 1 {
			t.Fatalf("budget dep %d wd %d", bud.dep, bud.wd)
		}
	})
	// A limiter that ignores the context and lets the second attempt go
	// only after the deadline: nothing is sent past the deadline.
	synctest.Test(t, func(t *testing.T) {
		l := &c6Limiter{wait: func(ctx context.Context, n int) error {
			if n == 2 {
				time.Sleep(2 * time.Hour)
			}
			return nil
		}}
		p, _ := retry.New(retry.WithRateLimit(l))
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		calls := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			calls++
			return c6Temp{}
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 1 || calls != 1 {
			t.Fatalf("late admit: err=%v calls=%d", err, calls)
		}
	})
	// A refusal of the first attempt: nothing sent, nothing deposited, Err nil.
	synctest.Test(t, func(t *testing.T) {
		bud := &c6Budget{}
		l := &c6Limiter{wait: func(ctx context.Context, n int) error { return limErr }}
		p, _ := retry.New(retry.WithRateLimit(l), retry.WithGuards(retry.Guards{Budget: bud}))
		calls := 0
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error { calls++; return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 || re.Err != nil || calls != 0 || bud.dep != 0 || !errors.Is(err, limErr) {
			t.Fatalf("first refusal: err=%v calls=%d dep=%d", err, calls, bud.dep)
		}
	})
}

// budget.Budget: "The zero value is a budget with the default settings whose
// window starts at its first use." Handing a zero Budget to retry.New (no
// deposit, no withdrawal yet) must not start its window: the first use is
// the first call's deposit.
func TestAttack6ZeroBudgetWindowStartsAtFirstCallNotAtNew(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b budget.Budget
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: &b}))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if err := p.Do(context.Background(), func(context.Context, int) error { return nil }); err != nil { // first use: a deposit
			t.Fatal(err)
		}
		time.Sleep(10*time.Second - 1) // 1 ns before the deposit's slice expires, if slice 0 began at the deposit
		if s := b.Stats(); s.Requests != 1 {
			t.Errorf("10 s - 1 ns after the first deposit: %+v, want 1 request (the window started at retry.New, 300 ms earlier)", s)
		}
	})
}

// A fleet-like budget whose withdrawal takes a round trip (within the time
// left, as retry.Budget asks).
type c6SlowBudget struct{ rtt time.Duration }

func (b *c6SlowBudget) Deposit()       {}
func (b *c6SlowBudget) Withdraw() bool { return true }
func (b *c6SlowBudget) WithdrawWithin(left time.Duration) bool {
	if left > 0 && b.rtt >= left {
		return false
	}
	time.Sleep(b.rtt)
	return true
}

// Policy.Plan: "Policy.Do makes exactly these decisions." With a budget
// whose WithdrawWithin takes 900 ms of the 1 s left, Do gives up (Deadline:
// the 200 ms sleep no longer fits), while the plan, told the same, admits
// the retry and returns a sleep that ends past the deadline.
func TestAttack6PlanMatchesDoSlowWithdrawWithin(t *testing.T) {
	newPolicy := func() *retry.Policy {
		b, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter}) // 200 ms before retry 1
		p, err := retry.New(retry.WithBackoff(b), retry.WithGuards(retry.Guards{Budget: &c6SlowBudget{rtt: 900 * time.Millisecond}}))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var doReason retry.Reason
	var doAttempts int
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 1100*time.Millisecond)
		defer cancel()
		err := newPolicy().Do(ctx, func(ctx context.Context, attempt int) error {
			doAttempts = attempt
			time.Sleep(100 * time.Millisecond)
			return c6Temp{}
		})
		var re *retry.Error
		if errors.As(err, &re) {
			doReason = re.Reason
		}
	})
	var sleep time.Duration
	var stop retry.Reason
	synctest.Test(t, func(t *testing.T) {
		next := newPolicy().Plan()
		start := time.Now()
		sleep, stop = next(c6Temp{}, time.Second) // attempt 1 took 100 ms of 1.1 s
		if stop == 0 {
			t.Logf("plan: sleep %v admitted at %v after the decision began; its end lies %v past the deadline",
				sleep, time.Since(start), time.Since(start)+sleep-time.Second)
		}
	})
	if doReason != retry.Deadline || doAttempts != 1 {
		t.Fatalf("Do: %v after %d attempts", doReason, doAttempts)
	}
	if stop != doReason {
		t.Errorf("Plan: sleep %v stop %v; Do stopped with %v after 1 attempt", sleep, stop, doReason)
	}
}
