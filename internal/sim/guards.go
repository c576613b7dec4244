package sim

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// BudgetSettings is the plain-data part of a [budget.Config] that the
// simulations use for every client's retry budget; the clock is always the
// simulation's. See package budget for the admission rule.
type BudgetSettings struct {
	// Ratio is the retries allowed per original request in the window, in
	// [0, 1].
	Ratio float64 `json:"ratio"`
	// MinPerSecond is the floor of retries per second every client gets on
	// top of Ratio; 0 means no floor.
	MinPerSecond float64 `json:"min_per_second"`
	// Window is the sliding window's length.
	Window time.Duration `json:"window_ns"`
	// Slices is the number of slices the window is cut into.
	Slices int `json:"slices"`
}

// DefaultBudgetSettings returns the defaults of package budget: ratio 0.1,
// floor 1 retry per second, a 10 s window in 10 slices.
func DefaultBudgetSettings() BudgetSettings {
	return BudgetSettings{Ratio: budget.DefaultRatio, MinPerSecond: budget.DefaultMinPerSecond, Window: budget.DefaultWindow, Slices: budget.DefaultSlices}
}

// none maps a setting of 0 (none) to the negative value package budget
// reads as none (its zero means the default).
func none(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// build returns a budget whose clock starts at start (the simulation's t=0),
// or an error wrapping ErrInvalidConfig.
func (s BudgetSettings) build(start time.Time) (*budget.Budget, error) {
	b, err := budget.New(budget.Config{
		Ratio:        none(s.Ratio),
		MinPerSecond: none(s.MinPerSecond),
		Window:       s.Window,
		Slices:       s.Slices,
		Now:          func() time.Time { return start },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: budget: %w", ErrInvalidConfig, err)
	}
	return b, nil
}

// BreakerSettings is the plain-data part of a [breaker.Config] that the
// simulations use for every client's circuit breaker; the clock is always
// the simulation's. See package breaker for the states and the rule.
type BreakerSettings struct {
	// FailureRatio is the fraction of failed calls in the window, in
	// (0, 1], at or above which the breaker trips.
	FailureRatio float64 `json:"failure_ratio"`
	// Window is the length of the sliding window, cut into Buckets.
	Window  time.Duration `json:"window_ns"`
	Buckets int           `json:"buckets"`
	// MinCalls is the number of calls the window must hold before the
	// breaker may trip.
	MinCalls int `json:"min_calls"`
	// OpenFor is how long the breaker stays open after tripping; with
	// MaxOpenFor above it, each consecutive trip doubles the open period
	// up to MaxOpenFor (0 means no growth).
	OpenFor    time.Duration `json:"open_for_ns"`
	MaxOpenFor time.Duration `json:"max_open_for_ns"`
	// Probes is the number of calls the half-open breaker admits; all must
	// succeed to close it.
	Probes int `json:"probes"`
}

// DefaultBreakerSettings returns 50% failures over 10 s in 10 buckets, at
// least 20 calls, 5 probes, and an open period of 5 s (the simulations'
// outage lasts 10 s).
func DefaultBreakerSettings() BreakerSettings {
	return BreakerSettings{
		FailureRatio: breaker.DefaultFailureRatio,
		Window:       breaker.DefaultWindow,
		Buckets:      breaker.DefaultBuckets,
		MinCalls:     breaker.DefaultMinCalls,
		OpenFor:      5 * time.Second,
		Probes:       5,
	}
}

// build returns a breaker on the clock now (read once now, as the
// breaker's start), or an error wrapping ErrInvalidConfig.
func (s BreakerSettings) build(now func() time.Time) (*breaker.Breaker, error) {
	b, err := breaker.New(breaker.Config{
		FailureRatio: s.FailureRatio,
		Window:       s.Window,
		Buckets:      s.Buckets,
		MinCalls:     s.MinCalls,
		OpenFor:      s.OpenFor,
		MaxOpenFor:   s.MaxOpenFor,
		Probes:       s.Probes,
		Now:          now,
		Rand:         func() float64 { return 0.5 }, // no jitter: reproducible
		MaxWaiters:   -1,                            // simulated calls do not wait on real timers
	})
	if err != nil {
		return nil, fmt.Errorf("%w: breaker: %w", ErrInvalidConfig, err)
	}
	return b, nil
}
