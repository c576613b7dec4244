package timed_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/timed"
)

// Packages budget and breaker set the entry points, with the types package
// retry asserts, and they count at the time given.
func TestEntryPoints(t *testing.T) {
	deposit, ok := timed.Deposit.(func(*budget.Budget, time.Time))
	if !ok {
		t.Fatalf("timed.Deposit is %T, want func(*budget.Budget, time.Time)", timed.Deposit)
	}
	success, ok := timed.Success.(func(*breaker.Breaker, breaker.Permit, bool, time.Duration, time.Time))
	if !ok {
		t.Fatalf("timed.Success is %T, want func(*breaker.Breaker, breaker.Permit, bool, time.Duration, time.Time)", timed.Success)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	bu, err := budget.New(budget.Config{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	br, err := breaker.New(breaker.Config{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	now = start.Add(time.Minute) // the clock moved on; the time given is the start's
	deposit(bu, start)
	p, _ := br.Allow()
	success(br, p, true, 0, start)
	if s := bu.Stats(); s.Requests != 0 {
		t.Errorf("a deposit given a time a minute old: %d requests in the window, want 0 (it counted at that time)", s.Requests)
	}
	now = start
	if s := bu.Stats(); s.Requests != 1 {
		t.Errorf("budget at the time given: %d requests, want 1", s.Requests)
	}
	if s := br.Snapshot(); s.Calls != 1 || s.Failures != 0 {
		t.Errorf("breaker at the time given: %+v, want 1 call, no failure", s)
	}
}
