package breaker

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults of a [Config]'s zero fields, documented there.
const (
	defaultFailureRatio = 0.5
	defaultWindow       = 10 * time.Second
	defaultBuckets      = 10
	defaultMinCalls     = 20
	defaultOpenFor      = time.Second
	defaultProbes       = 3
	defaultMaxWaiters   = 10_000
)

// Limits on a [Config], checked by [New] and documented there.
const (
	// maxBuckets bounds Buckets: a failure sums the window, so its cost
	// grows with Buckets.
	maxBuckets = 3600
	// minBucket is the shortest bucket, Window/Buckets.
	minBucket = time.Millisecond
)

// Config is the plain-data description of a breaker. Build a [Breaker] from
// it with [New]. Zero fields take the defaults, so Config{} trips at 50%
// failures over 10 s (at least 20 calls), probes with 3 calls about every
// second while open, and holds up to 10,000 waiting calls;
// breaker.Config{OpenFor: 5 * time.Second} changes only the probe interval.
type Config struct {
	// FailureRatio is the fraction of failed calls, in (0, 1], at or above
	// which the breaker trips; 0 means 0.5. The comparison allows a
	// relative 1e-12 for floating-point rounding (7 failures of 25 are at
	// 0.28, whose product 0.28·25 is 7.000000000000001), so a ratio within
	// that of a fraction trips at it. It is checked after each
	// failure over the window, and over the current bucket alone
	// (Window/Buckets, 1 s by default) when that holds MinCalls calls: a
	// dependency that goes down trips the breaker within about a bucket,
	// not after half a window of failures outweighs its healthy past.
	FailureRatio float64
	// Window is the length of the sliding window of closed-state outcomes;
	// 0 means 10 s. It must be a multiple of Buckets nanoseconds, with
	// Window/Buckets at least 1 ms.
	Window time.Duration
	// Buckets is the number of buckets the window is cut into, from 1 to
	// 3600; 0 means 10. The window covers the current bucket and the
	// Buckets−1 before it. A failure sums the window, so its cost grows
	// with Buckets.
	Buckets int
	// MinCalls is the number of calls the window must hold before the
	// breaker may trip on FailureRatio; 0 means 20.
	MinCalls int
	// ConsecutiveFailures, if positive, also trips the breaker when that
	// many closed-state failures come in a row, whatever the ratio and
	// MinCalls (gobreaker's default rule is "more than 5 in a row": 6
	// here). A success ends the run; so does every state change, so a
	// breaker that closes starts counting from 0. It catches a
	// low-traffic dependency that fails every call before the window holds
	// MinCalls calls. 0, the default, turns the rule off: only the ratio
	// trips the breaker. A negative value, or one above 4294967295 (the run
	// is counted in 32 bits), is an error. With it on, a
	// closed-state success costs one more atomic load (no store while no
	// failure is pending).
	ConsecutiveFailures int
	// OpenFor is the probe interval: how long the breaker stays open after
	// it trips, or after a failed probe, before it lets probes through
	// again; 0 means 1 s. Each open period is OpenFor jittered by ±20%, so
	// that breakers that tripped together do not probe together, and never
	// shorter than a Retry-After the dependency sent with the failure that
	// opened it (see [Breaker.Fail]). The sums saturate: an OpenFor of at
	// least half the largest Duration (146 years) is not jittered and keeps
	// the breaker open until Reset.
	OpenFor time.Duration
	// MaxOpenFor bounds the growth of the open period. 0 means no growth:
	// every open period is OpenFor. Otherwise it must be at least OpenFor,
	// and each consecutive failed probe doubles the open period, up to
	// MaxOpenFor, so that a dependency that stays down is probed less and
	// less often. The ±20% jitter of OpenFor applies after the bound: an
	// open period at the bound lasts 0.8 to 1.2 times MaxOpenFor.
	MaxOpenFor time.Duration
	// Probes is the number of calls a probe round admits; all of them
	// must succeed to close the breaker; 0 means 3.
	Probes int
	// MaxWaiters bounds the calls that may wait at once in [Breaker.Wait]
	// for the breaker to admit them; beyond it a call is rejected at once.
	// 0 means 10,000; a negative value turns waiting off.
	MaxWaiters int
	// ReleaseRate is the most waiting calls per second released when the
	// breaker closes, earliest deadline first, so that a recovering
	// dependency meets its backlog at a pace it can serve rather than as
	// one spike. The release starts at a quarter of it, or at Probes per
	// OpenFor if that is more (a floor the pace never goes below; at most
	// ReleaseRate itself), and doubles every half second up to it; a
	// failure while it runs halves the pace (down to that floor), and the
	// trip rule with Probes calls in the window in place of MinCalls
	// (failures >= FailureRatio of them; the window holds only the calls
	// since the close) trips the breaker again. It runs until the last
	// waiting call's release time. 0 means the rate of
	// calls the breaker saw before it tripped (the pace the dependency
	// served before the outage), at least Probes per OpenFor: the calls in
	// the window over the time it covers (its buckets up to the trip, or
	// the time since the last close or New if less; at least a bucket or a
	// second, whichever is less), or, if higher, the most a
	// failure found that way while the window was below FailureRatio, in
	// the two to three windows before the trip (window-aligned: an outage
	// that trips the breaker only once the healthy calls have left the
	// window, a window after it began, is released at the healthy pace, not
	// at its trickle's), or, for a trip less than a window after a close,
	// the trip before's pace (a dependency that fails again as its backlog
	// is released is released at the same pace the next time); a negative
	// value releases every waiting call at once. New calls are not held
	// back while the backlog drains. The release holds one call's credit
	// from the start: the first waiting call goes within the first slot,
	// and a slot is at most a second long, so below one call a second the
	// first goes within a second of the close, the rest at the pace
	// above.
	ReleaseRate float64
	// SlowCall, if positive, makes a call that took SlowCall or longer
	// count as a failure even when it succeeded (a success given to
	// [Breaker.Done], a closure of [Breaker.Execute] whose error is not a
	// failure): a dependency that answers, but slowly, trips the breaker
	// by the same rule as one that fails, and a slow probe reopens it. A
	// call's time runs from the [Breaker.Allow] or [Breaker.Wait] that
	// issued its permit (for a call that waited, from its admission; for
	// an attempt of package retry's loop that waited for a concurrency
	// limiter's slot after its admission, from the end of that wait) to
	// its Done, Fail or Execute's return. 0, the default, counts no call
	// as slow; negative is an error. Set, it costs two clock readings per
	// call.
	SlowCall time.Duration
	// IsFailure reports whether an error returned by the closure given to
	// [Breaker.Execute] counts as a failure. Nil means any non-nil
	// error is a failure. It is not used by [Breaker.Done], which is told
	// the outcome. It must be safe for concurrent use.
	IsFailure func(error) bool
	// OnStateChange, if not nil, is called after each state change with the
	// old and the new state; never while the breaker's lock is held, one
	// call at a time, in order (see the package documentation).
	OnStateChange func(from, to State)
	// Now returns the current time; nil means the monotonic clock
	// (time.Now's reading when New ran, advanced by time.Since: cheaper
	// than time.Now and immune to wall-clock steps). It must be safe for
	// concurrent use. The timers of [Breaker.Wait] run on real time (or a
	// testing/synctest bubble's).
	Now func() time.Time
	// Rand returns uniformly distributed numbers in [0, 1) for the jitter
	// of open periods and releases; nil means the Go runtime's generator.
	// A Rand pinned at 0.5 makes every open period exactly OpenFor (to the
	// nanosecond). It must be safe for concurrent use.
	Rand func() float64
	// Shared, if not nil, connects the breaker to breakers in other
	// processes (see [Shared]). Nil means the breaker decides alone.
	Shared Shared
}

// Shared connects a [Breaker] to the breakers of other processes that call
// the same dependency, so that a fleet of low-volume clients trips, probes
// and recovers as one. A fleet implementation counts outcomes locally,
// exchanges them in the background, and steers the breaker with
// [Breaker.Trip] and [Breaker.Reset]; it must never block the caller.
type Shared interface {
	// Outcome is told every closed-state outcome. It is on the hot path:
	// it must not block, do I/O or allocate.
	Outcome(success bool)
	// ProbeRound is asked, when a probe round is due, whether this process
	// may probe in it (the fleet hands out a few probe permits per round).
	// false keeps the breaker open for another probe interval. It may do
	// a short round trip; the breaker holds no lock while it runs.
	ProbeRound() bool
	// StateChanged is told every state change, like Config.OnStateChange
	// (outside the lock, one at a time, in order).
	StateChanged(from, to State)
}

// errInvalidConfig is wrapped by every error [New] returns: New fails for
// no other reason.
var errInvalidConfig = errors.New("breaker: invalid config")

// withDefaults returns c with its zero fields set to the defaults, or an
// error wrapping errInvalidConfig.
func (c Config) withDefaults() (Config, error) {
	if c.FailureRatio == 0 {
		c.FailureRatio = defaultFailureRatio
	}
	if c.Window == 0 {
		c.Window = defaultWindow
	}
	if c.Buckets == 0 {
		c.Buckets = defaultBuckets
	}
	if c.MinCalls == 0 {
		c.MinCalls = defaultMinCalls
	}
	if c.OpenFor == 0 {
		c.OpenFor = defaultOpenFor
	}
	if c.Probes == 0 {
		c.Probes = defaultProbes
	}
	if c.MaxWaiters == 0 {
		c.MaxWaiters = defaultMaxWaiters
	}
	switch {
	case !(c.FailureRatio > 0 && c.FailureRatio <= 1):
		return c, fmt.Errorf("%w: FailureRatio %v must be in (0, 1]", errInvalidConfig, c.FailureRatio)
	case c.Window < 0:
		return c, fmt.Errorf("%w: Window %v must be positive", errInvalidConfig, c.Window)
	case c.Buckets < 1 || c.Buckets > maxBuckets:
		return c, fmt.Errorf("%w: Buckets %d must be in [1, %d]", errInvalidConfig, c.Buckets, maxBuckets)
	case c.Window%time.Duration(c.Buckets) != 0:
		return c, fmt.Errorf("%w: Window %v is not a multiple of Buckets (%d)", errInvalidConfig, c.Window, c.Buckets)
	case c.Window/time.Duration(c.Buckets) < minBucket:
		return c, fmt.Errorf("%w: a bucket of %v (Window %v / Buckets %d) is shorter than %v",
			errInvalidConfig, c.Window/time.Duration(c.Buckets), c.Window, c.Buckets, minBucket)
	case c.MinCalls < 1:
		return c, fmt.Errorf("%w: MinCalls %d must be at least 1", errInvalidConfig, c.MinCalls)
	case c.ConsecutiveFailures < 0 || uint64(c.ConsecutiveFailures) > math.MaxUint32:
		return c, fmt.Errorf("%w: ConsecutiveFailures %d must be in [0, %d]", errInvalidConfig, c.ConsecutiveFailures, uint64(math.MaxUint32))
	case c.OpenFor < 0:
		return c, fmt.Errorf("%w: OpenFor %v must be positive", errInvalidConfig, c.OpenFor)
	case c.MaxOpenFor != 0 && c.MaxOpenFor < c.OpenFor:
		return c, fmt.Errorf("%w: MaxOpenFor %v must be 0 or at least OpenFor %v", errInvalidConfig, c.MaxOpenFor, c.OpenFor)
	case c.Probes < 1:
		return c, fmt.Errorf("%w: Probes %d must be at least 1", errInvalidConfig, c.Probes)
	case c.SlowCall < 0:
		return c, fmt.Errorf("%w: SlowCall %v must not be negative", errInvalidConfig, c.SlowCall)
	case math.IsNaN(c.ReleaseRate):
		return c, fmt.Errorf("%w: ReleaseRate is NaN", errInvalidConfig)
	}
	return c, nil
}
