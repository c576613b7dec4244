// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package limit_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

func atk2New(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// One slot in 8 goes to the oldest call without a deadline while both kinds wait.
func TestAttack2OpenShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 1})
		p0, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var order []string
		var permits = make(chan limit.Permit, 100)
		start := func(name string, d time.Duration) {
			go func() {
				ctx := context.Background()
				if d > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, d)
					defer cancel()
				}
				p, err := l.Acquire(ctx)
				if err != nil {
					mu.Lock()
					order = append(order, name+":"+err.Error())
					mu.Unlock()
					return
				}
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				permits <- p
			}()
			synctest.Wait()
		}
		for i := 0; i < 3; i++ {
			start(fmt.Sprintf("o%d", i), 0)
		}
		for i := 0; i < 20; i++ {
			start(fmt.Sprintf("d%02d", i), time.Hour+time.Duration(i)*time.Second)
		}
		l.Release(p0, false)
		for i := 0; i < 22; i++ {
			synctest.Wait()
			p := <-permits
			l.Release(p, false)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		got := strings.Join(order, ",")
		// grants: d00..d06 (7), o0, d07..d13, o1, d14..d19, o2
		want := "d00,d01,d02,d03,d04,d05,d06,o0,d07,d08,d09,d10,d11,d12,d13,o1,d14,d15,d16,d17,d18,d19,o2"
		if got != want {
			t.Errorf("order\n got %s\nwant %s", got, want)
		}
	})
}

// A done context takes a free slot; one over the limit is refused at once
// with ErrLimited and the context's error.
func TestAttack2DoneContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 1})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		p, err := l.Acquire(ctx)
		if err != nil {
			t.Fatalf("done ctx with a free slot: %v", err)
		}
		_, err = l.Acquire(ctx)
		if !errors.Is(err, limit.ErrLimited) || !errors.Is(err, context.Canceled) {
			t.Errorf("err %v", err)
		}
		dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer dcancel()
		_, err = l.Acquire(dctx)
		if !errors.Is(err, limit.ErrLimited) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err %v", err)
		}
		l.Release(p, false)
		if in, w := l.SetCap(-1); in != 0 || w != 0 {
			t.Errorf("in %d w %d", in, w)
		}
	})
}

// SetCap(0) makes calls wait; raising it grants them at once.
func TestAttack2SetCapZeroThenRaise(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{})
		l.SetCap(0)
		if l.Limit() != 0 {
			t.Logf("Limit() under cap 0 = %d", l.Limit())
		}
		got := make(chan error, 3)
		for i := 0; i < 3; i++ {
			go func() {
				_, err := l.Acquire(context.Background())
				got <- err
			}()
		}
		synctest.Wait()
		if in, w := l.SetCap(0); in != 0 || w != 3 {
			t.Fatalf("in %d waiting %d", in, w)
		}
		l.SetCap(2)
		synctest.Wait()
		if in, w := l.SetCap(2); in != 2 || w != 1 {
			t.Errorf("after raise: in %d waiting %d", in, w)
		}
		l.SetCap(-1)
		synctest.Wait()
		for i := 0; i < 3; i++ {
			if err := <-got; err != nil {
				t.Error(err)
			}
		}
	})
}

// A rate gate with burst b lets b calls go at once, then one per token:
// each waiting call at a drawn point of its token's time.
func TestAttack2RateBurst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{})
		l.SetRate(2, 3)
		start := time.Now()
		var at []time.Duration
		for i := 0; i < 6; i++ {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			at = append(at, time.Since(start))
			l.Release(p, false)
		}
		if fmt.Sprint(at[:3]) != fmt.Sprint([]time.Duration{0, 0, 0}) {
			t.Errorf("times %v want 0 0 0 first", at)
		}
		for i := 3; i < len(at); i++ {
			if lo := time.Duration(i-2) * 500 * time.Millisecond; at[i] < lo || at[i] >= lo+500*time.Millisecond {
				t.Errorf("times %v: call %d at %v, want [%v, %v)", at, i, at[i], lo, lo+500*time.Millisecond)
			}
		}
	})
}

// burst in (0,1) is a phase: first token (1-burst)/rate from now at the
// earliest, each waiting call at a drawn point of its token's time.
func TestAttack2RatePhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{})
		l.SetRate(1, 0.25)
		start := time.Now()
		var at []time.Duration
		for i := 0; i < 3; i++ {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			at = append(at, time.Since(start))
			l.Release(p, false)
		}
		for i := range at {
			if lo := 750*time.Millisecond + time.Duration(i)*time.Second; at[i] < lo || at[i] >= lo+time.Second {
				t.Errorf("times %v: call %d at %v, want [%v, %v)", at, i, at[i], lo, lo+time.Second)
			}
		}
	})
}

// Odd SetRate values never panic; NaN leaves the gate, <=0 and +Inf turn it off.
func TestAttack2RateOddValues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{})
		for _, v := range [][2]float64{{math.NaN(), 1}, {math.Inf(-1), 1}, {1e-300, math.Inf(1)}, {math.MaxFloat64, math.NaN()},
			{1, -5}, {1e300, 1e300}, {5e-324, 5e-324}} {
			l.SetRate(v[0], v[1])
		}
		l.SetRate(math.Inf(1), 1) // off
		for i := 0; i < 100; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			p, err := l.Acquire(ctx) // done ctx: only a free slot now
			if err != nil {
				t.Fatalf("gate off, call %d refused: %v", i, err)
			}
			l.Release(p, false)
		}
		l.SetRate(1, 1)
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
		l.SetRate(math.NaN(), 5) // leaves the gate: 1/s
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if _, err := l.Acquire(ctx); !errors.Is(err, limit.ErrLimited) {
			t.Errorf("NaN rate changed the gate: %v", err)
		}
		l.SetRate(0, 0)
		if p, err := l.Acquire(ctx); err != nil {
			t.Errorf("rate 0 should turn the gate off: %v", err)
		} else {
			l.Release(p, false)
		}
	})
}

// A deadline call that cannot get a token before its deadline fails fast
// ("no token"), at once.
func TestAttack2RateNoTokenFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{})
		l.SetRate(1, 1)
		p, _ := l.Acquire(context.Background())
		l.Release(p, false)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := l.Acquire(ctx)
		if !errors.Is(err, limit.ErrLimited) || time.Since(start) != 0 {
			t.Errorf("err %v after %v", err, time.Since(start))
		}
		_, _, refused, _, _, _ := l.SetRate(1, 1)
		if refused != 1 {
			t.Errorf("refused %d", refused)
		}
		// one that can: waits till the token (its time at 1 s, given at a
		// drawn point of the second that follows)
		ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel2()
		start = time.Now()
		p, err = l.Acquire(ctx2)
		if el := time.Since(start); err != nil || el < time.Second || el >= 2*time.Second {
			t.Errorf("err %v after %v, want a token in [1s, 2s)", err, el)
		}
		t.Logf("waited %v", time.Since(start))
		l.Release(p, false)
	})
}

func TestAttack2ColdStartFigures(t *testing.T) {
	for _, c := range []struct{ max, want int }{{0, 10}, {1, 1}, {5, 5}, {10, 10}, {1 << 30, 10}} {
		l := atk2New(t, limit.Config{Max: c.max})
		if l.Limit() != c.want {
			t.Errorf("Max %d: cold limit %d want %d", c.max, l.Limit(), c.want)
		}
	}
}

func TestAttack2SlowStartDoubles(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 1 << 30})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := 0; i < 2000; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					p, err := l.Acquire(ctx)
					if err != nil {
						return
					}
					time.Sleep(10 * time.Millisecond)
					l.Release(p, false)
				}
			}()
		}
		var seq []int
		for i := 0; i < 10; i++ {
			time.Sleep(10 * time.Millisecond)
			seq = append(seq, l.Limit())
		}
		cancel()
		wg.Wait()
		t.Logf("limit every 10ms: %v", seq)
	})
}

// A waiter with a deadline leaves at its deadline with no latency known,
// and at its deadline less the fastest answer once one is.
func TestAttack2WaiterLeavesWithinBaseline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{Max: 1})
		hold, _ := l.Acquire(context.Background())
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		_, err := l.Acquire(ctx)
		cancel()
		if !errors.Is(err, limit.ErrLimited) || time.Since(start) != time.Second {
			t.Errorf("no latency: err %v after %v, want ErrLimited at 1s", err, time.Since(start))
		}
		l.Release(hold, false)
		for i := 0; i < 40; i++ {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			l.Release(p, false)
		}
		_, _, _, _, fastest, samples := l.SetRate(0, 0)
		t.Logf("fastest %v samples %d limit %d", fastest, samples, l.Limit())
		hold, _ = l.Acquire(context.Background())
		ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start = time.Now()
		_, err = l.Acquire(ctx)
		if !errors.Is(err, limit.ErrLimited) || time.Since(start) != 900*time.Millisecond {
			t.Errorf("baseline 100ms: err %v after %v, want ErrLimited at 900ms", err, time.Since(start))
		}
		// a deadline within the baseline: refused at once
		ctx2, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel2()
		start = time.Now()
		_, err = l.Acquire(ctx2)
		if !errors.Is(err, limit.ErrLimited) || time.Since(start) != 0 {
			t.Errorf("deadline = baseline: err %v after %v, want at once", err, time.Since(start))
		}
		l.Release(hold, false)
	})
}

// docs/limit.md: "the limit itself only grows in windows that use at least
// half of it, so it stays within eight times what the traffic puts in
// flight, most often four". A black-box attack found 3.2-4.0x where the page
// said "about twice" (slow start doubles a limit whose half is in use), and
// a CI run on a loaded machine 7.9x with 81 calls where it said four.
func TestAttack2LimitWithinEightTimesInFlight(t *testing.T) {
	if raceEnabled {
		t.Skip("the figure of docs/limit.md is measured without -race")
	}
	for _, n := range []int{41, 81, 100, 161} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := atk2New(t, limit.Config{Max: 1 << 30})
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for i := 0; i < n; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for ctx.Err() == nil {
							p, err := l.Acquire(ctx)
							if err != nil {
								return
							}
							time.Sleep(10 * time.Millisecond)
							l.Release(p, false)
						}
					}()
				}
				peak := 0
				for i := 0; i < 6000; i++ { // 60 s
					time.Sleep(10 * time.Millisecond)
					peak = max(peak, l.Limit())
				}
				final := l.Limit()
				cancel()
				wg.Wait()
				t.Logf("%d in flight: peak limit %d, after 60 s %d", n, peak, final)
				// Slow start doubles a limit whose half is in use: most runs
				// end within four times n, and one more doubling (7.9x with
				// 81 calls) happened on a loaded machine: within eight.
				if final > 8*n {
					t.Errorf("%d callers always in flight: limit %d after 60 s (%.1fx), docs say within eight times", n, final, float64(final)/float64(n))
				}
			})
		})
	}
}

// Many callers, deadlines, cancels, drops, cap and rate changes: the slots
// in flight never exceed the limit in force by more than the documented
// cap lowering allows, and everything is given back.
func TestAttack2StressBalance(t *testing.T) {
	l := atk2New(t, limit.Config{Max: 8, Waiting: 50})
	var inFlight, peak atomic32
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx := context.Background()
				var cancel context.CancelFunc = func() {}
				switch (i + j) % 4 {
				case 0:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(j%5)*time.Millisecond)
				case 1:
					ctx, cancel = context.WithCancel(ctx)
					if j%3 == 0 {
						go cancel()
					}
				case 2:
					ctx, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
				}
				p, err := l.Acquire(ctx)
				if err == nil {
					n := inFlight.add(1)
					peak.max(n)
					if j%7 == 0 {
						time.Sleep(100 * time.Microsecond)
					}
					inFlight.add(-1)
					l.Release(p, j%5 == 0)
				} else if !errors.Is(err, limit.ErrLimited) {
					t.Errorf("refusal not ErrLimited: %v", err)
				}
				cancel()
			}
		}()
	}
	for k := 0; k < 50; k++ {
		time.Sleep(2 * time.Millisecond)
		switch k % 5 {
		case 0:
			l.SetRate(20000, 5)
		case 1:
			l.SetRate(0, 0)
		case 2:
			l.SetCap(3)
		case 3:
			l.SetCap(-1)
		}
	}
	l.SetCap(-1)
	l.SetRate(0, 0)
	close(stop)
	wg.Wait()
	if in, w := l.SetCap(-1); in != 0 || w != 0 {
		t.Errorf("after: in flight %d waiting %d", in, w)
	}
	if peak.get() > 8 {
		t.Errorf("peak in flight %d > Max 8", peak.get())
	}
}

type atomic32 struct {
	mu sync.Mutex
	v  int
}

func (a *atomic32) add(d int) int { a.mu.Lock(); defer a.mu.Unlock(); a.v += d; return a.v }
func (a *atomic32) get() int      { a.mu.Lock(); defer a.mu.Unlock(); return a.v }
func (a *atomic32) max(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n > a.v {
		a.v = n
	}
}

func TestAttack2Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("race")
	}
	l := atk2New(t, limit.Config{Max: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	done, dcancel := context.WithCancel(context.Background())
	dcancel()
	for name, c := range map[string]context.Context{"background": context.Background(), "deadline": ctx, "done": done} {
		a := testing.AllocsPerRun(2000, func() {
			p, err := l.Acquire(c)
			if err != nil {
				t.Fatal(err)
			}
			l.Release(p, false)
		})
		if a != 0 {
			t.Errorf("%s: %v allocs", name, a)
		}
	}
	l.SetRate(1e9, 1e6)
	a := testing.AllocsPerRun(2000, func() {
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
	})
	if a != 0 {
		t.Errorf("rate gate: %v allocs", a)
	}
	// a done context over the limit: refused, no allocation
	l2 := atk2New(t, limit.Config{Max: 1})
	p, _ := l2.Acquire(context.Background())
	a = testing.AllocsPerRun(1000, func() {
		if _, err := l2.Acquire(done); err == nil {
			t.Fatal("granted")
		}
	})
	if a != 0 {
		t.Errorf("done ctx refused: %v allocs", a)
	}
	l2.Release(p, false)
}

func TestAttack2SetRateRaiseAndLower(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := atk2New(t, limit.Config{})
		l.SetRate(1, 1)
		p, _ := l.Acquire(context.Background())
		l.Release(p, false)
		res := make(chan string, 10)
		for i := 0; i < 3; i++ {
			go func() {
				p, err := l.Acquire(context.Background())
				if err != nil {
					res <- err.Error()
					return
				}
				res <- "ok"
				l.Release(p, false)
			}()
		}
		synctest.Wait()
		start := time.Now()
		l.SetRate(0, 0) // off: all granted at once
		synctest.Wait()
		for i := 0; i < 3; i++ {
			if r := <-res; r != "ok" {
				t.Errorf("open waiter: %s", r)
			}
		}
		if time.Since(start) != 0 {
			t.Errorf("took %v", time.Since(start))
		}
		// lowered: deadline waiters whose turn comes too late fail at once
		l.SetRate(10, 1)
		p, _ = l.Acquire(context.Background())
		l.Release(p, false)
		var cancels []context.CancelFunc
		for i := 0; i < 3; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			cancels = append(cancels, cancel)
			go func() {
				p, err := l.Acquire(ctx)
				if err != nil {
					res <- fmt.Sprintf("%v@%v", errors.Is(err, limit.ErrLimited), time.Since(start))
					return
				}
				res <- fmt.Sprintf("ok@%v", time.Since(start))
				l.Release(p, false)
			}()
			synctest.Wait()
		}
		start = time.Now()
		_, _, refused, _, _, _ := l.SetRate(1, 1)
		synctest.Wait()
		var got []string
		for len(res) > 0 {
			got = append(got, <-res)
		}
		t.Logf("after lowering: %v (refused so far %d)", got, refused)
		time.Sleep(time.Second)
		for len(res) > 0 {
			got = append(got, <-res)
		}
		t.Logf("all: %v", got)
		_, _, refused, _, _, _ = l.SetRate(1, 1)
		t.Logf("refused %d", refused)
		for _, c := range cancels {
			c()
		}
		if len(got) != 3 {
			t.Errorf("got %v", got)
		}
	})
}
