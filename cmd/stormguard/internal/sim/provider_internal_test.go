package sim

import (
	"testing"
	"time"
)

const ms = time.Millisecond

// TestProviderAdvance: when a worker that starts an attempt at s finishes
// it, for each trigger (50 ms of work; the trigger from 1 s to 2 s).
func TestProviderAdvance(t *testing.T) {
	for _, tt := range []struct {
		kind   Trigger
		worker int
		start  time.Duration
		want   time.Duration
	}{
		{TriggerError, 0, 1000 * ms, 1050 * ms}, // 503s answer at once; the work itself is as usual
		{TriggerHang, 0, 500 * ms, 550 * ms},    // before
		{TriggerHang, 0, 980 * ms, 2030 * ms},   // 20 ms done, stalled, 30 ms after
		{TriggerHang, 3, 1500 * ms, 2050 * ms},  // starts stalled
		{TriggerHang, 0, 2000 * ms, 2050 * ms},  // after
		{TriggerSlow, 0, 1000 * ms, 1250 * ms},  // 5x slower
		{TriggerSlow, 0, 1990 * ms, 2048 * ms},  // 2 ms of work in the last 10 ms, 48 ms after
		{TriggerSlow, 0, 960 * ms, 1050 * ms},   // 40 ms before, 10 ms at a fifth: 50 ms
		{TriggerCut, 0, 1500 * ms, 1550 * ms},   // one of the workers that keep working
		{TriggerCut, 1, 1500 * ms, 1550 * ms},
		{TriggerCut, 2, 1500 * ms, 2050 * ms}, // stalled
		{TriggerCut, 9, 990 * ms, 2040 * ms},
	} {
		p := newProvider(&OutageConfig{Capacity: 200, Workers: 10, Queue: 100, Trigger: tt.kind, TriggerStart: time.Second, TriggerEnd: 2 * time.Second})
		if got := p.advance(tt.worker, tt.start); got != tt.want {
			t.Errorf("%v worker %d from %v: finishes at %v, want %v", tt.kind, tt.worker, tt.start, got, tt.want)
		}
	}
}

// TestProviderCapacity: a provider offered twice its capacity with a deep
// queue finishes Capacity attempts per second, a fifth of that through a
// slowdown or a cut, none through a hang, and sheds beyond its queue.
func TestProviderCapacity(t *testing.T) {
	for _, tt := range []struct {
		kind Trigger
		want int // finished in the trigger's second
	}{
		{TriggerError, 200}, {TriggerHang, 0}, {TriggerSlow, 40}, {TriggerCut, 40},
	} {
		p := newProvider(&OutageConfig{Capacity: 200, Workers: 10, Queue: 1000, Trigger: tt.kind, TriggerStart: time.Second, TriggerEnd: 2 * time.Second})
		in := 0
		for now := time.Duration(0); now < 2*time.Second; now += 2500 * time.Microsecond { // 400/s
			if f, ok := p.admit(now); ok && f >= time.Second && f < 2*time.Second {
				in++
			}
		}
		if in < tt.want-10 || in > tt.want+10 {
			t.Errorf("%v: %d attempts finished during the trigger, want about %d", tt.kind, in, tt.want)
		}
	}
	p := newProvider(&OutageConfig{Capacity: 200, Workers: 10, Queue: 5})
	shed := 0
	for range 100 {
		if _, ok := p.admit(0); !ok {
			shed++
		}
	}
	if shed != 100-10-5 {
		t.Errorf("100 attempts at once to 10 workers and a queue of 5: %d shed, want 85", shed)
	}
}
