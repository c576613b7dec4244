package breaker_test

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// TestConsecutiveFailures: with ConsecutiveFailures set, a run of that many
// closed-state failures trips the breaker whatever the ratio and MinCalls;
// a success, or a state change, ends the run; 0 leaves only the ratio.
func TestConsecutiveFailures(t *testing.T) {
	type step struct {
		success bool
		n       int
		want    breaker.State
	}
	tests := []struct {
		name   string
		consec int
		steps  []step
	}{
		{"off by default: 19 failures stay below MinCalls", 0, []step{
			{false, 19, breaker.Closed},
		}},
		{"a run of 5 trips below MinCalls", 5, []step{
			{false, 4, breaker.Closed},
			{false, 1, breaker.Open},
		}},
		{"a run of 1 trips on the first failure", 1, []step{
			{false, 1, breaker.Open},
		}},
		{"a success ends the run", 5, []step{
			{false, 4, breaker.Closed},
			{true, 1, breaker.Closed},
			{false, 4, breaker.Closed},
			{true, 1, breaker.Closed},
			{false, 4, breaker.Closed},
			{false, 1, breaker.Open},
		}},
		{"a long healthy past does not delay it", 3, []step{
			{true, 1000, breaker.Closed},
			{false, 2, breaker.Closed},
			{false, 1, breaker.Open},
		}},
		{"the ratio still trips with the rule on", 100, []step{
			{false, 10, breaker.Closed},
			{true, 1, breaker.Closed},
			{false, 8, breaker.Closed}, // 19 calls: below MinCalls, a run of 8
			{false, 1, breaker.Open},   // 19 failures of 20 calls: the ratio
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(c *breaker.Config) { c.ConsecutiveFailures = tt.consec })
			for i, s := range tt.steps {
				h.calls(t, s.n, s.success)
				if got := h.b.State(); got != s.want {
					t.Fatalf("step %d (%d x success=%v): state %v, want %v", i, s.n, s.success, got, s.want)
				}
			}
		})
	}
}

// TestConsecutiveFailuresAfterClose: a breaker that closes again starts
// its run from 0: the failures before it tripped do not count.
func TestConsecutiveFailuresAfterClose(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.ConsecutiveFailures = 3; c.Probes = 1 })
	h.calls(t, 3, false)
	if s := h.b.State(); s != breaker.Open {
		t.Fatalf("after 3 failures: %v, want open", s)
	}
	h.clk.Advance(31 * time.Second)
	h.calls(t, 1, true) // the probe closes it
	if s := h.b.State(); s != breaker.Closed {
		t.Fatalf("after the probe: %v, want closed", s)
	}
	h.calls(t, 2, false)
	if s := h.b.State(); s != breaker.Closed {
		t.Fatalf("2 failures after the close: %v, want closed (the run restarted)", s)
	}
	h.calls(t, 1, false)
	if s := h.b.State(); s != breaker.Open {
		t.Fatalf("3 failures after the close: %v, want open", s)
	}
	if got, want := h.rec.get(), []string{"closed>open", "open>half-open", "half-open>closed", "closed>open"}; !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}
}

// TestConsecutiveFailuresExecute: Execute counts by IsFailure, so the rule
// sees the same outcomes.
func TestConsecutiveFailuresExecute(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.ConsecutiveFailures = 2 })
	boom := errors.New("boom")
	for range 2 {
		_ = h.b.Execute(func() error { return boom })
	}
	if s := h.b.State(); s != breaker.Open {
		t.Fatalf("after 2 failing Executes: %v, want open", s)
	}
}

// TestConsecutiveFailuresConcurrent: goroutines failing at once trip the
// breaker exactly once, and -race finds no race on the run.
func TestConsecutiveFailuresConcurrent(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.ConsecutiveFailures = 50; c.MinCalls = 1 << 30 })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if p, err := h.b.Allow(); err == nil {
					h.b.Done(p, false)
				}
			}
		})
	}
	wg.Wait()
	if s := h.b.State(); s != breaker.Open {
		t.Fatalf("state %v, want open", s)
	}
	if got := h.rec.get(); !slices.Equal(got, []string{"closed>open"}) {
		t.Errorf("events %v, want one trip", got)
	}
}

func TestConsecutiveFailuresInvalid(t *testing.T) {
	_, err := breaker.New(breaker.Config{ConsecutiveFailures: -1})
	if err == nil || !strings.HasPrefix(err.Error(), "breaker: invalid config: ") {
		t.Fatalf("New(ConsecutiveFailures: -1) = %v, want an invalid-config error", err)
	}
}

// TestConsecutiveFailuresAllocs: with the rule on, a closed-state success
// and a failure that does not trip allocate nothing.
func TestConsecutiveFailuresAllocs(t *testing.T) {
	h := newHarness(t, func(c *breaker.Config) { c.ConsecutiveFailures = 1 << 20; c.MinCalls = 1 << 30 })
	fail := false
	if n := testing.AllocsPerRun(1000, func() {
		p, _ := h.b.Allow()
		h.b.Done(p, !fail)
		fail = !fail
	}); n != 0 {
		t.Errorf("Allow+Done with ConsecutiveFailures: %v allocs, want 0", n)
	}
}
