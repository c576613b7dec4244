// Black-box attacks (AREA limit2) on what the retry loop reports for each
// kind of limiter refusal: Reason Limited, Attempts 0, Err the limiter's
// refusal (errors.Is ErrLimited), one give-up event "limited", no attempt
// event, nothing deposited, the breaker's permit given back.

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

func lim2Limiter(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// lim2Check runs one call through a guarded policy and checks the report of
// a first-attempt refusal.
func lim2Check(t *testing.T, l *limit.Limiter, ctx context.Context, what string, prep func()) {
	t.Helper()
	brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1})
	brk.Trip(0)
	time.Sleep(2 * time.Second) // half-open: one probe, which the refused call must give back
	if prep != nil {
		prep()
	}
	b := &rlBudget{}
	o := &rlObs{}
	p := rlPolicy(t, retry.Guards{Limiter: l, Breaker: brk, Budget: b}, retry.WithObserver(o))
	sent := 0
	err := p.Do(ctx, func(context.Context, int) error { sent++; return nil })
	var re *retry.Error
	if !errors.As(err, &re) {
		t.Fatalf("%s: err %v, want *retry.Error", what, err)
	}
	if re.Reason != retry.Limited || re.Attempts != 0 || !errors.Is(err, limit.ErrLimited) || !errors.Is(re.Err, limit.ErrLimited) {
		t.Errorf("%s: Reason %v Attempts %d Err %v; want Limited, 0, the limiter's refusal", what, re.Reason, re.Attempts, re.Err)
	}
	if sent != 0 || b.dep.Load() != 0 || b.wd.Load() != 0 {
		t.Errorf("%s: sent %d deposits %d withdrawals %d; want 0 0 0", what, sent, b.dep.Load(), b.wd.Load())
	}
	if got := o.String(); got != "[give-up #0  limited] " {
		t.Errorf("%s: events %s", what, got)
	}
	if pm, err := brk.Allow(); err != nil {
		t.Errorf("%s: the probe was not given back: %v", what, err)
	} else {
		brk.Cancel(pm)
	}
}

// Throttled: Guards' doc lists the refusals (turn too late, too many
// waiting, waiting off); Limited's doc says the limiter "refused the next
// attempt". A throttle rejection is a refusal of the limiter (ErrLimited).
func TestAttackLimit2RetryThrottledIsLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2Limiter(t, limit.Config{Max: 10, Throttle: 1})
		lim2Check(t, l, context.Background(), "throttled", func() {
			for range 400 { // a destination that drops everything
				p, err := l.Acquire(context.Background())
				if err == nil {
					time.Sleep(time.Millisecond)
					l.Release(p, true)
				}
			}
			// The throttle now rejects nearly every call: find one.
			for i := range 50 {
				if p, err := l.Acquire(context.Background()); err == nil {
					l.Release(p, true)
					continue
				}
				_ = i
				break
			}
		})
	})
}

// No token: the rate gate's refusal, at once, of a call whose turn comes
// after its deadline.
func TestAttackLimit2RetryNoTokenIsLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2Limiter(t, limit.Config{Max: 10})
		l.SetRate(0.1, 1) // a token each 10 s
		time.Sleep(20 * time.Second)
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		// lim2Check sleeps 2 s first: 3 s are left, the token comes in 8.
		lim2Check(t, l, ctx, "no token", nil)
	})
}

// Too close: every slot held, a deadline nearer than the baseline.
func TestAttackLimit2RetryTooCloseIsLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2Limiter(t, limit.Config{Max: 1})
		for range 20 {
			p, _ := l.Acquire(context.Background())
			time.Sleep(100 * time.Millisecond)
			l.Release(p, false)
		}
		hold, _ := l.Acquire(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second+50*time.Millisecond)
		defer cancel()
		lim2Check(t, l, ctx, "too close", nil)
		l.Release(hold, false)
	})
}
