package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// hlAnswer is how the base answers one request.
type hlAnswer struct {
	after  time.Duration // time to the response headers
	status int           // 0: 200
	err    error         // a transport error instead of a response
	deaf   bool          // ignore the request's context
	slow   time.Duration // the body's first Read waits this long
	panic  bool          // panic after the wait
	goexit bool          // runtime.Goexit after the wait
}

// hlBase is an in-memory RoundTripper for synctest bubbles. plan gets the
// wire attempt number (1 when the header is absent) and the index of the
// request in arrival order.
type hlBase struct {
	mu    sync.Mutex
	plan  func(num, idx int) hlAnswer
	nums  []int
	times []time.Duration
	start time.Time
	open  int
}

type hlBody struct {
	b    *hlBase
	r    io.Reader
	once sync.Once
	slow time.Duration
}

func (z *hlBody) Read(p []byte) (int, error) {
	if d := z.slow; d > 0 {
		z.slow = 0
		time.Sleep(d)
	}
	return z.r.Read(p)
}
func (z *hlBody) Close() error {
	z.once.Do(func() { z.b.mu.Lock(); z.b.open--; z.b.mu.Unlock() })
	return nil
}

func (b *hlBase) RoundTrip(r *http.Request) (*http.Response, error) {
	num := 1
	if v := r.Header.Get(wire.AttemptHeader); v != "" {
		num, _ = strconv.Atoi(v)
	}
	b.mu.Lock()
	idx := len(b.nums)
	b.nums = append(b.nums, num)
	b.times = append(b.times, time.Since(b.start))
	b.mu.Unlock()
	a := b.plan(num, idx)
	if a.deaf {
		time.Sleep(a.after)
	} else {
		tm := time.NewTimer(a.after)
		select {
		case <-tm.C:
		case <-r.Context().Done():
			tm.Stop()
			return nil, r.Context().Err()
		}
	}
	if a.panic {
		panic(http.ErrAbortHandler)
	}
	if a.goexit {
		runtime.Goexit()
	}
	if a.err != nil {
		return nil, a.err
	}
	st := a.status
	if st == 0 {
		st = 200
	}
	b.mu.Lock()
	b.open++
	b.mu.Unlock()
	return &http.Response{StatusCode: st, Status: http.StatusText(st), Header: http.Header{}, Request: r,
		Body: &hlBody{b: b, r: strings.NewReader("body"), slow: a.slow}, ContentLength: 4, ProtoMajor: 1, ProtoMinor: 1}, nil
}

func (b *hlBase) sent() ([]int, []time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.nums...), append([]time.Duration(nil), b.times...)
}

// hlFree counts the limiter's free slots through its public API: Acquire on
// a done context takes a slot only if one is free now.
func hlFree(l *limit.Limiter) int {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	var ps []limit.Permit
	for range 1 << 12 {
		p, err := l.Acquire(done)
		if err != nil {
			break
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		l.Release(p, false)
	}
	return len(ps)
}

func hlGet(t *testing.T, rt http.RoundTripper, ctx context.Context) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://svc.test/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, err
}

// hlTransport builds a transport over base whose guards for every host are
// a generous budget and lim (a limiter the test can probe).
func hlTransport(t *testing.T, base http.RoundTripper, lim *limit.Limiter, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	bg, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return hlTransportB(t, base, bg, lim, opts...)
}

func hlTransportB(t *testing.T, base http.RoundTripper, bg *budget.Budget, lim *limit.Limiter, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	opts = append([]httpretry.Option{httpretry.WithGuards(func(string) (retry.Guards, error) {
		return retry.Guards{Budget: bg, Limiter: lim}, nil
	})}, opts...)
	tr, err := httpretry.NewTransport(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func hlLimiter(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// WithHedging: "its concurrency limiter (WithLimit) has a free slot at once".
// A limiter of limit 1 held by the first copy leaves no slot for a hedge; a
// limiter of 2 with two calls in flight neither.
func TestAttackHedgeLimitHedgeNoSlotAtLimit(t *testing.T) {
	for _, max := range []int{1, 2} {
		t.Run(strconv.Itoa(max), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &hlBase{start: time.Now(), plan: func(num, idx int) hlAnswer { return hlAnswer{after: 200 * time.Millisecond} }}
				lim := hlLimiter(t, limit.Config{Max: max})
				tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 1))
				var wg sync.WaitGroup
				for range max {
					wg.Go(func() {
						if _, err := hlGet(t, tr, context.Background()); err != nil {
							t.Error(err)
						}
					})
				}
				wg.Wait()
				nums, _ := b.sent()
				if len(nums) != max {
					t.Errorf("sent %v (wire numbers), want %d requests and no hedge at the limit", nums, max)
				}
				if f := hlFree(lim); f != lim.Limit() {
					t.Errorf("free slots %d, limit %d", f, lim.Limit())
				}
			})
		})
	}
}

// docs/limit.md: "Every slot is given back exactly once". Races of every
// kind, then every slot of the limiter must be free.
func TestAttackHedgeLimitSlotsAllReturned(t *testing.T) {
	type tc struct {
		name    string
		timeout time.Duration
		cancel  time.Duration // caller cancels at this time (0: never)
		plan    func(num, idx int) hlAnswer
		max     int
	}
	cases := []tc{
		{"hedge wins", 0, 0, func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: time.Second}
			}
			return hlAnswer{after: 10 * time.Millisecond}
		}, 1},
		{"hedge wins, deaf first", 0, 0, func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: time.Second, deaf: true}
			}
			return hlAnswer{after: 10 * time.Millisecond}
		}, 2},
		{"first wins, deaf hedges", 0, 0, func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: 70 * time.Millisecond}
			}
			return hlAnswer{after: time.Second, deaf: true}
		}, 3},
		{"hedge 503", 0, 0, func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: 300 * time.Millisecond}
			}
			return hlAnswer{after: 10 * time.Millisecond, status: 503}
		}, 2},
		{"hedge error", 0, 0, func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: 300 * time.Millisecond}
			}
			return hlAnswer{after: 10 * time.Millisecond, err: errors.New("boom")}
		}, 2},
		{"all fail", 0, 0, func(num, _ int) hlAnswer {
			return hlAnswer{after: 80 * time.Millisecond, err: errors.New("boom")}
		}, 2},
		{"attempt timeout", 100 * time.Millisecond, 0, func(num, _ int) hlAnswer {
			return hlAnswer{after: time.Second}
		}, 3},
		{"caller cancels", 0, 120 * time.Millisecond, func(num, _ int) hlAnswer {
			return hlAnswer{after: time.Second}
		}, 3},
		{"caller cancels, deaf", 0, 120 * time.Millisecond, func(num, _ int) hlAnswer {
			return hlAnswer{after: time.Second, deaf: true}
		}, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &hlBase{start: time.Now(), plan: c.plan}
				lim := hlLimiter(t, limit.Config{Max: 100})
				opts := []httpretry.Option{httpretry.WithHedging(50*time.Millisecond, 0.95, c.max)}
				if c.timeout > 0 {
					opts = append(opts, httpretry.WithAttemptTimeout(c.timeout))
				}
				tr := hlTransport(t, b, lim, opts...)
				var wg sync.WaitGroup
				for range 5 {
					wg.Go(func() {
						ctx := context.Background()
						if c.cancel > 0 {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, c.cancel)
							defer cancel()
						}
						_, _ = hlGet(t, tr, ctx)
					})
				}
				wg.Wait()
				time.Sleep(5 * time.Second)
				synctest.Wait()
				nums, _ := b.sent()
				t.Logf("wire numbers %v", nums)
				if f, l := hlFree(lim), lim.Limit(); f != l {
					t.Errorf("after %d requests %v: free slots %d, limit %d", len(nums), nums, f, l)
				}
				b.mu.Lock()
				if b.open != 0 {
					t.Errorf("%d bodies left open", b.open)
				}
				b.mu.Unlock()
			})
		})
	}
}

// docs/hedging.md: "The first good answer wins ... The other copies'
// contexts are canceled" and "a hedge's good answer cancels the first copy,
// and the caller gets the hedge's answer when the first copy's request
// returns, ... only when the first copy answers over one that does not
// [honour the request's context]". Once the first hedge has won (at 60 ms),
// the race is decided: no further hedge (a withdrawal, a slot and a request
// on the wire) should go at 100 ms while the deaf first copy is returning.
func TestAttackHedgeLimitNoHedgeAfterRaceWon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: time.Second, deaf: true} // a base deaf to the canceled first copy
			}
			return hlAnswer{after: 10 * time.Millisecond}
		}}
		lim := hlLimiter(t, limit.Config{Max: 100})
		tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 2))
		if _, err := hlGet(t, tr, context.Background()); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		nums, times := b.sent()
		if len(nums) != 2 {
			t.Errorf("requests on the wire %v at %v: the hedge #1 won at 60ms, want no hedge after it (2 requests)", nums, times)
		}
	})
}

// docs/hedging.md: a hedge's slot "is given back when the hedge ends: as a
// drop when the hedge failed or timed out, not when the race canceled it (a
// loser is no sign of overload)". Drops lower the limit; losers must not.
// The control (hedges that fail) shows the limit does fall on drops.
func TestAttackHedgeLimitLosingHedgeNotADrop(t *testing.T) {
	run := func(t *testing.T, hedge hlAnswer) int {
		got := 1 << 30
		synctest.Test(t, func(t *testing.T) {
			b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
				if num == 1 {
					return hlAnswer{after: 70 * time.Millisecond}
				}
				return hedge
			}}
			lim := hlLimiter(t, limit.Config{Max: 100})
			tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 1), httpretry.WithRetry(retry.WithMaxAttempts(1)))
			for range 200 {
				_, _ = hlGet(t, tr, context.Background())
				time.Sleep(250 * time.Millisecond) // under the due-share bound's floor of 5 a second
				got = min(got, lim.Limit())
			}
			time.Sleep(time.Second)
			nums, _ := b.sent()
			if len(nums) < 350 {
				t.Fatalf("only %d requests for 200 calls: hedges did not go", len(nums))
			}
		})
		return got
	}
	lose := run(t, hlAnswer{after: time.Second})                           // canceled by the race at 70 ms
	loseDeaf := run(t, hlAnswer{after: 40 * time.Millisecond, deaf: true}) // a good answer after the winner
	fail := run(t, hlAnswer{after: 10 * time.Millisecond, err: errors.New("reset")})
	t.Logf("lowest limit over 200 races: hedges lose %d, lose deaf %d, fail %d", lose, loseDeaf, fail)
	if fail >= 10 {
		t.Fatalf("control: failing hedges left the limit at %d, the test cannot see drops", fail)
	}
	if lose < 10 || loseDeaf < 10 {
		t.Errorf("losing hedges lowered the limit from 10: %d, %d", lose, loseDeaf)
	}
}

// docs/hedging.md: "a hedge carries the next Stormguard-Attempt number ...
// A retry after a hedged attempt carries the number after the hedges'", and
// "Every hedge is a withdrawal ... The slot is asked for after the budget, so
// a refused slot has spent a withdrawal". A limiter of 2: each race sends its
// first copy and one hedge; the second hedge is refused a slot.
func TestAttackHedgeLimitNumbersAndBudgetWithLimiterRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
			return hlAnswer{after: 120 * time.Millisecond, status: http.StatusBadGateway}
		}}
		bg, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: 1000})
		if err != nil {
			t.Fatal(err)
		}
		lim := hlLimiter(t, limit.Config{Max: 2})
		tr := hlTransportB(t, b, bg, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 2),
			httpretry.WithRetry(retry.WithMaxAttempts(3)))
		resp, err := hlGet(t, tr, context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		nums, times := b.sent()
		t.Logf("status %d, wire numbers %v at %v, budget %+v", resp.StatusCode, nums, times, bg.Stats())
		// The two 502s of the first race are drops: the limit falls to 1,
		// and the later races get no slot for their hedge (each due hedge
		// still withdraws). First race: #1, hedge #2 (the second hedge
		// refused); second race #3 (its two hedges refused), third #4 (one
		// refused, then the race ends). Withdrawals: 1 sent + 3 refused + 2
		// retries... as observed: 6.
		if want := []int{1, 2, 3, 4}; !slices.Equal(nums, want) {
			t.Errorf("wire numbers %v, want %v", nums, want)
		}
		if st := bg.Stats(); st.Requests != 1 || st.Retries != 6 {
			t.Errorf("budget %+v: want 1 deposit and 6 withdrawals", st)
		}
		if f := hlFree(lim); f != lim.Limit() {
			t.Errorf("free %d of %d", f, lim.Limit())
		}
	})
}

// docs/limit.md: "An HTTP attempt holds its slot until its response headers
// arrive (one answered with a failure, until its body is read into memory
// too: up to 64 KiB, for at most 50 ms)". A hedge is an attempt on the wire
// (docs/hedging.md) whose slot "is given back when the hedge ends". A hedge
// answered 503 at 60 ms whose body takes 30 ms to read: at 70 ms its slot
// should still be held (the first copy holds the other). The control: the
// same 503 on a request without hedging holds its slot at 10 ms.
func TestAttackHedgeLimitFailedHedgeHoldsSlotWhileBodyRead(t *testing.T) {
	t.Run("control without hedging", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
				if num == 1 {
					return hlAnswer{status: 503, slow: 30 * time.Millisecond}
				}
				return hlAnswer{}
			}}
			lim := hlLimiter(t, limit.Config{Max: 100})
			tr := hlTransport(t, b, lim)
			go func() { _, _ = hlGet(t, tr, context.Background()) }()
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
			if f, l := hlFree(lim), lim.Limit(); f != l-1 {
				t.Errorf("at 10 ms, while the 503's body is read: %d of %d slots free, want %d", f, l, l-1)
			}
			time.Sleep(time.Second)
		})
	})
	t.Run("hedge", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
				if num == 1 {
					return hlAnswer{after: 200 * time.Millisecond}
				}
				return hlAnswer{after: 10 * time.Millisecond, status: 503, slow: 30 * time.Millisecond}
			}}
			lim := hlLimiter(t, limit.Config{Max: 100})
			tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 1))
			go func() { _, _ = hlGet(t, tr, context.Background()) }()
			time.Sleep(70 * time.Millisecond)
			synctest.Wait()
			nums, _ := b.sent()
			if f, l := hlFree(lim), lim.Limit(); f != l-2 {
				t.Errorf("at 70 ms (sent %v), the hedge's 503 answered at 60 ms, its body read until 90 ms: %d of %d slots free, want %d", nums, f, l, l-2)
			}
			time.Sleep(time.Second)
		})
	})
}

// docs/limit.md: "Every slot is given back exactly once when its attempt
// ends, a panic included". The first copy's base panics at 100 ms while a
// hedge (sent at 50 ms) is in flight; the panic reaches the caller and
// every slot comes back.
func TestAttackHedgeLimitFirstCopyPanicSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer {
			if num == 1 {
				return hlAnswer{after: 100 * time.Millisecond, panic: true}
			}
			return hlAnswer{after: time.Second}
		}}
		lim := hlLimiter(t, limit.Config{Max: 100})
		tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 1))
		var got any
		func() {
			defer func() { got = recover() }()
			_, _ = hlGet(t, tr, context.Background())
		}()
		time.Sleep(5 * time.Second)
		synctest.Wait()
		nums, _ := b.sent()
		if got == nil {
			t.Errorf("no panic reached the caller (sent %v)", nums)
		}
		if f, l := hlFree(lim), lim.Limit(); f != l {
			t.Errorf("sent %v: free %d of %d", nums, f, l)
		}
	})
}

// observe.AttemptEnd: Outcome "failure" is "a failure of the dependency";
// "a hedge that lost its race ends with "canceled"..., and so does an
// attempt that failed after its call's context ended". docs/hedging.md: a
// hedge's slot is given back "as a drop when the hedge failed or timed out,
// not when the race canceled it". A hedge that times out on its own attempt
// timeout, in a race every copy of which fails (no winner, the caller still
// waiting), lost nothing: it failed, as the first copy's timeout does.
func TestAttackHedgeLimitHedgeTimeoutOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &hlBase{start: time.Now(), plan: func(num, _ int) hlAnswer { return hlAnswer{after: time.Second} }}
		lim := hlLimiter(t, limit.Config{Max: 100})
		var mu sync.Mutex
		var ends []string
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.AttemptEnd {
				mu.Lock()
				ends = append(ends, fmt.Sprintf("#%d hedge=%v %s", e.Attempt, e.Hedge, e.Outcome))
				mu.Unlock()
			}
		})
		tr := hlTransport(t, b, lim, httpretry.WithHedging(50*time.Millisecond, 0.95, 1),
			httpretry.WithAttemptTimeout(100*time.Millisecond), httpretry.WithRetry(retry.WithMaxAttempts(1)),
			httpretry.WithObserver(obs))
		_, err := hlGet(t, tr, context.Background())
		time.Sleep(time.Second)
		mu.Lock()
		defer mu.Unlock()
		t.Logf("err %v; attempt ends %v", err, ends)
		for _, e := range ends {
			if strings.Contains(e, "hedge=true") && !strings.HasSuffix(e, "failure") {
				t.Errorf("hedge timed out on its own attempt timeout (caller waiting, no copy won) reported %q, want Outcome failure", e)
			}
		}
	})
}
