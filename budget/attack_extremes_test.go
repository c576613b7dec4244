package budget_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// New: "It returns an error ... if and only if Ratio is NaN or above 1,
// MinPerSecond is NaN or infinite, Window is negative, Slices is outside
// [0, 3600], or Window is not a multiple of Slices nanoseconds of at least
// 1 ms each."
func TestAttackExtremesNewEdges(t *testing.T) {
	bad := map[string]budget.Config{
		"ratio NaN":          {Ratio: math.NaN()},
		"ratio +Inf":         {Ratio: math.Inf(1)},
		"ratio 1+eps":        {Ratio: math.Nextafter(1, 2)},
		"floor NaN":          {MinPerSecond: math.NaN()},
		"floor +Inf":         {MinPerSecond: math.Inf(1)},
		"floor -Inf":         {MinPerSecond: math.Inf(-1)},
		"window -1":          {Window: -1},
		"window MinInt64":    {Window: math.MinInt64},
		"slices -1":          {Slices: -1},
		"slices 3601":        {Slices: 3601},
		"slices MaxInt":      {Slices: math.MaxInt},
		"window 9ms/10":      {Window: 9 * time.Millisecond},
		"window 10s+1/10":    {Window: 10*time.Second + 1},
		"window max/10":      {Window: math.MaxInt64},
		"window 1ns/1":       {Window: 1, Slices: 1},
		"window 3599ms/3600": {Window: 3599 * time.Millisecond, Slices: 3600},
	}
	for name, c := range bad {
		if b, err := budget.New(c); err == nil || b != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, b, err)
		}
	}
	good := map[string]budget.Config{
		"ratio -Inf":       {Ratio: math.Inf(-1)},
		"ratio 1":          {Ratio: 1},
		"ratio tiny":       {Ratio: math.SmallestNonzeroFloat64},
		"floor MaxFloat":   {MinPerSecond: math.MaxFloat64},
		"floor -MaxFloat":  {MinPerSecond: -math.MaxFloat64},
		"window 1ms/1":     {Window: time.Millisecond, Slices: 1},
		"window max/7":     {Window: math.MaxInt64, Slices: 7},
		"window 3.6s/3600": {Window: 3600 * time.Millisecond, Slices: 3600},
	}
	for name, c := range good {
		if _, err := budget.New(c); err != nil {
			t.Errorf("%s: New: %v; want success", name, err)
		}
	}
}

// Ratio -Inf "means none: only the floor is left": with no requests the
// floor (MinPerSecond·Window.Seconds() = 10) still admits 10 retries, and
// the limit is never NaN (-Inf·0).
func TestAttackExtremesNegativeInfiniteRatioKeepsFloor(t *testing.T) {
	now := time.Unix(1000, 0)
	b, err := budget.New(budget.Config{Ratio: math.Inf(-1), Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for b.Withdraw() {
		n++
		if n > 100 {
			break
		}
	}
	if n != 10 {
		t.Errorf("ratio -Inf, no requests: %d retries admitted, want the floor's 10", n)
	}
	for range 1000 {
		b.Deposit()
	}
	if s := b.Stats(); math.IsNaN(s.Limit) || s.Limit != 10 {
		t.Errorf("Stats %+v, want Limit 10", s)
	}
}

// MinPerSecond of MaxFloat64 makes the floor infinite: every withdrawal is
// admitted, never refused by an overflowed (NaN or negative) limit; the
// counts saturate at 16,777,215 per slice.
func TestAttackExtremesHugeFloorAlwaysAdmits(t *testing.T) {
	now := time.Unix(1000, 0)
	b, err := budget.New(budget.Config{MinPerSecond: math.MaxFloat64, Ratio: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1<<16; i++ {
		if !b.Withdraw() {
			t.Fatalf("withdrawal %d refused under an infinite floor (Stats %+v)", i, b.Stats())
		}
	}
	// A negative huge floor: none.
	b2, err := budget.New(budget.Config{MinPerSecond: -math.MaxFloat64, Ratio: 1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	b2.DepositN(10)
	n := 0
	for b2.Withdraw() && n < 100 {
		n++
	}
	if n != 10 {
		t.Errorf("no floor, ratio 1, 10 requests: %d retries, want 10", n)
	}
}

// The largest window (MaxInt64 in 7 slices): deposits and withdrawals work
// with clock readings far apart (years), none panics.
func TestAttackExtremesMaxWindow(t *testing.T) {
	now := time.Unix(1000, 0)
	b, err := budget.New(budget.Config{Window: math.MaxInt64, Slices: 7, Ratio: 1, MinPerSecond: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	b.DepositN(3)
	now = now.Add(100 * 365 * 24 * time.Hour)
	n := 0
	for b.Withdraw() && n < 10 {
		n++
	}
	if n != 3 {
		t.Errorf("3 requests a century ago in a 292-year window, ratio 1: %d retries, want 3", n)
	}
	// DepositN extremes.
	b.DepositN(math.MinInt)
	b.DepositN(math.MaxInt)
	if s := b.Stats(); s.Requests < 0 || s.Requests > 2*16777215 {
		t.Errorf("Stats after DepositN(MaxInt): %+v", s)
	}
}
