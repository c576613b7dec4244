package lathist

import (
	"sync"
	"sync/atomic"
	"time"
)

// Dues counts, for one destination, the races that start and those whose
// first copy is still unanswered at its hedge delay ("due"), counted when
// the delay passes, not when the copy ends: a stall in which nothing ends
// shows in it at once. If the delay is the q quantile of the answers'
// latency, about 1-q of the races reach it; a much larger share in the last
// second is not a tail but a stall or an overload, and more copies would
// only add to it.
//
// The counts are kept per period in two slots, each one atomic word (the
// period's number and both counts), and read over a sliding period: the
// current one's counts plus the previous one's weighted by the part of it
// still within a period of now. Counts saturate at about a million per
// period.
//
// Besides, it keeps the races in flight (from Start to End) and those of
// them past their delay: the same share at this instant. At a high rate a
// period holds many races, so a burst of races queued behind a short
// stall of the destination (each due within a few milliseconds) stays
// within the period's share, and more copies would only lengthen the
// queue; but the burst makes most of the races in flight due at once. The
// instantaneous share shows it as soon as it forms, and falls back as soon
// as the burst's races end (the period's counts remember them for up to a
// period). If the delay is the q quantile and a race past it ends within
// about a median (its hedge's answer), about 1-q of the races in flight
// are past it (Little's law), as about 1-q of a period's races are.
//
// And it keeps the destination's good answers in a row that took longer
// than their race's delay (Answered), and when the last of them came: a
// queue at the destination, in which every request waits, makes each
// answer late, where a request that is slow on its own is late among
// answers on time (at the q quantile, 1-q of the answers are late, two in
// a row seldom). A hedge sent into the queue waits behind the same
// requests and adds to it (Queued).
//
// It allocates nothing and is safe for concurrent use. Start, End and
// Allows take no lock; Due takes a short one, so that races reaching their
// delay together are counted and decided in one order (with the two counts
// taken apart, ten races due at once could each see the other nine counted
// in one of them, and fewer than the floor got their hedge).
type Dues struct {
	base   time.Time
	period time.Duration
	w      [2]atomic.Uint64 // epoch<<epochShift | due<<countBits | started

	dueMu sync.Mutex // orders Due's calls: its two counts and the decision

	flight atomic.Int64 // races started and not ended
	past   atomic.Int64 // of them, those that reached their delay

	lateRun atomic.Int64 // good answers in a row that took longer than their delay
	lateAt  atomic.Int64 // when the last of them came, since base (ns)
}

// queuedAfter is the number of late answers in a row that Queued reads as
// a queue at the destination.
const queuedAfter = 2

const (
	countBits  = 20
	countMax   = 1<<countBits - 1
	epochShift = 2 * countBits
	epochMask  = 1<<(64-epochShift) - 1
)

// NewDues returns a counter over periods of period (at least 1 ms).
func NewDues(period time.Duration) *Dues {
	if period < time.Millisecond {
		period = time.Millisecond
	}
	return &Dues{base: time.Now(), period: period} // a slot of zeros is a period with no race
}

// Start counts a race that starts at now (the caller's reading of the
// clock, so that a race costs no second one). The race is in flight until
// its End.
func (d *Dues) Start(now time.Time) {
	since := now.Sub(d.base)
	ep := uint64(since/d.period) & epochMask
	d.count(&d.w[ep&1], ep, 1, 0)
	d.flight.Add(1)
}

// Due counts a race whose first copy reached its delay now (at most once
// per race, between its Start and its End), and reports whether the races
// that did so within the last period, this one included, are at most share
// of the races started within it, or at most floor; and the races in
// flight past their delay, this one included, at most share of the races
// in flight, or at most floor.
func (d *Dues) Due(share, floor float64) bool {
	d.dueMu.Lock()
	defer d.dueMu.Unlock()
	started, due := d.read(time.Now(), 1)
	past := d.past.Add(1)
	return due <= max(floor, share*started) && d.nowAllows(past, share, floor)
}

// Allows reports, without counting a race, whether the races that reached
// their delay within the last period are at most share of those started
// within it, or at most floor, and those in flight past their delay at
// most share of the races in flight, or at most floor.
func (d *Dues) Allows(share, floor float64) bool {
	started, due := d.read(time.Now(), 0)
	return due <= max(floor, share*started) && d.nowAllows(d.past.Load(), share, floor)
}

// End counts the end of a race that Start counted; due: Due counted it.
func (d *Dues) End(due bool) {
	if due {
		d.past.Add(-1)
	}
	d.flight.Add(-1)
}

// Answered notes a good answer of a copy in a race: late if it took
// longer than the race's hedge delay (the copy's own time, from its
// send). An answer on time ends a run of late ones at the cost of a read
// (most answers are on time: no write to a word that every race shares);
// a late one reads the clock.
func (d *Dues) Answered(late bool) {
	if late || d.lateRun.Load() != 0 {
		d.note(late)
	}
}

// note ends a run of late answers, or counts a late one: Answered's rare
// path, kept apart so that Answered inlines.
//
//go:noinline
func (d *Dues) note(late bool) {
	if !late {
		d.lateRun.Store(0)
		return
	}
	d.lateAt.Store(int64(time.Since(d.base)))
	d.lateRun.Add(1)
}

// Queued reports whether the destination's last good answers, queuedAfter
// or more in a row, each took longer than its race's delay, the last of
// them within half a delay of now: its requests wait in a queue, which a
// hedge would join. An answer on time ends it, and so does half a delay
// with no late answer (a held race looks again every half delay: one that
// finds no late answer since its last look sends its hedge).
func (d *Dues) Queued(delay time.Duration) bool {
	return d.lateRun.Load() >= queuedAfter && time.Since(d.base)-time.Duration(d.lateAt.Load()) <= delay/2
}

// nowAllows reports whether past races in flight past their delay are at
// most share of the races in flight, or at most floor.
func (d *Dues) nowAllows(past int64, share, floor float64) bool {
	return float64(past) <= max(floor, share*float64(d.flight.Load()))
}

// count adds started and due races to slot, the slot of period ep, and
// returns its counts after.
func (d *Dues) count(slot *atomic.Uint64, ep, started, due uint64) (s, u uint64) {
	for {
		old := slot.Load()
		s, u = 0, 0
		if old>>epochShift == ep {
			s, u = old&countMax, old>>countBits&countMax
		}
		if started == 0 && due == 0 {
			return s, u
		}
		s, u = min(s+started, countMax), min(u+due, countMax)
		if slot.CompareAndSwap(old, ep<<epochShift|u<<countBits|s) {
			return s, u
		}
	}
}

// read counts due races at now and returns the counts over the sliding
// period that ends at now.
func (d *Dues) read(now time.Time, due uint64) (float64, float64) {
	since := now.Sub(d.base)
	ep := uint64(since/d.period) & epochMask
	s, u := d.count(&d.w[ep&1], ep, 0, due)
	prev := d.w[(ep-1)&1].Load()
	if prev>>epochShift != (ep-1)&epochMask {
		return float64(s), float64(u)
	}
	left := 1 - float64(since%d.period)/float64(d.period) // the previous period's part still within one period of now
	return float64(s) + left*float64(prev&countMax), float64(u) + left*float64(prev>>countBits&countMax)
}

// LookAgain returns when a race held back by the bound (see Due) looks
// again for its hedge, after it has looked looks times since its delay
// (0 the first time): every half delay for the first 6 looks (three delays:
// a burst queued behind a few slow requests clears within a few delays,
// and a copy unanswered after it is most likely a slow one), then after
// one delay, doubling each time (a stall or an overload that lasts costs
// a race a few looks, not one per delay). At least 1 ms, at most a minute.
func LookAgain(delay time.Duration, looks int) time.Duration {
	d := delay / 2
	if looks >= 6 {
		k := min(looks-6, 16)
		if delay > time.Minute>>k {
			return time.Minute
		}
		d = delay << k
	}
	return min(max(d, time.Millisecond), time.Minute)
}
