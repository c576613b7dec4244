package limit

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func newRateLimiter(t *testing.T, c Config) *Limiter {
	t.Helper()
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// acquireAt runs one Acquire with a deadline d away on a goroutine and
// sends when it returned (since start) and its error.
type acquired struct {
	at  time.Duration
	err error
	tag int
}

func acquireAt(l *Limiter, start time.Time, d time.Duration, tag int, out chan<- acquired) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		p, err := l.Acquire(ctx)
		if err == nil {
			l.Release(p, false)
		}
		out <- acquired{time.Since(start), err, tag}
	}()
}

// TestRateGateBurstAndSpacing: a gate of 10 per second holding 3 tokens
// lets 3 calls go at once, then one waiting call per 100 ms, each at a
// drawn point of its 100 ms; an idle gate fills up to its burst again,
// not beyond.
func TestRateGateBurstAndSpacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{})
		l.SetRate(10, 3)
		start := time.Now()
		out := make(chan acquired, 10)
		for i := range 6 {
			acquireAt(l, start, 10*time.Second, i, out)
			synctest.Wait()
		}
		var got []time.Duration
		for range 6 {
			got = append(got, (<-out).at)
		}
		if got[0] != 0 || got[1] != 0 || got[2] != 0 {
			t.Fatalf("starts %v, want 3 at once", got)
		}
		for i := 3; i < 6; i++ {
			if lo := time.Duration(i-2) * 100 * time.Millisecond; got[i] < lo || got[i] >= lo+100*time.Millisecond {
				t.Fatalf("starts %v: waiting call %d at %v, want [%v, %v)", got, i, got[i], lo, lo+100*time.Millisecond)
			}
		}
		time.Sleep(10 * time.Second) // idle: the bucket fills to 3
		start = time.Now()
		for i := range 4 {
			acquireAt(l, start, 10*time.Second, i, out)
			synctest.Wait()
		}
		got = got[:0]
		for range 4 {
			got = append(got, (<-out).at)
		}
		if got[2] != 0 || got[3] < 100*time.Millisecond || got[3] >= 200*time.Millisecond {
			t.Fatalf("after an idle spell: starts %v, want 3 at once then one in [100ms, 200ms)", got)
		}
	})
}

// TestRateGateEarliestDeadlineFirst: calls waiting for tokens get them
// earliest deadline first, whatever their arrival order.
func TestRateGateEarliestDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{})
		l.SetRate(10, 1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p, err := l.Acquire(ctx) // takes the one token
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
		start := time.Now()
		out := make(chan acquired, 4)
		for i, d := range []time.Duration{4 * time.Second, 2 * time.Second, 3 * time.Second, 5 * time.Second} {
			acquireAt(l, start, d, i, out)
			synctest.Wait()
		}
		var order []int
		for range 4 {
			a := <-out
			if a.err != nil {
				t.Fatalf("call %d: %v", a.tag, a.err)
			}
			order = append(order, a.tag)
		}
		if order[0] != 1 || order[1] != 2 || order[2] != 0 || order[3] != 3 {
			t.Fatalf("token order %v, want earliest deadline first [1 2 0 3]", order)
		}
	})
}

// TestRateGateHopelessFailsFast: a call whose token comes after its
// deadline fails at once with ErrLimited, not at its deadline; a lowered
// rate fails the waiters it makes hopeless at once; SetRate counts both
// kinds of refusal.
func TestRateGateHopelessFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{})
		l.SetRate(1, 1)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if p, err := l.Acquire(ctx); err != nil {
			t.Fatal(err)
		} else {
			l.Release(p, false)
		}
		start := time.Now()
		out := make(chan acquired, 8)
		// Tokens at 1 s, 2 s, 3 s, each waiting call's at a drawn point
		// of the second that follows: with 3 s deadlines, two calls can
		// make it, the third cannot.
		for i := range 3 {
			acquireAt(l, start, 3*time.Second, i, out)
			synctest.Wait()
		}
		a := <-out
		if a.tag != 2 || a.at != 0 || !errors.Is(a.err, ErrLimited) || !errors.Is(a.err, errNoToken) {
			t.Fatalf("the third call: %+v, want an immediate no-token refusal", a)
		}
		// Lowered to one token per 10 s (the debt of 0.9 token kept: the
		// next token at 9.1 s): both waiters are hopeless now, at once.
		time.Sleep(100 * time.Millisecond)
		// SetRate reports the refusals since its last call (demand the
		// rate did not serve): the one on arrival and the two it makes.
		if _, _, refused, _, _, _ := l.SetRate(0.1, 1); refused != 3 {
			t.Fatalf("%d refused for want of a token, want 3", refused)
		}
		for range 2 {
			a := <-out
			if !errors.Is(a.err, errNoToken) || a.at != 100*time.Millisecond {
				t.Fatalf("after the rate fell: %+v, want a no-token refusal at 100ms", a)
			}
		}
		if _, w, refused, _, _, _ := l.SetRate(math.NaN(), 5); w != 0 || refused != 0 {
			t.Fatalf("%d waiting, %d refused since the last read; want 0, 0", w, refused)
		}
	})
}

// TestRateGateOffAndBadValues: 0, a negative rate and +Inf turn the gate
// off and grant the waiters at once; NaN leaves it as it was; a burst
// below 1 or NaN is 1.
func TestRateGateOffAndBadValues(t *testing.T) {
	for _, off := range []float64{0, -3, math.Inf(1), math.Inf(-1)} {
		synctest.Test(t, func(t *testing.T) {
			l := newRateLimiter(t, Config{})
			l.SetRate(0.5, math.NaN())
			start := time.Now()
			out := make(chan acquired, 2)
			acquireAt(l, start, 5*time.Second, 0, out)
			acquireAt(l, start, 5*time.Second, 1, out)
			synctest.Wait()
			if a := <-out; a.err != nil || a.at != 0 {
				t.Fatalf("the burst of 1: %+v", a)
			}
			l.SetRate(math.NaN(), 100) // ignored: still waiting
			synctest.Wait()
			if _, w, _, _, _, _ := l.SetRate(math.NaN(), 0); w != 1 {
				t.Fatalf("NaN: %d waiting, want 1 (the gate unchanged)", w)
			}
			time.Sleep(time.Second)
			l.SetRate(off, -1)
			if a := <-out; a.err != nil || a.at != time.Second {
				t.Fatalf("SetRate(%v): %+v, want granted at once (1s)", off, a)
			}
			if l.gated.Load() {
				t.Fatalf("SetRate(%v): still gated", off)
			}
		})
	}
}

// TestRateGateManyWaitersBounded: 100,000 calls arriving at once on a
// gate of 1000 per second with 2 s deadlines: about 2000 are served in
// token order, every other call fails fast (at once), and the waiting
// list never holds more than the calls that can make it. Under the race
// detector 20,000 calls (the same code, a fifth of the goroutines); the
// 100,000 run without it (make test's pass without -race).
func TestRateGateManyWaitersBounded(t *testing.T) {
	calls := 100_000
	if raceEnabled {
		calls = 20_000
	}
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{Waiting: 2 * calls})
		l.SetRate(1000, 1)
		var served, fast, late atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range calls {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				p, err := l.Acquire(ctx)
				switch {
				case err == nil:
					served.Add(1)
					l.Release(p, false)
				case time.Since(start) == 0:
					fast.Add(1)
				default:
					late.Add(1)
				}
			})
		}
		synctest.Wait()
		_, w, _, _, _, _ := l.SetRate(math.NaN(), 1)
		if w > 2000 {
			t.Errorf("%d calls waiting, want at most the 2000 that can make it", w)
		}
		wg.Wait()
		t.Logf("served %d, failed fast %d, failed later %d; at most %d waiting", served.Load(), fast.Load(), late.Load(), w)
		if s := served.Load(); s < 1990 || s > 2001 {
			t.Errorf("served %d, want about 2000 (2 s at 1000/s)", s)
		}
		if late.Load() > 10 {
			t.Errorf("%d calls failed after waiting, want them failed fast", late.Load())
		}
	})
}

// TestRateGateConcurrent: calls, releases and rate changes from many
// goroutines (run with -race): nothing is lost, every call ends.
func TestRateGateConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{Max: 8})
		var wg sync.WaitGroup
		var ok, refused atomic.Int64
		stop := make(chan struct{})
		wg.Go(func() {
			rates := []float64{50, 0, 500, 5, math.Inf(1), 1000}
			for i := 0; ; i++ {
				select {
				case <-stop:
					l.SetRate(0, 0)
					return
				case <-time.After(37 * time.Millisecond):
				}
				l.SetRate(rates[i%len(rates)], float64(1+i%4))
			}
		})
		for g := range 16 {
			wg.Go(func() {
				for i := range 200 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+g*i%300)*time.Millisecond)
					p, err := l.Acquire(ctx)
					cancel()
					if err != nil {
						refused.Add(1)
						continue
					}
					time.Sleep(time.Millisecond)
					l.Release(p, i%7 == 0)
					ok.Add(1)
				}
			})
		}
		time.Sleep(20 * time.Second)
		close(stop)
		wg.Wait()
		if in, w, _, _, _, _ := l.SetRate(0, 0); in != 0 || w != 0 {
			t.Fatalf("after all calls ended: %d in flight, %d waiting", in, w)
		}
		t.Logf("%d served, %d refused", ok.Load(), refused.Load())
		if ok.Load() == 0 {
			t.Fatal("nothing served")
		}
	})
}

// TestSetRateReportsLatency: SetRate returns the latency samples taken
// since its last call (their sum, the fastest and their number), then
// starts over.
func TestSetRateReportsLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{})
		ctx := context.Background()
		// One call in flight: the limiter samples one call in 16, the
		// first of them included; the others go unheld.
		hold := map[int]time.Duration{0: 30 * time.Millisecond, 16: 10 * time.Millisecond}
		for i := 0; i <= 16; i++ {
			p, err := l.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(hold[i])
			l.Release(p, false)
		}
		in, w, _, lat, fastest, n := l.SetRate(0, 0)
		if in != 0 || w != 0 || lat != 40*time.Millisecond || fastest != 10*time.Millisecond || n != 2 {
			t.Fatalf("SetRate = %d, %d, %v, %v, %d; want 0, 0, 40ms, 10ms, 2", in, w, lat, fastest, n)
		}
		if _, _, _, lat, fastest, n := l.SetRate(0, 0); lat != 0 || fastest != 0 || n != 0 {
			t.Fatalf("second read: %v, %v, %d; want nothing", lat, fastest, n)
		}
	})
}

// TestRateGateAllocs: with a token due, Acquire and Release allocate
// nothing and take no lock (no waiter, the token by compare-and-swap).
func TestRateGateAllocs(t *testing.T) {
	l := newRateLimiter(t, Config{})
	l.SetRate(1e9, 1e9)
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		p, err := l.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
	}); n != 0 {
		t.Fatalf("%v allocs per Acquire+Release through the rate gate, want 0", n)
	}
}

// TestRateGatePhase: a burst in (0, 1) pushes the next token out by
// (1 − burst) of a token's time, also on an idle gate that holds tokens:
// the first waiting call goes in the token's time that follows, the
// second in the one after.
func TestRateGatePhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{})
		l.SetRate(10, 5) // idle: 5 tokens
		l.SetRate(10, 0.25)
		start := time.Now()
		out := make(chan acquired, 2)
		acquireAt(l, start, time.Second, 0, out)
		acquireAt(l, start, time.Second, 1, out)
		a, b := <-out, <-out
		if a.at > b.at {
			a, b = b, a
		}
		if a.err != nil || b.err != nil || a.at < 75*time.Millisecond || a.at >= 175*time.Millisecond || b.at < 175*time.Millisecond || b.at >= 275*time.Millisecond {
			t.Fatalf("after a phase of 0.75 token at 10/s: %+v, %+v; want one in [75ms, 175ms), then one in [175ms, 275ms)", a, b)
		}
	})
}

// TestRateGateSpacingMean: the draws for waiting calls keep the rate and
// do not add up: at 100 a second, the k-th waiting call starts in
// [k·10ms, (k+1)·10ms), 1,000 of them in 10 s.
func TestRateGateSpacingMean(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newRateLimiter(t, Config{Max: 1 << 20})
		l.SetRate(100, 1)
		start := time.Now()
		var last time.Duration
		for i := range 1001 {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			at := time.Since(start)
			if lo := time.Duration(i) * 10 * time.Millisecond; i > 0 && (at < lo || at >= lo+10*time.Millisecond) {
				t.Fatalf("waiting call %d started at %v, want [%v, %v)", i, at, lo, lo+10*time.Millisecond)
			}
			last = at
			l.Release(p, false)
		}
		if last < 10*time.Second || last >= 10010*time.Millisecond {
			t.Fatalf("1,000 waiting calls at 100/s took %v, want 10s (within one token's time)", last)
		}
	})
}

// TestRateGatesInStepSpread: 200 gates set to one token every 2 s within
// 100 ms of each other, each with calls waiting, do not send in step:
// from the fifth token on, every 500 ms holds between a fifth and twice
// its mean of starts (with each waiting call at its token's time to the
// dot, they went as one wave of 200 every 2 s, and nothing between waves).
func TestRateGatesInStepSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const gates, waiting = 200, 40
		start := time.Now()
		var mu sync.Mutex
		starts := make([]int, 160) // per 500 ms, over 80 s
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		for g := range gates {
			time.Sleep(100 * time.Millisecond / gates)
			l := newRateLimiter(t, Config{})
			l.SetRate(0.5, 1)
			for range waiting {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p, err := l.Acquire(ctx)
					if err != nil {
						return
					}
					mu.Lock()
					if k := int(time.Since(start) / (500 * time.Millisecond)); k < len(starts) {
						starts[k]++
					}
					mu.Unlock()
					l.Release(p, false)
				}()
			}
			_ = g
		}
		time.Sleep(80 * time.Second)
		cancel()
		wg.Wait()
		mean := gates / 4 // a token every 2 s per gate: a quarter of the gates per 500 ms
		lo, hi := mean, 0
		for _, n := range starts[20:] { // from 10 s: the fifth token on
			lo, hi = min(lo, n), max(hi, n)
		}
		if lo < mean/5 || hi > 2*mean {
			t.Fatalf("starts per 500 ms from 10 s: %v (fewest %d, most %d), want between %d and %d", starts[20:], lo, hi, mean/5, 2*mean)
		}
	})
}

// TestRateGateTurnRuleBoundary (moved here from the black-box attacks, to
// read the token's drawn delay from the gate): the turn rule with the rate
// gate on ("whenever a token is due"): at the token's time, A with exactly
// twice the latency (200 ms) left gets the slot and the token; with 1 ns
// less it fails and B gets them.
func TestRateGateTurnRuleBoundary(t *testing.T) {
	for _, tc := range []struct {
		name   string
		less   time.Duration
		refuse bool
	}{{"equal", 0, false}, {"1ns-less", 1, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := newRateLimiter(t, Config{Max: 1})
				for range 30 { // one caller, attempts of 100 ms: every one a sample
					p, err := l.Acquire(context.Background())
					if err != nil {
						t.Fatal(err)
					}
					time.Sleep(100 * time.Millisecond)
					l.Release(p, false)
				}
				l.SetRate(10, 1) // a token each 100 ms
				t0 := time.Now()
				p, err := l.Acquire(context.Background()) // the token of t0
				if err != nil {
					t.Fatal(err)
				}
				// The next token's time is +100 ms; a waiting call gets it
				// its drawn delay later.
				tok := 100*time.Millisecond + time.Duration(l.tokenDelay(l.rtat.Load(), l.riv.Load()))
				type res struct {
					p   Permit
					err error
				}
				async := func(ctx context.Context) <-chan res {
					ch := make(chan res, 1)
					go func() {
						p, err := l.Acquire(ctx)
						ch <- res{p, err}
					}()
					return ch
				}
				ctxA, cA := context.WithDeadline(context.Background(), t0.Add(tok+200*time.Millisecond-tc.less))
				defer cA()
				a := async(ctxA)
				synctest.Wait()
				ctxB, cB := context.WithTimeout(context.Background(), 10*time.Second)
				defer cB()
				b := async(ctxB)
				synctest.Wait()
				time.Sleep(50 * time.Millisecond)
				l.Release(p, false) // the slot is free; the next token at +tok
				time.Sleep(tok - 50*time.Millisecond)
				synctest.Wait()
				var ra res
				select {
				case ra = <-a:
				default:
					t.Fatalf("A still waits at +%v (its token at +%v)", time.Since(t0), tok)
				}
				if tc.refuse != (ra.err != nil) {
					t.Fatalf("A at +%v with %v left: err %v, want refused=%v", time.Since(t0), 200*time.Millisecond-tc.less, ra.err, tc.refuse)
				}
				if ra.err == nil {
					l.Release(ra.p, false)
				}
				rb := <-b
				if rb.err != nil {
					t.Fatalf("B: %v", rb.err)
				}
				l.Release(rb.p, false)
			})
		})
	}
}
