package breaker

import (
	"context"
	"math"
	"time"

	"github.com/stormguard/stormguard/internal/waitq"
)

// Waiting: a call that meets an open breaker with time to spare waits in a
// list ordered by deadline ([waitq.List]), parked on a channel, until a
// probe round hands it a probe or the release lets it go.

// Wait is [Breaker.Allow] for a caller that can wait up to maxWait (the
// time its deadline leaves) to be admitted. A closed breaker admits at
// once. An open one makes the call wait, without sending it, when the next
// probe round comes before maxWait ends and fewer than MaxWaiters calls are
// waiting already: the call may be handed one of the round's probes (the
// calls with the most time left first), or, once the breaker closes, is
// released in its turn (earliest deadline first, at the release rate; see
// [Config].ReleaseRate). If the breaker reopens first, the call keeps
// waiting. A maxWait near the largest Duration means no bound: such a call
// is served after every call with a nearer deadline.
//
// Wait returns a [Permit] to give back as with Allow, or the
// [*OpenError] of the rejection when the call cannot wait (maxWait <= 0,
// the next round comes too late, too many waiters, waiting turned off), or
// when ctx ends or maxWait passes before the call is admitted. A waiting
// call holds no lock and starts no goroutine; its timers run on real time
// (or a testing/synctest bubble's). While the breaker is closed, Wait costs
// what Allow costs.
func (b *Breaker) Wait(ctx context.Context, maxWait time.Duration) (Permit, error) {
	w := b.state.Load()
	if stateOf(w) == Closed {
		if b.slow > 0 {
			return b.stamp(Permit{gen: genOf(w)}), nil
		}
		return Permit{gen: genOf(w)}, nil
	}
	p, err := b.waitSlow(ctx, w, maxWait)
	if b.slow > 0 {
		p = b.stamp(p)
	}
	return p, err
}

// noBound is where a maxWait means no bound: an open period that saturated
// at the largest Duration (a Retry-After of centuries) does not turn away a
// call that set none.
const noBound = time.Duration(math.MaxInt64 / 2)

// waitSlow is Wait for a breaker that was not closed (state word w).
func (b *Breaker) waitSlow(ctx context.Context, w uint64, maxWait time.Duration) (Permit, error) {
	p, err := b.allowSlow(w)
	if err == nil || maxWait <= 0 || b.waiters.Max == 0 || ctx.Err() != nil {
		return p, err
	}
	if oe, ok := err.(*OpenError); ok && oe.State == Open && oe.Wait >= maxWait && maxWait < noBound {
		return p, err // the round comes too late (a call without a bound waits for it, however far)
	}
	return b.wait(ctx, maxWait, err)
}

// waiter is what the breaker knows of a call waiting in Wait. Its fields
// are guarded by the breaker's mu.
type waiter struct {
	ch         chan struct{} // a buffered wake-up: something changed
	granted    bool          // permit holds a probe for this call
	permit     Permit        // the probe, when granted
	release    time.Duration // when closed: the release time since base, + 1; 0 if none
	releaseGen uint64        // the closed generation release belongs to
}

func (w *waiter) signal() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// wait parks the call until it is admitted, ctx ends or maxWait passes.
// rejection is what it returns if it gives up at once.
func (b *Breaker) wait(ctx context.Context, maxWait time.Duration, rejection error) (Permit, error) {
	n := &waitq.Waiter[waiter]{Value: waiter{ch: make(chan struct{}, 1)}}
	w := &n.Value
	b.mu.Lock()
	now := b.now()
	if !b.waiters.Push(n, waitq.Deadline(b.since(now), maxWait)) {
		b.mu.Unlock()
		return Permit{}, rejection
	}
	b.grantProbesLocked()
	b.armRoundLocked(now)
	b.mu.Unlock()

	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	var release *time.Timer
	var releaseC <-chan time.Time
	defer func() {
		if release != nil {
			release.Stop()
		}
	}()
	for {
		b.mu.Lock()
		s := b.state.Load()
		if w.granted && s != word(w.permit.gen, HalfOpen) {
			// Its round is over (the breaker reopened, or closed on the
			// other probes) before the call woke: it waits on as any
			// other call.
			w.granted, w.permit = false, Permit{}
			// A round in progress may have slots its grants passed it
			// over for (it still held the old grant): offer them again.
			b.grantProbesLocked()
		}
		switch {
		case w.granted:
			b.waiters.Remove(n)
			b.mu.Unlock()
			return w.permit, nil
		case stateOf(s) == Closed && (w.release == 0 || w.releaseGen != genOf(s)):
			if b.releasing.Load() && b.rel.gen == genOf(s) {
				releaseC = nil // the pacer will come to it
				break
			}
			// Closed and nothing paces the release (it joined as the
			// breaker closed): it goes now.
			b.waiters.Remove(n)
			b.mu.Unlock()
			return Permit{gen: genOf(s)}, nil
		case stateOf(s) == Closed:
			left := w.release - 1 - b.since(b.now())
			if left <= 0 {
				b.waiters.Remove(n)
				b.mu.Unlock()
				return Permit{gen: w.releaseGen}, nil
			}
			if release == nil {
				release = time.NewTimer(left)
			} else {
				release.Reset(left)
			}
			releaseC = release.C
		default:
			releaseC = nil
		}
		b.mu.Unlock()
		select {
		case <-w.ch:
		case <-releaseC:
		case <-ctx.Done():
			return Permit{}, b.leave(n)
		case <-deadline.C:
			return Permit{}, b.leave(n)
		}
	}
}

// leave takes a waiting call that gives up off the list (giving back a
// probe it was granted meanwhile) and returns its rejection.
func (b *Breaker) leave(n *waitq.Waiter[waiter]) error {
	now := b.now()
	b.mu.Lock()
	b.waiters.Remove(n)
	if n.Value.granted {
		b.cancelProbeLocked(n.Value.permit)
	}
	err := &OpenError{State: stateOf(b.state.Load())}
	if err.State == Open {
		err.Wait = b.openIn(now)
	}
	b.mu.Unlock()
	return err
}
