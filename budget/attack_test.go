// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package budget_test

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

type atkClock struct{ ns atomic.Int64 }

func (c *atkClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *atkClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

func TestAttackNewIffValidation(t *testing.T) {
	ok := []budget.Config{
		{Ratio: math.Inf(-1)},
		{Ratio: 1},
		{MinPerSecond: math.MaxFloat64},
		{MinPerSecond: -math.MaxFloat64},
		{Window: time.Millisecond, Slices: 1},
		{Window: 3600 * time.Millisecond, Slices: 3600},
		{Window: time.Duration(math.MaxInt64 / 3600 * 3600), Slices: 3600},
		{Window: 10 * time.Millisecond},
	}
	for _, c := range ok {
		if _, err := budget.New(c); err != nil {
			t.Errorf("New(%+v) = %v, want ok", c, err)
		}
	}
	bad := []budget.Config{
		{Ratio: math.NaN()}, {Ratio: math.Nextafter(1, 2)}, {Ratio: math.Inf(1)},
		{MinPerSecond: math.NaN()}, {MinPerSecond: math.Inf(1)}, {MinPerSecond: math.Inf(-1)},
		{Window: -1}, {Slices: -1}, {Slices: 3601},
		{Window: 3*time.Millisecond + 1, Slices: 2},
		{Window: 9 * time.Millisecond},
		{Window: 3599 * time.Millisecond, Slices: 3600},
	}
	for _, c := range bad {
		b, err := budget.New(c)
		if err == nil || b != nil || !strings.HasPrefix(err.Error(), "budget: invalid config: ") {
			t.Errorf("New(%+v) = %v, %v; want an invalid-config error", c, b, err)
		}
	}
}

func TestAttackHugeFloorAndWindow(t *testing.T) {
	c := &atkClock{}
	b, err := budget.New(budget.Config{MinPerSecond: math.MaxFloat64, Ratio: -1, Now: c.Now, Slices: 1, Window: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i++ {
		if !b.Withdraw() {
			t.Fatalf("withdraw %d refused with an infinite floor", i)
		}
	}
	if s := b.Stats(); s.Retries != 1000 {
		t.Errorf("stats %+v", s)
	}
	// Huge window.
	c2 := &atkClock{}
	w := time.Duration(math.MaxInt64 / 10 * 10)
	b2, err := budget.New(budget.Config{Window: w, Now: c2.Now, MinPerSecond: -1, Ratio: 1})
	if err != nil {
		t.Fatal(err)
	}
	b2.Deposit()
	c2.Advance(w - 1)
	if !b2.Withdraw() {
		t.Errorf("withdraw in the last slice of a huge window refused; stats %+v", b2.Stats())
	}
	if b2.Withdraw() {
		t.Errorf("second withdraw admitted; stats %+v", b2.Stats())
	}
	c2.Advance(math.MaxInt64) // saturates
	s := b2.Stats()
	t.Logf("far stats %+v", s)
}

// Exact expiry: "A slice expires exactly when its Slices-th successor begins."
func TestAttackExactExpiry(t *testing.T) {
	c := &atkClock{}
	c.ns.Store(1_000_000_000_000)
	b, _ := budget.New(budget.Config{Window: 2 * time.Second, Slices: 2, Ratio: 1, MinPerSecond: -1, Now: c.Now})
	b.Deposit()
	c.Advance(2*time.Second - 1)
	if s := b.Stats(); s.Requests != 1 {
		t.Errorf("at 2s-1ns stats %+v, want 1 request", s)
	}
	c.Advance(1)
	if s := b.Stats(); s.Requests != 0 {
		t.Errorf("at 2s stats %+v, want 0 request", s)
	}
	if b.Withdraw() {
		t.Errorf("withdraw admitted after expiry")
	}
}

// Backwards time: a withdrawal older than the head counts in the head slice;
// a deposit whose slice word was reused is dropped.
func TestAttackBackwardsClock(t *testing.T) {
	c := &atkClock{}
	c.ns.Store(1_000_000_000_000)
	b, _ := budget.New(budget.Config{Window: 3 * time.Second, Slices: 3, Ratio: -1, MinPerSecond: 1, Now: c.Now})
	c.Advance(5 * time.Second)
	for i := 0; i < 3; i++ {
		if !b.Withdraw() {
			t.Fatalf("withdraw %d refused", i)
		}
	}
	c.Advance(-5 * time.Second)
	if b.Withdraw() {
		t.Errorf("withdraw with clock back admitted; head slice already full")
	}
	c.Advance(5 * time.Second)
	if s := b.Stats(); s.Retries != 3 {
		t.Errorf("stats %+v, want 3 retries", s)
	}
	c.Advance(-5 * time.Second) // the deposit: slice 0, its word (0) free -> counted? fine either way
	b.Deposit()
	c.Advance(5*time.Second + 3*time.Second) // slice 8: window 6..8
	if s := b.Stats(); s.Requests != 0 || s.Retries != 0 {
		t.Errorf("stats %+v at slice 8, want empty", s)
	}
}

func TestAttackConcurrentNeverOverAdmits(t *testing.T) {
	c := &atkClock{}
	b, _ := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: 1, Window: 10 * time.Second, Now: c.Now})
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				b.Deposit()
				if b.Withdraw() {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// 8000 deposits: limit 4000 + 10.
	if n := admitted.Load(); n > 4010 {
		t.Errorf("admitted %d > limit 4010", n)
	}
	if s := b.Stats(); s.Retries != int(admitted.Load()) || s.Requests != 8000 {
		t.Errorf("stats %+v admitted %d", s, admitted.Load())
	}
}

func TestAttackZeroValueConcurrent(t *testing.T) {
	var b budget.Budget
	var wg sync.WaitGroup
	var n atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if b.Withdraw() {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if n.Load() != 10 {
		t.Errorf("zero Budget admitted %d retries with no deposits, want the floor 10", n.Load())
	}
	cfg := b.Config()
	if cfg.Ratio != 0.1 || cfg.MinPerSecond != 1 || cfg.Window != 10*time.Second || cfg.Slices != 10 || cfg.Now != nil {
		t.Errorf("config %+v", cfg)
	}
}

// Package doc: "the rule holds while the clock readings of a budget's calls
// are less than 2^39 slices apart ... and within about 292 years of New".
// "A slice expires exactly when its Slices-th successor begins." A
// black-box attack found the window stuck 300 years on, against a doc that
// promised 17,400 years: a reading is a time.Duration from New, and the
// doc now says so; 280 years on, the window slides.
func TestAttackFarReadingsWindowSlides(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var now atomic.Pointer[time.Time]
	now.Store(&base)
	clock := func() time.Time { return *now.Load() }
	b, err := budget.New(budget.Config{Now: clock}) // defaults: 10 s window, 1 s slices
	if err != nil {
		t.Fatal(err)
	}
	later := base.AddDate(280, 0, 0) // 280 years on: ~8.8e9 slices, far below 2^39
	now.Store(&later)
	b.Deposit()
	if s := b.Stats(); s.Requests != 1 {
		t.Fatalf("stats %+v, want the deposit", s)
	}
	after := later.Add(time.Minute) // a minute later the deposit has long expired
	now.Store(&after)
	if s := b.Stats(); s.Requests != 0 {
		t.Errorf("a minute after a deposit made 280 years after New, Stats %+v: the deposit has not expired", s)
	}
	for i := 0; i < 10; i++ {
		b.Withdraw()
	}
	after2 := after.Add(time.Hour)
	now.Store(&after2)
	if !b.Withdraw() {
		t.Errorf("an hour after the floor was spent, Withdraw refused: the window does not slide (stats %+v)", b.Stats())
	}
}
