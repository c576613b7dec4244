package backoff

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The formula of each strategy, tested on the unexported delay and exp
// (black-box tests walk them through a Sequence).

const (
	ms = time.Millisecond
	s  = time.Second
)

// fixed returns a Rand pinned at u.
func fixed(u float64) func() float64 { return func() float64 { return u } }

// strategies lists every strategy.
var strategies = []Strategy{NoJitter, FullJitter, EqualJitter, Decorrelated, Constant, Linear}

func mustNew(t testing.TB, c Config) *Backoff {
	t.Helper()
	b, err := New(c)
	if err != nil {
		t.Fatalf("New(%+v) = %v", c, err)
	}
	return b
}

// seeded returns a reproducible random source.
func seeded(seed uint64) func() float64 { return rand.New(rand.NewPCG(seed, 0)).Float64 }

func TestDelayExact(t *testing.T) {
	tests := []struct {
		name     string
		strategy Strategy
		u        float64
		n        int
		prev     time.Duration
		want     time.Duration
	}{
		{"none/1", NoJitter, 0.5, 1, 0, 200 * ms},
		{"none/2", NoJitter, 0.5, 2, 0, 400 * ms},
		{"none/3", NoJitter, 0.9, 3, 0, 800 * ms},
		{"none/4", NoJitter, 0, 4, 0, 1600 * ms},
		{"none/capped", NoJitter, 0.5, 7, 0, 10 * s},
		{"none/n=0 counts as 1", NoJitter, 0.5, 0, 0, 200 * ms},
		{"none/negative n counts as 1", NoJitter, 0.5, -5, 0, 200 * ms},
		{"full/1", FullJitter, 0.5, 1, 0, 100 * ms},
		{"full/2", FullJitter, 0.5, 2, 0, 200 * ms},
		{"full/u=0", FullJitter, 0, 3, 0, 0},
		{"full/u=0.25 n=4", FullJitter, 0.25, 4, 0, 400 * ms},
		{"full/capped", FullJitter, 0.5, 20, 0, 5 * s},
		{"equal/1", EqualJitter, 0.5, 1, 0, 150 * ms},
		{"equal/u=0", EqualJitter, 0, 2, 0, 200 * ms},
		{"equal/capped", EqualJitter, 0.5, 30, 0, 7500 * ms},
		{"decorrelated/first (prev 0 = base)", Decorrelated, 0.5, 1, 0, 200 * ms},
		{"decorrelated/prev=base", Decorrelated, 0.5, 1, 100 * ms, 200 * ms},
		{"decorrelated/prev=200ms", Decorrelated, 0.5, 2, 200 * ms, 350 * ms},
		{"decorrelated/u=0 is base", Decorrelated, 0, 3, 5 * s, 100 * ms},
		{"decorrelated/capped", Decorrelated, 0.9, 3, 8 * s, 10 * s},
		{"decorrelated/ignores n", Decorrelated, 0.5, 1000, 200 * ms, 350 * ms},
		{"constant/1", Constant, 0.5, 1, 0, 100 * ms},
		{"constant/ignores n, prev and U", Constant, 0.9, 1000, 5 * s, 100 * ms},
		{"linear/1", Linear, 0.5, 1, 0, 100 * ms},
		{"linear/2", Linear, 0.9, 2, 0, 200 * ms},
		{"linear/7", Linear, 0, 7, 0, 700 * ms},
		{"linear/n=0 counts as 1", Linear, 0.5, 0, 0, 100 * ms},
		{"linear/capped", Linear, 0.5, 101, 0, 10 * s},
		{"linear/huge n capped", Linear, 0.5, math.MaxInt, 0, 10 * s},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, Config{Strategy: tt.strategy, Base: 100 * ms, Cap: 10 * s, Rand: fixed(tt.u)})
			if got := b.delay(tt.n, tt.prev); got != tt.want {
				t.Errorf("%v delay(%d, %v) with U=%v = %v, want %v", tt.strategy, tt.n, tt.prev, tt.u, got, tt.want)
			}
		})
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
		src := seeded(r.Uint64())
		for _, st := range strategies {
			b := mustNew(t, Config{Strategy: st, Base: base, Cap: capd, Rand: src})
			exp := b.toDuration(b.exp(n))
			if exp < base || exp > capd {
				t.Fatalf("exp(%d) = %v outside [%v, %v]", n, exp, base, capd)
			}
			d := b.delay(n, prev)
			lo, hi := time.Duration(0), exp
			switch st {
			case NoJitter:
				lo = exp
			case EqualJitter:
				lo = exp / 2
			case Decorrelated:
				lo, hi = base, capd
			case Constant:
				lo, hi = base, base
			case Linear:
				lo = min(capd, time.Duration(min(float64(capd), float64(base)*float64(max(n, 1)))))
				hi = lo
			}
			if d < lo || d > hi {
				t.Fatalf("%v delay(%d, %v) base=%v cap=%v = %v, want in [%v, %v]", st, n, prev, base, capd, d, lo, hi)
			}
		}
	}
}

func TestHugeAttemptsSaturate(t *testing.T) {
	for _, capd := range []time.Duration{10 * s, math.MaxInt64} {
		for _, st := range strategies {
			b := mustNew(t, Config{Strategy: st, Base: ms, Cap: capd, Rand: fixed(0.999999)})
			for _, n := range []int{62, 63, 64, 1023, 1024, 1025, 5000, math.MaxInt} {
				d := b.delay(n, capd)
				if d < 0 || d > capd {
					t.Errorf("%v cap=%v delay(%d) = %v, want in [0, cap]", st, capd, n, d)
				}
				if e := b.toDuration(b.exp(n)); e != capd {
					t.Errorf("cap=%v exp(%d) = %v, want the cap", capd, n, e)
				}
			}
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
		b := mustNew(t, Config{Base: 100 * ms, Cap: 10 * s, Rand: func() float64 { return tt.u }})
		if got := b.delay(1, 0); got != tt.want {
			t.Errorf("U=%v: full delay(1) = %v, want %v", tt.u, got, tt.want)
		}
	}
}

func FuzzDelay(f *testing.F) {
	f.Add(uint8(0), 1, int64(100*ms), int64(10*s), int64(0), uint32(42))
	f.Add(uint8(3), 1<<40, int64(1), int64(math.MaxInt64), int64(math.MaxInt64), uint32(7))
	f.Add(uint8(2), -3, int64(-5), int64(0), int64(-1), uint32(0))
	f.Fuzz(func(t *testing.T, st uint8, n int, base, capd, prev int64, seed uint32) {
		b, err := New(Config{
			Strategy: Strategy(st), Base: time.Duration(base), Cap: time.Duration(capd),
			Rand: seeded(uint64(seed)),
		})
		if err != nil {
			if !errors.Is(err, errInvalidConfig) {
				t.Fatalf("New error %v does not wrap errInvalidConfig", err)
			}
			return
		}
		d := b.delay(n, time.Duration(prev))
		if d < 0 || d > time.Duration(capd) {
			t.Fatalf("%v delay(%d, %d) base=%d cap=%d = %v: negative or over the cap", Strategy(st), n, prev, base, capd, d)
		}
	})
}

func BenchmarkDelay(b *testing.B) {
	for _, st := range strategies {
		bo, err := New(Config{Strategy: st, Base: 100 * ms, Cap: 10 * s})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(st.String(), func(b *testing.B) {
			b.ReportAllocs()
			var sink time.Duration
			for i := 0; b.Loop(); i++ {
				sink += bo.delay(i&7+1, sink&(1<<30-1))
			}
			_ = sink
		})
	}
}

// TestDelayEdges: the bounds at the edges of float64. EqualJitter's
// e/2 + u·e/2 rounds up to e for a u just below 1, and a base above 2^53
// ns (104 days) does not fit a float64's 53 bits.
func TestDelayEdges(t *testing.T) {
	below1 := math.Nextafter(1, 0)
	huge := time.Duration(1<<53 + 1)
	third := time.Duration(math.MaxInt64 / 3)
	tests := []struct {
		name      string
		st        Strategy
		base, cap time.Duration
		u         float64
		n         int
		lo, hi    time.Duration // inclusive
	}{
		{"equal jitter, u just below 1", EqualJitter, 100 * ms, 10 * s, below1, 1, 100 * ms, 200*ms - 1},
		{"equal jitter, u of 1", EqualJitter, 100 * ms, 10 * s, 1, 1, 100 * ms, 200*ms - 1},
		{"equal jitter, 1 ns", EqualJitter, 1, s, below1, 1, 1, 1},
		{"equal jitter, at the cap", EqualJitter, 100 * ms, 100 * ms, below1, 3, 50 * ms, 100*ms - 1},
		{"linear, base above 2^53", Linear, huge, math.MaxInt64, 0, 1, huge, huge},
		{"linear, twice a base above 2^53", Linear, huge, math.MaxInt64, 0, 2, 2 * huge, 2 * huge},
		{"linear, a third of the largest", Linear, third, math.MaxInt64, 0, 3, 3 * third, 3 * third},
		{"linear, past the largest", Linear, third, math.MaxInt64, 0, 4, math.MaxInt64, math.MaxInt64},
		{"decorrelated, base above 2^53", Decorrelated, huge, math.MaxInt64, 0, 1, huge, math.MaxInt64},
		{"decorrelated, a third of the largest", Decorrelated, third, math.MaxInt64, 0, 1, third, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := mustNew(t, Config{Strategy: tt.st, Base: tt.base, Cap: tt.cap, Rand: fixed(tt.u)})
			if d := b.delay(tt.n, 0); d < tt.lo || d > tt.hi {
				t.Errorf("delay(%d) = %d ns, want in [%d, %d]", tt.n, int64(d), int64(tt.lo), int64(tt.hi))
			}
		})
	}
}
