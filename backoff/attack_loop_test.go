// Black-box attacks on package backoff (AREA loop): bounds for every retry
// number a Sequence reaches, with pathological random sources.

package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// backoff.go: Next "always in [0, cap], and for Decorrelated, Constant and
// Linear in [base, cap]"; Config.Rand: "a result outside is clamped into
// [0, 1)"; FullJitter in [0, exp(n)), EqualJitter in [exp(n)/2, exp(n)).
func TestAttackLoopBoundsPathologicalRand(t *testing.T) {
	rands := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 2, 1, -1e-300, 0.999999999999, 5e-324}
	sizes := [][2]time.Duration{
		{1, 1}, {1, 2}, {1, math.MaxInt64}, {3, 7}, {time.Duration(1<<53 + 1), time.Duration(1<<53 + 3)},
		{math.MaxInt64 / 3, math.MaxInt64}, {math.MaxInt64, math.MaxInt64}, {100 * time.Millisecond, 0},
	}
	for s := backoff.FullJitter; s <= backoff.Linear; s++ {
		for _, sz := range sizes {
			for _, r := range rands {
				b, err := backoff.New(backoff.Config{Strategy: s, Base: sz[0], Cap: sz[1], Rand: func() float64 { return r }})
				if err != nil {
					t.Fatalf("%v %v: %v", s, sz, err)
				}
				base, cp := sz[0], sz[1]
				if cp == 0 {
					cp = max(10*time.Second, base)
				}
				seq := b.Sequence()
				for n := 1; n <= 1500; n++ {
					d := seq.Next()
					if d < 0 || d > cp {
						t.Fatalf("%v base %v cap %v rand %v: retry %d = %v outside [0, cap]", s, base, cp, r, n, d)
					}
					if (s == backoff.Decorrelated || s == backoff.Constant || s == backoff.Linear) && d < base {
						t.Fatalf("%v base %v cap %v rand %v: retry %d = %v below base", s, base, cp, r, n, d)
					}
					exp := cp
					if n < 62 && float64(base)*math.Ldexp(1, n) < float64(cp) {
						exp = base << n
					}
					if s == backoff.FullJitter && d >= exp && exp > 0 {
						t.Fatalf("full: retry %d = %v, want < exp %v (base %v cap %v rand %v)", n, d, exp, base, cp, r)
					}
					if s == backoff.EqualJitter && d >= exp && exp > 1 {
						t.Fatalf("equal: retry %d = %v, want < exp %v (base %v cap %v rand %v)", n, d, exp, base, cp, r)
					}
				}
			}
		}
	}
}

// Jitter: "a delay in [d, d+spread) ... spread of 0 or less returns d; the
// sum saturates instead of overflowing."
func TestAttackLoopJitterEdges(t *testing.T) {
	for _, r := range []float64{0, 0.5, 1, math.NaN(), math.Inf(1), -3} {
		b, err := backoff.New(backoff.Config{Rand: func() float64 { return r }})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range [][2]time.Duration{
			{0, 1}, {-5, 3}, {math.MinInt64, math.MaxInt64}, {math.MaxInt64, math.MaxInt64}, {math.MaxInt64 - 1, 2},
			{time.Second, -1}, {time.Second, 0}, {1, 1 << 40},
		} {
			d, spread := c[0], c[1]
			got := b.Jitter(d, spread)
			if spread <= 0 {
				if got != d {
					t.Errorf("Jitter(%v, %v) = %v, want d", d, spread, got)
				}
				continue
			}
			hi := d + spread // may overflow: compare in float
			if got < d || (float64(d)+float64(spread) < math.MaxInt64 && got >= hi) {
				t.Errorf("rand %v: Jitter(%d, %d) = %d outside [d, d+spread)", r, d, spread, got)
			}
		}
	}
}
