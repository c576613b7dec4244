package backoff_test

import (
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

// strategies lists every strategy.
var strategies = []backoff.Strategy{backoff.NoJitter, backoff.FullJitter, backoff.EqualJitter, backoff.Decorrelated, backoff.Constant, backoff.Linear}

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
			if !strings.HasPrefix(err.Error(), "backoff: invalid config: ") {
				t.Errorf("New(%+v) error %v is not an invalid-config error", tt.c, err)
			}
		})
	}
	if _, err := backoff.New(backoff.Config{Base: s, Cap: s}); err != nil {
		t.Errorf("New with cap == base = %v, want nil", err)
	}
}

func TestNoJitterIsDeterministic(t *testing.T) {
	a := mustNew(t, backoff.Config{Strategy: backoff.NoJitter, Base: 100 * ms, Cap: 10 * s, Rand: rand.New(rand.NewPCG(1, 0)).Float64}).Sequence()
	b := mustNew(t, backoff.Config{Strategy: backoff.NoJitter, Base: 100 * ms, Cap: 10 * s, Rand: rand.New(rand.NewPCG(2, 0)).Float64}).Sequence()
	for n := 1; n < 10; n++ {
		if x, y := a.Next(), b.Next(); x != y {
			t.Errorf("none: retry %d differs between sources: %v vs %v", n, x, y)
		}
	}
}

func TestStrategyText(t *testing.T) {
	for _, st := range strategies {
		text, err := st.MarshalText()
		if err != nil {
			t.Fatalf("%v.MarshalText() = %v", st, err)
		}
		var back backoff.Strategy
		if err := back.UnmarshalText(text); err != nil || back != st {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, st)
		}
	}
	var st backoff.Strategy
	if err := st.UnmarshalText([]byte("Full")); err == nil {
		t.Error(`UnmarshalText("Full") = nil error, want an error (names are case-sensitive)`)
	}
	if got := backoff.Strategy(7).String(); got != "Strategy(7)" {
		t.Errorf("Strategy(7).String() = %q", got)
	}
	if _, err := backoff.Strategy(7).MarshalText(); err == nil {
		t.Error("Strategy(7).MarshalText() = nil error, want an error")
	}
}

// TestZeroFieldsTakeDefaults: Config{} is full jitter, 100 ms, 10 s; a
// Cap left at zero never falls below Base. With U pinned at 0.5, the first
// full-jitter delay is base·2/2 = base, and a late one is cap/2.
func TestZeroFieldsTakeDefaults(t *testing.T) {
	tests := []struct {
		in            backoff.Config
		base, wantCap time.Duration
	}{
		{backoff.Config{}, 100 * ms, 10 * s},
		{backoff.Config{Base: 20 * s}, 20 * s, 20 * s},
		{backoff.Config{Cap: 5 * s}, 100 * ms, 5 * s},
		{backoff.Config{Base: ms}, ms, 10 * s},
	}
	for _, tt := range tests {
		c := tt.in
		c.Rand = fixed(0.5)
		seq := mustNew(t, c).Sequence()
		first := seq.Next()
		for range 60 {
			seq.Next()
		}
		if want := min(tt.base, tt.wantCap/2); first != want || seq.Next() != tt.wantCap/2 {
			t.Errorf("New(%+v): first delay %v, 62nd %v; want full jitter, base %v, cap %v", tt.in, first, seq.Next(), tt.base, tt.wantCap)
		}
	}
}

func TestDefaultRandConcurrent(t *testing.T) {
	b := mustNew(t, backoff.Config{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			seq := b.Sequence()
			for i := 0; i < 1000; i++ {
				if d := seq.Next(); d < 0 || d > 10*s {
					t.Errorf("Next() = %v outside [0, 10s]", d)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestDelayAllocatesNothing(t *testing.T) {
	for _, st := range strategies {
		b := mustNew(t, backoff.Config{Strategy: st, Base: 100 * ms, Cap: 10 * s})
		if a := testing.AllocsPerRun(1000, func() {
			seq := b.Sequence()
			seq.Next()
			seq.Next()
			b.Jitter(time.Second, time.Second)
		}); a != 0 {
			t.Errorf("%v: Sequence, Next and Jitter allocate %v times per run, want 0", st, a)
		}
	}
}

func BenchmarkDelayParallel(b *testing.B) {
	bo, err := backoff.New(backoff.Config{})
	if err != nil {
		b.Fatal(err)
	}
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

// Jitter spreads d by up to spread and saturates: a hint near the largest
// Duration stays the largest, never a short wait after an overflow.
func TestJitterSaturates(t *testing.T) {
	b := mustNew(t, backoff.Config{Rand: fixed(0.999)})
	tests := []struct{ d, spread, lo, hi time.Duration }{
		{time.Second, 0, time.Second, time.Second},
		{time.Second, -time.Second, time.Second, time.Second},
		{time.Second, time.Second, 1998 * ms, 1999 * ms},
		{math.MaxInt64, time.Hour, math.MaxInt64, math.MaxInt64},
		{math.MaxInt64 - time.Second, time.Hour, math.MaxInt64, math.MaxInt64},
		{math.MaxInt64 / 2, math.MaxInt64, math.MaxInt64, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := b.Jitter(tt.d, tt.spread); got < tt.lo || got > tt.hi {
			t.Errorf("Jitter(%v, %v) = %v, want in [%v, %v]", tt.d, tt.spread, got, tt.lo, tt.hi)
		}
	}
}
