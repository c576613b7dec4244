package breaker_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// trip opens b with MinCalls failures (b must have MinCalls <= 4).
func trip(t *testing.T, b *breaker.Breaker) {
	t.Helper()
	for range 4 {
		p, err := b.Allow()
		if err != nil {
			break
		}
		b.Done(p, false)
	}
	if s := b.Snapshot().State; s != breaker.Open {
		t.Fatalf("after failures: state %v, want open", s)
	}
}

func newWaitBreaker(t *testing.T, edit func(*breaker.Config)) *breaker.Breaker {
	t.Helper()
	c := breaker.Config{MinCalls: 4, OpenFor: time.Second, Probes: 1, Rand: half}
	if edit != nil {
		edit(&c)
	}
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

// A call with time to spare waits behind the open breaker, is handed the
// probe of the next round, and the breaker closes on its success.
func TestWaitBecomesProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, nil)
		trip(t, b)
		start := time.Now()
		p, err := b.Wait(context.Background(), 5*time.Second)
		if err != nil {
			t.Fatalf("Wait = %v, want a permit", err)
		}
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("Wait returned after %v, want the 1s open period", waited)
		}
		if !p.Probe() {
			t.Errorf("Wait permit %+v is not a probe", p)
		}
		b.Done(p, true)
		if s := b.State(); s != breaker.Closed {
			t.Errorf("after the probe's success: %v, want closed", s)
		}
	})
}

// Without enough time left, or without any, Wait fails fast like Allow.
func TestWaitFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, nil)
		trip(t, b)
		for _, maxWait := range []time.Duration{0, -time.Second, 999 * time.Millisecond, time.Second} {
			start := time.Now()
			_, err := b.Wait(context.Background(), maxWait)
			var oe *breaker.OpenError
			if !errors.As(err, &oe) || oe.State != breaker.Open || oe.Wait != time.Second {
				t.Errorf("Wait(%v) = %v, want the open breaker's rejection (half-open in 1s)", maxWait, err)
			}
			if d := time.Since(start); d != 0 {
				t.Errorf("Wait(%v) took %v, want no wait", maxWait, d)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := b.Wait(ctx, time.Hour); !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("Wait(canceled ctx) = %v, want ErrOpen", err)
		}
		off := newWaitBreaker(t, func(c *breaker.Config) { c.MaxWaiters = -1 })
		trip(t, off)
		if _, err := off.Wait(context.Background(), time.Hour); !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("Wait with waiting turned off = %v, want ErrOpen at once", err)
		}
	})
}

// Waiters beyond MaxWaiters are rejected at once; those within wait.
func TestWaitBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.MaxWaiters = 3 })
		trip(t, b)
		var wg sync.WaitGroup
		var admitted atomic.Int32
		for range 3 {
			wg.Go(func() {
				if p, err := b.Wait(context.Background(), 10*time.Second); err == nil {
					admitted.Add(1)
					b.Done(p, true)
				}
			})
		}
		synctest.Wait()
		if n := b.Snapshot().Waiters; n != 3 {
			t.Fatalf("Waiters = %d, want 3", n)
		}
		start := time.Now()
		if _, err := b.Wait(context.Background(), 10*time.Second); !errors.Is(err, breaker.ErrOpen) || time.Since(start) != 0 {
			t.Errorf("fourth Wait = %v after %v, want an immediate rejection", err, time.Since(start))
		}
		wg.Wait()
		if n := admitted.Load(); n != 3 {
			t.Errorf("%d of 3 waiters admitted, want 3", n)
		}
	})
}

// A waiter whose time runs out before it is admitted gets the rejection,
// and leaves the queue.
func TestWaitTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, nil)
		trip(t, b)
		// The probe goes to the first waiter and never reports back.
		first, err := b.Wait(context.Background(), 2*time.Second)
		if err != nil || !first.Probe() {
			t.Fatalf("first Wait = %+v, %v; want the probe", first, err)
		}
		start := time.Now()
		_, err = b.Wait(context.Background(), 3*time.Second)
		if !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("second Wait = %v, want ErrOpen after waiting", err)
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Errorf("second Wait gave up after %v, want its 3s", d)
		}
		if n := b.Snapshot().Waiters; n != 0 {
			t.Errorf("Waiters = %d after the timeout, want 0", n)
		}
	})
}

// A failed probe reopens the breaker; the waiters keep waiting and the next
// round's probe goes to the oldest of them.
func TestWaitAcrossRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, nil)
		trip(t, b)
		start := time.Now()
		var mu sync.Mutex
		var got []time.Duration
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				got = append(got, time.Since(start))
				mu.Unlock()
				// The first two rounds fail, the third succeeds.
				b.Done(p, len(got) == 3)
			})
			synctest.Wait() // keep arrival order
		}
		wg.Wait()
		// Rounds at 1s (probe fails), 2s (fails), 3s (succeeds): the
		// last probe closes the breaker.
		want := []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}
		if !slices.Equal(got, want) {
			t.Errorf("admissions at %v, want %v", got, want)
		}
		if s := b.State(); s != breaker.Closed {
			t.Errorf("state %v, want closed", s)
		}
	})
}

// TestWaitThroughOutage is the patience scenario at the breaker: calls
// with time to spare that meet an open breaker during an outage are not
// sent while it is open, and go through within a second of recovery.
func TestWaitThroughOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.Probes = 3; c.ReleaseRate = 100 })
		start := time.Now()
		recovered := start.Add(10 * time.Second)
		var sent, sentWhileOpen atomic.Int32
		call := func(p breaker.Permit) error { // the dependency: down for 10 s
			sent.Add(1)
			if !p.Probe() && b.Snapshot().State == breaker.Open {
				sentWhileOpen.Add(1)
			}
			if time.Now().Before(recovered) {
				return errors.New("503")
			}
			return nil
		}
		trip(t, b)
		var wg sync.WaitGroup
		var late atomic.Int32
		for i := range 20 { // one call every 500 ms during the outage
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				for {
					dl, _ := ctx.Deadline()
					p, err := b.Wait(ctx, time.Until(dl))
					if err != nil {
						t.Errorf("call %d: %v", i, err)
						return
					}
					if err := call(p); err != nil {
						b.Done(p, false)
						continue
					}
					b.Done(p, true)
					if d := time.Since(recovered); d > time.Second+200*time.Millisecond {
						late.Add(1)
					}
					return
				}
			})
			time.Sleep(500 * time.Millisecond)
		}
		wg.Wait()
		if n := late.Load(); n != 0 {
			t.Errorf("%d of 20 calls succeeded more than ~1s after recovery", n)
		}
		if n := sentWhileOpen.Load(); n != 0 {
			t.Errorf("%d calls other than probes sent while the breaker was open", n)
		}
		// 4 trips + 3 probes per round for at most 10 rounds + 20 successes.
		if n := sent.Load(); n > 4+3*11+20 {
			t.Errorf("%d calls reached the dependency, want at most %d", n, 4+3*11+20)
		}
	})
}

// TestTenThousandWaiters: 10,000 waiting calls start no goroutine of the
// breaker's own, and the close releases them at the release rate, oldest
// first, not in one instant.
func TestTenThousandWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 10_000
		b := newWaitBreaker(t, func(c *breaker.Config) { c.ReleaseRate = 5000 })
		trip(t, b)
		base := runtime.NumGoroutine()
		start := time.Now()
		release := make([]time.Duration, n)
		var wg sync.WaitGroup
		var probe breaker.Permit
		probeIndex := -1
		for i := range n {
			wg.Go(func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				if p.Probe() {
					probe, probeIndex = p, i
					return
				}
				release[i] = time.Since(start)
				b.Done(p, true)
			})
			if i%1000 == 999 {
				synctest.Wait()
			}
		}
		synctest.Wait()
		if g := runtime.NumGoroutine() - base; g > n {
			t.Errorf("%d goroutines while %d calls wait, want no more than theirs (%d)", g, n, n)
		}
		if w := b.Snapshot().Waiters; w != n {
			t.Fatalf("Waiters = %d, want %d", w, n)
		}
		time.Sleep(time.Second) // the round: waiter 0 gets the probe
		synctest.Wait()
		b.Done(probe, true) // the dependency is back: close
		closed := time.Since(start)
		wg.Wait()
		var first, last time.Duration = time.Hour, 0
		perWindow := map[time.Duration]int{}
		if probeIndex < 0 {
			t.Fatal("no waiter got the probe")
		}
		for i, r := range release {
			if i == probeIndex {
				continue
			}
			if r < closed {
				t.Fatalf("waiter %d released at %v, before the close at %v", i, r, closed)
			}
			first, last = min(first, r), max(last, r)
			perWindow[(r-closed)/(50*time.Millisecond)]++
		}
		// 9,999 calls at up to 5,000/s, after a slow start from 1,250/s
		// doubling every half second: about 2.5 s, at most about 250 per
		// 50 ms.
		if spread := last - first; spread < 2300*time.Millisecond || spread > 2700*time.Millisecond {
			t.Errorf("released over %v, want about 2.5s (9,999 at up to 5,000/s after a slow start)", spread)
		}
		early := 0
		for _, c := range []time.Duration{0, 1, 2, 3, 4} {
			early += perWindow[c]
		}
		if early > 5*100 {
			t.Errorf("%d releases in the first 250 ms, want a slow start (about 1,250/s: ~70)", early)
		}
		peak := 0
		for _, c := range perWindow {
			peak = max(peak, c)
		}
		if peak > 300 {
			t.Errorf("peak %d releases per 50 ms, want about 250", peak)
		}
		// Oldest first: release order follows arrival order within each
		// batch of 1,000 (arrival is ordered by the synctest.Wait calls).
		for k := 1; k+1000 < n; k += 1000 {
			if k == probeIndex || k+1000 == probeIndex {
				continue
			}
			if release[k] > release[k+1000] {
				t.Errorf("waiter %d released at %v, after waiter %d at %v", k, release[k], k+1000, release[k+1000])
			}
		}
	})
}

// Failures while the waiting calls are released slow the release down and,
// once they reach the trip rule of a release (here Probes, 2 failing calls,
// below MinCalls 4), reopen the breaker: the calls not yet released go back
// to waiting, and a new round probes again.
func TestReleaseAbortsOnFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.MinCalls = 4; c.Probes = 2; c.ReleaseRate = 10 })
		trip(t, b)
		var wg sync.WaitGroup
		results := make(chan string, 20)
		for range 20 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				defer cancel()
				p, err := b.Wait(ctx, 4*time.Second)
				if err != nil {
					results <- "gave up"
					return
				}
				if p.Probe() {
					b.Done(p, true)
					results <- "probe"
					return
				}
				b.Done(p, false) // the dependency fails again after the close
				results <- "failed"
			})
		}
		synctest.Wait()
		wg.Wait()
		close(results)
		count := map[string]int{}
		for r := range results {
			count[r]++
		}
		// Each round's 2 probes succeed and close the breaker; the calls
		// released after it fail, and the 2nd failure opens it again: at
		// least two rounds, and never more released calls than 2 per
		// round.
		if count["probe"] < 4 || count["probe"]%2 != 0 || count["failed"] < 2 || count["failed"] > 2*count["probe"]/2 ||
			count["probe"]+count["failed"]+count["gave up"] != 20 {
			t.Errorf("outcomes %v, want rounds of 2 probes each followed by at most 2 failed releases", count)
		}
	})
}

// The release slows down when calls fail while it runs: with the
// dependency failing a third of the released calls, the waiters come out
// at less than the configured rate, and the rate comes back when the
// failures stop.
func TestReleaseSlowsOnFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.MinCalls = 1000; c.Probes = 1; c.ReleaseRate = 100 })
		b.Trip(0)
		start := time.Now()
		var mu sync.Mutex
		var releases []time.Duration
		var wg sync.WaitGroup
		for i := range 200 {
			wg.Go(func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				if p.Probe() {
					b.Done(p, true)
					return
				}
				mu.Lock()
				releases = append(releases, time.Since(start))
				n := len(releases)
				mu.Unlock()
				// The first 60 released calls: a third fail.
				b.Done(p, !(n <= 60 && n%3 == 0))
			})
		}
		synctest.Wait()
		wg.Wait()
		slices.Sort(releases)
		closed := releases[0]
		// At 100/s, 199 calls take about 2 s; halving the rate on the
		// failures makes the first 60 take longer than their 0.6 s.
		first60 := releases[59] - closed
		if first60 < 900*time.Millisecond {
			t.Errorf("the first 60 releases (a third failing) took %v, want the rate cut (more than 0.9s; 0.6s at 100/s)", first60)
		}
		if s := b.Snapshot(); s.State != breaker.Closed || s.Waiters != 0 {
			t.Errorf("after the release: %+v, want closed with no waiter", s)
		}
		// After the failures stop the rate climbs back: the last 100
		// releases come faster than the first 60 did.
		last100 := releases[198] - releases[98]
		if last100 >= first60*100/60 {
			t.Errorf("the last 100 releases took %v, the first 60 %v: want the rate back up", last100, first60)
		}
	})
}

// Fail's hint pushes the first probe round to at least the hint.
func TestFailHintSetsEarliestProbe(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 2; c.OpenFor = time.Second })
	p1, _ := h.b.Allow()
	p2, _ := h.b.Allow()
	h.b.Done(p1, false)
	h.b.Fail(p2, 7*time.Second)
	if s := h.b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn < 7*time.Second || s.HalfOpenIn > 10500*time.Millisecond {
		t.Fatalf("after Fail(7s): %+v, want open with the next round in [7s, 10.5s]", s)
	}
}

// Retry-After spreads: breakers told the same hint at the same instant do
// not all probe at the same instant.
func TestHintSpread(t *testing.T) {
	rounds := map[time.Duration]bool{}
	for range 100 {
		b, err := breaker.New(breaker.Config{MinCalls: 1, Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := b.Allow()
		b.Fail(p, 2*time.Second)
		in := b.Snapshot().HalfOpenIn
		if in < 2*time.Second || in > 3*time.Second {
			t.Fatalf("HalfOpenIn = %v, want in [2s, 3s]", in)
		}
		rounds[in/(50*time.Millisecond)] = true
	}
	if len(rounds) < 10 {
		t.Errorf("100 breakers told Retry-After 2s probe in only %d distinct 50 ms windows", len(rounds))
	}
}

// Trip and Reset steer the breaker from outside; Reset releases waiters.
func TestTripReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var events []string
		var mu sync.Mutex
		b := newWaitBreaker(t, func(c *breaker.Config) {
			c.OpenFor = 10 * time.Second
			c.ReleaseRate = -1 // all at once
			c.OnStateChange = func(from, to breaker.State) {
				mu.Lock()
				events = append(events, from.String()+">"+to.String())
				mu.Unlock()
			}
		})
		b.Trip(0)
		if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn != 10*time.Second {
			t.Fatalf("after Trip(0): %+v, want open for 10s", s)
		}
		b.Trip(30 * time.Second)
		if s := b.Snapshot(); s.HalfOpenIn < 30*time.Second {
			t.Fatalf("after Trip(30s) on an open breaker: next round in %v, want >= 30s", s.HalfOpenIn)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			start := time.Now()
			p, err := b.Wait(context.Background(), time.Minute)
			if err != nil || p.Probe() {
				t.Errorf("Wait = %+v, %v; want a closed-state permit", p, err)
			}
			if d := time.Since(start); d != 5*time.Second {
				t.Errorf("released after %v, want 5s (the Reset)", d)
			}
		})
		time.Sleep(5 * time.Second)
		b.Reset()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"closed>open", "open>closed"}; !slices.Equal(events, want) {
			t.Errorf("events %v, want %v", events, want)
		}
	})
}

// The release rate a trip sets is the rate of the calls the window held,
// over the time they took: a breaker that trips 2 s after it closed, having
// seen 40 calls, releases 20 per second (not 40 over the whole 10 s
// window).
func TestReleaseRateOverTheCallsSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.MinCalls = 40; c.Probes = 1 })
		for range 20 {
			p, _ := b.Allow()
			b.Done(p, true)
			time.Sleep(50 * time.Millisecond)
		}
		for range 20 {
			p, _ := b.Allow()
			b.Done(p, false)
			time.Sleep(50 * time.Millisecond)
		}
		if s := b.Snapshot().State; s != breaker.Open {
			t.Fatalf("state %v after 20 failures of 40 calls, want open", s)
		}
		release := make([]time.Duration, 11)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range release {
			wg.Go(func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				if p.Probe() {
					b.Done(p, true) // the probe closes the breaker
					return
				}
				release[i] = time.Since(start)
			})
			synctest.Wait()
		}
		wg.Wait()
		var first, last time.Duration = time.Hour, 0
		for _, r := range release {
			if r > 0 {
				first, last = min(first, r), max(last, r)
			}
		}
		// 10 calls after the probe at up to 20/s (40 calls over the 2 s
		// they took), after a slow start from 5/s: about 0.9 s from first
		// to last; at the 4/s of 40 calls over the whole 10 s window it
		// would take over 2.5 s.
		if spread := last - first; spread < 700*time.Millisecond || spread > 1200*time.Millisecond {
			t.Errorf("10 waiters released over %v, want about 0.9s (up to 20/s)", spread)
		}
	})
}

// A dependency that goes down after a long healthy run trips the breaker
// within about a bucket, not after half a window of failures outweighs the
// healthy past: 10 s of successes at 100 calls per second, then failures
// only.
func TestTripsWithinABucket(t *testing.T) {
	h := newHarness(t, nil) // 50% over 10 s in 1 s buckets, at least 20 calls
	for range 1000 {
		h.calls(t, 1, true)
		h.clk.Advance(10 * time.Millisecond)
	}
	failed := 0
	for h.b.State() == breaker.Closed {
		h.calls(t, 1, false)
		failed++
		h.clk.Advance(10 * time.Millisecond)
		if failed > 1000 {
			t.Fatal("still closed after 10 s of failures")
		}
	}
	// The window alone would need 500 failures (5 s); the bucket trips
	// after MinCalls failures of a fresh bucket.
	if failed > 100 {
		t.Errorf("tripped after %d failures (%v), want within a 1 s bucket (at most 100)", failed, time.Duration(failed)*10*time.Millisecond)
	}
}

// Waiting calls are served by deadline, not in arrival order: the probe to
// the call with the most time left (the first to arrive here), and the
// release earliest deadline first.
func TestWaitersByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.ReleaseRate = 10 })
		trip(t, b)
		// Arrival order 0..4, deadlines 50, 40, 30, 20, 10 s: the last to
		// arrive has the least time left.
		order := servedOrder(t, b, []time.Duration{50 * time.Second, 40 * time.Second, 30 * time.Second, 20 * time.Second, 10 * time.Second})
		if want := []int{0, 4, 3, 2, 1}; !slices.Equal(order, want) {
			t.Errorf("served in order %v, want %v (the probe to the most time left, then earliest deadline first)", order, want)
		}
	})
}

// servedOrder starts one call per wait in b.Wait, in turn (each parked
// before the next starts), and returns the indices of the calls in the
// order b admitted them. A call handed a probe reports success once the
// others are parked. It runs in a testing/synctest bubble.
func servedOrder(t *testing.T, b *breaker.Breaker, waits []time.Duration) []int {
	t.Helper()
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i, wait := range waits {
		wg.Go(func() {
			p, err := b.Wait(context.Background(), wait)
			if err != nil {
				t.Errorf("waiter %d: Wait(%v): %v", i, wait, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if p.Probe() {
				synctest.Wait() // the others stay parked until the probe reports
				b.Done(p, true)
			}
		})
		synctest.Wait()
	}
	wg.Wait()
	return order
}

// TestWaitGivesUpDuringRelease: a waiting call whose context ends while
// the release after the close has not reached it gets an *OpenError whose
// State is Closed and Wait 0 (OpenError.State), matching ErrOpen.
func TestWaitGivesUpDuringRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := breaker.New(breaker.Config{ReleaseRate: 1, Rand: func() float64 { return 0.5 }})
		b.Trip(0)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 3)
		for range 3 {
			go func() { _, err := b.Wait(ctx, time.Minute); errc <- err }()
		}
		synctest.Wait()
		b.Reset() // closed, paced at 1 a second: one goes now, two wait for their turn
		synctest.Wait()
		if err := <-errc; err != nil {
			t.Fatalf("first: %v", err)
		}
		cancel()
		synctest.Wait()
		for range 2 {
			err := <-errc
			var oe *breaker.OpenError
			if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) || oe.State != breaker.Closed || oe.Wait != 0 {
				t.Errorf("a call that gave up in the release: %v (%+v), want an OpenError with State Closed and Wait 0", err, oe)
			}
		}
	})
}

// TestReleaseSlowRates: at any ReleaseRate of one call a second or less,
// down to the smallest float64, the first waiting call goes within the
// first slot, which is a second long (at the jittered point Rand picks:
// its middle here), and no other within it. A slot in nanoseconds that
// does not fit a Duration (below about 1e-10 calls a second) was once
// taken for 10 ms.
func TestReleaseSlowRates(t *testing.T) {
	for _, rate := range []float64{1, 0.1, 1e-12, 1e-300, 5e-324} {
		synctest.Test(t, func(t *testing.T) {
			b, err := breaker.New(breaker.Config{Probes: 1, ReleaseRate: rate, Rand: func() float64 { return 0.5 }})
			if err != nil {
				t.Fatal(err)
			}
			b.Trip(0)
			start := time.Now()
			var mu sync.Mutex
			var at []time.Duration
			for i := range 3 {
				go func() {
					p, err := b.Wait(context.Background(), time.Duration(100+i)*time.Second)
					if err != nil {
						return
					}
					mu.Lock()
					at = append(at, time.Since(start))
					mu.Unlock()
					b.Done(p, true)
				}()
			}
			synctest.Wait()
			time.Sleep(3 * time.Second)
			mu.Lock()
			defer func() {
				mu.Unlock()
				time.Sleep(200 * time.Second) // the waiters' time runs out
			}()
			// The probe closes the breaker at its round (OpenFor 1 s,
			// jittered ±20% at Rand's 0.5: 1 s); the first released call
			// goes half a slot later.
			if len(at) < 2 || at[0] != time.Second || at[1] != 1500*time.Millisecond {
				t.Errorf("ReleaseRate %g: calls at %v, want the probe at 1s and the first released at 1.5s", rate, at)
			}
			if rate < 1 && len(at) > 2 {
				t.Errorf("ReleaseRate %g: calls at %v, want no third call within 3 s", rate, at)
			}
		})
	}
}

// An outage the closed state sees only as a trickle of failures (a
// concurrency limiter in front holds the other calls back: each bucket
// holds fewer than MinCalls) trips the breaker once the healthy calls have
// left the window, a window after the outage began. The release after it
// is paced by the rate the dependency served before the outage (100 calls
// a second here), not by the trickle's: the window at the trip holds 20
// failures over 10 s, and 40 waiters released at 2 per second would take
// 20 s.
func TestReleaseRateBeforeALateTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.Probes = 1 })
		for range 1000 { // 10 s at 100 calls a second
			p, _ := b.Allow()
			b.Done(p, true)
			time.Sleep(10 * time.Millisecond)
		}
		failed := 0
		for b.Snapshot().State == breaker.Closed {
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("Allow: %v", err)
			}
			b.Done(p, false)
			failed++
			time.Sleep(500 * time.Millisecond)
			if failed > 100 {
				t.Fatal("still closed after 50 s of failures")
			}
		}
		if failed < 15 {
			t.Fatalf("tripped after %d failures, want the healthy calls to leave the window first (about 20)", failed)
		}
		release := make([]time.Duration, 41)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range release {
			wg.Go(func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				if p.Probe() {
					b.Done(p, true) // the probe closes the breaker
					return
				}
				release[i] = time.Since(start)
			})
			synctest.Wait()
		}
		wg.Wait()
		var first, last time.Duration = time.Hour, 0
		for _, r := range release {
			if r > 0 {
				first, last = min(first, r), max(last, r)
			}
		}
		// 40 calls at up to 100/s after a slow start from 25/s: about 1 s.
		if spread := last - first; spread > 2*time.Second {
			t.Errorf("40 waiters released over %v, want about 1s (up to 100/s, the rate before the outage)", spread)
		}
	})
}
