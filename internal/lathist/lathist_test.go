package lathist

import (
	"math"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

func TestIndexBounds(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 7 * time.Microsecond, 9 * time.Microsecond,
		time.Millisecond, 37 * time.Millisecond, time.Second, 100 * time.Second} {
		i := index(d)
		lo, w := bounds(i)
		if d > 0 && (d < lo || d >= lo+w) {
			t.Errorf("index(%v) = %d, bucket [%v, %v) does not hold it", d, i, lo, lo+w)
		}
		if d >= 16*time.Microsecond && float64(w) > 0.0625*float64(lo)+1 {
			t.Errorf("bucket of %v is %v wide from %v: more than 6.25%%", d, w, lo)
		}
	}
	if i := index(time.Hour); i != nBuckets-1 {
		t.Errorf("index(1h) = %d, want the last bucket %d", i, nBuckets-1)
	}
}

// TestQuantileKnownDistributions records samples drawn from distributions
// whose quantiles are known and compares the histogram's reading with them:
// never below, and above by at most a bucket's width (6.25%); for a narrow
// service time (answers spread evenly over 10.8-11.9 ms, 1% at 23 ms)
// within half a millisecond (0.6 ms high with 8 buckets per power of two),
// and for answers at a few exact times (8 to 12 ms, a fifth each) never
// under the 12 ms that holds the p95 (an estimate interpolated within the
// bucket read 11.95 ms).
func TestQuantileKnownDistributions(t *testing.T) {
	cases := []struct {
		name string
		q    float64
		draw func(r *rand.Rand) time.Duration
		want time.Duration
	}{
		{"uniform 0-100ms p95", 0.95, func(r *rand.Rand) time.Duration { return time.Duration(r.Float64() * float64(100*time.Millisecond)) }, 95 * time.Millisecond},
		{"uniform 0-100ms p50", 0.5, func(r *rand.Rand) time.Duration { return time.Duration(r.Float64() * float64(100*time.Millisecond)) }, 50 * time.Millisecond},
		{"exponential mean 10ms p95", 0.95, func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(10*time.Millisecond)) },
			time.Duration(-math.Log(0.05) * float64(10*time.Millisecond))},
		{"99% 5ms, 1% 50ms p99.5", 0.995, func(r *rand.Rand) time.Duration {
			if r.IntN(100) == 0 {
				return 50 * time.Millisecond
			}
			return 5 * time.Millisecond
		}, 50 * time.Millisecond},
		{"99% 10.8-11.9ms, 1% 23ms p95", 0.95, func(r *rand.Rand) time.Duration {
			if r.IntN(100) == 0 {
				return 23 * time.Millisecond
			}
			return 10800*time.Microsecond + time.Duration(r.Float64()*float64(1100*time.Microsecond))
		}, 11856 * time.Microsecond}, // 10.8 ms + 0.95/0.99 of 1.1 ms
		{"8-12ms at whole ms, 1% 100ms p95", 0.95, func(r *rand.Rand) time.Duration {
			if r.IntN(100) == 0 {
				return 100 * time.Millisecond
			}
			return time.Duration(8+r.IntN(5)) * time.Millisecond
		}, 12 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := New(10*time.Second, c.q)
				r := rand.New(rand.NewPCG(1, 2))
				for range 20000 {
					h.Record(time.Now().Add(-c.draw(r)))
				}
				got := h.Quantile()
				if rel := float64(got-c.want) / float64(c.want); rel < 0 || rel > 0.0625 {
					t.Errorf("Quantile = %v, want %v or at most 6.25%% above (off by %.1f%%)", got, c.want, 100*rel)
				}
				if c.want < 20*time.Millisecond && got-c.want > 500*time.Microsecond {
					t.Errorf("Quantile = %v, want %v within 0.5 ms", got, c.want)
				}
			})
		})
	}
}

func TestQuantileNeedsSamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := New(time.Second, 0.95)
		for range minSamples - 1 {
			h.Record(time.Now().Add(-time.Millisecond))
		}
		if q := h.Quantile(); q != 0 {
			t.Errorf("Quantile with %d samples = %v, want 0", minSamples-1, q)
		}
		time.Sleep(time.Second) // the next refresh slot
		h.Record(time.Now().Add(-time.Millisecond))
		if q := h.Quantile(); q == 0 {
			t.Errorf("Quantile with %d samples over two windows = 0", minSamples)
		}
	})
}

// TestDecay: samples older than two periods no longer count.
func TestDecay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := New(time.Second, 0.95)
		for range 1000 {
			h.Record(time.Now().Add(-100 * time.Millisecond))
		}
		if q := h.Quantile(); q < 90*time.Millisecond {
			t.Fatalf("Quantile = %v, want about 100ms", q)
		}
		time.Sleep(2 * time.Second)
		for range 100 {
			h.Record(time.Now().Add(-10 * time.Millisecond))
		}
		if q := h.Quantile(); q > 12*time.Millisecond {
			t.Errorf("Quantile two periods later = %v, want about 10ms (the old samples decayed)", q)
		}
		time.Sleep(2 * time.Second)
		if q := h.Quantile(); q != 0 {
			t.Errorf("Quantile after two quiet periods = %v, want 0", q)
		}
	})
}

// TestInflated: a window whose median is 5 times the baseline's is
// inflated; the baseline does not follow it up at once.
func TestInflated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := New(time.Second, 0.95)
		rec := func(d time.Duration, n int) {
			for range n {
				h.Record(time.Now().Add(-d))
			}
		}
		rec(10*time.Millisecond, 100)
		time.Sleep(time.Second)
		rec(10*time.Millisecond, 100) // opens window 1: window 0 sets the baseline
		if h.Inflated(3) {
			t.Fatalf("Inflated at the baseline")
		}
		time.Sleep(time.Second)
		rec(50*time.Millisecond, 100) // window 2: the current median is 5x
		time.Sleep(time.Second / refreshes)
		if !h.Inflated(3) {
			t.Errorf("Inflated(3) = false with the current median 5x the baseline (baseline %v, current %v)",
				time.Duration(h.baseline.Load()), time.Duration(h.current.Load()))
		}
		for range 5 {
			time.Sleep(time.Second)
			rec(50*time.Millisecond, 100)
		}
		if !h.Inflated(3) {
			t.Errorf("Inflated(3) = false after 5 windows at 5x: the baseline rose too fast (%v)", time.Duration(h.baseline.Load()))
		}
	})
}

func TestAllocs(t *testing.T) {
	h := New(10*time.Second, 0.95)
	start := time.Now()
	if n := testing.AllocsPerRun(1000, func() { h.Record(start) }); n != 0 {
		t.Errorf("Record allocates %v times", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = h.Quantile(); _ = h.Inflated(3) }); n != 0 {
		t.Errorf("Quantile and Inflated allocate %v times", n)
	}
}

func BenchmarkRecord(b *testing.B) {
	h := New(10*time.Second, 0.95)
	start := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.Record(start)
		}
	})
}

func BenchmarkRecordOneGoroutine(b *testing.B) {
	h := New(10*time.Second, 0.95)
	start := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		h.Record(start)
	}
}

// TestInflatedRing: a shift in the middle of a window shows within the
// latest 32 samples, while the window's own median still holds.
func TestInflatedRing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := New(10*time.Second, 0.95)
		rec := func(d time.Duration, n int) {
			for range n {
				h.Record(time.Now().Add(-d))
			}
		}
		rec(10*time.Millisecond, 1000)
		time.Sleep(10 * time.Second)
		rec(10*time.Millisecond, 1000) // the baseline: 10ms
		time.Sleep(time.Second)
		rec(50*time.Millisecond, 15)
		time.Sleep(time.Second)
		if h.Inflated(3) {
			t.Fatalf("Inflated after 15 slow samples of 32")
		}
		rec(50*time.Millisecond, 2)
		time.Sleep(time.Second)
		if !h.Inflated(3) {
			t.Errorf("Inflated = false with 17 of the latest 32 samples at 5x the baseline")
		}
	})
}
