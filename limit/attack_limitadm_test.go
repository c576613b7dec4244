package limit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

func atkLANew(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return l
}

// atkLALearn runs n sequential attempts of d each, so that the limiter learns
// a baseline latency of d.
func atkLALearn(t *testing.T, l *limit.Limiter, n int, d time.Duration) {
	t.Helper()
	for range n {
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatalf("learning: %v", err)
		}
		time.Sleep(d)
		l.Release(p, false)
	}
}

// SetCap: "n = 0 lets no new attempt start (calls wait, as over any limit,
// within their deadlines)"; Acquire: "while waiting, when its deadline
// comes within the fastest answer (with no latency measured yet: at its
// deadline) ... or when ctx ends (the error then also wraps ctx's error)".
// Under a cap of 0 with no latency measured, a call with a 100 ms deadline
// waits and leaves at its deadline, with ErrLimited and DeadlineExceeded.
func TestAttackLimitadmCapZeroWaiterLeavesAtDeadlineNoLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atkLANew(t, limit.Config{Max: 4})
		l.SetCap(0)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := l.Acquire(ctx)
		el := time.Since(start)
		if !errors.Is(err, limit.ErrLimited) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err %v, want ErrLimited and DeadlineExceeded", err)
		}
		if el != 100*time.Millisecond {
			t.Errorf("left after %v, want at its deadline, 100ms", el)
		}
		if in, w := l.SetCap(0); in != 0 || w != 0 {
			t.Errorf("after: in flight %d, waiting %d; want 0, 0", in, w)
		}
	})
}

// Same with a baseline of 10 ms learned: the waiter under the cap leaves
// when its deadline comes within the baseline (at 90 ms, not at 100 ms),
// with ErrLimited, and the slot count is intact afterwards.
func TestAttackLimitadmCapZeroWaiterLeavesWithinBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atkLANew(t, limit.Config{Max: 4})
		atkLALearn(t, l, 64, 10*time.Millisecond)
		l.SetCap(0)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := l.Acquire(ctx)
		el := time.Since(start)
		if !errors.Is(err, limit.ErrLimited) {
			t.Errorf("err %v, want ErrLimited", err)
		}
		if el < 80*time.Millisecond || el >= 100*time.Millisecond {
			t.Errorf("left after %v (%v), want within the 10ms baseline of its deadline: [80ms,100ms)", el, err)
		}
		l.SetCap(-1)
		// Every slot is free again: Limit() done contexts take a slot each.
		done, c2 := context.WithCancel(context.Background())
		c2()
		var ps []limit.Permit
		for i := 0; i < l.Limit(); i++ {
			p, err := l.Acquire(done)
			if err != nil {
				t.Fatalf("slot %d of %d after the cap: %v", i+1, l.Limit(), err)
			}
			ps = append(ps, p)
		}
		for _, p := range ps {
			l.Release(p, false)
		}
	})
}

// deadline-only context: a deadline far in the future (beyond what a
// time.Duration from now can hold), never done unless canceled.
type atkLAFarCtx struct{ context.Context }

func (atkLAFarCtx) Deadline() (time.Time, bool) {
	return time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC), true
}

// Doc: "Calls with a deadline come first, earliest deadline first; calls
// without one wait behind them". A call whose deadline lies in year 9999
// (its distance saturates a Duration) is still a call with a deadline: it
// gets the slot a raised cap frees before an older call without one.
func TestAttackLimitadmFarDeadlineBeforeOpenCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atkLANew(t, limit.Config{Max: 4})
		l.SetCap(0)
		var order []string
		var mu sync.Mutex
		var wg sync.WaitGroup
		run := func(name string, ctx context.Context) {
			wg.Go(func() {
				p, err := l.Acquire(ctx)
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				l.Release(p, false)
			})
			synctest.Wait()
		}
		run("open", context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		run("far", atkLAFarCtx{ctx})
		l.SetCap(1)
		wg.Wait()
		if len(order) != 2 || order[0] != "far" {
			t.Errorf("grant order %v, want [far open]", order)
		}
	})
}

// Waiters under a cap of 0 whose deadline comes at the very instant the
// cap is removed: each either gets a slot with time left or fails with
// ErrLimited; none is lost (all slots free afterwards).
func TestAttackLimitadmCapRemovedAtDeadlineInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atkLANew(t, limit.Config{Max: 8})
		l.SetCap(0)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var held []limit.Permit
		for range 6 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				p, err := l.Acquire(ctx)
				if err != nil {
					if !errors.Is(err, limit.ErrLimited) {
						t.Errorf("err %v, want ErrLimited", err)
					}
					return
				}
				if ctx.Err() != nil {
					t.Errorf("granted with its context done")
				}
				mu.Lock()
				held = append(held, p)
				mu.Unlock()
			})
		}
		synctest.Wait()
		time.Sleep(50 * time.Millisecond)
		l.SetCap(-1)
		wg.Wait()
		in, w := l.SetCap(-1)
		if in != len(held) || w != 0 {
			t.Errorf("in flight %d, waiting %d; want %d, 0", in, w, len(held))
		}
		for _, p := range held {
			l.Release(p, false)
		}
		if in, _ := l.SetCap(-1); in != 0 {
			t.Errorf("in flight %d after releases", in)
		}
	})
}
