package sim

import (
	"fmt"
	"time"

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

// DefaultBudgetSettings returns the settings of [budget.DefaultConfig]:
// ratio 0.1, floor 1 retry per second, a 10 s window in 10 slices.
func DefaultBudgetSettings() BudgetSettings {
	d := budget.DefaultConfig()
	return BudgetSettings{Ratio: d.Ratio, MinPerSecond: d.MinPerSecond, Window: d.Window, Slices: d.Slices}
}

// build returns a budget whose clock starts at start (the simulation's t=0),
// or an error wrapping ErrInvalidConfig.
func (s BudgetSettings) build(start time.Time) (*budget.Budget, error) {
	b, err := budget.New(budget.Config{
		Ratio:        s.Ratio,
		MinPerSecond: s.MinPerSecond,
		Window:       s.Window,
		Slices:       s.Slices,
		Now:          func() time.Time { return start },
	})
	if err != nil {
		return nil, fmt.Errorf("%w: budget: %w", ErrInvalidConfig, err)
	}
	return b, nil
}
