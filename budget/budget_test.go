package budget_test

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// t0 is the fake time at which every test budget is built: slice 0 starts
// here.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fakeClock is a clock tests move by hand; safe for concurrent use.
type fakeClock struct{ ns atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(t0.UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *fakeClock) Set(t time.Time)         { c.ns.Store(t.UnixNano()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// none maps 0 (none, in these tests) to the negative value Config reads as
// none; Config's 0 means the default.
func none(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// clocked is a budget on a fake clock; its helpers set the clock to the
// time a test names and then call the budget, which reads it.
type clocked struct {
	*budget.Budget
	clk *fakeClock
}

func (b clocked) depositAt(t time.Time)            { b.clk.Set(t); b.Deposit() }
func (b clocked) withdrawAt(t time.Time) bool      { b.clk.Set(t); return b.Withdraw() }
func (b clocked) statsAt(t time.Time) budget.Stats { b.clk.Set(t); return b.Stats() }

// newBudget builds a budget on a fake clock whose slice 0 starts at t0; a
// ratio or perSec of 0 means none.
func newBudget(t testing.TB, ratio, perSec float64, window time.Duration, slices int) clocked {
	t.Helper()
	clk := newClock()
	b, err := budget.New(budget.Config{
		Ratio: none(ratio), MinPerSecond: none(perSec), Window: window, Slices: slices,
		Now: clk.Now,
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return clocked{b, clk}
}

// drain withdraws at t until refused and returns how many were admitted.
func drain(t *testing.T, b clocked, at time.Time) int {
	t.Helper()
	n := 0
	for b.withdrawAt(at) {
		n++
		if n > 1e7 {
			t.Fatalf("Withdraw at %v never refuses", at)
		}
	}
	return n
}

func TestZeroConfigTakesDefaults(t *testing.T) {
	b, err := budget.New(budget.Config{})
	if err != nil {
		t.Fatalf("New(Config{}) = %v, want nil error", err)
	}
	c := b.Config()
	want := budget.Config{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second, Slices: 10}
	if c.Ratio != want.Ratio || c.MinPerSecond != want.MinPerSecond || c.Window != want.Window ||
		c.Slices != want.Slices || c.Now != nil {
		t.Fatalf("New(Config{}).Config() = %+v, want %+v", c, want)
	}
}

// A zero Budget is usable: the defaults, its window starting at first use.
func TestZeroBudgetUsable(t *testing.T) {
	var b budget.Budget
	for range 100 {
		b.Deposit()
	}
	// 10% of 100 requests + 10 (1/s over 10 s) = 20 retries.
	n := 0
	for b.Withdraw() {
		n++
		if n > 1000 {
			t.Fatal("a zero Budget never refuses")
		}
	}
	if n != 20 {
		t.Errorf("zero Budget admitted %d retries after 100 requests, want 20", n)
	}
	if s := b.Stats(); s.Requests != 100 || s.Retries != 20 {
		t.Errorf("Stats() = %+v, want 100 requests, 20 retries", s)
	}
}

// Negative Ratio or MinPerSecond mean none; zero means the default.
func TestNegativeMeansNone(t *testing.T) {
	tests := []struct {
		ratio, perSec float64
		want          int
	}{
		{-1, -1, 0},
		{-1, 0, 10}, // the default floor only
		{0, -1, 10}, // the default 10% of 100 only
		{0.5, -1, 50},
	}
	for _, tt := range tests {
		b, err := budget.New(budget.Config{Ratio: tt.ratio, MinPerSecond: tt.perSec, Now: func() time.Time { return t0 }})
		if err != nil {
			t.Fatalf("New(ratio %v, floor %v) = %v", tt.ratio, tt.perSec, err)
		}
		for range 100 {
			b.Deposit()
		}
		if s := b.Stats(); int(s.Limit)-s.Retries != tt.want {
			t.Errorf("ratio %v, floor %v: %d retries available after 100 requests (%+v), want %d", tt.ratio, tt.perSec, int(s.Limit)-s.Retries, s, tt.want)
		}
	}
}

func TestNewInvalid(t *testing.T) {
	ok := budget.Config{}
	tests := []struct {
		name string
		edit func(c *budget.Config)
	}{
		{"ratio above 1", func(c *budget.Config) { c.Ratio = 1.5 }},
		{"NaN ratio", func(c *budget.Config) { c.Ratio = math.NaN() }},
		{"infinite ratio", func(c *budget.Config) { c.Ratio = math.Inf(1) }},
		{"negative infinite floor", func(c *budget.Config) { c.MinPerSecond = math.Inf(-1) }},
		{"NaN floor", func(c *budget.Config) { c.MinPerSecond = math.NaN() }},
		{"infinite floor", func(c *budget.Config) { c.MinPerSecond = math.Inf(1) }},
		{"negative window", func(c *budget.Config) { c.Window = -time.Second }},
		{"too many slices", func(c *budget.Config) { c.Slices = 3600 + 1; c.Window = 2 * time.Hour }},
		{"negative slices", func(c *budget.Config) { c.Slices = -3 }},
		{"too many slices", func(c *budget.Config) { c.Slices = 3600 + 1; c.Window = time.Hour * 2 }},
		{"window not a multiple of slices", func(c *budget.Config) { c.Window = 10*time.Second + 1 }},
		{"slice too short", func(c *budget.Config) { c.Window = 10 * time.Microsecond; c.Slices = 10 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.edit(&c)
			b, err := budget.New(c)
			if err == nil || !strings.HasPrefix(err.Error(), "budget: invalid config: ") || b != nil {
				t.Fatalf("New(%+v) = %v, %v; want nil, an invalid-config error", c, b, err)
			}
		})
	}
	// Edges that are valid.
	valid := []budget.Config{
		{Ratio: -1, MinPerSecond: -1, Window: time.Millisecond, Slices: 1},
		{Ratio: 1, MinPerSecond: 1000, Window: time.Hour, Slices: 3600},
	}
	for _, c := range valid {
		if _, err := budget.New(c); err != nil {
			t.Errorf("New(%+v) = %v, want nil error", c, err)
		}
	}
}

func TestAdmissionCount(t *testing.T) {
	tests := []struct {
		ratio, perSec float64
		deposits      int
		want          int // floor(ratio*deposits + perSec*10)
	}{
		{ratio: 0.1, perSec: 0, deposits: 0, want: 0},
		{ratio: 0.1, perSec: 0, deposits: 9, want: 0},
		{ratio: 0.1, perSec: 0, deposits: 10, want: 1},
		{ratio: 0.1, perSec: 0, deposits: 100, want: 10},
		{ratio: 0.1, perSec: 0, deposits: 109, want: 10},
		{ratio: 0.1, perSec: 1, deposits: 0, want: 10},
		{ratio: 0.1, perSec: 1, deposits: 100, want: 20},
		{ratio: 0.2, perSec: 10, deposits: 1000, want: 300},
		{ratio: 0, perSec: 0.25, deposits: 1000, want: 2},
		{ratio: 1, perSec: 0, deposits: 7, want: 7},
		{ratio: 0.5, perSec: 0.05, deposits: 3, want: 2}, // 1.5 + 0.5
	}
	for _, tt := range tests {
		name := fmt.Sprintf("ratio=%v floor=%v deposits=%d", tt.ratio, tt.perSec, tt.deposits)
		t.Run(name, func(t *testing.T) {
			b := newBudget(t, tt.ratio, tt.perSec, 10*time.Second, 10)
			at := t0.Add(3 * time.Second)
			for range tt.deposits {
				b.depositAt(at)
			}
			if got := drain(t, b, at); got != tt.want {
				t.Fatalf("admitted %d withdrawals after %d deposits, want %d", got, tt.deposits, tt.want)
			}
			st := b.statsAt(at)
			if st.Requests != tt.deposits || st.Retries != tt.want || int(st.Limit) != tt.want {
				t.Fatalf("Stats = %+v, want Requests %d Retries %d, none left (Limit %d.x)",
					st, tt.deposits, tt.want, tt.want)
			}
		})
	}
}

// TestSliceExpiry checks that a slice counts for exactly Slices slices: a
// deposit in slice 0 funds retries up to the last nanosecond of slice 9 and
// not from the first nanosecond of slice 10.
func TestSliceExpiry(t *testing.T) {
	const slice = time.Second
	tests := []struct {
		name      string
		deposit   time.Duration // after t0
		withdraw  time.Duration // after t0
		admitted  bool
		requests  int
		nextAlsoX bool
	}{
		{"same instant", 0, 0, true, 1, false},
		{"same slice, end", 0, slice - 1, true, 1, false},
		{"last slice of the window", 500 * time.Millisecond, 10*slice - 1, true, 1, false},
		{"first slice after the window", 999 * time.Millisecond, 10 * slice, false, 0, false},
		{"deposit at the end of slice 0", slice - 1, 10 * slice, false, 0, false},
		{"deposit at the start of slice 1", slice, 10 * slice, true, 1, false},
		{"deposit at the start of slice 1, window over", slice, 11 * slice, false, 0, false},
		{"before New: slice -1", -1, 9*slice - 1, true, 1, false},
		{"before New: slice -1 expired", -1, 9 * slice, false, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBudget(t, 1, 0, 10*slice, 10)
			b.depositAt(t0.Add(tt.deposit))
			at := t0.Add(tt.withdraw)
			if st := b.statsAt(at); st.Requests != tt.requests {
				t.Errorf("Stats at +%v: Requests = %d, want %d", tt.withdraw, st.Requests, tt.requests)
			}
			if got := b.withdrawAt(at); got != tt.admitted {
				t.Fatalf("Deposit at +%v; Withdraw at +%v = %v, want %v", tt.deposit, tt.withdraw, got, tt.admitted)
			}
		})
	}
}

// TestRetryExpiry checks that admitted retries leave the window exactly when
// their slice does.
func TestRetryExpiry(t *testing.T) {
	b := newBudget(t, 0, 0.5, 10*time.Second, 5) // 5 retries per window, 2 s slices
	// Spend the floor at t0+3s (slice 1: [2s, 4s)).
	if got := drain(t, b, t0.Add(3*time.Second)); got != 5 {
		t.Fatalf("drain at +3s admitted %d, want 5", got)
	}
	// Slice 1 is in the window until slice 6 starts at +12s.
	if b.withdrawAt(t0.Add(12*time.Second - 1)) {
		t.Fatalf("Withdraw at +12s-1ns = true, want false: slice 1 is still in the window")
	}
	if got := drain(t, b, t0.Add(12*time.Second)); got != 5 {
		t.Fatalf("drain at +12s admitted %d, want 5 (slice 1 expired)", got)
	}
}

// TestBackwardsTime checks the clamping rules for times older than the
// budget has seen.
func TestBackwardsTime(t *testing.T) {
	b := newBudget(t, 1, 0, 10*time.Second, 10)
	for range 3 {
		b.depositAt(t0.Add(20 * time.Second)) // slice 20
	}
	if !b.withdrawAt(t0.Add(20 * time.Second)) {
		t.Fatal("Withdraw at +20s = false, want true")
	}
	// A withdrawal at an older time counts in the head slice (20), where
	// the three deposits are.
	if !b.withdrawAt(t0) {
		t.Fatal("Withdraw at t0 after head slice 20 = false, want true (clamped to slice 20)")
	}
	if !b.withdrawAt(t0.Add(15 * time.Second)) {
		t.Fatal("Withdraw at +15s = false, want true (clamped to slice 20)")
	}
	if b.withdrawAt(t0) {
		t.Fatal("fourth withdrawal = true, want false: 3 deposits, ratio 1")
	}
	// Slice 10 shares its ring word with slice 20, which is newer: a
	// deposit at +10s has expired and is dropped.
	b.depositAt(t0.Add(10 * time.Second))
	if st := b.statsAt(t0.Add(20 * time.Second)); st.Requests != 3 {
		t.Fatalf("Stats at +20s: Requests = %d after an expired deposit, want 3", st.Requests)
	}
	// A deposit in an older slice still in the window counts.
	b.depositAt(t0.Add(11 * time.Second))
	if st := b.statsAt(t0.Add(20 * time.Second)); st.Requests != 4 || st.Retries != 3 {
		t.Fatalf("Stats at +20s = %+v, want Requests 4, Retries 3", st)
	}
}

func TestClockShorthands(t *testing.T) {
	clk := newClock()
	b, err := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: -1, Window: 4 * time.Second, Slices: 4, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	b.Deposit()
	b.Deposit()
	if !b.Withdraw() || b.Withdraw() {
		t.Fatal("after 2 deposits at ratio 0.5: Withdraw, Withdraw = want true, false")
	}
	clk.Advance(4 * time.Second)
	if st := b.Stats(); st != (budget.Stats{}) {
		t.Fatalf("Stats() one window later = %+v, want zero", st)
	}
	if b.Withdraw() {
		t.Fatal("Withdraw() one window later with no deposits = true, want false")
	}
}

// model is a straightforward reference implementation of the admission rule
// documented in the package: an event log, scanned in full.
type model struct {
	ratio, reserve float64
	slices         int64
	slice          time.Duration
	head           int64 // newest slice with an admitted retry
	reqSlot        map[int64]int64
	requests       map[int64]int  // per slice
	lost           map[int64]bool // slices whose request word was reused
	retries        map[int64]int  // per slice
}

func newModel(ratio, perSec float64, window time.Duration, slices int) *model {
	return &model{
		ratio: ratio, reserve: perSec * window.Seconds(), slices: int64(slices),
		slice: window / time.Duration(slices), head: math.MinInt64, reqSlot: map[int64]int64{},
		requests: map[int64]int{}, retries: map[int64]int{}, lost: map[int64]bool{},
	}
}

func (m *model) sliceOf(t time.Time) int64 {
	d := t.Sub(t0)
	s := int64(d / m.slice)
	if d < 0 && d%m.slice != 0 {
		s--
	}
	return s
}

func (m *model) deposit(t time.Time) {
	s := m.sliceOf(t)
	i := ((s % m.slices) + m.slices) % m.slices
	last, ok := m.reqSlot[i]
	switch {
	case ok && last > s:
		return // expired: a later slice already uses this word
	case ok && last < s:
		m.lost[last] = true // the word is reused: its old slice is gone
	}
	m.reqSlot[i] = s
	m.requests[s]++
}

// sum returns the total of counts over the window ending in slice cur.
func (m *model) sum(counts map[int64]int, cur int64) int {
	n := 0
	for s := cur - m.slices + 1; s <= cur; s++ {
		n += counts[s]
	}
	return n
}

// live returns the requests the budget still holds for the window ending
// in slice cur: those of slices whose word was not reused since.
func (m *model) live(cur int64) int {
	n := 0
	for s := cur - m.slices + 1; s <= cur; s++ {
		if !m.lost[s] {
			n += m.requests[s]
		}
	}
	return n
}

// withdraw returns the model's decision and the slice it counts in.
func (m *model) withdraw(t time.Time) (bool, int64) {
	cur := max(m.sliceOf(t), m.head)
	ok := float64(m.sum(m.retries, cur)+1) <= (m.ratio*float64(m.live(cur))+m.reserve)*(1+1e-12) // the rounding allowed for
	if ok {
		m.retries[cur]++
		m.head = cur
	}
	return ok, cur
}

// TestPropertyBound drives budgets with random arrival patterns on a fake
// clock and checks every decision against the reference model, and the
// bound: at every admission, the window's admitted retries (this one
// included) are at most Ratio·requests + MinPerSecond·Window.
func TestPropertyBound(t *testing.T) {
	rng := rand.New(rand.NewPCG(2026, 42))
	runs, ops := 200, 2000
	if testing.Short() {
		runs = 40
	}
	ratios := []float64{0, 0.05, 0.1, 0.2, 0.5, 1}
	floors := []float64{0, 0.1, 0.5, 1, 3.3}
	sliceLens := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second}
	var admittedTotal, refusedTotal int
	for run := range runs {
		ratio := ratios[rng.IntN(len(ratios))]
		if rng.IntN(4) == 0 {
			ratio = rng.Float64()
		}
		perSec := floors[rng.IntN(len(floors))]
		slices := 1 + rng.IntN(20)
		slice := sliceLens[rng.IntN(len(sliceLens))]
		window := slice * time.Duration(slices)
		b := newBudget(t, ratio, perSec, window, slices)
		m := newModel(ratio, perSec, window, slices)
		backwards := run%5 == 4 // some runs let time jump back a little
		now := t0
		depositP := rng.Float64()
		for op := range ops {
			// Arrival pattern: mostly small steps and bursts, sometimes a
			// step to just before or exactly at a slice boundary, or a gap.
			switch r := rng.IntN(100); {
			case r < 40: // burst: same instant
			case r < 75:
				now = now.Add(time.Duration(rng.Int64N(int64(slice) / 2)))
			case r < 85:
				k := now.Sub(t0)/slice + 1
				now = t0.Add(k*slice - time.Duration(rng.IntN(2))) // boundary or 1 ns before
			case r < 92:
				now = now.Add(time.Duration(rng.Int64N(int64(window) * 3)))
			case r < 95:
				depositP = rng.Float64() // the traffic mix changes
			default:
				if backwards {
					now = now.Add(-time.Duration(rng.Int64N(int64(window))))
				}
			}
			if rng.Float64() < depositP {
				b.depositAt(now)
				m.deposit(now)
				continue
			}
			got := b.withdrawAt(now)
			want, cur := m.withdraw(now)
			if got != want {
				t.Fatalf("run %d op %d (ratio %v floor %v/s window %v/%d): Withdraw at +%v = %v, model says %v",
					run, op, ratio, perSec, window, slices, now.Sub(t0), got, want)
			}
			if got {
				admittedTotal++
				retries, requests := m.sum(m.retries, cur), m.live(cur)
				if limit := (ratio*float64(requests) + perSec*window.Seconds()) * (1 + 1e-12); float64(retries) > limit {
					t.Fatalf("run %d op %d: %d retries admitted in the window with %d requests, limit %v",
						run, op, retries, requests, limit)
				}
			} else {
				refusedTotal++
			}
			st := b.statsAt(now)
			if st.Retries != m.sum(m.retries, cur) || st.Requests != m.live(cur) {
				t.Fatalf("run %d op %d: Stats at +%v = %+v, model has %d requests %d retries",
					run, op, now.Sub(t0), st, m.live(cur), m.sum(m.retries, cur))
			}
		}
		// Over every window of Slices slices, whether or not it ends in an
		// admission, the retries are at most Ratio times the requests of
		// that window and the one before it, plus the floor: the last
		// admission in the window was checked against a window that
		// started at most one window earlier.
		checkEveryWindow(t, run, m, ratio, perSec*window.Seconds())
		// Over every window ending in a slice where a retry was admitted,
		// the final counts obey the bound too (later deposits only raise
		// the limit; later retries of that window were checked themselves).
		for s := range m.retries {
			retries, requests := m.sum(m.retries, s), m.sum(m.requests, s)
			if limit := (ratio*float64(requests) + perSec*window.Seconds()) * (1 + 1e-12); float64(retries) > limit {
				t.Fatalf("run %d: window ending in slice %d holds %d retries, %d requests, limit %v",
					run, s, retries, requests, limit)
			}
		}
	}
	// The generator must exercise both outcomes, or the test proves little.
	if admittedTotal < runs*10 || refusedTotal < runs*10 {
		t.Fatalf("admitted %d, refused %d: the random patterns do not exercise the budget", admittedTotal, refusedTotal)
	}
}

// checkEveryWindow checks, for every window (k−S, k] that holds a retry,
// retries ≤ ratio·requests(k−2S, k] + reserve, using the model's full
// history.
func checkEveryWindow(t *testing.T, run int, m *model, ratio, reserve float64) {
	t.Helper()
	type prefix struct {
		keys []int64
		sums []int // sums[i] = total of counts over keys[:i]
	}
	build := func(counts map[int64]int) prefix {
		keys := slices.Sorted(maps.Keys(counts))
		p := prefix{keys: keys, sums: make([]int, len(keys)+1)}
		for i, k := range keys {
			p.sums[i+1] = p.sums[i] + counts[k]
		}
		return p
	}
	// in returns the total over slices in (a, b].
	in := func(p prefix, a, b int64) int {
		lo, _ := slices.BinarySearch(p.keys, a+1)
		hi, _ := slices.BinarySearch(p.keys, b+1)
		return p.sums[hi] - p.sums[lo]
	}
	ret, req := build(m.retries), build(m.requests)
	for _, j := range ret.keys {
		for k := j; k < j+m.slices; k++ {
			retries := in(ret, k-m.slices, k)
			requests := in(req, k-2*m.slices, k)
			if limit := (ratio*float64(requests) + reserve) * (1 + 1e-12); float64(retries) > limit {
				t.Fatalf("run %d: window ending in slice %d holds %d retries; the two windows up to it hold %d requests; limit %v",
					run, k, retries, requests, limit)
			}
		}
	}
}

// TestConcurrentSameSlice: many goroutines withdraw at once from a budget
// funded by concurrent deposits; exactly floor(limit) are admitted.
func TestConcurrentSameSlice(t *testing.T) {
	const (
		goroutines = 16
		deposits   = 1000 // per goroutine
		withdraws  = 500  // per goroutine
	)
	b := newBudget(t, 0.1, 1, 10*time.Second, 10)
	at := t0.Add(5 * time.Second)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range deposits {
				b.depositAt(at)
			}
		})
	}
	wg.Wait()
	var admitted atomic.Int64
	for range goroutines {
		wg.Go(func() {
			for range withdraws {
				if b.withdrawAt(at) {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	want := int64(0.1*goroutines*deposits + 10) // 1610
	if got := admitted.Load(); got != want {
		t.Fatalf("%d goroutines admitted %d withdrawals, want exactly %d", goroutines, got, want)
	}
	if st := b.statsAt(at); st.Requests != goroutines*deposits || int64(st.Retries) != want {
		t.Fatalf("Stats = %+v, want Requests %d Retries %d", st, goroutines*deposits, want)
	}
}

// TestConcurrentMixed: deposits and withdrawals race in phases on a clock
// that moves between phases (across slice boundaries, sometimes by whole
// windows). Within a phase every goroutine uses the same time. After each
// phase the window must obey the bound, and draining the rest of it must
// reach the limit exactly: nothing over-admitted, nothing lost.
func TestConcurrentMixed(t *testing.T) {
	const (
		goroutines = 8
		perG       = 300
		slices     = 5
		slice      = time.Second
	)
	phases := 60
	if testing.Short() {
		phases = 20
	}
	b := newBudget(t, 0.2, 0.3, slices*slice, slices)
	rng := rand.New(rand.NewPCG(7, 11))
	requests := map[int64]int{}
	retries := map[int64]int{}
	sum := func(m map[int64]int, cur int64) (n int) {
		for s := cur - slices + 1; s <= cur; s++ {
			n += m[s]
		}
		return n
	}
	now := t0
	for phase := range phases {
		now = now.Add(time.Duration(rng.Int64N(int64(3 * slice))))
		cur := int64(now.Sub(t0) / slice)
		var deps, adm atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			seed := rng.Uint64()
			wg.Go(func() {
				r := rand.New(rand.NewPCG(seed, uint64(g)))
				for range perG {
					if r.IntN(3) > 0 {
						b.depositAt(now)
						deps.Add(1)
					} else if b.withdrawAt(now) {
						adm.Add(1)
					}
				}
			})
		}
		wg.Wait()
		requests[cur] += int(deps.Load())
		retries[cur] += int(adm.Load())
		limit := (0.2*float64(sum(requests, cur)) + 0.3*float64(slices)) * (1 + 1e-12)
		if got := sum(retries, cur); float64(got) > limit {
			t.Fatalf("phase %d: %d retries admitted in the window, limit %v", phase, got, limit)
		}
		// Drain the rest sequentially: the total must hit floor(limit).
		retries[cur] += drain(t, b, now)
		if got, want := sum(retries, cur), int(math.Floor(limit)); got != want {
			t.Fatalf("phase %d: window holds %d retries after draining, want floor(%v) = %d", phase, got, limit, want)
		}
		if st := b.statsAt(now); st.Requests != sum(requests, cur) || st.Retries != sum(retries, cur) {
			t.Fatalf("phase %d: Stats = %+v, want Requests %d Retries %d",
				phase, st, sum(requests, cur), sum(retries, cur))
		}
	}
}

// TestConcurrentBoundary: goroutines withdraw at times on both sides of a
// slice boundary at once, so heads move while others admit: the budget's
// clock hands each call the next of four times around the boundary. The
// total over the window must not exceed the limit.
func TestConcurrentBoundary(t *testing.T) {
	for round := range 20 {
		times := []time.Time{
			t0.Add(time.Second - 1), t0.Add(time.Second), t0.Add(2*time.Second - 1), t0.Add(2 * time.Second),
		}
		var calls atomic.Int64
		b, err := budget.New(budget.Config{
			Ratio: -1, MinPerSecond: 1, Window: 4 * time.Second, Slices: 4, // floor only: 4 per window
			Now: func() time.Time {
				if n := calls.Add(1); n > 1 { // the first reading is New's: slice 0 starts at t0
					return times[n%int64(len(times))]
				}
				return t0
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 20 {
					if b.Withdraw() {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		// Every slice used is within one window (slices 0..2), so at most
		// 4 retries are admitted, and since withdrawals continue after the
		// head stops moving, exactly 4.
		if got := admitted.Load(); got != 4 {
			t.Fatalf("round %d: admitted %d across a slice boundary, want exactly 4", round, got)
		}
	}
}

func TestZeroAllocs(t *testing.T) {
	b := newBudget(t, 0.1, 1, 10*time.Second, 10)
	tests := []struct {
		name string
		fn   func()
	}{
		{"Deposit", func() { b.Deposit() }},
		{"DepositN", func() { b.DepositN(3) }},
		{"Withdraw", func() { b.Withdraw() }},
		{"Stats", func() { _ = b.Stats() }},
		{"moving clock", func() { b.clk.Advance(time.Second); b.Deposit(); b.Withdraw() }},
	}
	for _, tt := range tests {
		if n := testing.AllocsPerRun(1000, tt.fn); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", tt.name, n)
		}
	}
}

// TestRealClockDefault checks that a nil Now means time.Now, inside a
// synctest bubble where time is fake and sleeping costs nothing.
func TestRealClockDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: -1, Window: 2 * time.Second, Slices: 2})
		if err != nil {
			t.Fatal(err)
		}
		b.Deposit()
		b.Deposit()
		if !b.Withdraw() || b.Withdraw() {
			t.Fatal("Withdraw, Withdraw after 2 deposits at ratio 0.5 = want true, false")
		}
		time.Sleep(2 * time.Second) // the window slides past everything
		if st := b.Stats(); st.Requests != 0 || st.Retries != 0 {
			t.Fatalf("Stats() 2 s later = %+v, want an empty window", st)
		}
	})
}

// DepositN counts like n Deposit calls, saturating at 16,777,215 per
// slice.
func TestDepositN(t *testing.T) {
	const maxCount = 1<<24 - 1
	a := newBudget(t, 0.5, 0, 10*time.Second, 10)
	b := newBudget(t, 0.5, 0, 10*time.Second, 10)
	at := t0.Add(1500 * time.Millisecond)
	for range 40 {
		a.depositAt(at)
	}
	b.clk.Set(at)
	b.DepositN(40)
	b.DepositN(0)
	b.DepositN(-5)
	if sa, sb := a.statsAt(at), b.statsAt(at); sa != sb || sb.Requests != 40 {
		t.Errorf("DepositN(40) stats %+v, 40 Deposit %+v; want equal, 40 requests", sb, sa)
	}
	c := newBudget(t, 0.5, 0, 10*time.Second, 10)
	c.clk.Set(at)
	c.DepositN(maxCount - 1)
	c.DepositN(10)
	c.DepositN(math.MaxInt)
	if s := c.statsAt(at); s.Requests != maxCount {
		t.Errorf("DepositN past the largest count: %d requests, want %d (saturated)", s.Requests, maxCount)
	}
	d := newBudget(t, 0.5, 0, time.Second, 1)
	d.DepositN(7)
	d.clk.Set(t0.Add(time.Second))
	d.DepositN(3) // the next slice resets the word
	if s := d.statsAt(t0.Add(time.Second)); s.Requests != 3 {
		t.Errorf("after the slice moved on: %d requests, want 3", s.Requests)
	}
}

// Clock readings centuries apart (beyond what a Duration holds) neither
// panic nor wrap round: time differences saturate, a far-future slice is a
// window of its own, and a reading far in the past counts in the newest
// slice a retry was admitted in.
func TestFarClockReadings(t *testing.T) {
	now := t0                                                                                               // a time.Time: the fake clock's int64 nanoseconds cannot hold these
	b, err := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: 0.1, Window: 10 * time.Second, Slices: 10, // floor: 1 retry per window
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	drainAt := func(at time.Time) int {
		now = at
		n := 0
		for b.Withdraw() {
			if n++; n > 100 {
				t.Fatalf("Withdraw at %v never refuses", at)
			}
		}
		return n
	}
	for range 4 {
		b.Deposit()
	}
	if got := drainAt(t0); got != 3 { // 0.5·4 + 1
		t.Fatalf("drain at t0 admitted %d, want 3", got)
	}
	far := t0.Add(math.MaxInt64).Add(math.MaxInt64) // ~584 years on
	if got := drainAt(far); got != 1 {
		t.Fatalf("drain ~584 years on admitted %d, want 1 (the floor of an empty window)", got)
	}
	now = t0.Add(math.MinInt64).Add(math.MinInt64)
	b.Deposit() // long expired: no panic
	if got := drainAt(now); got != 0 {
		t.Fatalf("drain ~584 years back admitted %d, want 0 (it counts in the newest slice, already spent)", got)
	}
}
