package pace_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/pace"
)

// release runs p from start to end, ticking when due, and returns the
// times at which it released calls (each at the start of its tick's
// spread), with waiting calls always left.
func release(p *pace.Pacer, start, end time.Duration) []time.Duration {
	var at []time.Duration
	for now := start; now < end; now += p.Interval() {
		p.Tick(now)
		for p.Take() {
			at = append(at, now)
		}
		p.EndTick(true)
	}
	return at
}

func TestCeiling(t *testing.T) {
	tests := []struct {
		set   float64
		calls uint64
		span  time.Duration
		floor float64
		want  float64
	}{
		{0, 500, 10 * time.Second, 3, 50},
		{0, 500, 2 * time.Second, 3, 250},
		{0, 10, 10 * time.Second, 3, 3},
		{42, 500, time.Second, 3, 42},
		{-1, 500, time.Second, 3, math.Inf(1)},
	}
	for _, tt := range tests {
		if got := pace.Ceiling(tt.set, tt.calls, tt.span, tt.floor); got != tt.want {
			t.Errorf("Ceiling(%v, %d, %v, %v) = %v, want %v", tt.set, tt.calls, tt.span, tt.floor, got, tt.want)
		}
	}
}

// A slow start: a quarter of the ceiling, doubling every half second, up to
// the ceiling.
func TestSlowStart(t *testing.T) {
	var p pace.Pacer
	p.Start(time.Hour, 400, 3)
	if r := p.Rate(); r != 100 {
		t.Fatalf("rate after Start(ceiling 400) = %v, want 100", r)
	}
	if d := p.Interval(); d != 10*time.Millisecond {
		t.Fatalf("Interval at 100/s = %v, want 10ms", d)
	}
	at := release(&p, time.Hour, time.Hour+2*time.Second)
	if r := p.Rate(); r != 400 {
		t.Errorf("rate after 2 s = %v, want the ceiling 400", r)
	}
	// 100/s doubling every 0.5 s to 400/s: ~ 1 + 0.5·(100+200)/ln2·... at
	// least the integral of the slow start, at most the ceiling's.
	if n := len(at); n < 400 || n > 800 {
		t.Errorf("released %d calls in 2 s, want between 400 (slow start) and 800 (the ceiling)", n)
	}
	if at[0] != time.Hour {
		t.Errorf("first release at %v, want at once (the credit of one call)", at[0])
	}
}

// A failure halves the rate, once per tick, never below the floor, and
// the tick after it does not grow the rate.
func TestSlowDown(t *testing.T) {
	var p pace.Pacer
	p.Start(0, 100, 3)
	p.SlowDown(0)
	if r := p.Rate(); r != 12.5 {
		t.Fatalf("rate after one slow-down = %v, want 12.5", r)
	}
	p.SlowDown(time.Millisecond) // the same tick (80 ms at 12.5/s)
	if r := p.Rate(); r != 12.5 {
		t.Fatalf("rate after a second slow-down in the same tick = %v, want 12.5", r)
	}
	p.Tick(80 * time.Millisecond)
	if r := p.Rate(); r != 12.5 {
		t.Fatalf("rate after the tick that followed a slow-down = %v, want 12.5 (no growth)", r)
	}
	for i := range 10 {
		p.SlowDown(time.Duration(i+1) * 2 * time.Second)
	}
	if r := p.Rate(); r != 3 {
		t.Fatalf("rate after many slow-downs = %v, want the floor 3", r)
	}
	p.Tick(30 * time.Second) // slowed since the last tick: no growth
	p.Tick(35 * time.Second)
	if r := p.Rate(); r != 100 {
		t.Errorf("rate after a clean tick long after = %v, want back to the ceiling 100", r)
	}
}

// With nothing left to release, the credit is capped at one call.
func TestEndTickCapsCredit(t *testing.T) {
	var p pace.Pacer
	p.Start(0, 10, 1)
	p.Tick(time.Minute)
	p.EndTick(false)
	n := 0
	for p.Take() {
		n++
	}
	if n != 1 {
		t.Errorf("after a minute idle with nothing to release: %d calls of credit, want 1", n)
	}
}

// An unbounded ceiling releases everything at once, with no spread.
func TestUnbounded(t *testing.T) {
	var p pace.Pacer
	p.Start(0, math.Inf(1), 3)
	if spread := p.Tick(0); spread != 0 {
		t.Errorf("spread at an unbounded rate = %v, want 0", spread)
	}
	for range 100_000 {
		if !p.Take() {
			t.Fatal("an unbounded pacer ran out of credit")
		}
	}
	p.SlowDown(0)
	if !math.IsInf(p.Rate(), 1) {
		t.Errorf("rate after a slow-down at an unbounded ceiling = %v, want +Inf", p.Rate())
	}
}

// A controller moves the ceiling: down at once, up by growth.
func TestSetCeiling(t *testing.T) {
	var p pace.Pacer
	p.Start(0, 400, 2)
	p.SetCeiling(50)
	if r := p.Rate(); r != 50 {
		t.Fatalf("rate after SetCeiling(50) from 100 = %v, want 50", r)
	}
	p.SetCeiling(1)
	if r := p.Rate(); r != 2 {
		t.Fatalf("rate after SetCeiling(1) below the floor 2 = %v, want 2", r)
	}
	p.SetCeiling(1000)
	p.Tick(500 * time.Millisecond)
	if r := p.Rate(); r != 4 {
		t.Errorf("rate half a second after SetCeiling(1000) from 2 = %v, want 4 (doubling, not a jump)", r)
	}
}

// The zero Pacer releases nothing.
func TestZero(t *testing.T) {
	var p pace.Pacer
	p.Tick(time.Hour)
	if p.Take() {
		t.Error("the zero Pacer released a call")
	}
	if d := p.Interval(); d != 10*time.Millisecond {
		t.Errorf("Interval of the zero Pacer = %v, want 10ms", d)
	}
}

// Interval is one call's slot within [10 ms, 1 s], also at rates whose slot
// in nanoseconds does not fit a Duration (below about 1e-10 calls a second).
func TestIntervalBounds(t *testing.T) {
	for _, tt := range []struct {
		rate float64
		want time.Duration
	}{
		{1000, 10 * time.Millisecond},
		{50, 20 * time.Millisecond},
		{2, 500 * time.Millisecond},
		{1, time.Second},
		{0.5, time.Second},
		{1e-12, time.Second},
		{1e-300, time.Second},
		{5e-324, time.Second},
	} {
		var p pace.Pacer
		p.Start(0, tt.rate, tt.rate) // a floor at the ceiling: the rate is tt.rate
		if r := p.Rate(); r != tt.rate {
			t.Fatalf("Start(ceiling %v, floor %v): rate %v", tt.rate, tt.rate, r)
		}
		if got := p.Interval(); got != tt.want {
			t.Errorf("Interval at %v/s = %v, want %v", tt.rate, got, tt.want)
		}
	}
}
