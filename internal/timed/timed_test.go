package timed_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/timed"
)

// Package budget sets the entry point, with the type package retry
// asserts: on the budget's default clock it counts at the time given (the
// loop's reading of time.Now); on a clock of the caller's, at that clock's.
func TestEntryPoint(t *testing.T) {
	deposit, ok := timed.Deposit.(func(*budget.Budget, time.Time))
	if !ok {
		t.Fatalf("timed.Deposit is %T, want func(*budget.Budget, time.Time)", timed.Deposit)
	}
	synctest.Test(t, func(t *testing.T) {
		var bu budget.Budget // the zero value: the default clock, its window from its first use
		deposit(&bu, time.Now().Add(-time.Minute))
		if s := bu.Stats(); s.Requests != 0 {
			t.Errorf("a deposit given a time a minute old: %d requests in the window, want 0 (it counted at that time)", s.Requests)
		}
		deposit(&bu, time.Now())
		if s := bu.Stats(); s.Requests != 1 {
			t.Errorf("a deposit given the time now: %d requests, want 1", s.Requests)
		}
	})
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	clock := func() time.Time { return now }
	bu, err := budget.New(budget.Config{Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	deposit(bu, start.Add(-time.Hour)) // not on the budget's clock: it reads its own
	if s := bu.Stats(); s.Requests != 1 {
		t.Errorf("a budget with its own clock: %d requests, want 1 (counted at its clock's time)", s.Requests)
	}
}

// Package breaker sets Restamp, with the type package retry asserts.
func TestRestampEntryPoint(t *testing.T) {
	if _, ok := timed.Restamp.(func(*breaker.Breaker, breaker.Permit) breaker.Permit); !ok {
		t.Fatalf("timed.Restamp is %T, want func(*breaker.Breaker, breaker.Permit) breaker.Permit", timed.Restamp)
	}
}
