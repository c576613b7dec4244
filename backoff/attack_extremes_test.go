package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// New: an error "if and only if Base is negative, Cap is below Base, or the
// strategy is unknown"; Next: "always in [0, cap], and for Decorrelated,
// Constant and Linear in [base, cap]", whatever n and whatever Rand returns
// ("a result outside is clamped into it").
func TestAttackExtremesBoundsAtExtremes(t *testing.T) {
	for _, c := range []backoff.Config{{Base: -1}, {Base: math.MinInt64}, {Base: 2, Cap: 1}, {Strategy: 6}, {Strategy: 255}, {Base: math.MaxInt64, Cap: math.MaxInt64 - 1}} {
		if _, err := backoff.New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	rands := []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, 0, 1, 2, math.Nextafter(1, 0), 0.5}
	cfgs := [][2]time.Duration{{1, 1}, {1, math.MaxInt64}, {math.MaxInt64, 0}, {math.MaxInt64, math.MaxInt64}, {1 << 53, 1<<53 + 1}, {3, 7}, {time.Hour, 100 * 365 * 24 * time.Hour}}
	for s := backoff.Strategy(0); s < 6; s++ {
		for _, bc := range cfgs {
			for _, u := range rands {
				b, err := backoff.New(backoff.Config{Strategy: s, Base: bc[0], Cap: bc[1], Rand: func() float64 { return u }})
				if err != nil {
					t.Fatalf("%v %v: %v", s, bc, err)
				}
				base, capd := bc[0], bc[1]
				if capd == 0 {
					capd = max(10*time.Second, base)
				}
				seq := b.Sequence()
				for n := 1; n <= 200; n++ {
					d := seq.Next()
					lo := time.Duration(0)
					if s == backoff.Decorrelated || s == backoff.Constant || s == backoff.Linear {
						lo = base
					}
					if d < lo || d > capd {
						t.Fatalf("%v base %v cap %v u %v: retry %d delay %v outside [%v, %v]", s, base, capd, u, n, d, lo, capd)
					}
				}
			}
		}
	}
}

// Jitter: "a delay in [d, d+spread) ... spread of 0 or less returns d; the
// sum saturates instead of overflowing."
func TestAttackExtremesJitterEdges(t *testing.T) {
	for _, u := range []float64{0, 0.5, math.Nextafter(1, 0), 1, math.NaN(), math.Inf(1)} {
		b, _ := backoff.New(backoff.Config{Rand: func() float64 { return u }})
		for _, c := range [][2]time.Duration{{0, math.MaxInt64}, {math.MaxInt64, math.MaxInt64}, {math.MaxInt64 - 5, 10}, {1, 1}, {time.Hour, 1<<53 + 1}, {0, 1<<62 + 1}, {math.MinInt64, math.MaxInt64}} {
			d, sp := c[0], c[1]
			got := b.Jitter(d, sp)
			if got < d {
				t.Errorf("u %v: Jitter(%v, %v) = %v below d", u, d, sp, got)
			}
			if d <= math.MaxInt64-sp && got >= d+sp {
				t.Errorf("u %v: Jitter(%v, %v) = %v, not below d+spread", u, d, sp, got)
			}
		}
		for _, sp := range []time.Duration{0, -1, math.MinInt64} {
			if got := b.Jitter(time.Second, sp); got != time.Second {
				t.Errorf("Jitter(1s, %v) = %v", sp, got)
			}
		}
	}
}
