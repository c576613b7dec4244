package sim

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
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

// build returns a budget on the clock now, or an error wrapping
// ErrInvalidConfig. Callers that pass the time (DepositAt, WithdrawAt)
// may give any clock.
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

// DefaultBreakerSettings returns the defaults of package breaker, spelled
// out: 50% failures over 10 s in 10 buckets (or in the current bucket
// alone), at least 20 calls, 3 probes about every second (no growth), up
// to 10,000 waiting calls released by a pacer that works up to the pace of
// the window before the trip.
func DefaultBreakerSettings() BreakerSettings {
	return BreakerSettings{
		FailureRatio: breaker.DefaultFailureRatio,
		Window:       breaker.DefaultWindow,
		Buckets:      breaker.DefaultBuckets,
		MinCalls:     breaker.DefaultMinCalls,
		OpenFor:      breaker.DefaultOpenFor,
		Probes:       breaker.DefaultProbes,
		MaxWaiters:   breaker.DefaultMaxWaiters,
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
// its public API on the simulated clock; the waiting is modelled here,
// because [breaker.Breaker.Wait] parks a goroutine on real timers. See
// [OutageConfig] for how the model follows the breaker's documentation.
type simBreaker struct {
	b   *breaker.Breaker
	cfg breaker.Config // b.Config(): the defaults filled in
	idx int32          // index in outRun.brks, the who of its events

	// fifo holds the waiting calls from head on, earliest deadline first
	// (as the breaker serves them), in arrival order for equal deadlines.
	// An entry whose request has left (or waits again, under a new seq) is
	// stale and skipped.
	fifo []waitEntry
	head int
	// n counts the waiting calls, those scheduled for release included
	// (as breaker.Snapshot.Waiters does).
	n int
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
	// the window the breaker trips on, for its release rate.
	calls int
	// rate is the release rate of the next close, in calls per second, set
	// when the breaker trips from closed; 0 until then.
	rate float64
	// built is when the breaker was built (the origin of its clock), and
	// closedAt when it last closed (built, until it first does).
	built, closedAt time.Duration
	// pace is the release of the waiting calls after the last close.
	pace simPacer
}

// simPacer is the breaker's release pacer (see breaker.Config.ReleaseRate)
// on the simulated clock: the breaker's own runs on a real timer and
// releases the calls parked in [breaker.Breaker.Wait], which the model
// does not use. It follows the breaker's rule step for step, with the same
// arithmetic: after a close it releases the waiting calls in order (earliest deadline first),
// one per unit of credit, each at a uniformly random point of the coming
// tick (one call's slot at the current rate, within [10 ms, 1 s]); the
// credit grows by the rate per second, and the rate starts at a quarter of
// the release rate (at least the floor, Probes per OpenFor) and doubles
// every half second up to it, except over a tick in which a failure halved
// it (at most once per tick, down to the floor). It stops when every
// waiting call has been released or the breaker opens again.
type simPacer struct {
	on     bool   // releasing
	epoch  uint32 // the breaker's epoch (its closed generation) it releases for
	cutNow bool   // a failure halved the rate since the last tick
	// rate is the current pace, max the release rate, floor the least
	// pace, in calls per second; credit is the calls it may release now.
	rate, max, floor, credit float64
	// last is the last tick, cut the last slow-down, due the next tick.
	last, cut, due time.Duration
}

// paceDoubling is how long a clean release takes to double its pace.
const paceDoubling = 500 * time.Millisecond

// start sets p up for a close at now in epoch, of a breaker built at built
// and releasing at rate (+Inf: all at once) with probes per openFor as
// its floor. It does not release anything: call advance next.
func (p *simPacer) start(now, built time.Duration, epoch uint32, rate float64, probes int, openFor time.Duration) {
	floor := min(rate, float64(probes)/openFor.Seconds())
	begin := rate
	if !math.IsInf(rate, 1) {
		begin = max(rate/4, floor)
	}
	*p = simPacer{epoch: epoch, max: rate, rate: begin, floor: floor, credit: 1, last: now, cut: built}
}

// tick returns the pacer's tick: one call's slot at the current rate,
// within [10 ms, 1 s].
func (p *simPacer) tick() time.Duration {
	if math.IsInf(p.rate, 1) || p.rate <= 0 {
		return 10 * time.Millisecond
	}
	return min(max(time.Duration(float64(time.Second)/p.rate), 10*time.Millisecond), time.Second)
}

// advance is a tick at now: the credit earned since the last one, the
// rate's growth. It returns the span of the coming tick over which the
// calls it releases now are spread, in nanoseconds (0: all at once).
func (p *simPacer) advance(now time.Duration) float64 {
	if math.IsInf(p.rate, 1) {
		p.credit = math.Inf(1)
	} else {
		p.credit += p.rate * float64(now-p.last) / float64(time.Second)
	}
	if !p.cutNow && p.rate < p.max && now > p.last {
		p.rate = min(p.max, p.rate*math.Exp2(float64(now-p.last)/float64(paceDoubling)))
	}
	p.last, p.cutNow = now, false
	if math.IsInf(p.rate, 1) {
		return 0
	}
	return float64(p.tick())
}

// take spends the credit of one release, and reports false, spending
// nothing, when there is not enough.
func (p *simPacer) take() bool {
	if p.credit < 1 {
		return false
	}
	p.credit--
	return true
}

// settle ends a tick; left reports whether calls are still to be
// released.
func (p *simPacer) settle(left bool) {
	if !left {
		p.credit = min(p.credit, 1)
	}
}

// slowDown halves the rate after a closed-state failure at now, while
// the pacer releases, at most once per tick.
func (p *simPacer) slowDown(now time.Duration) {
	if !p.on || now-p.cut < p.tick() {
		return
	}
	p.cut, p.cutNow = now, true
	if math.IsInf(p.rate, 1) {
		p.rate = p.max
		return
	}
	p.rate = max(p.rate/2, p.floor)
}

// waitEntry is one wait of request id: its seq-th, ending at deadline.
type waitEntry struct {
	id       int32
	seq      uint32
	deadline time.Duration
}

// enqueue inserts e in deadline order, after the entries whose deadline is
// the same or earlier (the breaker's order); deadlines mostly grow with
// arrival, so the search from the back is short.
func (sb *simBreaker) enqueue(e waitEntry) {
	sb.fifo = append(sb.fifo, e)
	i := len(sb.fifo) - 1
	for i > sb.head && sb.fifo[i-1].deadline > e.deadline {
		sb.fifo[i] = sb.fifo[i-1]
		i--
	}
	sb.fifo[i] = e
}

// releaseRate returns the pace, in calls per second, at which sb releases
// its waiting calls after a close: the breaker's rule (see
// breaker.Config.ReleaseRate).
func (sb *simBreaker) releaseRate() float64 {
	switch r := sb.cfg.ReleaseRate; {
	case r < 0:
		return math.Inf(1)
	case r > 0:
		return r
	}
	floor := float64(sb.cfg.Probes) / sb.cfg.OpenFor.Seconds()
	return max(sb.rate, floor)
}

// tripped records that the breaker tripped from closed at now on a window
// of sb.calls calls: they took the window, or the time since the breaker
// closed (or was built) if that is shorter (at least one bucket).
func (sb *simBreaker) tripped(now time.Duration) {
	bucket := sb.cfg.Window / time.Duration(sb.cfg.Buckets)
	span := min(sb.cfg.Window, max(now-sb.closedAt, bucket))
	sb.rate = float64(sb.calls) / span.Seconds()
}

// compact drops the stale entries of the FIFO when nothing waits, and the
// consumed prefix when it is long.
func (sb *simBreaker) compact() {
	switch {
	case sb.n == 0:
		sb.fifo, sb.head = sb.fifo[:0], 0
	case sb.head > 1024 && sb.head > len(sb.fifo)/2:
		k := copy(sb.fifo, sb.fifo[sb.head:])
		sb.fifo, sb.head = sb.fifo[:k], 0
	}
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
