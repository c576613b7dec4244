package backoff_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

// fixed returns a Rand pinned at u.
func fixed(u float64) func() float64 { return func() float64 { return u } }

func mustNew(t testing.TB, c backoff.Config) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(c)
	if err != nil {
		t.Fatalf("New(%+v) = %v", c, err)
	}
	return b
}

func TestDelayExact(t *testing.T) {
	tests := []struct {
		name     string
		strategy backoff.Strategy
		u        float64
		n        int
		prev     time.Duration
		want     time.Duration
	}{
		{"none/1", backoff.NoJitter, 0.5, 1, 0, 200 * ms},
		{"none/2", backoff.NoJitter, 0.5, 2, 0, 400 * ms},
		{"none/3", backoff.NoJitter, 0.9, 3, 0, 800 * ms},
		{"none/4", backoff.NoJitter, 0, 4, 0, 1600 * ms},
		{"none/capped", backoff.NoJitter, 0.5, 7, 0, 10 * s},
		{"none/n=0 counts as 1", backoff.NoJitter, 0.5, 0, 0, 200 * ms},
		{"none/negative n counts as 1", backoff.NoJitter, 0.5, -5, 0, 200 * ms},
		{"full/1", backoff.FullJitter, 0.5, 1, 0, 100 * ms},
		{"full/2", backoff.FullJitter, 0.5, 2, 0, 200 * ms},
		{"full/u=0", backoff.FullJitter, 0, 3, 0, 0},
		{"full/u=0.25 n=4", backoff.FullJitter, 0.25, 4, 0, 400 * ms},
		{"full/capped", backoff.FullJitter, 0.5, 20, 0, 5 * s},
		{"equal/1", backoff.EqualJitter, 0.5, 1, 0, 150 * ms},
		{"equal/u=0", backoff.EqualJitter, 0, 2, 0, 200 * ms},
		{"equal/capped", backoff.EqualJitter, 0.5, 30, 0, 7500 * ms},
		{"decorrelated/first (prev 0 = base)", backoff.Decorrelated, 0.5, 1, 0, 200 * ms},
		{"decorrelated/prev=base", backoff.Decorrelated, 0.5, 1, 100 * ms, 200 * ms},
		{"decorrelated/prev=200ms", backoff.Decorrelated, 0.5, 2, 200 * ms, 350 * ms},
		{"decorrelated/u=0 is base", backoff.Decorrelated, 0, 3, 5 * s, 100 * ms},
		{"decorrelated/capped", backoff.Decorrelated, 0.9, 3, 8 * s, 10 * s},
		{"decorrelated/ignores n", backoff.Decorrelated, 0.5, 1000, 200 * ms, 350 * ms},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, backoff.Config{Strategy: tt.strategy, Base: 100 * ms, Cap: 10 * s, Rand: fixed(tt.u)})
			if got := b.Delay(tt.n, tt.prev); got != tt.want {
				t.Errorf("%v Delay(%d, %v) with U=%v = %v, want %v", tt.strategy, tt.n, tt.prev, tt.u, got, tt.want)
			}
		})
	}
}

func TestSequenceFeedsPrev(t *testing.T) {
	// Decorrelated with U=0.5: d1 = 100 + 0.5*(300-100) = 200,
	// d2 = 100 + 0.5*(600-100) = 350, d3 = 100 + 0.5*(1050-100) = 575.
	b := mustNew(t, backoff.Config{Strategy: backoff.Decorrelated, Base: 100 * ms, Cap: 10 * s, Rand: fixed(0.5)})
	seq := b.Sequence()
	for i, want := range []time.Duration{200 * ms, 350 * ms, 575 * ms} {
		if got := seq.Next(); got != want {
			t.Errorf("Next() #%d = %v, want %v", i+1, got, want)
		}
	}
	if got := seq.Retries(); got != 3 {
		t.Errorf("Retries() = %d, want 3", got)
	}
	// Full jitter: the sequence is retry 1, 2, 3 of the formula.
	b = mustNew(t, backoff.Config{Strategy: backoff.FullJitter, Base: 100 * ms, Cap: 10 * s, Rand: fixed(0.5)})
	seq = b.Sequence()
	for i, want := range []time.Duration{100 * ms, 200 * ms, 400 * ms} {
		if got := seq.Next(); got != want {
			t.Errorf("full Next() #%d = %v, want %v", i+1, got, want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		c    backoff.Config
	}{
		{"negative base", backoff.Config{Base: -ms, Cap: s}},
		{"negative cap", backoff.Config{Base: ms, Cap: -s}},
		{"zero base, cap below the default base", backoff.Config{Cap: ms}},
		{"cap below base", backoff.Config{Base: s, Cap: ms}},
		{"unknown strategy", backoff.Config{Strategy: backoff.Strategy(9), Base: ms, Cap: s}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := backoff.New(tt.c)
			if err == nil || b != nil {
				t.Fatalf("New(%+v) = %v, %v; want nil, error", tt.c, b, err)
			}
			if !errors.Is(err, backoff.ErrInvalidConfig) {
				t.Errorf("New(%+v) error %v does not wrap ErrInvalidConfig", tt.c, err)
			}
		})
	}
	if _, err := backoff.New(backoff.Config{Base: s, Cap: s}); err != nil {
		t.Errorf("New with cap == base = %v, want nil", err)
	}
}

// TestDelayBounds is the property test: for random settings, attempts and
// draws, every strategy stays inside its interval and never above the cap.
func TestDelayBounds(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		base := time.Duration(1 + r.Int64N(int64(5*s)))
		capd := base + time.Duration(r.Int64N(int64(time.Hour)))
		n := r.IntN(200) - 5
		prev := time.Duration(r.Int64N(int64(capd) + 1))
		src := backoff.NewMulberry32(r.Uint32())
		for _, st := range backoff.Strategies() {
			b := mustNew(t, backoff.Config{Strategy: st, Base: base, Cap: capd, Rand: src.Float64})
			exp := b.Exp(n)
			if exp < base || exp > capd {
				t.Fatalf("Exp(%d) = %v outside [%v, %v]", n, exp, base, capd)
			}
			d := b.Delay(n, prev)
			lo, hi := time.Duration(0), exp
			switch st {
			case backoff.NoJitter:
				lo = exp
			case backoff.EqualJitter:
				lo = exp / 2
			case backoff.Decorrelated:
				lo, hi = base, capd
			}
			if d < lo || d > hi {
				t.Fatalf("%v Delay(%d, %v) base=%v cap=%v = %v, want in [%v, %v]", st, n, prev, base, capd, d, lo, hi)
			}
		}
	}
}

func TestNoJitterIsDeterministic(t *testing.T) {
	a := mustNew(t, backoff.Config{Strategy: backoff.NoJitter, Base: 100 * ms, Cap: 10 * s, Rand: backoff.NewMulberry32(1).Float64})
	b := mustNew(t, backoff.Config{Strategy: backoff.NoJitter, Base: 100 * ms, Cap: 10 * s, Rand: backoff.NewMulberry32(2).Float64})
	for n := 1; n < 10; n++ {
		if x, y := a.Delay(n, 0), b.Delay(n, 0); x != y {
			t.Errorf("none Delay(%d) differs between sources: %v vs %v", n, x, y)
		}
	}
}

func TestHugeAttemptsSaturate(t *testing.T) {
	for _, capd := range []time.Duration{10 * s, math.MaxInt64} {
		for _, st := range backoff.Strategies() {
			b := mustNew(t, backoff.Config{Strategy: st, Base: ms, Cap: capd, Rand: fixed(0.999999)})
			for _, n := range []int{62, 63, 64, 1023, 1024, 1025, 5000, math.MaxInt} {
				d := b.Delay(n, capd)
				if d < 0 || d > capd {
					t.Errorf("%v cap=%v Delay(%d) = %v, want in [0, cap]", st, capd, n, d)
				}
				if e := b.Exp(n); e != capd {
					t.Errorf("cap=%v Exp(%d) = %v, want the cap", capd, n, e)
				}
			}
		}
	}
}

func TestStrategyText(t *testing.T) {
	for _, st := range backoff.Strategies() {
		text, err := st.MarshalText()
		if err != nil {
			t.Fatalf("%v.MarshalText() = %v", st, err)
		}
		var back backoff.Strategy
		if err := back.UnmarshalText(text); err != nil || back != st {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, st)
		}
	}
	if _, err := backoff.ParseStrategy("Full"); err == nil {
		t.Error(`ParseStrategy("Full") = nil error, want an error`)
	}
	if got := backoff.Strategy(7).String(); got != "Strategy(7)" {
		t.Errorf("Strategy(7).String() = %q", got)
	}
	if _, err := backoff.Strategy(7).MarshalText(); err == nil {
		t.Error("Strategy(7).MarshalText() = nil error, want an error")
	}
}

// TestZeroFieldsTakeDefaults: Config{} is full jitter, 100 ms, 10 s; a
// Cap left at zero never falls below Base.
func TestZeroFieldsTakeDefaults(t *testing.T) {
	tests := []struct {
		in            backoff.Config
		base, wantCap time.Duration
	}{
		{backoff.Config{}, backoff.DefaultBase, backoff.DefaultCap},
		{backoff.Config{Base: 20 * s}, 20 * s, 20 * s},
		{backoff.Config{Cap: 5 * s}, backoff.DefaultBase, 5 * s},
		{backoff.Config{Base: ms}, ms, backoff.DefaultCap},
	}
	for _, tt := range tests {
		got := mustNew(t, tt.in).Config()
		if got.Strategy != backoff.FullJitter || got.Base != tt.base || got.Cap != tt.wantCap {
			t.Errorf("New(%+v).Config() = %+v, want full jitter, base %v, cap %v", tt.in, got, tt.base, tt.wantCap)
		}
	}
}

// TestRandClamped: a Rand that strays outside [0, 1) is clamped, so no
// delay leaves [0, cap].
func TestRandClamped(t *testing.T) {
	tests := []struct {
		u    float64
		want time.Duration
	}{
		{0.5, 100 * ms}, {0, 0}, {-1, 0}, {math.NaN(), 0}, {1, 200*ms - 1}, {7, 200*ms - 1},
	}
	for _, tt := range tests {
		b := mustNew(t, backoff.Config{Base: 100 * ms, Cap: 10 * s, Rand: func() float64 { return tt.u }})
		if got := b.Delay(1, 0); got != tt.want {
			t.Errorf("U=%v: full Delay(1) = %v, want %v", tt.u, got, tt.want)
		}
	}
}

// TestMulberry32MatchesJavaScript checks the first outputs for seed 42
// against values computed with the JavaScript original (the seed's generator).
func TestMulberry32MatchesJavaScript(t *testing.T) {
	// node -e 'function m(a){return function(){var t=a+=0x6D2B79F5;t=Math.imul(t^t>>>15,t|1);t^=t+Math.imul(t^t>>>7,t|61);return((t^t>>>14)>>>0)/4294967296}};const r=m(42);for(let i=0;i<5;i++)console.log(r())'
	want := []float64{0.6011037519201636, 0.44829055899754167, 0.8524657934904099, 0.6697340414393693, 0.17481389874592423}
	m := backoff.NewMulberry32(42)
	for i, w := range want {
		if got := m.Float64(); got != w {
			t.Errorf("Mulberry32(42) output #%d = %v, want %v", i, got, w)
		}
	}
	var zero backoff.Mulberry32
	if got, want := zero.Uint32(), backoff.NewMulberry32(0).Uint32(); got != want {
		t.Errorf("zero Mulberry32 first output %d, want seed-0 output %d", got, want)
	}
}

func TestDefaultRandConcurrent(t *testing.T) {
	b := backoff.Default()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := b.Sequence()
			for i := 0; i < 1000; i++ {
				if d := seq.Next(); d < 0 || d > backoff.DefaultCap {
					t.Errorf("Next() = %v outside [0, %v]", d, backoff.DefaultCap)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestDelayAllocatesNothing(t *testing.T) {
	for _, st := range backoff.Strategies() {
		b := mustNew(t, backoff.Config{Strategy: st, Base: 100 * ms, Cap: 10 * s})
		if a := testing.AllocsPerRun(1000, func() {
			seq := b.Sequence()
			seq.Next()
			b.Delay(3, 200*ms)
		}); a != 0 {
			t.Errorf("%v: Delay allocates %v times per run, want 0", st, a)
		}
	}
}

func TestConfigRoundTrip(t *testing.T) {
	got := backoff.Default().Config()
	if got.Strategy != backoff.FullJitter || got.Base != backoff.DefaultBase || got.Cap != backoff.DefaultCap || got.Rand != nil {
		t.Errorf("Default().Config() = %+v, want full jitter, %v, %v, nil Rand", got, backoff.DefaultBase, backoff.DefaultCap)
	}
}

func FuzzDelay(f *testing.F) {
	f.Add(uint8(0), 1, int64(100*ms), int64(10*s), int64(0), uint32(42))
	f.Add(uint8(3), 1<<40, int64(1), int64(math.MaxInt64), int64(math.MaxInt64), uint32(7))
	f.Add(uint8(2), -3, int64(-5), int64(0), int64(-1), uint32(0))
	f.Fuzz(func(t *testing.T, st uint8, n int, base, capd, prev int64, seed uint32) {
		b, err := backoff.New(backoff.Config{
			Strategy: backoff.Strategy(st), Base: time.Duration(base), Cap: time.Duration(capd),
			Rand: backoff.NewMulberry32(seed).Float64,
		})
		if err != nil {
			if !errors.Is(err, backoff.ErrInvalidConfig) {
				t.Fatalf("New error %v does not wrap ErrInvalidConfig", err)
			}
			return
		}
		d := b.Delay(n, time.Duration(prev))
		if d < 0 || d > time.Duration(capd) {
			t.Fatalf("%v Delay(%d, %d) base=%d cap=%d = %v: negative or over the cap", backoff.Strategy(st), n, prev, base, capd, d)
		}
	})
}

func BenchmarkDelay(b *testing.B) {
	for _, st := range backoff.Strategies() {
		bo, err := backoff.New(backoff.Config{Strategy: st, Base: 100 * ms, Cap: 10 * s})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(st.String(), func(b *testing.B) {
			b.ReportAllocs()
			var sink time.Duration
			for i := 0; b.Loop(); i++ {
				sink += bo.Delay(i&7+1, sink&(1<<30-1))
			}
			_ = sink
		})
	}
}

func BenchmarkDelayParallel(b *testing.B) {
	bo := backoff.Default()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		seq := bo.Sequence()
		var sink time.Duration
		for pb.Next() {
			sink += seq.Next()
		}
		_ = sink
	})
}
