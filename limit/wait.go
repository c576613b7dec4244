package limit

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/stormguard/stormguard/internal/sat"
	"github.com/stormguard/stormguard/internal/waitq"
)

// Refusals of a waiting call that cannot make its deadline.
var (
	errTooClose = fmt.Errorf("%w: the deadline leaves less than the destination's fastest answer", ErrLimited)
	errNoTurn   = fmt.Errorf("%w: no slot expected before the deadline", ErrLimited)
	// errWaitDeadline refuses a call granted a slot at or after its
	// deadline, its context's timer not run yet.
	errWaitDeadline = fmt.Errorf("%w: deadline passed while waiting for a slot: %w", ErrLimited, context.DeadlineExceeded)
	errNoTime       = fmt.Errorf("%w: a slot came with less time left than twice the destination's latency, and a later call has more", ErrLimited)
)

// maxWalk bounds the waiters the hopeless checks walk at a time.
const maxWalk = 4096

// waiter is a call waiting in Acquire. Its fields are written under mu
// before the wake-up is sent on ch, and read after it is received.
type waiter struct {
	ch       chan struct{} // a buffered wake-up: granted or hopeless
	granted  bool          // a slot is the call's
	hopeless bool          // the call cannot make its deadline: it fails
	noToken  bool          // hopeless for want of a token (the rate gate)
	noTime   bool          // hopeless at its turn: less time left than the latency
	since    time.Duration // when the call began to wait (with the throttle on only)
}

// openShare is the share of the slots that calls without a deadline get
// while calls with a deadline wait too: one grant in openShare goes to the
// oldest call without a deadline, so that deadline calls that keep coming
// cannot starve it.
const openShare = 8

// wait parks a call over the limit until a release grants it a slot, ctx
// ends, or it cannot make its deadline any more. A call with a deadline
// waits in the earliest-deadline-first list and fails fast when its
// deadline is less than the baseline latency away (an attempt granted
// later could not be answered in time), or when the slots expected before
// its turn, at twice the rate the destination is served at, come too
// late. A call without a deadline waits in the open list, first in first
// out, behind every call with a deadline but for one grant in openShare;
// it is never hopeless and leaves only when granted or when ctx ends.
func (l *Limiter) wait(ctx context.Context, flags uint8) (Permit, error) {
	if !l.waiting {
		l.undoThrottle()
		return Permit{}, errNoWaiting
	}
	dl, ok := ctx.Deadline()
	n := &waitq.Waiter[waiter]{Value: waiter{ch: make(chan struct{}, 1)}}
	if l.throttle != nil {
		n.Value.since = l.since()
	}
	l.mu.Lock()
	if !ok {
		if l.fullLocked() {
			l.mu.Unlock()
			l.undoThrottle()
			return Permit{}, errTooMany
		}
		l.open.Push(n, math.MaxInt64) // the largest deadline: arrival order
		l.nwait.Add(1)
		l.grantLocked()
		l.mu.Unlock()
		return l.await(ctx, n, nil, flags)
	}
	now := l.since()
	// Saturating: a deadline far in the past (a context's zero time)
	// must not wrap around to one far in the future.
	left := sat.Add(dl.Sub(l.base), -now)
	b := l.learn.base.value
	if left <= b { // within the fastest answer, or passed (no latency yet)
		l.mu.Unlock()
		l.undoThrottle()
		return Permit{}, errTooClose
	}
	if l.fullLocked() {
		l.mu.Unlock()
		l.undoThrottle()
		return Permit{}, errTooMany
	}
	l.waiters.Push(n, waitq.Deadline(now, left))
	l.nwait.Add(1)
	if gap, iv := l.gapLocked(), l.riv.Load(); gap > 0 || iv > 0 {
		behind := 0
		for w := n.Next(); w != nil && behind <= maxWalk; w = w.Next() {
			behind++
		}
		ahead := l.waiters.Len() - 1 - behind
		if behind > maxWalk {
			// Too many behind to count them: count those ahead, up to
			// maxWalk+1, a lower bound on them that the checks below
			// refuse on only when even it leaves no turn.
			ahead = 0
			for w := n.Prev(); w != nil && ahead <= maxWalk; w = w.Prev() {
				ahead++
			}
		}
		var err error
		switch {
		case gap > 0 && time.Duration(ahead+1)*gap+b >= left:
			err = errNoTurn
		case !l.rateTurnLocked(now, now+left, ahead):
			err = errNoToken
			l.repNoTok++
		}
		if err != nil {
			l.waiters.Remove(n)
			l.nwait.Add(-1)
			l.mu.Unlock()
			l.undoThrottle()
			return Permit{}, err
		}
	}
	// A release that ran between the failed fast path and the Push did not
	// see this waiter: grant what is free now.
	l.grantLocked()
	l.mu.Unlock()

	t := time.NewTimer(tooCloseIn(left, b))
	defer t.Stop()
	return l.await(ctx, n, t, flags)
}

// tooCloseIn returns when a waiting call with left to its deadline looks
// again whether that is within the baseline b: at left - b, or with no
// baseline yet halfway to the deadline (a baseline learned meanwhile is
// then seen within half the time left).
func tooCloseIn(left, b time.Duration) time.Duration {
	if b > 0 {
		return left - b
	}
	return left / 2
}

// baselineLatency returns the baseline latency.
func (l *Limiter) baselineLatency() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.learn.base.value
}

// fullLocked reports whether Config.Waiting calls wait already, with and
// without a deadline. Calls with mu held.
func (l *Limiter) fullLocked() bool {
	return l.waiters.Len()+l.open.Len() >= l.maxWait
}

// await waits for n's wake-up (a slot, or hopeless) or its refusal (see
// awaitWake), and returns the slot, or why there is none.
func (l *Limiter) await(ctx context.Context, n *waitq.Waiter[waiter], tooClose *time.Timer, flags uint8) (Permit, error) {
	if err := l.awaitWake(ctx, n, tooClose); err != nil {
		return Permit{}, err
	}
	if n.Value.hopeless {
		l.undoThrottle()
		switch {
		case n.Value.noToken:
			return Permit{}, errNoToken
		case n.Value.noTime:
			return Permit{}, errNoTime
		}
		return Permit{}, errNoTurn
	}
	// A slot granted as the call's context ended, or at or after its
	// deadline (before the context's timer ran): the call gets no slot
	// it has no time to use, and the slot goes back unused.
	if ctx.Err() != nil {
		return Permit{}, l.leave(n, waitError(ctx))
	}
	if n.Deadline() != math.MaxInt64 {
		switch left := n.Deadline() - l.since(); {
		case left <= 0:
			return Permit{}, l.leave(n, errWaitDeadline)
		case left <= l.baselineLatency():
			// Within the fastest answer: the slot could not be
			// answered in time (the baseline may have been learned
			// after the call began to wait).
			return Permit{}, l.leave(n, errTooClose)
		}
	}
	// The throttle judges again a call that waited longer than its
	// history at its slot: one that passed it before the destination
	// stopped accepting would otherwise go at the pace of the slots,
	// not the throttle's.
	if l.throttle != nil {
		if now := l.since(); now-n.Value.since >= throttleHistory && !l.throttle.admit(now) {
			l.Release(permit(0, permitOK), false)
			return Permit{}, errThrottled
		}
	}
	if flags&permitSampled != 0 || l.sampleWaiter() {
		return permit(l.since(), flags|permitSampled), nil
	}
	return permit(0, flags), nil
}

// leave takes a call that gives up off the list and returns err; a slot it
// was granted meanwhile goes back.
func (l *Limiter) leave(n *waitq.Waiter[waiter], err error) error {
	l.undoThrottle()
	l.mu.Lock()
	if l.waiters.Remove(n) || l.open.Remove(n) {
		l.nwait.Add(-1)
		l.mu.Unlock()
		return err
	}
	granted := n.Value.granted
	l.mu.Unlock()
	if granted {
		l.Release(permit(0, permitOK), false)
	}
	return err
}

// undoThrottle takes back the throttle's count of a call the limit
// refused.
func (l *Limiter) undoThrottle() {
	if l.throttle != nil {
		l.throttle.undo(l.since())
	}
}

// gapLocked returns the expected time between two slots at twice the rate
// the destination is served at (the highest of the completions per second
// measured over the last window, their smoothed rate, and the limit per
// smoothed round trip), or 0 when no latency is known yet: the estimate
// of how long the waiters ahead of a call take, optimistic so that a call
// is refused only when even twice the rate would not serve it in time.
// While slow start (or the recovery that restarts it) may still double
// the limit every round trip, the limit it counts is the highest the
// limit in force can reach, Config.Max or the cap: a limit far below
// them says nothing of the rate a round trip later, but one held down by
// them (where callers queue) is the rate. Calls with mu held.
func (l *Limiter) gapLocked() time.Duration {
	c := &l.learn
	lim := float64(l.lim.Load())
	if c.slow || c.recovering {
		lim = c.max
		if c.capped >= 0 {
			lim = math.Min(lim, c.capped)
		}
	}
	r := c.served(lim)
	if c.srtt == 0 || r <= 0 {
		return 0
	}
	return max(1, time.Duration(float64(time.Second)/(2*r)))
}

// expireLocked fails the first waiters (up to maxWalk) whose turn is
// expected after their deadline less the baseline. Calls with mu held.
func (l *Limiter) expireLocked(now time.Duration) {
	gap := l.gapLocked()
	if gap == 0 {
		return
	}
	b := l.learn.base.value
	i := 0
	for w := l.waiters.Front(); w != nil && i < maxWalk; {
		next := w.Next()
		if w.Deadline() < now+time.Duration(i+1)*gap+b {
			l.failLocked(w)
		} else {
			i++
		}
		w = next
	}
}

// sampleWaiter reports whether a call that waited is sampled: as the
// loaded fast path, one in mask+1.
func (l *Limiter) sampleWaiter() bool {
	return uint32(l.state.Load()>>32)&l.mask.Load() == 0
}

// grantLocked hands free slots to the waiters: earliest deadline first,
// then the calls without a deadline in arrival order, except that while
// both wait, one grant in openShare goes to the oldest call without a
// deadline; each with a token when the rate gate is on (the gate's timer
// is armed for the next token when the waiter next in turn finds none).
// A call with a deadline whose turn comes with less time left than twice
// the destination's latency (see answerLocked) fails instead, with
// errNoTime, when a call that has that much time left waits after it (or
// a call without a deadline waits) and the free slots are fewer than the
// waiters (or the rate gate is on): the slot goes to a call that can use
// it, not to an answer that would come after its caller left. When no
// later call has the time, the slot goes to the first in turn as before:
// failing them all would serve no one. Calls with mu held.
func (l *Limiter) grantLocked() {
	iv := l.riv.Load()
	var now time.Duration
	clocked := false
	if iv > 0 && (l.waiters.Len() > 0 || l.open.Len() > 0) {
		now, clocked = l.since(), true
	}
	for {
		d, o := l.waiters.Front(), l.open.Front()
		w, list := d, &l.waiters
		if o != nil && (d == nil || l.contested >= openShare-1) {
			w, list = o, &l.open
		}
		if w == nil {
			return
		}
		s := l.state.Load()
		free := l.lim.Load() - int64(uint32(s))
		if free <= 0 {
			return
		}
		if iv > 0 && !l.takeToken(now, iv, true) {
			l.armLocked(now, l.nextToken(now))
			return
		}
		if list == &l.waiters && (iv > 0 || free < int64(l.waiters.Len()+l.open.Len())) && (w.Next() != nil || o != nil) {
			// A slot (and a token) for w, not for every waiter: the turn
			// rule decides whether w or a later call gets it.
			if !clocked {
				now, clocked = l.since(), true
			}
			if need := sat.Add(now, l.answerLocked()); w.Deadline() < need && (o != nil || l.waiters.Back().Deadline() >= need) {
				if iv > 0 {
					l.giveToken(iv)
				}
				w.Value.noTime = true
				l.failLocked(w)
				continue
			}
		}
		if !l.state.CompareAndSwap(s, s+1<<32+1) {
			if iv > 0 {
				l.giveToken(iv)
			}
			continue
		}
		if !l.utilized.Load() {
			l.utilized.Store(true)
		}
		if d != nil && o != nil {
			if list == &l.open {
				l.contested = 0
			} else {
				l.contested++
			}
		}
		list.Remove(w)
		l.nwait.Add(-1)
		w.Value.granted = true
		w.Value.ch <- struct{}{}
	}
}

// failLocked takes w, a call with a deadline, off the list and wakes it
// as hopeless (its flags say why, errNoTurn when none is set). Calls with
// mu held.
func (l *Limiter) failLocked(w *waitq.Waiter[waiter]) {
	l.waiters.Remove(w)
	l.nwait.Add(-1)
	w.Value.hopeless = true
	w.Value.ch <- struct{}{}
}

// answerLocked returns the time left that a call needs at its turn for
// its answer to come in time: twice the destination's latency now (the
// smoothed latency of the sampled attempts, or the last window's mean
// when lower, so that a destination that recovered is seen at once), at
// least the baseline (0 before any latency). Calls with mu held.
func (l *Limiter) answerLocked() time.Duration {
	return max(l.learn.base.value, 2*min(l.learn.srtt, l.learn.recent))
}

// awaitWake waits for n's wake-up (nil), for ctx to end, or for n's
// deadline to come within the baseline latency (errTooClose): tooClose,
// nil for a call without a deadline, fires when that is due, and is set
// again if the baseline changed since (it falls, or was learned while the
// call waited).
func (l *Limiter) awaitWake(ctx context.Context, n *waitq.Waiter[waiter], tooClose *time.Timer) error {
	var c <-chan time.Time
	if tooClose != nil {
		c = tooClose.C
	}
	for {
		select {
		case <-n.Value.ch:
			return nil
		case <-ctx.Done():
			return l.leave(n, waitError(ctx))
		case <-c:
			left, b := n.Deadline()-l.since(), l.baselineLatency()
			if b > 0 && left <= b {
				return l.leave(n, errTooClose)
			}
			if d := tooCloseIn(left, b); d > time.Millisecond {
				tooClose.Reset(d)
			} else {
				c = nil // no baseline, the deadline near: ctx ends the wait
			}
		}
	}
}
