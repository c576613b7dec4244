// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package backoff_test

import (
	"encoding/json"
	"flag"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

func atkOne() float64 { return 1 } // clamped to the largest float64 below 1

// Jitter promises [d, d+spread). With a spread that a float64 cannot hold
// exactly (above 2^53 ns) and U at its largest, the result reaches past it.
func TestAttackJitterHalfOpenLargeSpread(t *testing.T) {
	b, err := backoff.New(backoff.Config{Rand: atkOne})
	if err != nil {
		t.Fatal(err)
	}
	spread := time.Duration(1<<62 + 3<<9 + 1)
	if got := b.Jitter(0, spread); got >= spread {
		t.Errorf("Jitter(0, %d) = %d; want < %d (doc: a delay in [d, d+spread))", spread, got, spread)
	}
}

// FullJitter promises [0, exp(n)); exp(n) = cap here.
func TestAttackFullJitterHalfOpenLargeCap(t *testing.T) {
	cp := time.Duration(1<<62 + 3<<9 + 1)
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Second, Cap: cp, Rand: atkOne})
	if err != nil {
		t.Fatal(err)
	}
	s := b.Sequence()
	for i := 0; i < 80; i++ {
		if d := s.Next(); d >= cp {
			t.Fatalf("FullJitter retry %d = %d; want < exp(n) = cap = %d (doc: [0, exp(n)))", i+1, d, cp)
		}
	}
}

// EqualJitter promises [exp(n)/2, exp(n)).
func TestAttackEqualJitterHalfOpenLargeCap(t *testing.T) {
	cp := time.Duration(1<<62 + 3<<9 + 1)
	b, err := backoff.New(backoff.Config{Strategy: backoff.EqualJitter, Base: time.Second, Cap: cp, Rand: atkOne})
	if err != nil {
		t.Fatal(err)
	}
	s := b.Sequence()
	for i := 0; i < 80; i++ {
		if d := s.Next(); d >= cp {
			t.Fatalf("EqualJitter retry %d = %d; want < exp(n) = cap = %d (doc: [exp(n)/2, exp(n)))", i+1, d, cp)
		}
	}
}

// Recompute the documented reference table (docs/backoff.md, U = 0.5).
func TestAttackReferenceTable(t *testing.T) {
	half := func() float64 { return 0.5 }
	want := map[backoff.Strategy][]time.Duration{
		backoff.NoJitter:     {200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond},
		backoff.FullJitter:   {100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond},
		backoff.EqualJitter:  {150 * time.Millisecond, 300 * time.Millisecond, 600 * time.Millisecond, 1200 * time.Millisecond},
		backoff.Decorrelated: {200 * time.Millisecond, 350 * time.Millisecond, 575 * time.Millisecond, 912500 * time.Microsecond},
		backoff.Constant:     {100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond},
		backoff.Linear:       {100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond, 400 * time.Millisecond},
	}
	for st, w := range want {
		b, err := backoff.New(backoff.Config{Strategy: st, Rand: half})
		if err != nil {
			t.Fatal(err)
		}
		s := b.Sequence()
		for i, wd := range w {
			if d := s.Next(); d != wd {
				t.Errorf("%v retry %d = %v; want %v", st, i+1, d, wd)
			}
		}
	}
}

// Independent reference of the package formulas, for many configs and U.
func TestAttackFormulaReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 20000; trial++ {
		base := time.Duration(1 + r.Int64N(int64(time.Hour)))
		cp := base + time.Duration(r.Int64N(int64(100*time.Hour)))
		st := backoff.Strategy(r.IntN(6))
		us := make([]float64, 0, 64)
		src := rand.New(rand.NewPCG(uint64(trial), 9))
		b, err := backoff.New(backoff.Config{Strategy: st, Base: base, Cap: cp, Rand: func() float64 {
			u := src.Float64()
			us = append(us, u)
			return u
		}})
		if err != nil {
			t.Fatal(err)
		}
		s := b.Sequence()
		prev := float64(base)
		for n := 1; n <= 40; n++ {
			us = us[:0]
			d := s.Next()
			if d < 0 || d > cp {
				t.Fatalf("%v base %v cap %v n %d: %v outside [0, cap]", st, base, cp, n, d)
			}
			e := math.Min(float64(cp), float64(base)*math.Pow(2, float64(n)))
			var want float64
			switch st {
			case backoff.NoJitter:
				want = e
			case backoff.FullJitter:
				want = us[0] * e
				if float64(d) >= e {
					t.Fatalf("full >= exp")
				}
			case backoff.EqualJitter:
				want = e/2 + us[0]*e/2
				if float64(d) >= e || float64(d) < math.Floor(e/2) {
					t.Fatalf("equal out of [e/2,e): %v e=%v", d, e)
				}
			case backoff.Decorrelated:
				want = math.Min(float64(cp), float64(base)+us[0]*(prev*3-float64(base)))
				if d < base {
					t.Fatalf("decorrelated below base")
				}
			case backoff.Constant:
				want = float64(base)
			case backoff.Linear:
				want = math.Min(float64(cp), float64(base)*float64(n))
			}
			if math.Abs(float64(d)-want) > 2 {
				t.Fatalf("%v base %d cap %d n %d: got %d want %.1f (u=%v)", st, base, cp, n, d, want, us)
			}
			prev = float64(d)
		}
	}
}

func TestAttackHugeBaseAndCap(t *testing.T) {
	for st := backoff.Strategy(0); st < 6; st++ {
		for _, c := range []backoff.Config{
			{Base: math.MaxInt64, Cap: math.MaxInt64},
			{Base: 1, Cap: math.MaxInt64},
			{Base: math.MaxInt64 - 1, Cap: math.MaxInt64},
			{Base: 1 << 53, Cap: 1<<53 + 1},
			{Base: 1<<53 + 1, Cap: 1<<53 + 1},
			{Base: 1<<62 + 1, Cap: 1<<62 + 3},
		} {
			for _, u := range []float64{0, 0.5, 1, math.NaN(), -1, math.Inf(1), 2} {
				c := c
				c.Strategy = st
				uu := u
				c.Rand = func() float64 { return uu }
				b, err := backoff.New(c)
				if err != nil {
					t.Fatal(err)
				}
				s := b.Sequence()
				for i := 0; i < 200; i++ {
					d := s.Next()
					lo := time.Duration(0)
					if st == backoff.Decorrelated || st == backoff.Constant || st == backoff.Linear {
						lo = c.Base
					}
					if d < lo || d > c.Cap {
						t.Fatalf("%v %+v u=%v retry %d: %d outside [%d, %d]", st, c, u, i+1, d, lo, c.Cap)
					}
				}
			}
		}
	}
}

func TestAttackLinearHugeN(t *testing.T) {
	b, _ := backoff.New(backoff.Config{Strategy: backoff.Linear, Base: 1, Cap: math.MaxInt64})
	s := b.Sequence()
	for i := 1; i <= 1000000; i++ {
		if d := s.Next(); d != time.Duration(i) {
			t.Fatalf("linear %d = %d", i, d)
		}
	}
}

func TestAttackNewErrors(t *testing.T) {
	cases := []struct {
		c     backoff.Config
		isErr bool
	}{
		{backoff.Config{}, false},
		{backoff.Config{Base: -1}, true},
		{backoff.Config{Base: -1, Cap: -1}, true},
		{backoff.Config{Cap: -1}, true},
		{backoff.Config{Base: time.Second, Cap: time.Second - 1}, true},
		{backoff.Config{Base: time.Minute}, false},
		{backoff.Config{Strategy: 6}, true},
		{backoff.Config{Strategy: 255}, true},
		{backoff.Config{Base: math.MaxInt64}, false},
		{backoff.Config{Base: 1, Cap: 1}, false},
	}
	for _, tc := range cases {
		b, err := backoff.New(tc.c)
		if (err != nil) != tc.isErr {
			t.Errorf("New(%+v) err=%v, want error %v", tc.c, err, tc.isErr)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "backoff: invalid config: ") {
			t.Errorf("error text %q", err)
		}
		if err == nil && b == nil {
			t.Errorf("nil backoff")
		}
	}
	// Zero cap with a large base: cap = base.
	b, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Minute})
	s := b.Sequence()
	if d := s.Next(); d != time.Minute {
		t.Errorf("cap default with big base: %v", d)
	}
	// defaults
	b, _ = backoff.New(backoff.Config{Strategy: backoff.NoJitter})
	s = b.Sequence()
	var last time.Duration
	for i := 0; i < 100; i++ {
		last = s.Next()
	}
	if last != 10*time.Second {
		t.Errorf("default cap = %v", last)
	}
}

func TestAttackStrategyText(t *testing.T) {
	names := []string{"full", "none", "equal", "decorrelated", "constant", "linear"}
	for i, n := range names {
		s := backoff.Strategy(i)
		if s.String() != n {
			t.Errorf("String(%d) = %q", i, s.String())
		}
		b, err := s.MarshalText()
		if err != nil || string(b) != n {
			t.Errorf("MarshalText %v %v", b, err)
		}
		var u backoff.Strategy = 99
		if err := u.UnmarshalText([]byte(n)); err != nil || u != s {
			t.Errorf("UnmarshalText(%q) = %v %v", n, u, err)
		}
		if err := u.UnmarshalText([]byte(strings.ToUpper(n))); err == nil {
			t.Errorf("UnmarshalText upper %q accepted", n)
		}
	}
	if s := backoff.Strategy(7).String(); s != "Strategy(7)" {
		t.Errorf("unknown String = %q", s)
	}
	if _, err := backoff.Strategy(7).MarshalText(); err == nil {
		t.Errorf("MarshalText unknown no error")
	}
	var st backoff.Strategy
	for _, bad := range []string{"", " full", "Strategy(1)", "jitter"} {
		st = backoff.Linear
		if err := st.UnmarshalText([]byte(bad)); err == nil || st != backoff.Linear {
			t.Errorf("UnmarshalText(%q) accepted or changed: %v %v", bad, st, err)
		}
	}
	// json + flag
	var cfg struct{ S backoff.Strategy }
	if err := json.Unmarshal([]byte(`{"S":"decorrelated"}`), &cfg); err != nil || cfg.S != backoff.Decorrelated {
		t.Errorf("json %v %v", cfg, err)
	}
	out, err := json.Marshal(struct{ S backoff.Strategy }{backoff.EqualJitter})
	if err != nil || string(out) != `{"S":"equal"}` {
		t.Errorf("json marshal %s %v", out, err)
	}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var fv backoff.Strategy
	fs.TextVar(&fv, "s", backoff.FullJitter, "")
	if err := fs.Parse([]string{"-s", "linear"}); err != nil || fv != backoff.Linear {
		t.Errorf("flag %v %v", fv, err)
	}
}

func TestAttackJitterEdges(t *testing.T) {
	b, _ := backoff.New(backoff.Config{Rand: atkOne})
	if got := b.Jitter(math.MaxInt64-5, time.Second); got != math.MaxInt64 {
		t.Errorf("saturation: %d", got)
	}
	if got := b.Jitter(time.Second, 0); got != time.Second {
		t.Errorf("zero spread %v", got)
	}
	if got := b.Jitter(time.Second, -5); got != time.Second {
		t.Errorf("neg spread %v", got)
	}
	if got := b.Jitter(-time.Second, time.Second); got < -time.Second || got >= 0 {
		t.Errorf("neg d %v", got)
	}
	for _, sp := range []time.Duration{1, 2, 3, 7, 1000, time.Second, 1 << 53, 1<<53 + 1, math.MaxInt64} {
		if got := b.Jitter(0, sp); got < 0 || got >= sp {
			t.Errorf("Jitter(0,%d) = %d not in [0, spread)", sp, got)
		}
	}
	b0, _ := backoff.New(backoff.Config{Rand: func() float64 { return 0 }})
	if got := b0.Jitter(5, 100); got != 5 {
		t.Errorf("u=0 %v", got)
	}
}

func TestAttackConcurrentDefault(t *testing.T) {
	b, _ := backoff.New(backoff.Config{Strategy: backoff.Decorrelated})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := b.Sequence()
			for i := 0; i < 1000; i++ {
				if d := s.Next(); d < 100*time.Millisecond || d > 10*time.Second {
					t.Errorf("out of range %v", d)
				}
				b.Jitter(time.Second, time.Second)
			}
		}()
	}
	wg.Wait()
}

func TestAttackAllocs(t *testing.T) {
	for st := backoff.Strategy(0); st < 6; st++ {
		b, _ := backoff.New(backoff.Config{Strategy: st})
		a := testing.AllocsPerRun(100, func() {
			s := b.Sequence()
			s.Next()
			s.Next()
		})
		if a != 0 {
			t.Errorf("%v allocs %v", st, a)
		}
	}
}

func FuzzAttackBackoffBounds(f *testing.F) {
	f.Add(uint8(0), int64(100e6), int64(10e9), uint64(1), uint16(10))
	f.Add(uint8(3), int64(1), int64(math.MaxInt64), uint64(2), uint16(200))
	f.Add(uint8(2), int64(1<<62+1), int64(1<<62+3), uint64(3), uint16(70))
	f.Fuzz(func(t *testing.T, st uint8, base, cp int64, seed uint64, rounds uint16) {
		c := backoff.Config{Strategy: backoff.Strategy(st), Base: time.Duration(base), Cap: time.Duration(cp)}
		src := rand.New(rand.NewPCG(seed, seed^0xabc))
		var u float64
		c.Rand = func() float64 {
			switch seed % 4 {
			case 0:
				u = 1 - 0x1p-53
			case 1:
				u = 0
			default:
				u = src.Float64()
			}
			return u
		}
		b, err := backoff.New(c)
		eb, ec := c.Base, c.Cap
		if eb == 0 {
			eb = 100 * time.Millisecond
		}
		if ec == 0 {
			ec = max(10*time.Second, eb)
		}
		wantErr := st >= 6 || eb < 0 || ec < eb
		if (err != nil) != wantErr {
			t.Fatalf("New(%+v) err = %v, want error %v", c, err, wantErr)
		}
		if err != nil {
			if !strings.HasPrefix(err.Error(), "backoff: invalid config: ") {
				t.Fatalf("err text %q", err)
			}
			return
		}
		s := b.Sequence()
		prev := float64(eb)
		for n := 1; n <= int(rounds%300)+1; n++ {
			u = -1
			d := s.Next()
			if d < 0 || d > ec {
				t.Fatalf("n=%d: %d outside [0, %d]", n, d, ec)
			}
			e := math.Min(float64(ec), float64(eb)*math.Pow(2, float64(n)))
			switch backoff.Strategy(st) {
			case backoff.FullJitter:
				if float64(d) >= e && e > 0 {
					t.Fatalf("full n=%d: %d >= exp %v", n, d, e)
				}
			case backoff.EqualJitter:
				if float64(d) >= e || float64(d) < math.Floor(e/2)-1 {
					t.Fatalf("equal n=%d: %d outside [%v, %v)", n, d, e/2, e)
				}
			case backoff.NoJitter:
				if math.Abs(float64(d)-e) > e*1e-15+1 {
					t.Fatalf("none n=%d: %d want %v", n, d, e)
				}
			case backoff.Decorrelated:
				want := math.Max(float64(eb), math.Min(float64(ec), float64(eb)+u*(prev*3-float64(eb))))
				if d < eb || math.Abs(float64(d)-want) > want*1e-15+1 {
					t.Fatalf("decorrelated n=%d: %d want %v", n, d, want)
				}
			case backoff.Constant:
				if d != eb {
					t.Fatalf("constant %d", d)
				}
			case backoff.Linear:
				var want time.Duration
				if int64(ec)/int64(eb) < int64(n) {
					want = ec
				} else {
					want = min(ec, eb*time.Duration(n))
				}
				if d != want {
					t.Fatalf("linear n=%d: %d want %d", n, d, want)
				}
			}
			prev = float64(d)
		}
	})
}
