// Package pace is the pacer that lets waiting calls go at a rate a
// recovering dependency can serve: when a circuit breaker closes, the calls
// that waited through the outage are released by a [Pacer] instead of all
// at once.
//
// A Pacer is a time-explicit value: every method that needs the time takes
// it (a time.Duration since an origin the owner picks), and it starts no
// timer. The owner calls [Pacer.Tick] when [Pacer.Interval] has passed
// since the last tick and releases as many calls as [Pacer.Take] allows.
// The circuit breaker steps its pacer on a timer; the simulator steps the
// same pacer on its simulated clock.
//
// The rule: the rate starts at a quarter of the ceiling (a slow start; the
// dependency's capacity beyond its usual load is unknown) and doubles every
// half second of clean release up to the ceiling; a failure while it
// releases halves it, at most once per tick and never below the floor. A
// controller may move the ceiling at any time ([Pacer.SetCeiling]), e.g.
// to a concurrency limit learned from the dependency's latency.
//
// Module cmd/stormguard may not import this package and holds a copy of
// it, cmd/stormguard/internal/pace, for its simulator; internal/copycheck's TestRepositoryCopies keeps the
// copy equal (only its import paths differ): change this folder, then
// bring the copy over with the command the test prints.
package pace

import (
	"math"
	"time"
)

const (
	// doubling is how long a clean release takes to double its rate.
	doubling = 500 * time.Millisecond
	// minTick and maxTick bound a tick, one call's slot at the current
	// rate.
	minTick, maxTick = 10 * time.Millisecond, time.Second
)

// Pacer releases calls at a rate, in calls per second. Its zero value
// releases nothing until [Pacer.Start]. A Pacer is not safe for concurrent
// use: its owner guards it.
type Pacer struct {
	rate, ceiling, floor float64 // calls per second
	credit               float64 // calls it may release now
	last                 time.Duration
	cut                  time.Duration // the last slow-down, if slowed
	slowed               bool          // it slowed down since Start
	slowedSinceTick      bool
}

// Ceiling returns the ceiling of a release: set if positive, +Inf (all at
// once) if negative, and otherwise the rate of the calls seen before the
// outage, calls over span, but at least floor.
func Ceiling(set float64, calls uint64, span time.Duration, floor float64) float64 {
	switch {
	case set < 0:
		return math.Inf(1)
	case set > 0:
		return set
	}
	return max(float64(calls)/span.Seconds(), floor)
}

// Start resets p for a release that begins at now, with ceiling calls per
// second at most (+Inf: every call at once) and floor as the least rate
// (capped at the ceiling). The rate starts at a quarter of the ceiling, at
// least the floor, and p holds the credit of one call: the first
// [Pacer.Tick], due at once, releases one.
func (p *Pacer) Start(now time.Duration, ceiling, floor float64) {
	floor = min(ceiling, floor)
	rate := ceiling
	if !math.IsInf(ceiling, 1) {
		rate = max(ceiling/4, floor)
	}
	*p = Pacer{rate: rate, ceiling: ceiling, floor: floor, credit: 1, last: now}
}

// SetCeiling moves the ceiling to c calls per second (at least the floor):
// the rate keeps growing towards it, or drops to it at once if above.
func (p *Pacer) SetCeiling(c float64) {
	p.ceiling = max(c, p.floor)
	p.rate = min(p.rate, p.ceiling)
}

// Rate returns the current rate, in calls per second.
func (p *Pacer) Rate() float64 { return p.rate }

// Interval returns how long after a tick the next one is due: one call's
// slot at the current rate, within [10 ms, 1 s].
func (p *Pacer) Interval() time.Duration {
	if math.IsInf(p.rate, 1) || p.rate <= 0 {
		return minTick
	}
	if p.rate <= 1 {
		// A slot of a second or more; and below about 1e-10 calls a
		// second, a slot's nanoseconds would not fit a Duration.
		return maxTick
	}
	return min(max(time.Duration(float64(time.Second)/p.rate), minTick), maxTick)
}

// Tick is a tick at now: p earns the credit of the time since the last
// tick, and its rate grows (doubling every half second, up to the ceiling)
// unless a failure slowed it since the last tick. It returns the span over
// which to spread the calls released now, each at a uniformly random point
// of it, so that they do not reach the dependency in one instant: the
// coming interval, or 0 when the rate is unbounded. Release calls with
// [Pacer.Take] and end the tick with [Pacer.EndTick].
func (p *Pacer) Tick(now time.Duration) (spread time.Duration) {
	if math.IsInf(p.rate, 1) {
		p.credit = math.Inf(1)
	} else {
		p.credit += p.rate * float64(now-p.last) / float64(time.Second)
	}
	if !p.slowedSinceTick && p.rate < p.ceiling && now > p.last {
		p.rate = min(p.ceiling, p.rate*math.Exp2(float64(now-p.last)/float64(doubling)))
	}
	p.last, p.slowedSinceTick = now, false
	if math.IsInf(p.rate, 1) {
		return 0
	}
	return p.Interval()
}

// Take spends the credit of one call and reports whether there was enough.
func (p *Pacer) Take() bool {
	if p.credit < 1 {
		return false
	}
	p.credit--
	return true
}

// EndTick ends a tick; left reports whether calls are still waiting to be
// released. With none left, p keeps the credit of one call at most, so a
// call that comes to wait later is not released in a burst of saved-up
// credit.
func (p *Pacer) EndTick(left bool) {
	if !left {
		p.credit = min(p.credit, 1)
	}
}

// SlowDown halves the rate, down to the floor, after a failure at now
// while p releases: at most once per tick (a burst of failures from one
// tick's calls is one signal). An unbounded rate drops to the ceiling.
func (p *Pacer) SlowDown(now time.Duration) {
	if p.slowed && now-p.cut < p.Interval() {
		return
	}
	p.cut, p.slowed, p.slowedSinceTick = now, true, true
	if math.IsInf(p.rate, 1) {
		p.rate = p.ceiling
		return
	}
	p.rate = max(p.rate/2, p.floor)
}
