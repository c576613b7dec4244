package sim

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
)

// The model's release rate follows breaker.Config.ReleaseRate: the trip's
// window per second of the time its calls took, at least Probes per
// OpenFor; a set rate as is; a negative one all at once.
func TestSimBreakerReleaseRate(t *testing.T) {
	s := DefaultBreakerSettings() // 10 s window in 1 s buckets, 3 probes per 1 s
	tests := []struct {
		name     string
		rate     float64 // ReleaseRate setting
		calls    int     // in the window at the trip
		closedAt time.Duration
		trip     time.Duration
		want     float64
	}{
		{"whole window", 0, 500, 0, 30 * time.Second, 50},
		{"closed 2 s before the trip", 0, 500, 28 * time.Second, 30 * time.Second, 250},
		{"closed just before: one bucket", 0, 500, 30*time.Second - time.Millisecond, 30 * time.Second, 500},
		{"floor: probes per open period", 0, 10, 0, 30 * time.Second, 3},
		{"set", 42, 500, 0, 30 * time.Second, 42},
		{"all at once", -1, 500, 0, 30 * time.Second, math.Inf(1)},
	}
	for _, tt := range tests {
		s.ReleaseRate = tt.rate
		b, err := s.build(fixedClock, nil, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		sb := &simBreaker{b: b, cfg: b.Config(), calls: tt.calls, closedAt: tt.closedAt}
		sb.tripped(tt.trip)
		if got := sb.releaseCeiling(); math.Abs(got-tt.want) > 1e-9 && got != tt.want {
			t.Errorf("%s: release rate %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestOpenWait(t *testing.T) {
	b, err := DefaultBreakerSettings().build(fixedClock, nil, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	b.Trip(0)
	_, rejection := b.Allow()
	wait, open, err := openWait(rejection)
	if err != nil || !open || wait <= 0 || wait > 2*time.Second {
		t.Errorf("openWait(open breaker's rejection) = %v, %v, %v; want up to 1.2 s, open", wait, open, err)
	}
	if _, _, err := openWait(errors.New("not a breaker's")); !errors.Is(err, errNotOpen) {
		t.Errorf("openWait(other error) = %v, want errNotOpen", err)
	}
	if _, open, _ := openWait(&breaker.OpenError{State: breaker.HalfOpen}); open {
		t.Error("openWait(half-open rejection) reports open")
	}
}

// While the model's pacer releases waiting calls, the breaker trips again
// at Probes failing calls in its window, not MinCalls (the breaker's rule
// while it releases), and the calls not yet released wait again.
func TestModelRetripsAtProbesWhileReleasing(t *testing.T) {
	s := DefaultBreakerSettings() // MinCalls 20, Probes 3
	s.ReleaseRate = 1             // one call a second: the release lasts
	r := &outRun{c: &OutageConfig{Horizon: time.Hour, Breaker: s}, p: OutagePolicy{Breaker: true, Wait: true},
		bu: func() float64 { return 0.5 }, reqs: make([]outRequest, 10)}
	sb, err := r.newBreaker()
	if err != nil {
		t.Fatal(err)
	}
	fail := func() {
		t.Helper()
		p, err := sb.b.Allow()
		if err != nil {
			t.Fatalf("Allow() at %v: %v", r.now, err)
		}
		r.record(sb, outOutcome{permit: p, gen: sb.epoch})
	}
	sb.b.Trip(0)
	for i := range r.reqs {
		w := &waitq.Waiter[int32]{Value: int32(i)}
		sb.waiting.Push(w, time.Hour)
		r.reqs[i] = outRequest{state: reqWaiting, wait: w}
	}
	r.now += sb.b.Snapshot().HalfOpenIn
	for range s.Probes {
		p, err := sb.b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("probe: %+v, %v", p, err)
		}
		r.record(sb, outOutcome{permit: p, gen: sb.epoch, ok: true})
	}
	if st := sb.b.State(); st != breaker.Closed || !sb.releasing {
		t.Fatalf("after the probes: %v, releasing %v; want closed and releasing", st, sb.releasing)
	}
	for i := 1; i < s.Probes; i++ {
		r.now += 10 * time.Millisecond
		fail()
		if st := sb.b.State(); st != breaker.Closed {
			t.Fatalf("after %d failures while releasing: %v, want still closed (Probes %d)", i, st, s.Probes)
		}
	}
	r.now += 10 * time.Millisecond
	fail()
	if st := sb.b.State(); st != breaker.Open || sb.releasing {
		t.Fatalf("after %d failures while releasing: %v, releasing %v; want open, not releasing", s.Probes, st, sb.releasing)
	}
	for i := range r.reqs {
		if st := r.reqs[i].state; st != reqWaiting {
			t.Errorf("request %d in state %d after the re-trip, want waiting", i, st)
		}
	}
}

// The simulations' default settings are the library's defaults: what a
// zero budget.Config and a zero breaker.Config give.
func TestDefaultSettingsAreTheLibrarys(t *testing.T) {
	bu, err := budget.New(budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	c := bu.Config()
	if got, want := (BudgetSettings{Ratio: c.Ratio, MinPerSecond: c.MinPerSecond, Window: c.Window, Slices: c.Slices}), DefaultBudgetSettings(); got != want {
		t.Errorf("budget defaults %+v, DefaultBudgetSettings %+v", got, want)
	}
	br, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	bc := br.Config()
	got := BreakerSettings{FailureRatio: bc.FailureRatio, Window: bc.Window, Buckets: bc.Buckets, MinCalls: bc.MinCalls,
		OpenFor: bc.OpenFor, MaxOpenFor: bc.MaxOpenFor, Probes: bc.Probes, MaxWaiters: bc.MaxWaiters, ReleaseRate: bc.ReleaseRate}
	if want := DefaultBreakerSettings(); got != want {
		t.Errorf("breaker defaults %+v, DefaultBreakerSettings %+v", got, want)
	}
}
