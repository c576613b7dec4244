package limit

import (
	"context"
	"errors"
	"math"
	"runtime"
	"slices"
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
	if l.maxWait != defaultWaiting || l.learn.max != defaultMax {
		t.Errorf("defaults: waiting %d, max %v", l.maxWait, l.learn.max)
	}
}

// Over the limit: a call with waiting off, or with its context done,
// fails at once; a zero Permit releases nothing.
func TestFailFast(t *testing.T) {
	l := mustNew(t, Config{Max: 1})
	p, err := l.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err = l.Acquire(done); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire over the limit with a done context: %v, want context.Canceled", err)
	}
	l.Release(Permit{}, false)
	if _, err := l.Acquire(done); err == nil {
		t.Error("a zero Permit's Release freed a slot")
	}
	l.Release(p, false)
	if _, err = l.Acquire(done); err != nil {
		t.Fatalf("after Release: %v (a done context takes a free slot)", err)
	}
	off := mustNew(t, Config{Max: 1, Waiting: -1})
	off.Acquire(context.Background())
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		hour, cancel := context.WithTimeout(ctx, time.Hour)
		if _, err := off.Acquire(ctx); !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "waiting is off") {
			t.Errorf("Acquire without a deadline, waiting off: %v", err)
		}
		if _, err := off.Acquire(hour); !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "waiting is off") {
			t.Errorf("Acquire with a deadline, waiting off: %v", err)
		}
		cancel()
	}
}

// A call without a deadline over the limit waits: behind every call with
// a deadline (earliest first), first come first served among themselves,
// until a slot comes or its context ends (then ErrLimited and the
// context's error); Config.Waiting bounds both kinds together.
func TestWaitWithoutDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 1, Waiting: 5})
		held, _ := l.Acquire(context.Background())
		var mu sync.Mutex
		var order []string
		var wg sync.WaitGroup
		arrive := func(name string, ctx context.Context) {
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
		arrive("open1", context.Background())
		dl, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		arrive("open2", context.Background())
		arrive("dl", dl)
		gone, leave := context.WithCancel(context.Background())
		left := make(chan error, 1)
		go func() {
			_, err := l.Acquire(gone)
			left <- err
		}()
		synctest.Wait()
		arrive("open3", context.Background())
		// Five wait: the sixth is refused at once, with or without a deadline.
		if _, err := l.Acquire(context.Background()); !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "too many") {
			t.Errorf("a sixth waiter without a deadline: %v, want too many", err)
		}
		if _, err := l.Acquire(dl); !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "too many") {
			t.Errorf("a sixth waiter with a deadline: %v, want too many", err)
		}
		leave()
		if err := <-left; !errors.Is(err, ErrLimited) || !errors.Is(err, context.Canceled) {
			t.Errorf("a waiter without a deadline whose context ends: %v, want ErrLimited and context.Canceled", err)
		}
		if _, waiting := l.SetCap(-1); waiting != 4 {
			t.Errorf("%d waiting, want 4", waiting)
		}
		l.Release(held, false)
		wg.Wait()
		if want := []string{"dl", "open1", "open2", "open3"}; !slices.Equal(order, want) {
			t.Errorf("granted in the order %v, want %v", order, want)
		}
		if in, waiting := l.SetCap(-1); in != 0 || waiting != 0 {
			t.Errorf("after: %d in flight, %d waiting; want 0, 0", in, waiting)
		}
	})
}

// Calls without a deadline are not starved by calls with a deadline that
// keep coming: while both wait, one slot in openShare goes to the oldest
// call without a deadline.
func TestWaitWithoutDeadlineNotStarved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 1})
		held, _ := l.Acquire(context.Background())
		var open atomic.Int64
		var wg sync.WaitGroup
		const nOpen = 3
		for range nOpen {
			wg.Go(func() {
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				open.Add(1)
				l.Release(p, false)
			})
		}
		synctest.Wait()
		// Deadline calls, always two waiting: each holds its slot 1 ms
		// and a new one comes for every one granted.
		dl, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		var deadlined atomic.Int64
		var stop atomic.Bool
		var call func()
		call = func() {
			p, err := l.Acquire(dl)
			if err != nil {
				t.Error(err)
				return
			}
			if !stop.Load() {
				wg.Go(call)
			}
			deadlined.Add(1)
			time.Sleep(time.Millisecond)
			l.Release(p, false)
		}
		wg.Go(call)
		wg.Go(call)
		synctest.Wait()
		l.Release(held, false)
		for open.Load() < nOpen && deadlined.Load() < 1000 {
			time.Sleep(time.Millisecond)
		}
		stop.Store(true)
		wg.Wait()
		// The open calls got one slot in openShare while deadline calls
		// waited: all three within about 3·openShare grants (without the
		// share, none before the 1000th deadline call).
		if got, d := open.Load(), deadlined.Load(); got != nOpen || d > (nOpen+1)*openShare {
			t.Errorf("%d of %d calls without a deadline served after %d deadline calls, want all within %d", got, nOpen, d, (nOpen+1)*openShare)
		}
	})
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
// exceeds the limit. Under the race detector 20,000 calls (twice Waiting:
// the same code, a fifth of the goroutines, each several times dearer
// there); the 100,000 run without it (make test's pass without -race).
//
// Parallel tests: the long simulations of this package (synctest bubbles,
// whose clock is fake, or explicit simulated time) call t.Parallel, so that
// under make test they use both cores instead of running one after the
// other at the end of the root module (about 30 CPU-s under -race); CPU
// contention changes none of their results. This test stays sequential:
// it counts the goroutines of the whole process, so it runs before the
// parallel ones start.
func TestManyWaitersBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 4, Waiting: 10_000})
		var held []Permit
		for range 4 {
			p, _ := l.Acquire(context.Background())
			held = append(held, p)
		}
		callers := 100_000
		if raceEnabled {
			callers = 20_000
		}
		var refused, served, in, peak atomic.Int64
		var wg sync.WaitGroup
		g0 := runtime.NumGoroutine()
		for i := range callers {
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
		// (NumGoroutine counts the process: others may have ended, or a
		// few started, as the runtime's and the test runner's do: 10,001
		// was seen once under -race; a goroutine per waiter would be
		// 10,000 more).
		if g := runtime.NumGoroutine() - g0; g > 10_000+64 {
			t.Errorf("%d goroutines more while 10000 calls wait, want at most 10000 (+64 for the process's others)", g)
		}
		for _, p := range held {
			l.Release(p, false)
		}
		wg.Wait()
		t.Logf("refused %d, served %d, peak in flight %d, limit %d", refused.Load(), served.Load(), peak.Load(), l.Limit())
		if refused.Load() != int64(callers-10_000) || served.Load() != 10_000 {
			t.Errorf("%d calls: refused %d and served %d, want %d and 10000", callers, refused.Load(), served.Load(), callers-10_000)
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

// TestDoneContextSlotIsNoSample: slots taken with a context already done
// (a hedge's, which its race may cancel a millisecond after it went) are
// no latency samples. 8 callers keep the limiter busy with 10 ms attempts;
// beside each attempt a done context's slot is taken and given back at
// once. On the code before, those instant releases were samples, the
// baseline latency fell to 0 and every 10 ms attempt read as a queue:
// the limit fell from 10 to 1.
func TestDoneContextSlotIsNoSample(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 100})
		done, cancel := context.WithCancel(context.Background())
		cancel()
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 500 {
					p, err := l.Acquire(context.Background())
					if err != nil {
						t.Errorf("Acquire: %v", err)
						return
					}
					if h, err := l.Acquire(done); err == nil {
						l.Release(h, false) // a hedge canceled at once: not a drop
					}
					time.Sleep(10 * time.Millisecond)
					l.Release(p, false)
				}
			})
		}
		wg.Wait()
		if got := l.Limit(); got < 10 {
			t.Errorf("limit %d after 4,000 attempts of 10 ms beside instant done-context slots, want at least the cold 10", got)
		}
	})
}
