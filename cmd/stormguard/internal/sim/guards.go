package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/pace"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
)

// BudgetSettings is the plain-data part of a [budget.Config] that the
// simulations use for every retry budget; the clock is always the
// simulation's. See package budget for the admission rule. Unlike a
// budget.Config, every field is explicit: 0 means none, not the default.
type BudgetSettings struct {
	// Ratio is the retries allowed per original request in the window, in
	// [0, 1]; 0 means none (only the floor).
	Ratio float64 `json:"ratio"`
	// MinPerSecond is the floor of retries per second on top of Ratio
	// (for a fleet-shared budget, one floor for the whole fleet); 0 means
	// no floor. It must be finite and not negative.
	MinPerSecond float64 `json:"min_per_second"`
	// Window is the sliding window's length; it must be positive.
	Window time.Duration `json:"window_ns"`
	// Slices is the number of slices the window is cut into; it must be
	// positive.
	Slices int `json:"slices"`
}

// DefaultBudgetSettings returns the defaults of package budget (what its
// zero Config gives): ratio 0.1, floor 1 retry per second, a 10 s window in
// 10 slices. TestDefaultSettingsAreTheLibrarys keeps them equal.
func DefaultBudgetSettings() BudgetSettings {
	return BudgetSettings{Ratio: 0.1, MinPerSecond: 1, Window: 10 * time.Second, Slices: 10}
}

// none maps a setting of 0 (none) to the negative value package budget
// reads as none (its zero means the default).
func none(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

// build returns a budget on the clock now, or an error wrapping
// ErrInvalidConfig.
func (s BudgetSettings) build(now func() time.Time) (*budget.Budget, error) {
	switch {
	case !(s.Ratio >= 0 && s.Ratio <= 1):
		return nil, fmt.Errorf("%w: budget ratio %v must be in [0, 1]", ErrInvalidConfig, s.Ratio)
	case !(s.MinPerSecond >= 0) || math.IsInf(s.MinPerSecond, 0):
		return nil, fmt.Errorf("%w: budget floor %v must be finite and not negative", ErrInvalidConfig, s.MinPerSecond)
	case s.Window <= 0 || s.Slices <= 0:
		return nil, fmt.Errorf("%w: budget window %v and slices %d must be positive", ErrInvalidConfig, s.Window, s.Slices)
	}
	b, err := budget.New(budget.Config{
		Ratio:        none(s.Ratio),
		MinPerSecond: none(s.MinPerSecond),
		Window:       s.Window,
		Slices:       s.Slices,
		Now:          now,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: budget: %w", ErrInvalidConfig, err)
	}
	return b, nil
}

// BreakerSettings is the plain-data part of a [breaker.Config] that the
// simulations use for every circuit breaker; the clock, the random source
// and the state-change callback are always the simulation's. See package
// breaker for the states and the rules. As in a breaker.Config, a zero
// field takes the library's default.
type BreakerSettings struct {
	// FailureRatio is the fraction of failed calls, in (0, 1], at or
	// above which the breaker trips: in the window, or in its current
	// bucket alone (Window/Buckets) when that holds MinCalls calls.
	FailureRatio float64 `json:"failure_ratio"`
	// Window is the length of the sliding window, cut into Buckets.
	Window  time.Duration `json:"window_ns"`
	Buckets int           `json:"buckets"`
	// MinCalls is the number of calls the window must hold before the
	// breaker may trip.
	MinCalls int `json:"min_calls"`
	// OpenFor is the probe interval (jittered by ±20%); with MaxOpenFor
	// above it, each consecutive failed probe doubles the open period up
	// to MaxOpenFor (0 means no growth).
	OpenFor    time.Duration `json:"open_for_ns"`
	MaxOpenFor time.Duration `json:"max_open_for_ns"`
	// Probes is the number of calls a probe round admits; all must
	// succeed to close the breaker.
	Probes int `json:"probes"`
	// MaxWaiters bounds the calls waiting behind the breaker, for the
	// policies that wait (OutagePolicy.Wait); a negative value turns
	// waiting off.
	MaxWaiters int `json:"max_waiters"`
	// ReleaseRate is the most waiting calls per second released after a
	// close: the release starts at a quarter of it, doubles every half
	// second up to it and halves on a failure. 0 means the rate of calls
	// the window held when the breaker tripped, per second of the time
	// they took (at least Probes per OpenFor); a negative value releases
	// them all at once.
	ReleaseRate float64 `json:"release_rate"`
}

// DefaultBreakerSettings returns the defaults of package breaker (what its
// zero Config gives), spelled out (TestDefaultSettingsAreTheLibrarys keeps
// them equal): 50% failures over 10 s in 10 buckets (or in the current bucket
// alone), at least 20 calls, 3 probes about every second (no growth), up
// to 10,000 waiting calls released by a pacer that works up to the pace of
// the window before the trip.
func DefaultBreakerSettings() BreakerSettings {
	return BreakerSettings{
		FailureRatio: 0.5,
		Window:       10 * time.Second,
		Buckets:      10,
		MinCalls:     20,
		OpenFor:      time.Second,
		Probes:       3,
		MaxWaiters:   10_000,
	}
}

// build returns a breaker of s on clock with random source u (nil: the
// runtime's), reporting its state changes to onChange (nil: none); wait
// false turns waiting off whatever MaxWaiters says. The error wraps
// ErrInvalidConfig.
func (s BreakerSettings) build(clock func() time.Time, u func() float64, onChange func(from, to breaker.State), wait bool) (*breaker.Breaker, error) {
	c := breaker.Config{
		FailureRatio:  s.FailureRatio,
		Window:        s.Window,
		Buckets:       s.Buckets,
		MinCalls:      s.MinCalls,
		OpenFor:       s.OpenFor,
		MaxOpenFor:    s.MaxOpenFor,
		Probes:        s.Probes,
		MaxWaiters:    s.MaxWaiters,
		ReleaseRate:   s.ReleaseRate,
		Now:           clock,
		Rand:          u,
		OnStateChange: onChange,
	}
	if !wait {
		c.MaxWaiters = -1
	}
	b, err := breaker.New(c)
	if err != nil {
		return nil, fmt.Errorf("%w: breaker: %w", ErrInvalidConfig, err)
	}
	return b, nil
}

// simBreaker is one circuit breaker of the outage model together with the
// calls waiting behind it. The breaker is the library's, driven through
// its public API on the simulated clock; the waiting calls wait in the
// breaker's own wait order (a [waitq.List]) and are released by the
// breaker's own pacer (a [pace.Pacer]), stepped on the simulated clock,
// because [breaker.Breaker.Wait] parks a goroutine on real timers. See
// [OutageConfig] for how the model follows the breaker's documentation.
type simBreaker struct {
	b   *breaker.Breaker
	cfg breaker.Config // b.Config(): the defaults filled in
	idx int32          // index in outRun.brks, the who of its events

	// waiting holds the request ids of the waiting calls, earliest
	// deadline first, those scheduled for release included (as
	// breaker.Snapshot.Waiters counts them).
	waiting waitq.List[int32]
	// perClient, for a fleet's breaker, counts the waiting calls of each
	// client: MaxWaiters bounds each client's, as each process bounds its
	// own. Nil for a client's own breaker.
	perClient []int32
	// armed is set while a probe-round event is scheduled.
	armed bool
	// epoch grows on every state change, as the breaker's generation
	// does: a release scheduled in an older epoch is void, and a permit
	// issued in an older epoch is one the breaker ignores.
	epoch uint32
	// calls is the closed window's calls, the failure being recorded
	// included, read just before each closed-state failure is reported:
	// the window the breaker trips on, for its release ceiling.
	calls int
	// ceiling is the release ceiling of the next close, in calls per
	// second, set when the breaker trips from closed; 0 until then.
	ceiling float64
	// closedAt is when the breaker last closed (when it was built, until
	// it first does).
	closedAt time.Duration

	// pace releases the waiting calls after the last close, in epoch
	// paceEpoch, while releasing; its next tick is due at paceDue.
	pace      pace.Pacer
	releasing bool
	paceEpoch uint32
	paceDue   time.Duration
}

// releaseFloor is the least release rate, Probes per OpenFor (the
// breaker's rule).
func (sb *simBreaker) releaseFloor() float64 {
	return float64(sb.cfg.Probes) / sb.cfg.OpenFor.Seconds()
}

// tripped records that the breaker tripped from closed at now on a window
// of sb.calls calls, and sets the ceiling of the next release as the
// breaker does (see breaker.Config.ReleaseRate): the calls per second of
// the time they took, the window or the time since the breaker closed (or
// was built) if that is shorter, at least one bucket.
func (sb *simBreaker) tripped(now time.Duration) {
	bucket := sb.cfg.Window / time.Duration(sb.cfg.Buckets)
	span := min(sb.cfg.Window, max(now-sb.closedAt, bucket))
	sb.ceiling = pace.Ceiling(sb.cfg.ReleaseRate, uint64(sb.calls), span, sb.releaseFloor())
}

// releaseCeiling returns the ceiling of the release that starts now: the
// one the last trip set, or, if the breaker never tripped from closed, the
// floor (or ReleaseRate when set), as the breaker computes it.
func (sb *simBreaker) releaseCeiling() float64 {
	if sb.ceiling != 0 {
		return sb.ceiling
	}
	return pace.Ceiling(sb.cfg.ReleaseRate, 0, sb.cfg.Window, sb.releaseFloor())
}

// openWait returns how long until the next probe round of the rejection
// err, and whether err is an open breaker's (a half-open breaker with all
// probes taken is not).
func openWait(err error) (time.Duration, bool, error) {
	var oe *breaker.OpenError
	if !errors.As(err, &oe) {
		return 0, false, errNotOpen
	}
	return oe.Wait, oe.State == breaker.Open, nil
}

// errNotOpen reports a breaker rejection without an *OpenError, which
// package breaker never returns.
var errNotOpen = errors.New("sim: breaker rejection without an OpenError")
