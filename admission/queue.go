package admission

import (
	"context"
	"time"
)

// The queue is controlled by its delay, CoDel-style (Nichols and Jacobson,
// "Controlling Queue Delay", 2012, with the action of Facebook's "Fail at
// Scale", 2015). A list that has, within the last interval, been empty or
// given a slot to a request that had waited no longer than the target is
// absorbing a burst, and a request that joins it may wait up to
// MaxQueueWait. A list that has not (the shortest delay its requests met
// over a whole interval was above the target: CoDel's test) is a standing
// queue, which only adds delay, and a request that joins it waits at most
// the standing wait, and is then shed. The interval is MaxQueueWait/5, the
// target MaxQueueWait/100 (100 ms and 5 ms with the default 500 ms).
//
// The standing wait is the target or codelTurns turns, whichever is
// longer, and at most the interval; a turn is the running mean of the
// time between two slots the queue hands over while requests wait (the
// time a waiting request moves up one place). A queue of a few requests,
// each waiting for a slot to free, is how a server near its capacity runs:
// at 90% load with Poisson arrivals on 10 slots of 20 ms (a turn of 2
// ms), waits of a few turns are common. A standing queue taken to be one
// not empty for an interval, with a wait of the 5 ms target (2.5 turns)
// under it, shed 0.5-4% of the originals each second with no trigger at
// all, and up to 14% in the first second after one (TestNoShedAtNormalLoad).
// Each shed original is a payment whose resend is a retry, and right after
// a trigger the backlog's resends have taken the retries' allowance: that
// kept the payments started after a trigger failing for seconds. (RFC 8289
// likewise sets CoDel's target at no less than one packet's transmission
// time.) Under sustained overload the standing wait still keeps the queue
// short: at most the interval, 25 turns of the slower service.
const (
	codelIntervalDiv = 5
	codelTargetDiv   = 100
	codelTurns       = 25
	// turnWeight is the weight of the running mean of the turn: each
	// handed-over slot moves it by 1/turnWeight of its sample.
	turnWeight = 8
)

// Two classes share the queue: originals and retries (an attempt number of
// 2 or more, from the attempt header, the idempotency key seen or the
// caller). A freed slot goes to the oldest original; to the oldest retry
// only while no original waits. An original that finds the queue full
// takes the place of the oldest queued retry, which is refused
// ([QueueFull], with the don't-retry signal). Each class's list has its own
// delay control: a list of retries that stands (they wait for the gaps the
// originals leave) does not shorten the originals' wait, and originals
// that stand do not keep the retries' list from absorbing a burst. See the
// package documentation, "Originals before retries", for why.
const (
	classOriginal = iota
	classRetry
	classes
)

// classOf returns the queue class of an attempt number.
func classOf(attempt int) int {
	if attempt >= 2 {
		return classRetry
	}
	return classOriginal
}

// standingWait returns how long a request that joins a standing queue at
// now may wait: the target or codelTurns turns, whichever is longer, at
// most the interval (see above). The turn is the running mean, or the turn
// in progress if that is longer: a queue that has handed no slot over for
// 150 ms has a turn of at least 150 ms, whether or not it ever handed one
// over before. It requires mu held.
func (c *Controller) standingWait(now time.Time) time.Duration {
	turn := max(c.turn, now.Sub(c.lastTurn))
	return min(max(c.maxWait/codelTargetDiv, codelTurns*turn), c.maxWait/codelIntervalDiv)
}

// queueTimeout returns how long a request of class cls that joins the queue
// now may wait in it (CoDel, see above, on its class's list), and records
// an empty list. It requires mu held.
func (c *Controller) queueTimeout(now time.Time, cls int) time.Duration {
	if c.queues[cls].Len() == 0 {
		c.lastGood[cls] = now
		return c.maxWait
	}
	if now.Sub(c.lastGood[cls]) > c.maxWait/codelIntervalDiv {
		return c.standingWait(now)
	}
	return c.maxWait
}

// ahead reports whether a request of class cls has someone queued ahead of
// it: an original, for an original; anyone, for a retry. It requires mu
// held.
func (c *Controller) ahead(cls int) bool {
	if cls == classOriginal {
		return c.queues[classOriginal].Len() > 0
	}
	return c.qlen.Load() > 0
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
	cls := classOf(d.attempt)
	start := c.now()
	c.mu.Lock()
	// Announce this request before looking for a slot: a Release that frees
	// one after the look below then sees nwait > 0 and hands the slot over.
	c.nwait.Add(1)
	if !c.ahead(cls) && c.tryInc() {
		c.nwait.Add(-1)
		if c.queues[cls].Len() == 0 {
			c.lastGood[cls] = start
		}
		c.mu.Unlock()
		return c.admit(ctx, &d)
	}
	full := c.qlen.Load() >= int64(c.maxQueue)
	if full && (cls == classRetry || c.queues[classRetry].Len() == 0) {
		c.nwait.Add(-1)
		c.mu.Unlock()
		return Permit{}, c.refuse(ctx, d, QueueFull)
	}
	limit := c.queueTimeout(start, cls)
	if !dl.IsZero() {
		// The caller leaves at dl: a request that would wait past it, as
		// long as the last one of its class that got a slot waited, is
		// dropped now (before it takes a retry's place: a request dropped
		// evicts nobody).
		left := dl.Sub(start)
		if left <= time.Duration(c.sojourn[cls].Load()) {
			c.nwait.Add(-1)
			c.mu.Unlock()
			d.deadline = true
			return Permit{}, c.refuse(ctx, d, Canceled)
		}
		if left <= limit { // a deadline at the queue's limit is the caller's: it has left by then
			limit, d.deadline = left, true
		}
	}
	if full {
		// An original takes the place of the oldest retry.
		v := c.queues[classRetry].Front().Value.(*waiter)
		c.unlink(v)
		v.state = evicted
		v.ready <- struct{}{} // buffered: never blocks
		if c.queues[classRetry].Len() == 0 {
			// No retry waits now: no wait to drop retries by on arrival
			// (a stale one dropped a retry with none queued).
			c.lastGood[classRetry] = start
			c.sojourn[classRetry].Store(0)
		}
	}
	if c.qlen.Load() == 0 {
		c.lastTurn = start // the first turn starts with the first waiter
	}
	w := &waiter{ready: make(chan struct{}, 1), since: start, at: c.grants, class: uint8(cls)}
	w.elem = c.queues[cls].PushBack(w)
	c.qlen.Add(1)
	c.mu.Unlock()
	if c.obs != nil {
		c.reportQueued(ctx, &d, w)
	}

	var done <-chan struct{}
	if ctx != nil {
		done = ctx.Done()
	}
	timer := time.NewTimer(limit)
	o := Admitted
	select {
	case <-w.ready:
		switch {
		case w.state == evicted:
			o = QueueFull
		case !dl.IsZero() && !c.now().Before(dl):
			// Granted at the caller's deadline, the timer set for it due
			// at the same moment (which of the two the select sees is
			// chance): the caller has left, and the slot goes on below.
			o, d.deadline = Canceled, true
		case done != nil && ctx.Err() != nil:
			// Granted after the caller's context ended (which of the two
			// the select sees is chance): the caller has left, and the
			// slot goes on below.
			o = Canceled
			d.deadline = d.deadline && !c.now().Before(dl)
		}
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
	giveBack := false
	if o == QueueTimeout || o == Canceled {
		c.mu.Lock()
		switch w.state {
		case granted:
			if o == Canceled {
				// The slot came for a caller that has left (its context
				// ended, at its deadline or before): the handler must not
				// start. The slot goes to the next in line.
				giveBack = true
				break
			}
			o = Admitted // the queue's timeout and a slot at the same moment: take it
		case evicted:
			o, d.deadline = QueueFull, false // so did an original that took its place
		default:
			c.dequeueLocked(w)
		}
		c.mu.Unlock()
	}
	if giveBack {
		c.freeSlot()
	}
	d.waited = max(c.now().Sub(start), 0)
	if o == Admitted {
		d.deadline = false
		return c.admit(ctx, &d)
	}
	if o == QueueFull {
		d.deadline = false
	}
	return Permit{}, c.refuse(ctx, d, o)
}

// dequeueLocked takes w, still waiting, out of its queue, for a caller
// that leaves. It requires mu held.
func (c *Controller) dequeueLocked(w *waiter) {
	c.unlink(w)
	if c.queues[w.class].Len() == 0 {
		c.lastGood[w.class] = c.now()
		// Nobody of its class waits: no wait to drop arrivals by (as
		// handOff when it empties the list; a stale one dropped requests
		// on arrival with the queue empty).
		c.sojourn[w.class].Store(0)
	}
}

// reportQueued reports d's wait in the queue to the observer. An observer
// that panics (or calls runtime.Goexit) takes w out of the queue, or gives
// on the slot it was granted meanwhile: the request does not run, and the
// panic goes on.
func (c *Controller) reportQueued(ctx context.Context, d *decision, w *waiter) {
	reported := false
	defer func() {
		if reported {
			return
		}
		c.mu.Lock()
		state := w.state
		if state != granted && state != evicted {
			c.dequeueLocked(w)
		}
		c.mu.Unlock()
		if state == granted {
			c.freeSlot()
		}
	}()
	c.report(ctx, d, "queued")
	reported = true
}

// unlink removes w from the queue. It requires mu held.
func (c *Controller) unlink(w *waiter) {
	c.queues[w.class].Remove(w.elem)
	w.elem = nil
	c.qlen.Add(-1)
	c.nwait.Add(-1)
}

// handOff gives free slots to the oldest waiters, originals first, and
// records how long the last one of each class waited (the estimate of its
// list's delay), the turn, and when each list became empty or gave a slot
// to a request that waited no longer than the target.
func (c *Controller) handOff() {
	c.mu.Lock()
	if c.qlen.Load() > 0 {
		now := c.now()
		for c.qlen.Load() > 0 && c.tryInc() {
			cls := classOriginal
			if c.queues[classOriginal].Len() == 0 {
				cls = classRetry
			}
			w := c.queues[cls].Front().Value.(*waiter)
			c.unlink(w)
			w.state = granted
			waited := max(now.Sub(w.since), 0)
			c.sojourn[cls].Store(int64(waited))
			// It waited for the slots handed over since it joined, its
			// own included: a sample of the turn.
			c.grants++
			c.turn += (waited/time.Duration(c.grants-w.at) - c.turn) / turnWeight
			c.lastTurn = now
			if waited <= c.maxWait/codelTargetDiv {
				c.lastGood[cls] = now
			}
			w.ready <- struct{}{} // buffered: never blocks
		}
		for cls := range c.queues {
			if c.queues[cls].Len() == 0 {
				c.lastGood[cls] = now
				c.sojourn[cls].Store(0)
			}
		}
	}
	c.mu.Unlock()
}
