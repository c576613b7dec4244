package breaker

import (
	"time"

	"github.com/stormguard/stormguard/internal/pace"
	"github.com/stormguard/stormguard/internal/sat"
)

// The release: when the breaker closes, the calls that waited through the
// open period go, earliest deadline first, at the pace of a [pace.Pacer]
// that this file steps on a timer (see Config.ReleaseRate for the rule).

// release is the pacer of the release after the last close and its timer.
// Its fields are guarded by mu.
type release struct {
	pace  pace.Pacer
	gen   uint64        // the closed generation it releases for
	until time.Duration // the latest release time handed out (since base): the release lasts until then
	timer *time.Timer
}

// slowDown halves the pace after a failure at now in closed generation
// gen, if the pacer releases for that generation (see pace.Pacer.SlowDown).
func (r *release) slowDown(now time.Duration, gen uint64) {
	if gen == r.gen {
		r.pace.SlowDown(now)
	}
}

// startReleaseLocked starts releasing the waiting calls at now, the breaker
// having just closed, with ceiling rate (calls per second). It requires mu
// held.
func (b *Breaker) startReleaseLocked(now time.Time, rate float64) {
	b.rel.gen = genOf(b.state.Load())
	b.rel.pace.Start(b.since(now), rate, b.releaseFloor())
	b.rel.until = 0
	if b.releaseLocked(now) {
		b.releasing.Store(true)
		b.armReleaseLocked()
	} else if d := b.rel.until - b.since(now); d > 0 {
		// Every waiting call has its time, the last one still to come:
		// the release lasts until then (the trip rule's Probes, and the
		// slow-down after a failure, apply to its calls).
		b.releasing.Store(true)
		b.armReleaseIn(d)
	}
}

// releaseLocked is a tick of the pacer: it releases the waiting calls the
// pacer's credit allows, earliest deadline first, each at a random point of
// the coming tick, and reports whether some are left to release. It
// requires mu held.
func (b *Breaker) releaseLocked(now time.Time) bool {
	p := &b.rel.pace
	if b.state.Load() != word(b.rel.gen, Closed) {
		return false
	}
	t := b.since(now)
	spread := float64(p.Tick(t))
	left := false
	for w := b.waiters.Front(); w != nil; w = w.Next() {
		c := &w.Value
		if c.granted || c.release != 0 {
			continue
		}
		if !p.Take() {
			left = true
			break
		}
		// release holds the time + 1, so that 0 means none.
		at := sat.Add(t, time.Duration(b.u()*spread))
		c.release, c.releaseGen = sat.Add(at, 1), b.rel.gen
		b.rel.until = max(b.rel.until, at)
		c.signal()
	}
	p.EndTick(left)
	return left
}

// unreleaseLocked sends the waiting calls whose release was scheduled back
// to waiting (the breaker opened again). It requires mu held.
func (b *Breaker) unreleaseLocked() {
	for w := b.waiters.Front(); w != nil; w = w.Next() {
		if c := &w.Value; c.release != 0 {
			c.release = 0
			c.signal()
		}
	}
}

// armReleaseLocked schedules the pacer's next tick. It requires mu held.
func (b *Breaker) armReleaseLocked() { b.armReleaseIn(b.rel.pace.Interval()) }

// armReleaseIn schedules the pacer's next tick d from now. It requires mu
// held.
func (b *Breaker) armReleaseIn(d time.Duration) {
	if b.rel.timer == nil {
		b.rel.timer = time.AfterFunc(d, b.releaseDue)
	} else {
		b.rel.timer.Reset(d)
	}
}

// releaseDue runs on the pacer's timer.
func (b *Breaker) releaseDue() {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.releasing.Load() {
		return
	}
	if b.releaseLocked(now) {
		b.armReleaseLocked()
		return
	}
	if d := b.rel.until - b.since(now); d > 0 {
		b.armReleaseIn(d) // the last release time handed out is still to come
		return
	}
	b.releasing.Store(false)
}

// stopReleaseLocked stops releasing (the breaker opens again, or closes
// anew). It requires mu held.
func (b *Breaker) stopReleaseLocked() {
	b.releasing.Store(false)
	if b.rel.timer != nil {
		b.rel.timer.Stop()
	}
}
