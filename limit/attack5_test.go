// Black-box attacks on package limit (AREA limit5), against limit/doc.go,
// go doc and docs/limit.md.

package limit_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

func l5New(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// SetRate: "fails fast with ErrLimited ("no token") when its turn, the
// next token plus one token per call waiting ahead of it, comes after its
// deadline less the destination's fastest answer". A bucket holding 99
// tokens has a token for every one of 5 callers now: none of them is
// refused for want of a token (they wait for the slot, not for a token).
func TestAttack5LRateBurstNoTokenWithTokensInBucket(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := l5New(t, limit.Config{Max: 1})
		l.SetRate(1, 100) // 1 token/s, burst 100: an idle gate holds 100
		hold, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		const n = 5
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				p, err := l.Acquire(ctx)
				errs[i] = err
				if err == nil {
					l.Release(p, false)
				}
			})
			synctest.Wait() // arrival order
		}
		_, waiting := l.SetCap(-1)
		l.Release(hold, false) // the slot frees at once: all 5 get it in turn within microseconds
		wg.Wait()
		_, _, refused, _, _, _ := l.SetRate(0, 0)
		bad := 0
		for i, err := range errs {
			if err != nil {
				bad++
				t.Logf("caller %d: %v", i, err)
			}
		}
		if bad > 0 || refused > 0 {
			t.Errorf("with 99 tokens in the bucket: %d of %d callers refused (waiting when released: %d), SetRate refused count %d; want 0 refused", bad, n, waiting, refused)
		}
	})
}

// Acquire: "Every refusal wraps ErrLimited and says why"; the rate gate
// refuses "no token". A done context on a gate with no token due, the
// limit far from reached (nothing in flight), is refused for want of a
// token, not because the "limit [was] reached".
func TestAttack5LDoneContextNoTokenReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := l5New(t, limit.Config{Max: 100})
		l.SetRate(1, 1)
		p, err := l.Acquire(context.Background()) // takes the one token
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false) // nothing in flight: the limit (10) is far
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = l.Acquire(ctx)
		if err == nil {
			t.Fatal("granted without a token")
		}
		if !errors.Is(err, limit.ErrLimited) || !errors.Is(err, context.Canceled) {
			t.Errorf("err %v: want ErrLimited and context.Canceled", err)
		}
		if strings.Contains(err.Error(), "limit reached") || !strings.Contains(err.Error(), "token") {
			t.Errorf("in flight 0, limit %d, no token due: err %q says the limit was reached, not that no token was due", l.Limit(), err)
		}
		dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer dcancel()
		_, err = l.Acquire(dctx)
		if err == nil || strings.Contains(err.Error(), "limit reached") || !strings.Contains(err.Error(), "token") {
			t.Errorf("past deadline, in flight 0, no token due: err %q", err)
		}
	})
}

// New: "It returns an error naming the field when Max is negative or above
// 2^30, Timeout is negative, or Throttle is NaN, infinite, negative or in
// (0, 1). Every Waiting is valid. A Limiter that was built never fails or
// panics later".
func TestAttack5LConfigValidation(t *testing.T) {
	bad := []struct {
		c     limit.Config
		field string
	}{
		{limit.Config{Max: -1}, "Max"},
		{limit.Config{Max: 1<<30 + 1}, "Max"},
		{limit.Config{Max: math.MaxInt}, "Max"},
		{limit.Config{Max: math.MinInt}, "Max"},
		{limit.Config{Timeout: -1}, "Timeout"},
		{limit.Config{Timeout: math.MinInt64}, "Timeout"},
		{limit.Config{Throttle: math.NaN()}, "Throttle"},
		{limit.Config{Throttle: math.Inf(1)}, "Throttle"},
		{limit.Config{Throttle: math.Inf(-1)}, "Throttle"},
		{limit.Config{Throttle: -1}, "Throttle"},
		{limit.Config{Throttle: math.Copysign(0, -1) - 1e-300}, "Throttle"},
		{limit.Config{Throttle: 0.5}, "Throttle"},
		{limit.Config{Throttle: math.SmallestNonzeroFloat64}, "Throttle"},
		{limit.Config{Throttle: math.Nextafter(1, 0)}, "Throttle"},
		{limit.Config{Max: -1, Timeout: -1}, "Max"},
	}
	for _, b := range bad {
		l, err := limit.New(b.c)
		if err == nil || l != nil {
			t.Errorf("New(%+v) = %v, %v: want an error", b.c, l, err)
			continue
		}
		if !strings.Contains(err.Error(), b.field) {
			t.Errorf("New(%+v): %q does not name %s", b.c, err, b.field)
		}
	}
	good := []limit.Config{
		{Max: 1 << 30}, {Max: 1}, {Timeout: math.MaxInt64}, {Timeout: 1},
		{Throttle: 1}, {Throttle: math.MaxFloat64}, {Waiting: math.MaxInt}, {Waiting: math.MinInt},
		{Max: 1 << 30, Timeout: 1, Throttle: math.MaxFloat64, Waiting: 1},
	}
	for _, c := range good {
		synctest.Test(t, func(t *testing.T) {
			l, err := limit.New(c)
			if err != nil {
				t.Fatalf("New(%+v): %v", c, err)
			}
			if c.Max == 1<<30 || c.Max == 0 {
				if got := l.Limit(); got != 10 {
					t.Errorf("New(%+v): cold limit %d, want 10", c, got)
				}
			}
			// A short life: calls of 1 ms, some dropped, with a cap and a rate.
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Go(func() {
					for i := range 200 {
						ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
						p, err := l.Acquire(ctx)
						if err == nil {
							time.Sleep(time.Millisecond)
							l.Release(p, (g+i)%7 == 0)
						} else if !errors.Is(err, limit.ErrLimited) {
							t.Errorf("New(%+v): err %v does not wrap ErrLimited", c, err)
						}
						cancel()
					}
				})
			}
			wg.Wait()
			if lim := l.Limit(); lim < 1 || (c.Max > 0 && lim > c.Max) || lim > 1000 && c.Max == 0 {
				t.Errorf("New(%+v): Limit %d out of range", c, lim)
			}
			if in, w := l.SetCap(-1); in != 0 || w != 0 {
				t.Errorf("New(%+v): in flight %d, waiting %d at the end", c, in, w)
			}
		})
	}
}

// doc.go "Rate gate": "A call whose turn (the next token, plus one token
// per call waiting ahead of it) comes after its deadline less the baseline
// latency fails fast with ErrLimited ("no token"), on arrival". With a
// token a second and 5 calls ahead of it, a call with 5 s left is refused
// on arrival, whatever number of calls with later deadlines wait behind
// it: here 5,000 (within Config.Waiting, 10,000).
func TestAttack5LNoTokenOnArrivalWithManyBehind(t *testing.T) {
	for _, behind := range []int{100, 5000} {
		t.Run(strconv.Itoa(behind), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := l5New(t, limit.Config{})
				l.SetRate(1, 1)
				p, err := l.Acquire(context.Background()) // the idle gate's one token
				if err != nil {
					t.Fatal(err)
				}
				l.Release(p, false)
				late, cancelLate := context.WithTimeout(context.Background(), 10*time.Hour)
				defer cancelLate()
				var wg sync.WaitGroup
				for range behind {
					wg.Go(func() { l.Acquire(late) })
				}
				synctest.Wait()
				soon, cancelSoon := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancelSoon()
				for range 5 { // turns at 1, 2, 3, 4 s: in time; the 5th's at 5 s is not
					wg.Go(func() { l.Acquire(soon) })
				}
				synctest.Wait()
				start := time.Now()
				_, err = l.Acquire(soon) // 6th: its token at 6 s, after its deadline at 5 s
				waited := time.Since(start)
				if err == nil || !strings.Contains(err.Error(), "token") || waited > 0 {
					t.Errorf("%d calls behind it: a call whose token comes at 6 s with 5 s left: err %v after %v, want \"no token\" on arrival", behind, err, waited)
				}
				l.SetRate(0, 0) // off: grant the rest
				cancelLate()
				wg.Wait()
			})
		})
	}
}

// doc.go "Waiting": "Calls that cannot make their deadline fail fast with
// ErrLimited and the reason, not at their deadline: at once when more
// calls with a deadline wait ahead than twice the limit's measured rate
// serves before the deadline". A limit of 4 at 10 ms serves about 400 a
// second: of 100 calls with 100 ms left, those with more than about 80
// ahead of them are refused at once, whatever number of calls with later
// deadlines wait behind them.
func TestAttack5LNoTurnOnArrivalWithManyBehind(t *testing.T) {
	for _, behind := range []int{100, 5000} {
		t.Run(strconv.Itoa(behind), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := l5New(t, limit.Config{Max: 4})
				var wg sync.WaitGroup
				for range 4 {
					wg.Go(func() {
						for range 50 {
							p, err := l.Acquire(context.Background())
							if err == nil {
								time.Sleep(10 * time.Millisecond)
								l.Release(p, false)
							}
						}
					})
				}
				wg.Wait()
				var held []limit.Permit
				for range l.Limit() {
					if p, err := l.Acquire(context.Background()); err == nil {
						held = append(held, p)
					}
				}
				late, cancelLate := context.WithTimeout(context.Background(), time.Hour)
				defer cancelLate()
				for range behind {
					wg.Go(func() { l.Acquire(late) })
				}
				synctest.Wait()
				soon, cancelSoon := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancelSoon()
				start := time.Now()
				var mu sync.Mutex
				atOnce, later := 0, 0
				var firstLater time.Duration
				for range 100 {
					wg.Go(func() {
						_, err := l.Acquire(soon)
						mu.Lock()
						defer mu.Unlock()
						if err != nil && time.Since(start) == 0 {
							atOnce++
						} else if err != nil {
							later++
							if firstLater == 0 {
								firstLater = time.Since(start)
							}
						}
					})
					synctest.Wait()
				}
				mu.Lock()
				t.Logf("%d behind, limit %d: of 100 calls with 100 ms left, %d refused on arrival", behind, l.Limit(), atOnce)
				mu.Unlock()
				time.Sleep(200 * time.Millisecond)
				mu.Lock()
				t.Logf("by 200 ms: %d refused later, the first at %v", later, firstLater)
				if atOnce == 0 {
					t.Errorf("%d calls with later deadlines behind: none of 100 calls with 100 ms left refused on arrival (limit %d held by a hang; %d refused later, the first at %v)", behind, l.Limit(), later, firstLater)
				}
				mu.Unlock()
				for _, p := range held {
					l.Release(p, false)
				}
				cancelLate()
				wg.Wait()
			})
		})
	}
}

// "It is safe for concurrent use" (Limiter, SetCap, SetRate, Release):
// Acquire and Release with cancellations, drops and done contexts, while
// SetCap and SetRate change and Limit is read; at the end nothing is in
// flight or waiting, every slot comes back, and every refusal wraps
// ErrLimited.
func TestAttack5LConcurrentEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := l5New(t, limit.Config{Max: 16, Throttle: 2, Timeout: 40 * time.Millisecond, Waiting: 50})
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var peakOver int
		var mu sync.Mutex
		for g := range 12 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var ctx context.Context
					var cancel context.CancelFunc
					switch (g + i) % 4 {
					case 0:
						ctx, cancel = context.WithCancel(context.Background())
						cancel()
					case 1:
						ctx, cancel = context.WithCancel(context.Background())
						time.AfterFunc(time.Duration(1+i%5)*time.Millisecond, cancel)
					default:
						ctx, cancel = context.WithTimeout(context.Background(), time.Duration(5+i%30)*time.Millisecond)
					}
					p, err := l.Acquire(ctx)
					if err != nil {
						if !errors.Is(err, limit.ErrLimited) {
							t.Errorf("err %v", err)
						}
						cancel()
						time.Sleep(time.Millisecond)
						continue
					}
					if in, _ := l.SetCap(-2); in > 16+1 {
						mu.Lock()
						peakOver = max(peakOver, in)
						mu.Unlock()
					}
					time.Sleep(time.Duration(1+i%7) * time.Millisecond)
					l.Release(p, i%9 == 0)
					cancel()
				}
			})
		}
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				switch i % 4 {
				case 0:
					l.SetCap(i % 8)
				case 1:
					l.SetCap(-1)
				case 2:
					l.SetRate(float64(500+i%1000), float64(i%5))
				case 3:
					l.SetRate(0, 0)
				}
				_ = l.Limit()
				time.Sleep(3 * time.Millisecond)
			}
		})
		time.Sleep(5 * time.Second)
		close(stop)
		wg.Wait()
		l.SetRate(0, 0)
		in, w := l.SetCap(-1)
		if in != 0 || w != 0 {
			t.Errorf("at the end: in flight %d, waiting %d", in, w)
		}
		if peakOver > 0 {
			t.Logf("in flight reached %d (Max 16) during cap changes", peakOver)
		}
		// The throttle (Throttle 2) may still refuse a share after the
		// storm's drops: its history passes within seconds.
		time.Sleep(time.Minute)
		lim := l.Limit()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		got := 0
		var ps []limit.Permit
		for range lim + 3 {
			if p, err := l.Acquire(ctx); err == nil {
				ps = append(ps, p)
				got++
			}
		}
		for _, p := range ps {
			l.Release(p, false)
		}
		if got != lim {
			t.Errorf("a drained limiter gives %d slots, want the limit %d", got, lim)
		}
	})
}
