package timed_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/timed"
)

// Package budget sets the entry point, with the type package retry
// asserts, and it counts at the time given.
func TestEntryPoint(t *testing.T) {
	deposit, ok := timed.Deposit.(func(*budget.Budget, time.Time))
	if !ok {
		t.Fatalf("timed.Deposit is %T, want func(*budget.Budget, time.Time)", timed.Deposit)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	bu, err := budget.New(budget.Config{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	now = start.Add(time.Minute) // the clock moved on; the time given is the start's
	deposit(bu, start)
	if s := bu.Stats(); s.Requests != 0 {
		t.Errorf("a deposit given a time a minute old: %d requests in the window, want 0 (it counted at that time)", s.Requests)
	}
	now = start
	if s := bu.Stats(); s.Requests != 1 {
		t.Errorf("budget at the time given: %d requests, want 1", s.Requests)
	}
}

// Package breaker sets Restamp, with the type package retry asserts.
func TestRestampEntryPoint(t *testing.T) {
	if _, ok := timed.Restamp.(func(*breaker.Breaker, breaker.Permit) breaker.Permit); !ok {
		t.Fatalf("timed.Restamp is %T, want func(*breaker.Breaker, breaker.Permit) breaker.Permit", timed.Restamp)
	}
}
