package backoff_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// Constant and Linear at the extremes: exact, capped, never negative.
func TestAttackGapsNamedStrategiesExtremes(t *testing.T) {
	bases := []time.Duration{1, 3, time.Millisecond, 1<<53 + 1, math.MaxInt64 / 2, math.MaxInt64 / 3, math.MaxInt64 - 1, math.MaxInt64}
	for _, base := range bases {
		for _, capv := range []time.Duration{0, base, base + 1, math.MaxInt64 - 1, math.MaxInt64} {
			if capv != 0 && capv < base {
				continue
			}
			if base == math.MaxInt64 && capv == base+1 {
				continue
			}
			for _, s := range []backoff.Strategy{backoff.Constant, backoff.Linear} {
				b, err := backoff.New(backoff.Config{Strategy: s, Base: base, Cap: capv, Rand: func() float64 { return math.NaN() }})
				if err != nil {
					t.Errorf("%v base %v cap %v: %v", s, base, capv, err)
					continue
				}
				c := capv
				if c == 0 {
					c = max(10*time.Second, base)
				}
				seq := b.Sequence()
				for n := 1; n <= 200; n++ {
					d := seq.Next()
					var want time.Duration
					if s == backoff.Constant {
						want = base
					} else {
						// min(c, base·n) in big arithmetic
						if base > c/time.Duration(n) {
							want = c
						} else {
							want = min(c, base*time.Duration(n))
						}
					}
					if d != want {
						t.Errorf("%v base %v cap %v n %d: %v, want %v", s, base, c, n, d, want)
						break
					}
				}
			}
		}
	}
}

// New's errors name the field, start with the documented prefix, and
// come exactly for the documented reasons.
func TestAttackGapsConfigErrors(t *testing.T) {
	cases := []struct {
		c     backoff.Config
		field string // "" means valid
	}{
		{backoff.Config{Base: -1}, "Base"},
		{backoff.Config{Base: math.MinInt64}, "Base"},
		{backoff.Config{Cap: -1}, "Cap"},
		{backoff.Config{Cap: math.MinInt64, Strategy: backoff.Constant}, "Cap"},
		{backoff.Config{Base: time.Second, Cap: time.Second - 1, Strategy: backoff.Constant}, "Cap"},
		{backoff.Config{Base: time.Second, Cap: time.Second - 1, Strategy: backoff.Linear}, "Cap"},
		{backoff.Config{Strategy: 6}, "Strategy"},
		{backoff.Config{Strategy: 255, Base: -1}, "Strategy"},
		{backoff.Config{Base: 20 * time.Second, Strategy: backoff.Constant}, ""},
		{backoff.Config{Base: math.MaxInt64, Strategy: backoff.Linear}, ""},
		{backoff.Config{Cap: 1}, "Cap"}, // default Base 100ms > Cap 1ns
		{backoff.Config{Base: 1, Cap: 1}, ""},
	}
	for _, c := range cases {
		b, err := backoff.New(c.c)
		if c.field == "" {
			if err != nil || b == nil {
				t.Errorf("%+v: %v", c.c, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%+v: no error", c.c)
			continue
		}
		if !strings.HasPrefix(err.Error(), "backoff: invalid config: ") || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%+v: error %q does not name %s", c.c, err, c.field)
		}
	}
}

// Every strategy stays in its documented range with pathological random
// sources and the largest figures.
func TestAttackGapsRangesPathologicalRand(t *testing.T) {
	rands := []float64{math.NaN(), math.Inf(1), math.Inf(-1), math.Copysign(0, -1), 0, 1, 2, -1, math.Nextafter(1, 0), math.SmallestNonzeroFloat64}
	for _, s := range []backoff.Strategy{backoff.FullJitter, backoff.NoJitter, backoff.EqualJitter, backoff.Decorrelated, backoff.Constant, backoff.Linear} {
		for _, base := range []time.Duration{1, 7, time.Millisecond, math.MaxInt64 / 2, math.MaxInt64} {
			for _, r := range rands {
				b, err := backoff.New(backoff.Config{Strategy: s, Base: base, Cap: math.MaxInt64, Rand: func() float64 { return r }})
				if err != nil {
					t.Fatal(err)
				}
				seq := b.Sequence()
				for n := 1; n <= 70; n++ {
					d := seq.Next()
					lo := time.Duration(0)
					if s == backoff.Decorrelated || s == backoff.Constant || s == backoff.Linear {
						lo = base
					}
					if d < lo { // and at most the cap, math.MaxInt64, as every Duration
						t.Errorf("%v base %v rand %v n %d: %v out of [%v, cap]", s, base, r, n, d, lo)
						break
					}
				}
				// Jitter saturates.
				if j := b.Jitter(math.MaxInt64, math.MaxInt64); j != math.MaxInt64 {
					t.Errorf("Jitter(max,max) = %v", j)
				}
				if j := b.Jitter(math.MinInt64, math.MaxInt64); j >= 0 {
					t.Errorf("%v rand %v: Jitter(min,max) = %v, want in [min, -1]", s, r, j)
				}
				if j := b.Jitter(5, -1); j != 5 {
					t.Errorf("Jitter(5,-1) = %v", j)
				}
				if j := b.Jitter(5, 1); j != 5 {
					t.Errorf("rand %v: Jitter(5,1) = %v, want 5 ([5,6))", r, j)
				}
			}
		}
	}
}

// Strategy text round trip: the named ones by name, case-sensitive.
func TestAttackGapsStrategyText(t *testing.T) {
	for _, s := range []backoff.Strategy{backoff.Constant, backoff.Linear} {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back backoff.Strategy
		if err := json.Unmarshal(b, &back); err != nil || back != s {
			t.Errorf("%v: %s -> %v, %v", s, b, back, err)
		}
	}
	var x backoff.Strategy
	for _, bad := range []string{`"Constant"`, `"LINEAR"`, `"Strategy(6)"`, `""`, `" linear"`} {
		if err := json.Unmarshal([]byte(bad), &x); err == nil {
			t.Errorf("%s accepted as %v", bad, x)
		}
	}
	if _, err := json.Marshal(backoff.Strategy(6)); err == nil {
		t.Errorf("marshal of Strategy(6) succeeded")
	}
}

// The doc table at U fixed: constant and linear against their formulas,
// full/equal/none exponential capped, from the first retry.
func TestAttackGapsFormulaTable(t *testing.T) {
	base, capv := 100*time.Millisecond, 10*time.Second
	want := map[backoff.Strategy][]time.Duration{
		backoff.Constant:    {100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		backoff.Linear:      {100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond},
		backoff.NoJitter:    {200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond},
		backoff.FullJitter:  {100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond},
		backoff.EqualJitter: {150 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond},
	}
	for s, w := range want {
		b, _ := backoff.New(backoff.Config{Strategy: s, Base: base, Cap: capv, Rand: func() float64 { return 0.5 }})
		seq := b.Sequence()
		for i, d := range w {
			if got := seq.Next(); got != d {
				t.Errorf("%v retry %d: %v, want %v", s, i+1, got, d)
			}
		}
	}
	// Linear reaches the cap at n = 100 and stays there.
	b, _ := backoff.New(backoff.Config{Strategy: backoff.Linear, Base: base, Cap: capv})
	seq := b.Sequence()
	for n := 1; n <= 1000; n++ {
		d := seq.Next()
		if want := min(capv, base*time.Duration(n)); d != want {
			t.Fatalf("linear n %d: %v want %v", n, d, want)
		}
	}
}

// Concurrency: one Backoff with a seeded, locked source, many sequences.
func TestAttackGapsConcurrentSequences(t *testing.T) {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range []backoff.Strategy{backoff.Constant, backoff.Linear, backoff.Decorrelated, backoff.FullJitter} {
		b, _ := backoff.New(backoff.Config{Strategy: s, Base: time.Millisecond, Cap: time.Second, Rand: func() float64 { mu.Lock(); defer mu.Unlock(); return r.Float64() }})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				seq := b.Sequence()
				for range 200 {
					if d := seq.Next(); d < 0 || d > time.Second {
						t.Errorf("%v: %v", s, d)
					}
				}
			})
		}
		wg.Wait()
	}
}
