// Black-box attack on the recent retry promises (AREA recent).
package retry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// atkRecentPastCtx is a context whose deadline has passed but which is not Done:
// its timer has not run (deterministic, unlike a race with a real timer).
type atkRecentPastCtx struct{ context.Context }

func (atkRecentPastCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

type atkRecentRate struct{ n int }

func (r *atkRecentRate) Wait(context.Context) error { r.n++; return nil }

type atkRecentNopObs struct{}

func (atkRecentNopObs) Observe(context.Context, observe.Event) {}

// Do: "the loop stops ... the deadline has passed: Reason [Deadline]" and
// "If ctx has already ended, op is not called"; the recent fix: a call whose
// deadline has passed, its timer not yet run, sends nothing, on every path
// (bare, budget only, rate limit, observer, breaker, attempt timeout), and
// DoValue / DoValueIf too, without a deposit.
func TestAttackRecentPassedDeadlineSendsNothingEveryPath(t *testing.T) {
	bud, _ := budget.New(budget.Config{})
	brk, _ := breaker.New(breaker.Config{})
	rl := &atkRecentRate{}
	mk := func(opts ...retry.Option) *retry.Policy {
		p, err := retry.New(opts...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	policies := map[string]*retry.Policy{
		"nil":          nil,
		"budget":       mk(retry.WithGuards(retry.Guards{Budget: bud})),
		"rate":         mk(retry.WithRateLimit(rl)),
		"observer":     mk(retry.WithObserver(atkRecentNopObs{})),
		"breaker":      mk(retry.WithGuards(retry.Guards{Breaker: brk})),
		"attempt-tout": mk(retry.WithAttemptTimeout(time.Hour)),
	}
	ctx := atkRecentPastCtx{context.Background()}
	for name, p := range policies {
		calls := 0
		op := func(context.Context, int) (int, error) { calls++; return 7, nil }
		var errs []error
		errs = append(errs, p.Do(ctx, func(c context.Context, a int) error { _, err := op(c, a); return err }))
		v1, e1 := retry.DoValue(ctx, p, op)
		v2, e2 := retry.DoValueIf(ctx, p, op, func(int) bool { return true })
		errs = append(errs, e1, e2)
		if calls != 0 || v1 != 0 || v2 != 0 {
			t.Errorf("%s: op ran %d times (values %d, %d) on a context whose deadline had passed", name, calls, v1, v2)
		}
		for _, err := range errs {
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: err %v, want Reason Deadline, 0 attempts", name, err)
			}
		}
	}
	if rl.n != 0 {
		t.Errorf("the rate limiter was waited for %d times by calls whose deadline had passed", rl.n)
	}
	if s := bud.Stats(); s.Requests != 0 {
		t.Errorf("budget stats %+v: calls that sent nothing deposited", s)
	}
}
