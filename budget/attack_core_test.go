package budget_test

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// fakeNow is a settable clock for Config.Now.
type fakeNow struct{ ns atomic.Int64 }

func (f *fakeNow) now() time.Time { return time.Unix(0, f.ns.Load()) }
func newFake() *fakeNow           { f := &fakeNow{}; f.ns.Store(1_700_000_000e9); return f }

// Stats doc (budget/budget.go, type Stats): "⌊Limit·(1+10⁻¹²)⌋ − Retries
// more are available if nothing else happens", the rounding allowance of
// withdrawals ("0.29·100, 28.999999999999996, admits 29"). It once said
// ⌊Limit⌋, and a caller reading Stats was told one retry too few.
func TestAttackCore5StatsLimitAtRatioBoundary(t *testing.T) {
	clk := newFake()
	b, err := budget.New(budget.Config{Ratio: 0.29, MinPerSecond: -1, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	b.DepositN(100)
	s := b.Stats()
	promised := int(math.Floor(s.Limit*(1+1e-12))) - s.Retries
	got := 0
	for b.Withdraw() {
		got++
	}
	if got != promised {
		t.Errorf("Stats %+v promises ⌊Limit·(1+10⁻¹²)⌋−Retries = %d more retries; Withdraw admitted %d", s, promised, got)
	}
}

// Package doc: "at every admission the window's admitted retries, this one
// included, are at most Ratio·requests + MinPerSecond·Window.Seconds()"
// with the rounding of decimal ratios allowed for. Sweep decimal ratios and
// request counts: exactly ⌊ratio·requests⌋ (decimal) retries are admitted.
func TestAttackCore5DecimalRatioBoundaries(t *testing.T) {
	for pct := 1; pct <= 100; pct++ {
		for _, req := range []int{1, 3, 7, 10, 99, 100, 101, 1000, 12345} {
			clk := newFake()
			b, err := budget.New(budget.Config{Ratio: float64(pct) / 100, MinPerSecond: -1, Now: clk.now})
			if err != nil {
				t.Fatal(err)
			}
			b.DepositN(req)
			want := pct * req / 100 // exact decimal floor
			got := 0
			for b.Withdraw() {
				got++
				if got > req+1 {
					break
				}
			}
			if got != want {
				t.Errorf("Ratio %d%% of %d requests: %d retries admitted, want %d", pct, req, got, want)
			}
		}
	}
}

// The floor alone: MinPerSecond·Window.Seconds() retries per window of
// whole slices, exactly, for fractional per-second floors.
func TestAttackCore5FloorBoundaries(t *testing.T) {
	cases := []struct {
		mps    float64
		window time.Duration
		slices int
		want   int
	}{
		{0.1, 10 * time.Second, 10, 1},
		{0.3, 10 * time.Second, 10, 3},
		{0.7, 10 * time.Second, 10, 7},
		{1.0 / 3, 3 * time.Second, 3, 1},
		{0.29, 100 * time.Second, 100, 29},
		{1000, 3 * time.Millisecond, 3, 3},
	}
	for _, c := range cases {
		clk := newFake()
		b, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: c.mps, Window: c.window, Slices: c.slices, Now: clk.now})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for b.Withdraw() {
			got++
			if got > 10*c.want+10 {
				break
			}
		}
		if got != c.want {
			t.Errorf("MinPerSecond %v over %v: %d admitted, want %d", c.mps, c.window, got, c.want)
		}
	}
}

// Concurrency: many goroutines withdraw at once; the total admitted is
// exactly the window's allowance (never more, and none lost).
func TestAttackCore5ConcurrentExactAllowance(t *testing.T) {
	clk := newFake()
	b, err := budget.New(budget.Config{Ratio: 0.1, MinPerSecond: 1, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 125; j++ {
				b.Deposit()
			}
		}()
	}
	wg.Wait()
	var granted atomic.Int64
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				if b.Withdraw() {
					granted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if g := granted.Load(); g != 110 { // 0.1·1000 + 1·10
		t.Errorf("granted %d, want 110 (%+v)", g, b.Stats())
	}
}

// New's error iff list: Ratio NaN or above 1, MinPerSecond NaN or infinite,
// Window negative, Slices outside [0, 3600], Window not a multiple of
// Slices ns of at least 1 ms each.
func TestAttackCore5NewIff(t *testing.T) {
	bad := []budget.Config{
		{Ratio: math.NaN()}, {Ratio: math.Inf(1)}, {Ratio: math.Nextafter(1, 2)},
		{MinPerSecond: math.NaN()}, {MinPerSecond: math.Inf(1)}, {MinPerSecond: math.Inf(-1)},
		{Window: -1}, {Slices: -1}, {Slices: 3601},
		{Window: time.Second, Slices: 3}, {Window: 9 * time.Millisecond, Slices: 10},
	}
	for _, c := range bad {
		if _, err := budget.New(c); err == nil {
			t.Errorf("New(%+v) = nil error, want one", c)
		}
	}
	good := []budget.Config{
		{Ratio: 1}, {Ratio: math.Inf(-1)}, {Ratio: -5}, {MinPerSecond: -math.MaxFloat64}, {MinPerSecond: math.MaxFloat64},
		{Window: time.Duration(math.MaxInt64 / 3600 * 3600), Slices: 3600}, {Window: 3600 * time.Millisecond, Slices: 3600},
		{Window: time.Millisecond, Slices: 1},
	}
	for _, c := range good {
		b, err := budget.New(c)
		if err != nil {
			t.Errorf("New(%+v) = %v, want nil", c, err)
			continue
		}
		b.Deposit()
		b.Withdraw()
		_ = b.Stats()
	}
}
