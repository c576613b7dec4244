package breaker

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/pace"
	"github.com/stormguard/stormguard/internal/tagged"
)

// The closed-state window: outcomes counted in Buckets buckets of
// Window/Buckets each, one atomic counter word per bucket and outcome,
// tagged with the bucket's number, so that counting a success is one
// compare-and-swap and takes no lock.

// bucket holds the counters of one bucket, each tagged with the bucket
// number.
type bucket struct{ succ, fail atomic.Uint64 }

// bucketOf returns the bucket number of time t in closed generation gen.
func (b *Breaker) bucketOf(t time.Time, gen uint64) int64 {
	d := t.Sub(b.base)
	e := int64(d / b.bucket)
	if d < 0 && d%b.bucket != 0 {
		e-- // floor
	}
	// Generations are at least 3 apart between closed states, so the
	// buckets of an older closed generation are at least 3 windows behind.
	return e + int64(gen)*b.buckets
}

// index returns the ring position of bucket e.
func (b *Breaker) index(e int64) int64 {
	i := e % b.buckets
	if i < 0 {
		i += b.buckets
	}
	return i
}

// record counts a closed-state outcome of generation gen and, for a
// failure, trips the breaker if the window calls for it. A success cannot
// trip it, so it costs one counter update and no window sum; at, if not
// zero, is the time of a success (the caller read the clock).
func (b *Breaker) record(gen uint64, success bool, hint time.Duration, at time.Time) {
	if b.shared != nil {
		b.shared.Outcome(success)
	}
	now := at
	if !success || now.IsZero() {
		now = b.now()
	}
	// The run of consecutive failures first: it does not depend on the
	// clock, so an outcome too old for the window (a Config.Now stepped
	// back) still counts in it.
	run := false
	if b.consec > 0 {
		if success {
			if b.streak.Load() != 0 {
				b.streak.Store(0)
			}
		} else {
			run = b.failStreak(gen) >= b.consec
		}
	}
	e := b.bucketOf(now, gen)
	ctr, other := &b.counts[b.index(e)].succ, &b.counts[b.index(e)].fail
	if !success {
		ctr, other = other, ctr
	}
	tag := tagged.Tag(e)
count:
	for {
		old := ctr.Load()
		otag, n := tagged.Unpack(old)
		var next uint64
		switch d := tagged.Diff(tag, otag); {
		case d == 0:
			if n == tagged.MaxCount {
				// Full: halve both of the bucket's counts, which keeps
				// their ratio (a count that stopped at the top while the
				// other went on read 33% failures as 50%).
				next = tagged.Pack(e, n/2+1)
				if ctr.CompareAndSwap(old, next) {
					halve(other, e)
					break count
				}
				continue
			}
			next = old + 1
		case d > 0:
			next = tagged.Pack(e, 1) // the counter held an expired bucket
		default:
			// The counter holds a later bucket: this outcome is too old
			// for the window.
			if run {
				break count
			}
			return
		}
		if next == old || ctr.CompareAndSwap(old, next) {
			break
		}
	}
	if success {
		return
	}
	releasing := b.releasing.Load()
	if releasing {
		b.mu.Lock()
		b.rel.slowDown(b.since(now), gen)
		b.mu.Unlock()
	}
	calls, failures := b.window(e)
	if !run && !b.trips(calls, failures, releasing) {
		if bc, bf := b.bucketCounts(e); !b.trips(bc, bf, false) {
			b.notePeak(calls, failures, now, e)
			return
		}
	}
	b.mu.Lock()
	if b.state.Load() == word(gen, Closed) {
		b.rate = b.tripRate(calls, now, e)
		b.reopens = 0
		b.openLocked(Closed, now, hint)
	}
	b.mu.Unlock()
	b.deliver()
}

// halve halves the count ctr holds for bucket e, if it holds one.
func halve(ctr *atomic.Uint64, e int64) {
	for {
		old := ctr.Load()
		otag, n := tagged.Unpack(old)
		// Rounded up: a count of 1 stays 1 (at 0, one success among 2^24
		// failures read as none, and FailureRatio 1 tripped).
		if tagged.Diff(tagged.Tag(e), otag) != 0 || ctr.CompareAndSwap(old, tagged.Pack(e, (n+1)/2)) {
			return
		}
	}
}

// failStreak adds a failure of closed generation gen to the run of
// consecutive failures and returns the run's length. A run of an older
// generation starts again at 1.
func (b *Breaker) failStreak(gen uint64) uint64 {
	tag := gen << 32
	for {
		old := b.streak.Load()
		next := tag | 1
		if old&^(1<<32-1) == tag {
			next = old + 1
			if old&(1<<32-1) == 1<<32-1 {
				next = old // saturated
			}
		}
		if next == old || b.streak.CompareAndSwap(old, next) {
			return next & (1<<32 - 1)
		}
	}
}

// trips reports whether calls outcomes with failures among them cross the
// failure ratio, with at least MinCalls calls, or at least Probes calls
// while the calls that waited are being released (the dependency has just
// passed a probe round of that many calls; as many calls of the release,
// failures at least the failure ratio of them, are as strong a sign that
// it is down again).
func (b *Breaker) trips(calls, failures uint64, releasing bool) bool {
	least := b.minCalls
	if releasing {
		least = min(least, uint64(b.probes))
	}
	return calls >= least && b.atRatio(calls, failures)
}

// atRatio reports whether failures of calls are at or above the failure
// ratio. The product's rounding is allowed for (0.28·25 is
// 7.000000000000001 in floating point, and 7 failures of 25 are at 0.28).
func (b *Breaker) atRatio(calls, failures uint64) bool {
	return float64(failures) >= b.ratio*float64(calls)*(1-1e-12)
}

// bucketCounts returns the calls and failures of bucket e alone.
func (b *Breaker) bucketCounts(e int64) (calls, failures uint64) {
	c, tag := &b.counts[b.index(e)], tagged.Tag(e)
	if t, n := tagged.Unpack(c.succ.Load()); t == tag {
		calls += n
	}
	if t, n := tagged.Unpack(c.fail.Load()); t == tag {
		calls += n
		failures += n
	}
	return calls, failures
}

// window returns the calls and failures in the window ending in bucket cur.
func (b *Breaker) window(cur int64) (calls, failures uint64) {
	e := cur - b.buckets + 1
	for i := b.index(e); e <= cur; e++ {
		c, tag := &b.counts[i], tagged.Tag(e)
		if t, n := tagged.Unpack(c.succ.Load()); t == tag {
			calls += n
		}
		if t, n := tagged.Unpack(c.fail.Load()); t == tag {
			calls += n
			failures += n
		}
		if i++; i == int64(len(b.counts)) {
			i = 0
		}
	}
	return calls, failures
}

// releaseRate returns the ceiling, in calls per second, of the release of
// the waiting calls after the next close, for a trip at now with calls in
// the window (see [pace.Ceiling]).
func (b *Breaker) releaseRate(calls uint64, now time.Time) float64 {
	return pace.Ceiling(b.cfg.ReleaseRate, calls, b.span(now), b.releaseFloor())
}

// span returns the time the window covers at now: its buckets (the
// current one up to now), or the time since the breaker last closed (or
// was built) if that is less; at least a bucket or a second, whichever is
// less (a few calls over a moment are no rate).
func (b *Breaker) span(now time.Time) time.Duration {
	d := b.since(now)
	in := d % b.bucket
	if in < 0 {
		in += b.bucket
	}
	span := time.Duration(b.buckets-1)*b.bucket + in
	span = min(span, d-time.Duration(b.closedAt.Load()))
	return max(span, min(b.bucket, time.Second))
}

// notePeak keeps, for a closed-state failure at now in bucket e that did
// not trip the breaker, the rate over the window (its calls over the time
// it covers) if the window is below the
// failure ratio: the highest such rate of each window-aligned period, two
// periods kept. Two failures at once may keep the lower of their rates:
// an estimate.
func (b *Breaker) notePeak(calls, failures uint64, now time.Time, e int64) {
	if calls == 0 || b.atRatio(calls, failures) || b.sinceClose(now) < b.cfg.Window {
		// Within a window of a close the window holds the release (the
		// backlog on top of the new calls, over a short time): not the
		// pace the dependency served.
		return
	}
	r := float32(float64(calls) / b.span(now).Seconds())
	ep := uint32(b.period(e))
	slot := &b.peaks[ep&1]
	for {
		old := slot.Load()
		if oep, orate := peakOf(old); oep == ep && orate >= r {
			return
		}
		if slot.CompareAndSwap(old, uint64(math.Float32bits(r))<<32|uint64(ep)) {
			return
		}
	}
}

// peakOf unpacks a kept peak: its period (low 32 bits) and its rate, calls
// per second (a float32's bits, high 32).
func peakOf(v uint64) (period uint32, rate float32) {
	return uint32(v), math.Float32frombits(uint32(v >> 32))
}

// period returns the window-aligned period of bucket e.
func (b *Breaker) period(e int64) int64 {
	p := e / b.buckets
	if e < 0 && e%b.buckets != 0 {
		p-- // floor
	}
	return p
}

// tripRate returns the release ceiling for a trip at now, in bucket e, with
// calls in the window: [Breaker.releaseRate], or, with
// ReleaseRate 0, if higher, the peak a failure kept in this period or the
// two before (notePeak); if the breaker closed less than a window ago, the
// ceiling of the trip before instead (the window then holds the release of
// the backlog, a rate the dependency may not serve). An outage the closed state sees as a
// trickle of failures (a concurrency limiter holds the other calls back,
// each bucket holds fewer than MinCalls) trips the breaker only once the
// healthy calls leave the window: the window's rate then is the trickle's,
// the peak the rate the dependency served before the outage. A trip soon
// after a close (a dependency that fails again as its backlog is released)
// finds only the calls since the close in the window. It requires mu held.
func (b *Breaker) tripRate(calls uint64, now time.Time, e int64) float64 {
	r := b.releaseRate(calls, now)
	if b.cfg.ReleaseRate != 0 {
		return r
	}
	ep := uint32(b.period(e))
	for i := range b.peaks {
		if pp, pr := peakOf(b.peaks[i].Load()); ep-pp <= 2 {
			r = max(r, float64(pr))
		}
	}
	if b.sinceClose(now) < b.cfg.Window && b.rate > 0 {
		return b.rate // the window holds the release, not the pace before
	}
	return r
}

// sinceClose returns the time from the breaker's last close to now; the
// largest Duration if it never closed after a trip (or a Reset).
func (b *Breaker) sinceClose(now time.Time) time.Duration {
	if !b.reclosed.Load() {
		return math.MaxInt64
	}
	return b.since(now) - time.Duration(b.closedAt.Load())
}

// releaseFloor is the least release rate: Probes per OpenFor, the pace of
// the probe rounds.
func (b *Breaker) releaseFloor() float64 {
	return float64(b.probes) / b.cfg.OpenFor.Seconds()
}
