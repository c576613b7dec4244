package breaker

import (
	"time"

	"github.com/stormguard/stormguard/internal/pace"
	"github.com/stormguard/stormguard/internal/sat"
	"github.com/stormguard/stormguard/internal/waitq"
)

// The state changes (open, half-open, close) and the probe rounds: an open
// period ends, a round half-opens the breaker and hands its probes to the
// waiting calls first, and its outcome closes or reopens it.

// startRound starts the probe round that is due in open state word w:
// the breaker half-opens, and waiting calls get the probe permits first.
// With a Shared fleet that refuses the round, the breaker stays open for
// another probe interval. It reports false if the breaker is still open
// (refused, or another goroutine is asking the fleet).
func (b *Breaker) startRound(w uint64, now time.Time) bool {
	if b.shared != nil {
		if !b.asking.CompareAndSwap(false, true) {
			return b.state.Load() != w
		}
		ok := b.askRound()
		now = b.now() // the round trip took time: the next interval counts from its answer
		if !ok {
			b.mu.Lock()
			if t := b.since(now); b.state.Load() == w && b.openUntil.Load() <= int64(t) {
				// Another probe interval, not the open period again:
				// a server's Retry-After that set it has been honoured.
				b.openUntil.Store(int64(sat.Add(t, b.jitter(b.intervalLocked()))))
				b.armRoundLocked(now)
			}
			b.mu.Unlock()
			return false
		}
	}
	b.mu.Lock()
	b.halfOpenLocked(w, now)
	b.mu.Unlock()
	b.deliver()
	return true
}

// askRound asks Shared for a probe round; it requires asking set, and
// clears it whatever ProbeRound does: a panic (re-raised to the caller)
// must not leave every later round waiting for an answer that never comes.
func (b *Breaker) askRound() bool {
	defer b.asking.Store(false)
	return b.shared.ProbeRound()
}

// openIn returns how long after now the current open period ends (0 if it
// has ended).
func (b *Breaker) openIn(now time.Time) time.Duration {
	return max(sat.Add(time.Duration(b.openUntil.Load()), -b.since(now)), 0)
}

// jitter returns d spread uniformly over ±20%, saturating. A d of noBound
// or more is not spread: it means no end (see Config.OpenFor), which 80% of
// it would give one.
func (b *Breaker) jitter(d time.Duration) time.Duration {
	if d >= noBound {
		return d
	}
	f := 0.8 + 0.4*b.u()
	if f == 1 { // exactly d: float64(d) would round a d above 2^53 ns
		return d
	}
	return sat.Scale(d, f)
}

// spread returns hint plus up to half of it again, saturating: breakers
// told the same Retry-After at the same instant do not probe in step, and a
// hint near the largest Duration stays a time far ahead.
func (b *Breaker) spread(hint time.Duration) time.Duration {
	return sat.Add(hint, time.Duration(b.u()*float64(hint/2)))
}

// openLocked opens the breaker from state from, for OpenFor doubled once
// per earlier consecutive trip (b.reopens), up to MaxOpenFor, jittered, and
// at least hint spread by up to half of it. Waiting calls whose release was
// scheduled go back to waiting. It requires mu held.
func (b *Breaker) openLocked(from State, now time.Time, hint time.Duration) {
	d := b.jitter(b.intervalLocked())
	if hint > 0 {
		d = max(d, b.spread(hint))
	}
	b.openUntil.Store(int64(sat.Add(b.since(now), d)))
	b.stopReleaseLocked()
	b.setLocked(from, Open)
	b.unreleaseLocked()
	b.armRoundLocked(now)
}

// intervalLocked returns the probe interval, before jitter: OpenFor
// doubled once per earlier consecutive trip (b.reopens), up to MaxOpenFor.
// It requires mu held.
func (b *Breaker) intervalLocked() time.Duration {
	d := b.cfg.OpenFor
	if limit := b.cfg.MaxOpenFor; limit > 0 {
		for range b.reopens {
			if d >= limit-d { // doubled, it would reach the limit (limit/2 rounds down)
				d = limit
				break
			}
			d *= 2
		}
		d = min(d, limit)
	}
	return d
}

// halfOpenLocked moves the breaker from Open to HalfOpen if its state is
// still w and the open period is over at now, and hands the probes to the
// waiting calls with the most time left. It requires mu held.
func (b *Breaker) halfOpenLocked(w uint64, now time.Time) {
	if b.state.Load() != w || stateOf(w) != Open || b.openIn(now) > 0 {
		return
	}
	b.admitted, b.succeeded = 0, 0
	b.setLocked(Open, HalfOpen)
	b.grantProbesLocked()
}

// closeLocked closes the breaker from state from and starts the release of
// the waiting calls, earliest deadline first. It requires mu held.
func (b *Breaker) closeLocked(from State, now time.Time) {
	b.reopens = 0
	b.closedAt.Store(int64(b.since(now)))
	b.reclosed.Store(true)
	b.setLocked(from, Closed)
	rate := b.rate
	if rate == 0 { // it never tripped from closed
		rate = pace.Ceiling(b.cfg.ReleaseRate, 0, b.cfg.Window, b.releaseFloor())
	}
	b.startReleaseLocked(now, rate)
}

// grantProbesLocked hands the free probes of the current half-open round
// to the waiting calls with the most time left: the latest deadlines, of
// equal ones the first to come (a call still holding a grant of a round
// that ended included). A probe is there to bring back the
// dependency's answer; a call about to give up would carry it to its
// deadline and hand it on unanswered (the next such call the same), so
// that a round to a dependency that is down would never end. It requires
// mu held.
func (b *Breaker) grantProbesLocked() {
	s := b.state.Load()
	if stateOf(s) != HalfOpen {
		return
	}
	// Groups of equal deadlines from the back, each in arrival order.
	for last := b.waiters.Back(); last != nil && b.admitted < b.probes; {
		first := waitq.LastFirst(last)
		for w := first; b.admitted < b.probes; w = w.Next() {
			// A grant of a round that ended (the call has not woken
			// since) is no grant: the call keeps its place.
			if c := &w.Value; !c.granted || c.permit.gen != genOf(s) {
				c.granted, c.permit = true, Permit{gen: genOf(s), bits: isProbe}
				b.admitted++
				c.signal()
			}
			if w == last {
				break
			}
		}
		last = first.Prev()
	}
}

// cancelProbeLocked frees the slot of probe p and hands it to the waiting
// call with the most time left, if any. It requires mu held.
func (b *Breaker) cancelProbeLocked(p Permit) {
	if b.state.Load() == word(p.gen, HalfOpen) && b.admitted > b.succeeded {
		b.admitted--
		b.grantProbesLocked()
	}
}

// armRoundLocked makes sure that a probe round starts for the waiting
// calls when the open period ends, even if no other call arrives then. It
// requires mu held.
// A timer armed for a later time (an open period since cut short: a Reset
// and a new trip) is brought forward.
func (b *Breaker) armRoundLocked(now time.Time) {
	if b.waiters.Len() == 0 || stateOf(b.state.Load()) != Open {
		return
	}
	d := b.openIn(now)
	due := sat.Add(b.since(now), d)
	if b.roundArmed && b.roundAt <= due {
		return
	}
	b.roundArmed, b.roundAt = true, due
	if b.roundTimer == nil {
		b.roundTimer = time.AfterFunc(d, b.roundDue)
	} else {
		b.roundTimer.Reset(d)
	}
}

// roundDue runs on the round timer's goroutine when an open period ends
// while calls are waiting. A callback or Shared.ProbeRound that panics
// there, where no caller could recover it, is recovered: its value is
// dropped, and a breaker still open asks for its round again an interval
// later (a ProbeRound that panics counts as a refusal).
func (b *Breaker) roundDue() {
	defer func() {
		if recover() != nil {
			b.mu.Lock()
			if stateOf(b.state.Load()) == Open {
				now := b.now()
				if t := b.since(now); b.openUntil.Load() <= int64(t) {
					b.openUntil.Store(int64(sat.Add(t, b.jitter(b.intervalLocked())))) // as a refusal
				}
				b.armRoundLocked(now)
			}
			b.mu.Unlock()
		}
	}()
	b.mu.Lock()
	b.roundArmed = false
	w := b.state.Load()
	b.mu.Unlock()
	if stateOf(w) != Open {
		return
	}
	now := b.now()
	if b.openIn(now) > 0 || !b.startRound(w, now) {
		if b.openIn(now) == 0 && b.asking.Load() {
			// Another goroutine is asking Shared for this round: if it is
			// refused, it re-arms the round. Re-arming here would find
			// the period over and fire again at once, in a loop, for as
			// long as the ask (a round trip) takes.
			return
		}
		b.mu.Lock()
		b.armRoundLocked(b.now())
		b.mu.Unlock()
	}
}
