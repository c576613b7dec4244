package limit

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		c     Config
		field string
	}{
		{Config{Max: -1}, "Config.Max"},
		{Config{Max: 1<<30 + 1}, "Config.Max"},
		{Config{Timeout: -time.Second}, "Config.Timeout"},
		{Config{Throttle: -2}, "Config.Throttle"},
		{Config{Throttle: 0.5}, "Config.Throttle"},
		{Config{Throttle: math.NaN()}, "Config.Throttle"},
		{Config{Throttle: math.Inf(1)}, "Config.Throttle"},
	} {
		l, err := New(tc.c)
		if err == nil || l != nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("New(%+v) = %v, %v; want an error naming %s", tc.c, l, err, tc.field)
		}
	}
	for _, c := range []Config{{}, {Max: 1}, {Max: 1 << 30}, {Throttle: 1}, {Throttle: 2}, {Waiting: -1}, {Waiting: 1}, {Timeout: time.Nanosecond}} {
		if _, err := New(c); err != nil {
			t.Errorf("New(%+v): %v", c, err)
		}
	}
}

func TestDefaults(t *testing.T) {
	l := mustNew(t, Config{})
	if got := l.Limit(); got != initialLimit {
		t.Errorf("cold Limit() = %d, want %d", got, initialLimit)
	}
	if l := mustNew(t, Config{Max: 3}); l.Limit() != 3 {
		t.Errorf("cold Limit() with Max 3 = %d, want 3", l.Limit())
	}
	if l.waiters.Max != defaultWaiting || l.learn.max != defaultMax {
		t.Errorf("defaults: waiting %d, max %v", l.waiters.Max, l.learn.max)
	}
}

// Over the limit: a call without a deadline, or with waiting off, fails
// at once; a zero Permit releases nothing.
func TestFailFast(t *testing.T) {
	l := mustNew(t, Config{Max: 1})
	p, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(context.Background())
	if !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "no deadline") {
		t.Errorf("Acquire over the limit without a deadline: %v, want ErrLimited (no deadline)", err)
	}
	l.Release(Permit{}, false)
	if _, err := l.Acquire(context.Background()); err == nil {
		t.Error("a zero Permit's Release freed a slot")
	}
	l.Release(p, false)
	if _, err = l.Acquire(context.Background()); err != nil {
		t.Fatalf("after Release: %v", err)
	}
	off := mustNew(t, Config{Max: 1, Waiting: -1})
	off.Acquire(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	if _, err := off.Acquire(ctx); !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "waiting is off") {
		t.Errorf("Acquire with waiting off: %v", err)
	}
}

// Waiters get the slots earliest deadline first.
func TestWaitEarliestDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 1})
		held, _ := l.Acquire(context.Background())
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		deadlines := []time.Duration{5, 3, 9, 1, 7} // seconds
		for i, d := range deadlines {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), d*time.Second)
				defer cancel()
				p, err := l.Acquire(ctx)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, int(d))
				mu.Unlock()
				time.Sleep(100 * time.Millisecond)
				l.Release(p, false)
			})
			synctest.Wait()
		}
		l.Release(held, false)
		wg.Wait()
		if want := []int{1, 3, 5, 7, 9}; !equal(order, want) {
			t.Errorf("served in deadline order %v, want %v", order, want)
		}

	})
}

// A waiter whose deadline passes leaves the list at its deadline, not
// later, with an error matching both ErrLimited and
// context.DeadlineExceeded.
func TestWaitLeavesAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 1})
		held, _ := l.Acquire(context.Background())
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		_, err := l.Acquire(ctx)
		if waited := time.Since(start); waited != 250*time.Millisecond {
			t.Errorf("left the wait after %v, want at its deadline (250ms)", waited)
		}
		if !errors.Is(err, ErrLimited) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("deadline passed while waiting: %v, want ErrLimited and DeadlineExceeded", err)
		}
		if n := l.waiters.Len(); n != 0 || l.nwait.Load() != 0 {
			t.Errorf("%d waiters (%d counted) after the deadline, want 0", n, l.nwait.Load())
		}
		l.Release(held, false)
	})
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// 100,000 calls over the limit: at most Config.Waiting wait, the rest fail
// at once; every waiter is served in the end and the in-flight count never
// exceeds the limit.
func TestManyWaitersBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 4, Waiting: 10_000})
		var held []Permit
		for range 4 {
			p, _ := l.Acquire(context.Background())
			held = append(held, p)
		}
		var refused, served, in, peak atomic.Int64
		var wg sync.WaitGroup
		g0 := runtime.NumGoroutine()
		for i := range 100_000 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour+time.Duration(i))
				defer cancel()
				p, err := l.Acquire(ctx)
				if err != nil {
					if !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "too many") {
						t.Errorf("refusal: %v", err)
					}
					refused.Add(1)
					return
				}
				n := in.Add(1)
				for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
				}
				time.Sleep(time.Millisecond)
				in.Add(-1)
				served.Add(1)
				l.Release(p, false)
			})
		}
		synctest.Wait()
		if n := l.waiters.Len(); n != 10_000 {
			t.Errorf("%d waiting, want 10000 (Config.Waiting)", n)
		}
		// No goroutine per waiter: only the 10,000 waiting callers' own
		// (NumGoroutine counts the process: others may have ended).
		if g := runtime.NumGoroutine() - g0; g > 10_000 {
			t.Errorf("%d goroutines more while 10000 calls wait, want at most 10000", g)
		}
		for _, p := range held {
			l.Release(p, false)
		}
		wg.Wait()
		t.Logf("refused %d, served %d, peak in flight %d, limit %d", refused.Load(), served.Load(), peak.Load(), l.Limit())
		if refused.Load() != 90_000 || served.Load() != 10_000 {
			t.Errorf("refused %d and served %d, want 90000 and 10000", refused.Load(), served.Load())
		}
		if peak.Load() > 4 {
			t.Errorf("peak in flight %d, above Max 4", peak.Load())
		}
		if uint32(l.state.Load()) != 0 || l.nwait.Load() != 0 {
			t.Errorf("in flight %d, waiting %d at the end", uint32(l.state.Load()), l.nwait.Load())
		}
	})
}

// A cancelled waiter leaves with ErrLimited wrapping context.Canceled.
func TestWaitCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 1})
		held, _ := l.Acquire(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		go func() { time.Sleep(time.Second); cancel() }()
		start := time.Now()
		_, err := l.Acquire(ctx)
		if !errors.Is(err, ErrLimited) || !errors.Is(err, context.Canceled) || time.Since(start) != time.Second {
			t.Errorf("cancelled after %v: %v", time.Since(start), err)
		}
		l.Release(held, false)
		if _, err := l.Acquire(context.Background()); err != nil {
			t.Errorf("slot lost after a cancelled waiter: %v", err)
		}
	})
}

// Many goroutines acquire and release with random outcomes (run with
// -race): the in-flight count never exceeds Max and ends at zero.
func TestConcurrent(t *testing.T) {
	const max = 8
	l := mustNew(t, Config{Max: max, Timeout: 10 * time.Millisecond, Throttle: 2})
	var in, peak atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 2000 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+i%3)*time.Millisecond)
				p, err := l.Acquire(ctx)
				cancel()
				if err != nil {
					continue
				}
				n := in.Add(1)
				for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
				}
				if i%50 == 0 {
					time.Sleep(50 * time.Microsecond)
				}
				in.Add(-1)
				l.Release(p, (i+g)%7 == 0)
			}
		})
	}
	wg.Wait()
	if peak.Load() > max {
		t.Errorf("peak in flight %d, above Max %d", peak.Load(), max)
	}
	if uint32(l.state.Load()) != 0 || l.nwait.Load() != 0 || l.waiters.Len() != 0 {
		t.Errorf("in flight %d, waiting %d at the end", uint32(l.state.Load()), l.nwait.Load())
	}
}

// Acquire and Release on the uncontended path allocate nothing.
func TestAllocs(t *testing.T) {
	l := mustNew(t, Config{Timeout: time.Second})
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		p, err := l.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
	}); n != 0 {
		t.Errorf("Acquire+Release: %v allocs, want 0", n)
	}
	th := mustNew(t, Config{Throttle: 2})
	if n := testing.AllocsPerRun(1000, func() {
		p, _ := th.Acquire(ctx)
		th.Release(p, false)
	}); n != 0 {
		t.Errorf("Acquire+Release with the throttle: %v allocs, want 0", n)
	}
}
