package live

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"
)

// TestMetaOf checks the metastability summary on a hand-made run: 10 s,
// a trigger from 2 s to 4 s, one call per 100 ms.
func TestMetaOf(t *testing.T) {
	pc := ProviderConfig{FailAt: 2 * time.Second, FailFor: 2 * time.Second, Capacity: 10, Work: 100 * time.Millisecond, Window: time.Second, Horizon: 12 * time.Second}
	fc := FleetConfig{Clients: 9, Every: time.Second, Duration: 10 * time.Second, Deadline: 20 * time.Second}
	r := &Result{Provider: pc, Fleet: fc}
	for i := range 100 {
		at := time.Duration(i) * 100 * time.Millisecond
		// Calls fail from 2 s to 6 s (the trigger and 2 s after it).
		ok := at < 2*time.Second || at >= 6*time.Second
		r.Stats.Calls = append(r.Stats.Calls, CallRecord{Start: at, OK: ok})
	}
	r.Windows = make([]Window, 12)
	for i := range r.Windows {
		r.Windows[i] = Window{Start: time.Duration(i) * time.Second, Attempts: 10, Served: 10}
	}
	r.Windows[2].Attempts, r.Windows[3].Attempts = 30, 30 // during: 60 for 20 calls
	r.Windows[4].Wasted, r.Windows[5].Wasted = 10, 10     // 20 of the 80 served after
	r.Windows[9].Shed = 1                                 // from end+5s on
	r.Windows[8].Failed = 2
	m := MetaOf(r)
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"GoodBefore", m.GoodBefore, 1},
		{"GoodDuring", m.GoodDuring, 0},
		{"GoodAfter", m.GoodAfter, 40.0 / 60}, // 4 s to 10 s: 60 calls, 40 OK (the run ends before 14 s)
		{"AttemptsDuring", m.AttemptsDuring, 3},
		{"AttemptsAfter", m.AttemptsAfter, 80.0 / 60},
		{"Wasted", m.Wasted, 0.25},
		{"Bound", m.Bound, min(1, 0.1*20/(0.9*2))},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if !math.IsNaN(m.GoodRest) {
		t.Errorf("GoodRest = %v, want NaN (no call started 10 s after the trigger)", m.GoodRest)
	}
	if !m.Recovered || m.RecoverAfter != 2*time.Second {
		t.Errorf("recovered %v after %v, want true after 2s", m.Recovered, m.RecoverAfter)
	}
	if m.ShedLate != 1 {
		t.Errorf("ShedLate = %d, want 1 (the shed at 9 s; the failures at 8 s are before end+5s)", m.ShedLate)
	}
	// A run whose last second fails is stuck.
	r.Stats.Calls[99].OK = false
	if m := MetaOf(r); m.Recovered {
		t.Errorf("recovered after %v with the last second at 90%%, want stuck", m.RecoverAfter)
	}
}

// TestTriggerConfig checks that a bad trigger gets an error and that a
// hang or a slowdown needs a capacity.
func TestTriggerConfig(t *testing.T) {
	base := ProviderConfig{Window: time.Second, Horizon: time.Minute}
	for _, tt := range []struct {
		trigger  Trigger
		capacity int
		slowBy   float64
		ok       bool
	}{
		{Trigger503, 0, 0, true},
		{TriggerHang, 0, 0, false},
		{TriggerHang, 1, 0, true},
		{TriggerSlow, 1, 0, true},
		{TriggerSlow, 1, -1, false},
		{"melt", 1, 0, false},
	} {
		c := base
		c.Trigger, c.Capacity, c.SlowBy = tt.trigger, tt.capacity, tt.slowBy
		p, err := NewProvider(c)
		if (err == nil) != tt.ok {
			t.Errorf("NewProvider(trigger %q, capacity %d, slow by %v) = %v, want ok %v", tt.trigger, tt.capacity, tt.slowBy, err, tt.ok)
		}
		if err == nil && tt.trigger == TriggerSlow && p.Config().SlowBy != 5 {
			t.Errorf("SlowBy 0 reads %v, want 5", p.Config().SlowBy)
		}
	}
}

// TestWastedWork checks that work served after its caller's attempt ended
// is counted as wasted, and work served in time is not.
func TestWastedWork(t *testing.T) {
	p, err := NewProvider(ProviderConfig{Capacity: 1, Queue: 1, Work: 300 * time.Millisecond, Window: time.Minute, Horizon: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	url, stop, err := p.Listen()
	if err != nil {
		t.Fatal(err)
	}
	p.Start()
	// The first caller gives up long before the work ends; the second waits.
	if err := Get(&http.Client{Timeout: 20 * time.Millisecond}, url)(context.Background()); err == nil {
		t.Error("a 20 ms attempt at 300 ms of work succeeded")
	}
	if err := Get(&http.Client{}, url)(context.Background()); err != nil {
		t.Errorf("a patient attempt: %v", err)
	}
	stop()
	if w := p.Windows()[0]; w.Served != 2 || w.Wasted != 1 {
		t.Errorf("served %d, wasted %d; want 2 and 1", w.Served, w.Wasted)
	}
}
