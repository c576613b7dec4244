package breaker_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// TestSlowCall: with SlowCall set, a success that took SlowCall or longer
// counts as a failure (it trips the breaker by the usual rule, and a slow
// probe reopens it); faster ones, and every call with SlowCall 0, count as
// successes.
func TestSlowCall(t *testing.T) {
	tests := []struct {
		name     string
		slowCall time.Duration
		took     time.Duration // each call's time, Allow to Done(true)
		want     breaker.State
	}{
		{"off: slow successes are successes", 0, time.Hour, breaker.Closed},
		{"below the threshold", 100 * time.Millisecond, 99 * time.Millisecond, breaker.Closed},
		{"at the threshold", 100 * time.Millisecond, 100 * time.Millisecond, breaker.Open},
		{"above the threshold", 100 * time.Millisecond, time.Second, breaker.Open},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 5; c.SlowCall = tt.slowCall })
			for range 5 {
				p, err := h.b.Allow()
				if err != nil {
					t.Fatalf("Allow() = %v", err)
				}
				h.clk.Advance(tt.took)
				h.b.Done(p, true)
			}
			if got := h.b.State(); got != tt.want {
				t.Errorf("state after 5 successes of %v = %v, want %v", tt.took, got, tt.want)
			}
		})
	}
}

// TestSlowCallForms: Execute, Wait and probes measure the same way; a slow
// probe reopens the breaker, a fast round closes it; a call that waited is
// timed from its admission.
func TestSlowCallForms(t *testing.T) {
	const slow = 100 * time.Millisecond
	h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 2; c.SlowCall = slow; c.Probes = 1; c.OpenFor = time.Second })
	for range 2 {
		_ = h.b.Execute(func() error { h.clk.Advance(slow); return nil })
	}
	if s := h.b.State(); s != breaker.Open {
		t.Fatalf("state after 2 slow Executes = %v, want open", s)
	}
	h.clk.Advance(time.Second)
	p, err := h.b.Wait(context.Background(), time.Minute)
	if err != nil || !p.Probe() {
		t.Fatalf("Wait after the open period = %+v, %v; want a probe", p, err)
	}
	h.clk.Advance(slow)
	h.b.Done(p, true)
	if s := h.b.State(); s != breaker.Open {
		t.Fatalf("state after a slow probe = %v, want open again", s)
	}
	h.clk.Advance(time.Second)
	p, err = h.b.Allow()
	if err != nil || !p.Probe() {
		t.Fatalf("Allow after the open period = %+v, %v; want a probe", p, err)
	}
	h.clk.Advance(slow - 1)
	h.b.Done(p, true)
	if s := h.b.State(); s != breaker.Closed {
		t.Fatalf("state after a fast probe = %v, want closed", s)
	}
}
