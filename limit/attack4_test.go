// Black-box attacks on package limit (AREA limit2): the turn rule's exact
// boundaries, the Waiting bound with both kinds of waiters, Release
// misuse documented as ignored, SetRate's edge values, the limit's range.

package limit_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

func lim2New(t testing.TB, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type lim2Res struct {
	p   limit.Permit
	err error
}

func lim2Async(l *limit.Limiter, ctx context.Context) <-chan lim2Res {
	ch := make(chan lim2Res, 1)
	go func() {
		p, err := l.Acquire(ctx)
		ch <- lim2Res{p, err}
	}()
	return ch
}

// lim2Warm: one caller, rounds attempts of exactly svc each (limit 1: every
// attempt a sample), so baseline = smoothed = last window's latency = svc.
func lim2Warm(t *testing.T, l *limit.Limiter, rounds int, svc time.Duration) {
	t.Helper()
	for range rounds {
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(svc)
		l.Release(p, false)
	}
}

// lim2Free counts the free slots (up to limit+5) with a done context, and
// gives them back.
func lim2Free(l *limit.Limiter) int {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var ps []limit.Permit
	for range l.Limit() + 5 {
		p, err := l.Acquire(ctx)
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

// doc.go "Waiting": "a call whose slot comes with less time left than
// twice the destination's latency ... fails then ... when a later call has
// that much time left". The destination's latency here is exactly 100 ms
// (every sample 100 ms): a call whose slot comes with exactly 200 ms left
// does not have less than twice it and must get the slot; one with 1 ns
// less must fail and the slot go to the later call.
func TestAttackLimit2TurnRuleExactBoundary(t *testing.T) {
	for _, tc := range []struct {
		name   string
		less   time.Duration // time left at the turn: 200 ms - less
		refuse bool
	}{{"equal", 0, false}, {"1ns-less", 1, true}, {"1ms-more", -time.Millisecond, false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const svc = 100 * time.Millisecond
				l := lim2New(t, limit.Config{Max: 1})
				lim2Warm(t, l, 30, svc)
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				t0 := time.Now()
				ctxA, cA := context.WithDeadline(context.Background(), t0.Add(300*time.Millisecond-tc.less))
				defer cA()
				a := lim2Async(l, ctxA)
				synctest.Wait()
				ctxB, cB := context.WithTimeout(context.Background(), 10*time.Second)
				defer cB()
				b := lim2Async(l, ctxB)
				synctest.Wait()
				time.Sleep(100 * time.Millisecond) // A's slot comes with 200 ms - less left
				l.Release(p, false)
				synctest.Wait()
				var ra lim2Res
				select {
				case ra = <-a:
				default:
					t.Fatalf("A still waiting at its turn")
				}
				if tc.refuse {
					if !errors.Is(ra.err, limit.ErrLimited) {
						t.Fatalf("A with %v left (less than twice the 100 ms latency) got the slot, want ErrLimited", 200*time.Millisecond-tc.less)
					}
					rb := <-b
					if rb.err != nil {
						t.Fatalf("B: %v", rb.err)
					}
					l.Release(rb.p, false)
				} else {
					if ra.err != nil {
						t.Fatalf("A with %v left (not less than twice the 100 ms latency) refused: %v", 200*time.Millisecond-tc.less, ra.err)
					}
					l.Release(ra.p, false)
					rb := <-b
					if rb.err != nil {
						t.Fatalf("B: %v", rb.err)
					}
					l.Release(rb.p, false)
				}
				if n := lim2Free(l); n != 1 {
					t.Errorf("free slots %d, want 1", n)
				}
			})
		})
	}
}

// The turn rule applies only "when ... the free slots are fewer than the
// calls waiting": with exactly as many free slots as waiters (a cap of 0
// raised to 2 with A short and B long waiting), both get one.
func TestAttackLimit2TurnRuleFreeEqualsWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const svc = 100 * time.Millisecond
		l := lim2New(t, limit.Config{Max: 4})
		for range 20 { // 4 callers: limit 4, latency 100 ms
			var wg sync.WaitGroup
			for range 4 {
				wg.Go(func() {
					p, err := l.Acquire(context.Background())
					if err == nil {
						time.Sleep(svc)
						l.Release(p, false)
					}
				})
			}
			wg.Wait()
		}
		if l.Limit() < 2 {
			t.Fatalf("limit %d", l.Limit())
		}
		l.SetCap(0)
		ctxA, cA := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cA()
		a := lim2Async(l, ctxA)
		synctest.Wait()
		ctxB, cB := context.WithTimeout(context.Background(), 10*time.Second)
		defer cB()
		b := lim2Async(l, ctxB)
		synctest.Wait()
		l.SetCap(2) // 2 free slots, 2 waiters
		ra, rb := <-a, <-b
		if ra.err != nil || rb.err != nil {
			t.Fatalf("2 free slots for 2 waiters: A %v, B %v; want both granted", ra.err, rb.err)
		}
		l.Release(ra.p, false)
		l.Release(rb.p, false)
	})
}

// Config.Waiting "bounds the calls that may wait at once for a slot, with
// and without a deadline together; beyond it Acquire fails at once". With
// Waiting 2: one deadline call and one open call wait; a third of either
// kind fails at once; when one leaves, a new one may wait.
func TestAttackLimit2WaitingBoundMixed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2New(t, limit.Config{Max: 1, Waiting: 2})
		p, _ := l.Acquire(context.Background())
		ctxD, cD := context.WithTimeout(context.Background(), time.Hour)
		defer cD()
		d := lim2Async(l, ctxD)
		ctxO, cO := context.WithCancel(context.Background())
		o := lim2Async(l, ctxO)
		synctest.Wait()
		ctx3, c3 := context.WithTimeout(context.Background(), time.Hour)
		defer c3()
		if _, err := l.Acquire(ctx3); !errors.Is(err, limit.ErrLimited) {
			t.Errorf("third (deadline) caller: %v, want refused at once", err)
		}
		ctx4, c4 := context.WithCancel(context.Background())
		r4 := lim2Async(l, ctx4)
		synctest.Wait()
		select {
		case r := <-r4:
			if !errors.Is(r.err, limit.ErrLimited) {
				t.Errorf("third (open) caller: %v", r.err)
			}
		default:
			t.Errorf("third (open) caller waits beyond Waiting 2")
			c4()
			<-r4
		}
		c4()
		cO()
		<-o
		// one place free again: an open call may wait
		ctx5, c5 := context.WithCancel(context.Background())
		r5 := lim2Async(l, ctx5)
		synctest.Wait()
		select {
		case r := <-r5:
			t.Errorf("after one left, a new caller was refused: %v", r.err)
		default:
		}
		l.Release(p, false)
		rd := <-d
		if rd.err != nil {
			t.Fatalf("deadline waiter: %v", rd.err)
		}
		l.Release(rd.p, false)
		r := <-r5
		if r.err != nil {
			t.Fatal(r.err)
		}
		l.Release(r.p, false)
		c5()
		if n := lim2Free(l); n != 1 {
			t.Errorf("free %d, want 1", n)
		}
	})
}

// Release: "with none in flight it is ignored (the count never goes below
// zero)". A stale Permit released again while nothing is in flight, by one
// goroutine, while another goroutine acquires and releases: the stale
// Releases must not matter, and in particular must not leave the other
// caller waiting for a slot with no attempt in flight.
func TestAttackLimit2ExtraReleaseWithNoneInFlightIsIgnored(t *testing.T) {
	// The race needs the goroutines to meet: up to 10 rounds, stopping at
	// the first that shows it (2 under the race detector).
	rounds := 10
	if raceEnabled {
		rounds = 2
	}
	for round := 0; round < rounds && !t.Failed(); round++ {
		synctest.Test(t, func(t *testing.T) {
			l := lim2New(t, limit.Config{Max: 1})
			stale, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			l.Release(stale, false)
			var hDoneFlag atomic.Bool
			hStarted := make(chan struct{})
			hDone := make(chan struct{})
			go func() {
				defer close(hDone)
				close(hStarted)
				for range 3_000_000 {
					l.Release(stale, false)
				}
				hDoneFlag.Store(true)
			}()
			gctx, gcancel := context.WithCancel(context.Background())
			defer gcancel()
			gDone := make(chan int, 1)
			<-hStarted
			go func() {
				n := 0
				for !hDoneFlag.Load() {
					p, err := l.Acquire(gctx)
					if err != nil {
						break
					}
					n++
					l.Release(p, false)
				}
				gDone <- n
			}()
			<-hDone
			var n int
			stuck := false
			select {
			case n = <-gDone:
			case <-time.After(time.Hour): // bubble time: fires only when G is blocked
				stuck = true
			}
			in, w := l.SetCap(-1)
			if stuck {
				t.Errorf("the acquiring caller is stuck waiting after the extra Releases stopped: %d in flight, %d waiting, limit %d (extra Releases with none in flight were not ignored)", in, w, l.Limit())
				gcancel()
				n = <-gDone
			}
			t.Logf("G ran %d attempts", n)
			if f := lim2Free(l); f != l.Limit() {
				t.Errorf("free %d, limit %d", f, l.Limit())
			}
		})
	}
}

// Limit: "the most attempts that may be in flight, from 1 to Config.Max,
// or lower under a cap". Random sequences of acquires, releases (dropped
// or not, with varying latencies) and cap changes: with no cap the limit
// is in [1, Max], with cap c it is in [min(1,c)... c], and never more
// attempts are granted than the limit in force.
func TestAttackLimit2LimitRange(t *testing.T) {
	for _, mx := range []int{1, 2, 3, 7, 64} {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(mx), 7))
			l := lim2New(t, limit.Config{Max: mx, Timeout: 300 * time.Millisecond})
			var held []limit.Permit
			capv := -1
			for i := range 5000 {
				switch k := rng.IntN(10); {
				case k < 4:
					p, err := l.Acquire(func() context.Context {
						c, cancel := context.WithCancel(context.Background())
						cancel()
						return c
					}())
					if err == nil {
						held = append(held, p)
					}
				case k < 8 && len(held) > 0:
					j := rng.IntN(len(held))
					l.Release(held[j], rng.IntN(3) == 0)
					held = append(held[:j], held[j+1:]...)
				case k == 8:
					time.Sleep(time.Duration(1+rng.IntN(200)) * time.Millisecond)
				default:
					if rng.IntN(4) == 0 {
						capv = rng.IntN(mx+3) - 1
						if capv < 0 {
							capv = -1
						}
						l.SetCap(capv)
					}
				}
				lim := l.Limit()
				lo, hi := 1, mx
				if capv >= 0 {
					hi = min(hi, capv)
					lo = min(lo, capv)
				}
				if lim < lo || lim > hi {
					t.Fatalf("Max %d cap %d step %d: Limit() %d outside [%d, %d]", mx, capv, i, lim, lo, hi)
				}
			}
			for _, p := range held {
				l.Release(p, false)
			}
			l.SetCap(-1)
			if f := lim2Free(l); f != l.Limit() {
				t.Errorf("Max %d: free %d, limit %d", mx, f, l.Limit())
			}
		})
	}
}

// SetRate: "perSecond <= 0 or +Inf turns the gate off (the default)". A
// very large finite rate (1e300, MaxFloat64 tokens a second) is the gate
// on at that rate: with burst 1000, a thousand calls go at once, and a
// rate of MaxFloat64 per second lets any number of calls through in any
// instant worth of time... Probed with done contexts (a slot only if one
// is free now, no waiting) in one instant of bubble time.
func TestAttackLimit2SetRateHugeRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2New(t, limit.Config{Max: 1000})
		l.SetRate(math.MaxFloat64, 1)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		got := 0
		var ps []limit.Permit
		for range 5 {
			p, err := l.Acquire(ctx)
			if err != nil {
				break
			}
			got++
			ps = append(ps, p)
		}
		for _, p := range ps {
			l.Release(p, false)
		}
		t.Logf("rate MaxFloat64/s, burst 1: %d of 5 calls in one instant", got)
	})
}

// SetRate returns "the attempts in flight and the calls waiting now": the
// same as SetCap's reading, whatever the rate argument (NaN leaves the gate
// as it is).
func TestAttackLimit2SetRateReadsCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2New(t, limit.Config{Max: 2})
		p1, _ := l.Acquire(context.Background())
		p2, _ := l.Acquire(context.Background())
		ctx, cancel := context.WithCancel(context.Background())
		r := lim2Async(l, ctx)
		ctx2, cancel2 := context.WithTimeout(context.Background(), time.Hour)
		defer cancel2()
		r2 := lim2Async(l, ctx2)
		synctest.Wait()
		in, w, refused, _, _, _ := l.SetRate(math.NaN(), math.NaN())
		if in != 2 || w != 2 || refused != 0 {
			t.Errorf("SetRate(NaN): in %d waiting %d refused %d; want 2, 2, 0", in, w, refused)
		}
		cancel()
		<-r
		l.Release(p1, false)
		x := <-r2
		if x.err != nil {
			t.Fatal(x.err)
		}
		l.Release(x.p, false)
		l.Release(p2, false)
		if in, w, _, _, _, _ := l.SetRate(math.NaN(), 0); in != 0 || w != 0 {
			t.Errorf("after: in %d waiting %d", in, w)
		}
	})
}

// Release: a second Release "corrupts its count of attempts in flight:
// while others are in flight, undetected, one more attempt than the limit
// may then run; with none in flight it is ignored (the count never goes
// below zero)". Callers that each release their permit twice (a defer
// plus an explicit Release, say), concurrently: whatever the corruption,
// the count must not go below zero, so once every caller is done the
// limiter reads 0 in flight and still hands out slots.
func TestAttackLimit2DoubleReleaseConcurrentCountNeverBelowZero(t *testing.T) {
	// The race needs the goroutines to meet: up to 10 rounds, stopping at
	// the first that shows it (2 under the race detector, 30 times slower).
	rounds := 10
	if raceEnabled {
		rounds = 2
	}
	for round := 0; round < rounds && !t.Failed(); round++ {
		synctest.Test(t, func(t *testing.T) {
			l := lim2New(t, limit.Config{Max: 4})
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range 3 {
				wg.Go(func() {
					ctx, cancel := context.WithCancel(context.Background())
					cancel() // a slot only if one is free now: nobody waits
					<-start
					for range 2_000_000 {
						p, err := l.Acquire(ctx)
						if err != nil {
							continue
						}
						l.Release(p, false)
						l.Release(p, false) // the misuse
					}
				})
			}
			synctest.Wait()
			close(start)
			wg.Wait()
			in, w := l.SetCap(-1)
			if in != 0 || w != 0 {
				t.Errorf("after every caller finished: %d in flight (as uint32: %d below zero), %d waiting; want 0 in flight", in, uint32(-int32(in)), w)
			}
			if f := lim2Free(l); f != l.Limit() {
				t.Errorf("free slots %d, limit %d: the limiter no longer hands out its slots", f, l.Limit())
			}
		})
	}
}

// The turn rule's other side: A (short) fails "when a later call has that
// much time left" (twice the latency, 200 ms here). B with exactly 200 ms
// left at A's turn has that much: A fails, B gets the slot. B with 1 ns
// less has not: "the first in turn when no later call has the time
// either" gets the slot: A.
func TestAttackLimit2TurnRuleLaterCallBoundary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		bLeft   time.Duration
		aRefuse bool
	}{{"later-equal", 200 * time.Millisecond, true}, {"later-1ns-less", 200*time.Millisecond - 1, false}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := lim2New(t, limit.Config{Max: 1})
				lim2Warm(t, l, 30, 100*time.Millisecond)
				p, _ := l.Acquire(context.Background())
				t0 := time.Now()
				// A: 150 ms left at its turn (at +100 ms); B: bLeft left then.
				ctxA, cA := context.WithDeadline(context.Background(), t0.Add(250*time.Millisecond))
				defer cA()
				a := lim2Async(l, ctxA)
				synctest.Wait()
				ctxB, cB := context.WithDeadline(context.Background(), t0.Add(100*time.Millisecond+tc.bLeft))
				defer cB()
				b := lim2Async(l, ctxB)
				synctest.Wait()
				time.Sleep(100 * time.Millisecond)
				l.Release(p, false)
				synctest.Wait()
				var ra, rb lim2Res
				select {
				case ra = <-a:
				default:
					t.Fatal("A still waits at its turn")
				}
				if tc.aRefuse {
					if ra.err == nil {
						t.Fatalf("A got the slot although B has exactly twice the latency left")
					}
					rb = <-b
					if rb.err != nil {
						t.Fatalf("B: %v", rb.err)
					}
					l.Release(rb.p, false)
				} else {
					if ra.err != nil {
						t.Fatalf("A refused (%v) although no later call has twice the latency left", ra.err)
					}
					l.Release(ra.p, false)
					rb = <-b
					if rb.err == nil {
						l.Release(rb.p, false)
					}
				}
				if n := lim2Free(l); n != 1 {
					t.Errorf("free %d", n)
				}
			})
		})
	}
}

// SetRate: "a token bucket of perSecond tokens per second holding up to
// burst tokens ... A gate that was idle lets burst calls go at once".
// and "at most a day's worth of them at that rate": at 1 token a second
// with burst 100,000, an idle gate lets a day's worth (86,400, and the
// token due now) go at once, no more, no fewer.
func TestAttackLimit2SetRateLargeBurstGoesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2New(t, limit.Config{Max: 10})
		const burst = 100_000
		l.SetRate(1, burst)
		time.Sleep(time.Hour) // idle
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // a slot (and token) only if one is there now
		got := 0
		for range burst + 10 {
			p, err := l.Acquire(ctx)
			if err != nil {
				break
			}
			got++
			l.Release(p, false)
		}
		if want := 86_401; got != want {
			t.Errorf("an idle gate of burst %d at 1/s let %d calls go at once, want a day's worth, %d", burst, got, want)
		}
		t.Logf("%d calls at once", got)
	})
}

// Cancel/release storm: at one instant of bubble time, every holder
// releases while every waiter's context is canceled (and some deadlines
// fall due): afterwards no call waits, nothing is in flight, and every
// slot of the limit is free.
func TestAttackLimit2CancelReleaseStormSameInstant(t *testing.T) {
	for seed := range 10 {
		synctest.Test(t, func(t *testing.T) {
			l := lim2New(t, limit.Config{Max: 8, Throttle: float64(seed%2) * 2})
			lim2Warm(t, l, 20, 10*time.Millisecond)
			if seed >= 5 {
				l.SetRate(2000, 3) // a token each 0.5 ms: the turn rule applies whenever one is due
			}
			lim := l.Limit()
			var held []limit.Permit
			for range lim {
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				held = append(held, p)
			}
			var cancels []context.CancelFunc
			var wg sync.WaitGroup
			t0 := time.Now()
			for i := range 200 {
				var ctx context.Context
				var cancel context.CancelFunc
				switch (i + seed) % 3 {
				case 0:
					ctx, cancel = context.WithCancel(context.Background())
				case 1:
					ctx, cancel = context.WithDeadline(context.Background(), t0.Add(50*time.Millisecond))
				default:
					ctx, cancel = context.WithDeadline(context.Background(), t0.Add(time.Duration(60+i)*time.Millisecond))
				}
				cancels = append(cancels, cancel)
				wg.Go(func() {
					p, err := l.Acquire(ctx)
					if err == nil {
						l.Release(p, i%2 == 0)
					}
				})
			}
			synctest.Wait()
			time.Sleep(50*time.Millisecond - time.Since(t0))
			var wg2 sync.WaitGroup
			for _, p := range held {
				wg2.Go(func() { l.Release(p, false) })
			}
			for _, c := range cancels {
				wg2.Go(c)
			}
			wg2.Wait()
			wg.Wait()
			l.SetRate(0, 0)
			in, w := l.SetCap(-1)
			if in != 0 || w != 0 {
				t.Errorf("after the storm: %d in flight, %d waiting; want 0, 0", in, w)
			}
			if f := lim2Free(l); f != l.Limit() {
				t.Errorf("free %d, limit %d", f, l.Limit())
			}
		})
	}
}

// Acquire: "Every refusal wraps ErrLimited and says why". With waiting
// off and the rate gate on, a call that finds a free slot but no token is
// refused: the reason must be the token, not "limit reached" (0 of 10 in
// flight); and SetRate's refused count ("the calls refused ("no token",
// on arrival or while waiting)", a fleet's unserved demand) counts it.
func TestAttackLimit2NoTokenWithWaitingOffSaysWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2New(t, limit.Config{Max: 10, Waiting: -1})
		l.SetRate(1, 1)
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
		_, err = l.Acquire(context.Background())
		if !errors.Is(err, limit.ErrLimited) {
			t.Fatalf("err %v, want ErrLimited", err)
		}
		in, w, refused, _, _, _ := l.SetRate(math.NaN(), 0)
		t.Logf("refusal: %q; in flight %d of limit %d, waiting %d, refused count %d", err, in, l.Limit(), w, refused)
		if in < l.Limit() && strings.Contains(err.Error(), "limit reached") {
			t.Errorf("refusal says %q with %d of %d slots in flight: the reason is the missing token", err, in, l.Limit())
		}
		if refused != 1 {
			t.Errorf("SetRate's refused count %d, want 1 (a call refused for want of a token)", refused)
		}
	})
}

// SetRate: "perSecond <= 0 or +Inf turns the gate off ... a raised one (or
// off) grants at once the waiters whose tokens are then due". Waiters
// (with and without a deadline) behind a gate of one token an hour: each
// way of turning it off grants them all at once.
func TestAttackLimit2SetRateOffGrantsAtOnce(t *testing.T) {
	for _, off := range []float64{0, -1, math.Inf(1), math.Inf(-1), -math.MaxFloat64} {
		synctest.Test(t, func(t *testing.T) {
			l := lim2New(t, limit.Config{Max: 10})
			l.SetRate(1.0/3600, 1)
			p, _ := l.Acquire(context.Background())
			l.Release(p, false)
			var rs []<-chan lim2Res
			for i := range 4 {
				ctx := context.Background()
				if i%2 == 0 {
					c, cancel := context.WithTimeout(ctx, 3*time.Hour)
					defer cancel()
					ctx = c
				}
				rs = append(rs, lim2Async(l, ctx))
			}
			synctest.Wait()
			if _, w, _, _, _, _ := l.SetRate(math.NaN(), 0); w != 4 {
				t.Fatalf("waiting %d, want 4", w)
			}
			l.SetRate(off, 5)
			synctest.Wait()
			for i, r := range rs {
				select {
				case x := <-r:
					if x.err != nil {
						t.Errorf("off=%v: waiter %d refused: %v", off, i, x.err)
					} else {
						l.Release(x.p, false)
					}
				default:
					t.Errorf("off=%v: waiter %d still waits after the gate was turned off", off, i)
				}
			}
		})
	}
}

// Acquire: "the slot a done context gets is no latency sample (nor, with
// Config.Throttle, a request of the throttle's count)". Every attempt
// taken with a done context and released as dropped: the throttle must
// not start rejecting calls.
func TestAttackLimit2ThrottleIgnoresDoneContextSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := lim2New(t, limit.Config{Max: 10, Throttle: 1})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		for range 1000 {
			p, err := l.Acquire(ctx)
			if err != nil {
				t.Fatalf("done-context call refused: %v", err)
			}
			time.Sleep(100 * time.Microsecond)
			l.Release(p, true)
		}
		rej := 0
		for range 100 {
			p, err := l.Acquire(context.Background())
			if err != nil {
				rej++
				continue
			}
			l.Release(p, false)
		}
		if rej > 0 {
			t.Errorf("%d of 100 calls throttled after only done-context slots were dropped", rej)
		}
	})
}
