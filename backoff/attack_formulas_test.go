package backoff_test

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

const fmlJustUnder1 = 1 - 0x1p-53

func fmlNew(t *testing.T, s backoff.Strategy, base, cap time.Duration, u float64) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: s, Base: base, Cap: cap, Rand: func() float64 { return u }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fmlExp is exp(n) = min(c, b·2^n) in exact integer arithmetic.
func fmlExp(b, c time.Duration, n int) time.Duration {
	if n >= 63 || b > c>>n {
		return c
	}
	return min(c, b<<n)
}

// TestAttackFormulasStrategyRanges checks the n-th delay of every strategy against the
// documented range for U = 0, 0.5 and just under 1, with several base/cap
// pairs (odd ones too), n up to 80 (well past the cap).
func TestAttackFormulasStrategyRanges(t *testing.T) {
	pairs := [][2]time.Duration{
		{100 * time.Millisecond, 10 * time.Second},
		{1, 1}, {1, 2}, {1, 3}, {3, 7}, {7, 1000}, {time.Second, time.Second},
		{333 * time.Millisecond, 4999 * time.Millisecond},
		{1, math.MaxInt64}, {time.Hour, math.MaxInt64}, {math.MaxInt64 / 3, math.MaxInt64},
	}
	for _, p := range pairs {
		b, c := p[0], p[1]
		for _, u := range []float64{0, 0.5, fmlJustUnder1} {
			for _, s := range []backoff.Strategy{backoff.FullJitter, backoff.NoJitter, backoff.EqualJitter, backoff.Decorrelated, backoff.Constant, backoff.Linear} {
				bo := fmlNew(t, s, b, c, u)
				seq := bo.Sequence()
				prev := b
				for n := 1; n <= 80; n++ {
					d := seq.Next()
					if d < 0 || d > c {
						t.Fatalf("%v b=%d c=%d u=%v n=%d: %d outside [0, cap]", s, b, c, u, n, d)
					}
					e := fmlExp(b, c, n)
					switch s {
					case backoff.NoJitter:
						if d != e {
							t.Errorf("%v b=%d c=%d u=%v n=%d: %d, want exp(n)=%d", s, b, c, u, n, d, e)
						}
					case backoff.FullJitter:
						if d >= e && e > 0 {
							t.Errorf("%v b=%d c=%d u=%v n=%d: %d, want in [0, %d)", s, b, c, u, n, d, e)
						}
						if u == 0 && d != 0 {
							t.Errorf("%v u=0 n=%d: %d, want 0", s, n, d)
						}
						want := float64(e) * u
						if math.Abs(float64(d)-want) > 1+want*1e-12 {
							t.Errorf("%v b=%d c=%d u=%v n=%d: %d, want U·exp = %v", s, b, c, u, n, d, want)
						}
					case backoff.EqualJitter:
						if e >= 2 && (d < e/2 || d >= e) {
							t.Errorf("%v b=%d c=%d u=%v n=%d: %d, want in [exp/2=%d/2, %d)", s, b, c, u, n, d, e, e)
						}
						want := float64(e)/2 + u*float64(e)/2
						if e >= 2 && math.Abs(float64(d)-want) > 1+want*1e-12 {
							t.Errorf("%v b=%d c=%d u=%v n=%d: %d, want exp/2+U·exp/2 = %v", s, b, c, u, n, d, want)
						}
					case backoff.Decorrelated:
						want := math.Min(float64(c), float64(b)+u*(float64(prev)*3-float64(b)))
						if d < b || math.Abs(float64(d)-want) > 1+want*1e-12 {
							t.Errorf("%v b=%d c=%d u=%v n=%d prev=%d: %d, want %v", s, b, c, u, n, prev, d, want)
						}
					case backoff.Constant:
						if d != b {
							t.Errorf("%v n=%d: %d, want base %d", s, n, d, b)
						}
					case backoff.Linear:
						want := c
						if int64(c)/int64(b) >= int64(n) {
							want = min(c, b*time.Duration(n))
						}
						if d != want {
							t.Errorf("%v b=%d c=%d n=%d: %d, want %d", s, b, c, n, d, want)
						}
					}
					prev = d
				}
			}
		}
	}
}

func TestAttackFormulasDocTableHalf(t *testing.T) {
	want := map[backoff.Strategy][]time.Duration{
		backoff.NoJitter:     {200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond},
		backoff.FullJitter:   {100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond},
		backoff.EqualJitter:  {150 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond},
		backoff.Decorrelated: {200 * time.Millisecond, 350 * time.Millisecond, 575 * time.Millisecond, 912500 * time.Microsecond},
		backoff.Constant:     {100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		backoff.Linear:       {100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond},
	}
	for s, w := range want {
		b, err := backoff.New(backoff.Config{Strategy: s, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		seq := b.Sequence()
		for i, wd := range w {
			if d := seq.Next(); d != wd {
				t.Errorf("%v delay %d = %v, want %v", s, i+1, d, wd)
			}
		}
	}
}

// Sequences of one Backoff are independent; a copy of a Sequence carries on
// from the same point; a new Sequence starts again at retry 1.
func TestAttackFormulasSequenceIndependence(t *testing.T) {
	for _, s := range []backoff.Strategy{backoff.NoJitter, backoff.Decorrelated, backoff.Linear, backoff.EqualJitter} {
		b := fmlNew(t, s, 10*time.Millisecond, time.Hour, 0.5)
		ref := b.Sequence()
		var want []time.Duration
		for range 10 {
			want = append(want, ref.Next())
		}
		s1, s2 := b.Sequence(), b.Sequence()
		for i := range 10 {
			if d := s1.Next(); d != want[i] {
				t.Errorf("%v s1[%d] = %v, want %v", s, i, d, want[i])
			}
			if i%2 == 0 {
				continue
			}
			s2.Next()
		}
		s3 := b.Sequence()
		s3.Next()
		cp := s3
		if a, c := s3.Next(), cp.Next(); a != c || a != want[1] {
			t.Errorf("%v copy: %v vs %v, want %v", s, a, c, want[1])
		}
	}
}

func TestAttackFormulasJitterRange(t *testing.T) {
	for _, u := range []float64{0, 0.5, fmlJustUnder1, 1, 2, -1, math.NaN(), math.Inf(1)} {
		b := fmlNew(t, backoff.FullJitter, 0, 0, u)
		for _, tc := range []struct{ d, spread time.Duration }{
			{time.Second, 500 * time.Millisecond}, {0, 1}, {5, 3}, {time.Second, math.MaxInt64},
			{math.MaxInt64 - 10, 100}, {0, math.MaxInt64}, {0, 1<<62 - 1}, {7, 1<<53 + 1}, {0, 1<<62 + 1<<10 - 1},
		} {
			j := b.Jitter(tc.d, tc.spread)
			if j < tc.d {
				t.Errorf("u=%v Jitter(%d,%d) = %d < d", u, tc.d, tc.spread, j)
			}
			if tc.d <= math.MaxInt64-tc.spread && j >= tc.d+tc.spread {
				t.Errorf("u=%v Jitter(%d,%d) = %d, not below d+spread", u, tc.d, tc.spread, j)
			}
			if !(u > 0) && j != tc.d {
				t.Errorf("u=%v Jitter(%d,%d) = %d, want d", u, tc.d, tc.spread, j)
			}
		}
		for _, sp := range []time.Duration{0, -1, math.MinInt64} {
			if j := b.Jitter(time.Second, sp); j != time.Second {
				t.Errorf("Jitter(1s, %d) = %v, want 1s", sp, j)
			}
		}
	}
	b := fmlNew(t, backoff.FullJitter, 0, 0, 0.5)
	if j := b.Jitter(time.Second, time.Second); j != 1500*time.Millisecond {
		t.Errorf("Jitter(1s,1s) at 0.5 = %v", j)
	}
}

func TestAttackFormulasStrategyText(t *testing.T) {
	names := map[backoff.Strategy]string{backoff.NoJitter: "none", backoff.FullJitter: "full", backoff.EqualJitter: "equal", backoff.Decorrelated: "decorrelated", backoff.Constant: "constant", backoff.Linear: "linear"}
	for s, n := range names {
		if s.String() != n {
			t.Errorf("String(%d) = %q, want %q", s, s.String(), n)
		}
		txt, err := s.MarshalText()
		if err != nil || string(txt) != n {
			t.Errorf("MarshalText(%v) = %q, %v", s, txt, err)
		}
		var got backoff.Strategy = 99
		if err := got.UnmarshalText(txt); err != nil || got != s {
			t.Errorf("UnmarshalText(%q) = %v, %v", txt, got, err)
		}
		js, err := json.Marshal(struct{ S backoff.Strategy }{s})
		if err != nil || string(js) != `{"S":"`+n+`"}` {
			t.Errorf("json %s %v", js, err)
		}
		var back struct{ S backoff.Strategy }
		back.S = 99
		if err := json.Unmarshal(js, &back); err != nil || back.S != s {
			t.Errorf("json back %v %v", back.S, err)
		}
		for _, bad := range []string{strings.ToUpper(n), " " + n, n + " ", strings.ToUpper(n[:1]) + n[1:]} {
			v := backoff.Strategy(42)
			if err := v.UnmarshalText([]byte(bad)); err == nil || v != 42 {
				t.Errorf("UnmarshalText(%q) = %v, %v; want an error and no change", bad, v, err)
			}
		}
	}
	for _, bad := range []string{"", "jitter", "Strategy(6)", "0", "exponential", "full\x00"} {
		v := backoff.Strategy(42)
		if err := v.UnmarshalText([]byte(bad)); err == nil || v != 42 {
			t.Errorf("UnmarshalText(%q) = %v, %v; want an error", bad, v, err)
		}
	}
	if s := backoff.Strategy(6).String(); s != "Strategy(6)" {
		t.Errorf("String(6) = %q", s)
	}
	if s := backoff.Strategy(255).String(); s != "Strategy(255)" {
		t.Errorf("String(255) = %q", s)
	}
	if _, err := backoff.New(backoff.Config{Strategy: 6}); err == nil || !strings.HasPrefix(err.Error(), "backoff: invalid config: ") {
		t.Errorf("New(Strategy 6) err = %v", err)
	}
}

func TestAttackFormulasNewValidation(t *testing.T) {
	for _, tc := range []struct {
		c  backoff.Config
		ok bool
	}{
		{backoff.Config{}, true},
		{backoff.Config{Base: -1}, false},
		{backoff.Config{Base: -1, Cap: time.Second}, false},
		{backoff.Config{Cap: -1}, false},
		{backoff.Config{Base: time.Second, Cap: time.Second - 1}, false},
		{backoff.Config{Base: time.Minute}, true},
		{backoff.Config{Base: math.MaxInt64}, true},
		{backoff.Config{Cap: 50 * time.Millisecond}, false},
		{backoff.Config{Base: 1, Cap: 1}, true},
	} {
		b, err := backoff.New(tc.c)
		if (err == nil) != tc.ok {
			t.Errorf("New(%+v) err = %v, want ok=%v", tc.c, err, tc.ok)
			continue
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "backoff: invalid config: ") {
				t.Errorf("error text %q", err)
			}
			continue
		}
		seq := b.Sequence()
		base := tc.c.Base
		if base == 0 {
			base = 100 * time.Millisecond
		}
		cap := tc.c.Cap
		if cap == 0 {
			cap = max(10*time.Second, base)
		}
		for range 200 {
			if d := seq.Next(); d < 0 || d > cap {
				t.Errorf("New(%+v): delay %v outside [0, %v]", tc.c, d, cap)
			}
		}
	}
}
