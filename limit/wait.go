package limit

import (
	"context"

	"github.com/stormguard/stormguard/internal/waitq"
)

// wait parks a call over the limit in the earliest-deadline-first list
// until a release grants it a slot or ctx ends.
func (l *Limiter) wait(ctx context.Context, flags uint8) (Permit, error) {
	dl, ok := ctx.Deadline()
	if !l.waiting || !ok {
		if l.throttle != nil {
			l.throttle.undo(l.since())
		}
		if !ok {
			return Permit{}, errNoDeadline
		}
		return Permit{}, errNoWaiting
	}
	n := &waitq.Waiter[waiter]{Value: waiter{ch: make(chan struct{}, 1)}}
	l.mu.Lock()
	now := l.since()
	if !l.waiters.Push(n, waitq.Deadline(now, dl.Sub(l.base)-now)) {
		l.mu.Unlock()
		if l.throttle != nil {
			l.throttle.undo(now)
		}
		return Permit{}, errTooMany
	}
	l.nwait.Add(1)
	// A release that ran between the failed fast path and the Push did not
	// see this waiter: grant what is free now.
	l.grantLocked()
	l.mu.Unlock()
	select {
	case <-n.Value.ch:
	case <-ctx.Done():
		if l.throttle != nil {
			l.throttle.undo(l.since())
		}
		l.mu.Lock()
		if l.waiters.Remove(n) {
			l.nwait.Add(-1)
			l.mu.Unlock()
			return Permit{}, waitError(ctx)
		}
		l.mu.Unlock()
		// Granted as ctx ended: give the slot back.
		l.Release(Permit{flags: permitOK}, false)
		return Permit{}, waitError(ctx)
	}
	if flags&permitSampled != 0 || l.sampleWaiter() {
		return Permit{start: l.since(), flags: flags | permitSampled}, nil
	}
	return Permit{flags: flags}, nil
}

// sampleWaiter reports whether a call that waited is sampled: as the
// loaded fast path, one in mask+1.
func (l *Limiter) sampleWaiter() bool {
	return uint32(l.state.Load()>>32)&l.mask.Load() == 0
}

// grantLocked hands free slots to the waiters, earliest deadline first.
// Calls with mu held.
func (l *Limiter) grantLocked() {
	for w := l.waiters.Front(); w != nil; w = l.waiters.Front() {
		s := l.state.Load()
		if int64(uint32(s)) >= l.lim.Load() {
			return
		}
		if !l.state.CompareAndSwap(s, s+1<<32+1) {
			continue
		}
		if !l.utilized.Load() {
			l.utilized.Store(true)
		}
		l.waiters.Remove(w)
		l.nwait.Add(-1)
		w.Value.granted = true
		w.Value.ch <- struct{}{}
	}
}
