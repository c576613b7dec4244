package admission

import (
	"context"
	"time"
)

// The queue is controlled by its delay, CoDel-style (Nichols and Jacobson,
// "Controlling Queue Delay", 2012, in the form of Facebook's "Fail at
// Scale", 2015): a queue that has been empty within the last interval is
// absorbing a burst, and a request that joins it may wait up to
// MaxQueueWait; a queue that has not been empty for a whole interval is a
// standing queue, which only adds delay, and a request that joins it waits
// at most the short target. The interval is MaxQueueWait/5 and the target
// MaxQueueWait/100 (100 ms and 5 ms with the default 500 ms).
const (
	codelIntervalDiv = 5
	codelTargetDiv   = 100
)

// queueTimeout returns how long a request that joins the queue now may wait
// in it (CoDel, see above), and records an empty queue. It requires mu held.
func (c *Controller) queueTimeout(now time.Time) time.Duration {
	if c.queue.Len() == 0 {
		c.lastEmpty = now
		return c.maxWait
	}
	if now.Sub(c.lastEmpty) > c.maxWait/codelIntervalDiv {
		return c.maxWait / codelTargetDiv
	}
	return c.maxWait
}

// wait is the slow path of acquire: no slot was free at first sight, or
// requests are queued ahead. dl is the caller's deadline (zero: none).
//
//stormguard:long the queue's join, wait and leave share the lock and the waiter
func (c *Controller) wait(ctx context.Context, d decision, dl time.Time) (Permit, Decision) {
	if c.maxQueue == 0 {
		if c.tryInc() {
			return c.admit(ctx, &d)
		}
		return Permit{}, c.refuse(ctx, d, QueueFull)
	}
	start := c.now()
	c.mu.Lock()
	// Announce this request before looking for a slot: a Release that frees
	// one after the look below then sees nwait > 0 and hands the slot over.
	c.nwait.Add(1)
	if c.queue.Len() == 0 && c.tryInc() {
		c.nwait.Add(-1)
		c.lastEmpty = start
		c.mu.Unlock()
		return c.admit(ctx, &d)
	}
	if c.qlen.Load() >= int64(c.maxQueue) {
		c.nwait.Add(-1)
		c.mu.Unlock()
		return Permit{}, c.refuse(ctx, d, QueueFull)
	}
	limit := c.queueTimeout(start)
	if !dl.IsZero() {
		// The caller leaves at dl: a request that would wait past it, as
		// long as the last one that got a slot waited, is dropped now.
		left := dl.Sub(start)
		if left <= time.Duration(c.sojourn.Load()) {
			c.nwait.Add(-1)
			c.mu.Unlock()
			d.deadline = true
			return Permit{}, c.refuse(ctx, d, Canceled)
		}
		if left < limit {
			limit, d.deadline = left, true
		}
	}
	w := &waiter{ready: make(chan struct{}, 1), since: start}
	w.elem = c.queue.PushBack(w)
	c.qlen.Add(1)
	c.mu.Unlock()
	if c.obs != nil {
		c.report(ctx, &d, "queued")
	}

	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	timer := time.NewTimer(limit)
	o := Admitted
	select {
	case <-w.ready:
	case <-timer.C:
		o = QueueTimeout
		if d.deadline {
			o = Canceled // the caller's deadline came first: it left
		}
	case <-done:
		o = Canceled
		// The context ends at the caller's deadline too, at the same
		// moment as the timer set for it: which of the two this select
		// sees is chance. A context that ended at or after the deadline
		// is the deadline's drop; one canceled before it, a caller gone.
		d.deadline = d.deadline && !c.now().Before(dl)
	}
	timer.Stop()
	if o != Admitted {
		c.mu.Lock()
		if w.granted {
			o = Admitted // a slot came at the same moment: take it
		} else {
			c.unlink(w)
			if c.queue.Len() == 0 {
				c.lastEmpty = c.now()
			}
		}
		c.mu.Unlock()
	}
	d.waited = max(c.now().Sub(start), 0)
	if o == Admitted {
		d.deadline = false
		return c.admit(ctx, &d)
	}
	return Permit{}, c.refuse(ctx, d, o)
}

// unlink removes w from the queue. It requires mu held.
func (c *Controller) unlink(w *waiter) {
	c.queue.Remove(w.elem)
	w.elem = nil
	c.qlen.Add(-1)
	c.nwait.Add(-1)
}

// handOff gives free slots to the oldest waiters, and records how long the
// last one waited (the estimate of the queue's delay) and when the queue
// became empty.
func (c *Controller) handOff() {
	c.mu.Lock()
	if c.queue.Len() > 0 {
		now := c.now()
		for c.queue.Len() > 0 && c.tryInc() {
			w := c.queue.Front().Value.(*waiter)
			c.unlink(w)
			w.granted = true
			c.sojourn.Store(int64(max(now.Sub(w.since), 0)))
			w.ready <- struct{}{} // buffered: never blocks
		}
		if c.queue.Len() == 0 {
			c.lastEmpty = now
			c.sojourn.Store(0)
		}
	}
	c.mu.Unlock()
}
