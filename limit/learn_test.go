package limit

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

// A cold limiter in front of a destination that serves 5000 attempts per
// second (50 servers, 10 ms each) reaches its capacity in a few round
// trips, and then serves near capacity without a standing queue of more
// than a round trip.
func TestColdStartFindsCapacity(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const rtt = 10 * time.Millisecond
		d := newDest(50, rtt)
		l := mustNew(t, Config{Timeout: time.Second})
		stop := make(chan struct{})
		tr := trace(l, time.Millisecond, stop)
		wg := load(l, d, 400, 2*time.Second, time.Second, stop)
		time.Sleep(2 * time.Second)
		served := d.served.Load()
		close(stop)
		wg.Wait()
		at := tr.first(50)
		t.Logf("limit reached 50 (capacity) after %v = %.1f round trips; served %d in 2 s (capacity 10000)", at, float64(at)/float64(rtt), served)
		if at < 0 || at > 6*rtt {
			t.Errorf("limit reached capacity after %v, want within 6 round trips (%v)", at, 6*rtt)
		}
		if served < 9000 {
			t.Errorf("served %d in 2 s, want at least 90%% of capacity (10000)", served)
		}
		lo, hi := tr.between(time.Second, 2*time.Second)
		t.Logf("limit in the second second: %d..%d", lo, hi)
		if lo < 40 || hi > 100 {
			t.Errorf("limit in the second second %d..%d, want within 40..100 (capacity 50)", lo, hi)
		}
	})
}

func TestSlowStartRounds(t *testing.T) {
	t.Parallel()
	for _, capacity := range []int{50, 200, 1000} {
		t.Run(fmt.Sprint(capacity), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const rtt = 10 * time.Millisecond
				d := newDest(capacity, rtt)
				l := mustNew(t, Config{Max: 5000, Timeout: time.Second})
				stop := make(chan struct{})
				tr := trace(l, time.Millisecond, stop)
				wg := load(l, d, 3*capacity, 2*time.Second, time.Second, stop)
				time.Sleep(150 * time.Millisecond)
				close(stop)
				wg.Wait()
				at := tr.first(capacity)
				t.Logf("capacity %d in flight: reached after %.1f round trips", capacity, float64(at)/float64(rtt))
				if at < 0 || at > 10*rtt {
					t.Errorf("limit reached capacity %d after %v, want within 10 round trips", capacity, at)
				}
			})
		})
	}
}

// Properties of the learning rules over random windows (seeded): a window
// with a drop never raises the limit; a window whose mean latency is at
// least twice the reference never raises it (unless it ran at a low
// limit, where that latency becomes the reference: the destination's own,
// not this limiter's queue); the limit stays within [1, Max].
func TestLearnerProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 200 {
		c := newLearner(1+rng.IntN(2000), time.Duration(rng.IntN(3))*time.Second)
		now := time.Duration(0)
		for range 500 {
			now += time.Duration(1+rng.IntN(50)) * time.Millisecond
			base := 10 * time.Millisecond
			n := rng.IntN(40)
			slow := rng.IntN(4) == 0
			for range n {
				rtt := base + time.Duration(rng.IntN(int(base)))
				if slow {
					rtt *= time.Duration(2 + rng.IntN(100))
				}
				c.sample(rtt)
			}
			drops := int64(0)
			if rng.IntN(3) == 0 {
				drops = int64(1 + rng.IntN(40))
			}
			attempts := int64(n) + drops + int64(rng.IntN(10))
			before, ref := c.limit, max(c.base.value, c.ref)
			var mean time.Duration
			if c.n > 0 {
				mean = c.sum / time.Duration(c.n)
			}
			hadDrops := drops+c.ceilDrops > 0
			low := before <= math.Max(lowLimit, c.healthy/8)
			after := c.window(now, attempts, 0, drops, rng.IntN(2) == 0)
			if hadDrops && after > before {
				t.Fatalf("run %d: a window with drops raised the limit %v → %v", run, before, after)
			}
			if !hadDrops && !low && mean > 0 && ref > 0 && mean >= 2*ref && after > before {
				t.Fatalf("run %d: a window at %v (reference %v) raised the limit %v → %v", run, mean, ref, before, after)
			}
			if after < 1 || after > c.max {
				t.Fatalf("run %d: limit %v outside [1, %v]", run, after, c.max)
			}
		}
	}
}

// Recovery restores the last healthy limit; a restored limit that meets
// drops at once (a second outage right after the first clean window)
// halves the memory, and the window that restores does not overwrite it
// with the outage's limit.
func TestRecoveryRemembersHealthy(t *testing.T) {
	c := newLearner(1000, time.Second)
	now := time.Duration(0)
	win := func(rtt time.Duration, n int, drops int64) float64 {
		now += 10 * time.Millisecond
		for range n {
			c.sample(rtt)
		}
		return c.window(now, int64(n)+drops, 0, drops, true)
	}
	outage := func() {
		for range 10 {
			win(0, 0, 20) // every attempt dropped
		}
		if c.limit != 1 {
			t.Fatalf("limit %v after an outage, want 1", c.limit)
		}
	}
	for range 5 { // slow start: 10, 20, 40, 80, 160, 320
		win(10*time.Millisecond, 8, 0)
	}
	healthy := c.healthy
	if healthy != 160 {
		t.Fatalf("healthy limit %v after slow start to 320, want 160", healthy)
	}
	outage()
	if got := win(10*time.Millisecond, 8, 0); got != 2*healthy {
		t.Errorf("limit %v after the first clean window, want %v (restored %v, doubled)", got, 2*healthy, healthy)
	}
	outage() // at once: the restored limit was too much
	if got := win(10*time.Millisecond, 8, 0); got != healthy {
		t.Errorf("limit %v after the second outage's first clean window, want %v (half the memory, doubled)", got, healthy)
	}
	// A destination that keeps failing every restore: the memory halves
	// each time, below the initial limit too (a floor there brought the
	// limit back to 10, then 20, every few windows of a destination that
	// drops a share of every round trip).
	var got []float64
	for range 10 {
		outage()
		got = append(got, win(10*time.Millisecond, 8, 0))
	}
	for i := 1; i < len(got); i++ {
		if got[i] > got[i-1] {
			t.Errorf("limits after each restore that met drops at once: %v, want them never higher than the one before", got)
			break
		}
	}
	if last := got[len(got)-1]; last > 2 {
		t.Errorf("limits after each restore that met drops at once: %v, want the last at most 2", got)
	}
}

// The probe's rate counts completed attempts: while the limit climbs, a
// destination that serves 1000 attempts per second sees more acquired
// (the attempts in flight grow), and counting those would set the peak
// above what it serves, so that steady periods after the climb read below
// 95% of it and start a step at a destination already at its capacity.
func TestProbePeakIsTheServedRate(t *testing.T) {
	c := newLearner(1000, time.Second)
	c.slow, c.srtt = false, 50*time.Millisecond
	const served = 50 // completions per 50 ms window: 1000 per second
	now, inflight := time.Second, int64(20)
	win := func(grow int64) {
		now += 50 * time.Millisecond
		inflight += grow
		c.limit += float64(grow)
		lim := c.probe(now, served+grow, inflight, c.limit-0.5, true)
		if c.stage != 0 {
			t.Fatalf("at %v (limit %v, peak %.0f/s): a step started (to %v) at a destination at its capacity", now, c.limit, c.peak, lim)
		}
	}
	c.limit = float64(inflight)
	for range 12 { // the climb: 20 → 56 in flight
		win(3)
	}
	for range 40 { // steady at 56 in flight
		win(0)
	}
	if c.peak < 990 || c.peak > 1010 {
		t.Errorf("peak %.0f/s, want the served rate (1000/s)", c.peak)
	}
}
