// Package waitq is the wait list of calls that wait for permission to go
// (behind an open circuit breaker, or, later, behind a concurrency limit),
// served earliest deadline first: the call with the least time left gets
// the next permit, so that a call that already slept through a Retry-After
// does not queue behind calls with time to spare. (A breaker's probes go
// the other way, from the back: see [LastFirst].)
//
// Time is explicit: a deadline is a time.Duration since an origin the
// owner picks (the breaker's construction, the simulation's start), and no
// method reads a clock or starts a timer. The breaker keeps its list under
// its mutex and steps it from its calls and timers; the simulator steps its
// own list on the simulated clock. Both get the same order.
//
// A waiter is a node the owner allocates once per wait and links into the
// list; a waiting call holds no goroutine and no timer of the list's.
//
// Module cmd/stormguard may not import this package and holds a copy of
// it, cmd/stormguard/internal/waitq, for its simulator; internal/copycheck's TestRepositoryCopies keeps the
// copy equal (only its import paths differ): change this folder, then
// bring the copy over with the command the test prints.
package waitq

import (
	"math/bits"
	"time"

	"github.com/stormguard/stormguard/internal/sat"
)

// List is a list of waiters in deadline order, earliest first; waiters
// with the same deadline keep their arrival order. Its zero value is an
// empty, unbounded list. A List is not safe for concurrent use: its owner
// guards it.
type List[T any] struct {
	// Max bounds the number of waiters: Push refuses a waiter beyond it.
	// 0 or less means no bound.
	Max int

	head, tail *Waiter[T]
	n          int
	// Express lanes (a skip list over the list): level i (1 to levels-1)
	// links, in order, the waiters of more than i levels, about one in
	// 4^i, so that Push finds its place in O(log n) steps whatever the
	// order of deadlines (a call with a short timeout behind 100,000 with
	// long ones walked past every one of them, under its owner's lock).
	heads, tails [levels]*Waiter[T] // index 0 unused: level 0 is head, tail
	pushes       uint64             // Push calls: the seed of a waiter's level
}

// levels is the most levels a waiter links at (level 0, the list itself,
// and levels-1 express lanes): enough for 4^11 (about 4 million) waiters.
const levels = 12

// lane is a waiter's links at an express level.
type lane[T any] struct{ prev, next *Waiter[T] }

// Waiter is one waiting call in a [List]. Value holds the owner's data
// about the call; the rest is the list's.
type Waiter[T any] struct {
	Value T

	deadline   time.Duration
	prev, next *Waiter[T]
	list       *List[T]
	up         []lane[T] // links at levels 1 to len(up): one in four waiters has any
}

// Deadline returns the time (since the owner's origin) at which now+wait
// ends, saturating at the largest Duration: a call that may wait without
// bound sorts after every call with a finite wait, never before them.
func Deadline(now, wait time.Duration) time.Duration { return sat.Add(now, wait) }

// Len returns the number of waiters.
func (l *List[T]) Len() int { return l.n }

// Full reports whether Push would refuse a waiter.
func (l *List[T]) Full() bool { return l.Max > 0 && l.n >= l.Max }

// Front returns the waiter with the earliest deadline, or nil.
func (l *List[T]) Front() *Waiter[T] { return l.head }

// Back returns the waiter with the latest deadline, or nil.
func (l *List[T]) Back() *Waiter[T] { return l.tail }

// Next returns the waiter after w in l's order, or nil.
func (w *Waiter[T]) Next() *Waiter[T] { return w.next }

// Prev returns the waiter before w in l's order, or nil.
func (w *Waiter[T]) Prev() *Waiter[T] { return w.prev }

// LastFirst returns the first to come of the waiters with the latest
// deadline among w and those before it (w itself when the one before it
// has an earlier deadline), or nil if w is nil: walking a list from its
// back, the call with the most time left, of equal ones the one that has
// waited longest.
func LastFirst[T any](w *Waiter[T]) *Waiter[T] {
	for w != nil && w.prev != nil && w.prev.deadline == w.deadline {
		w = w.prev
	}
	return w
}

// Deadline returns the deadline w was pushed with.
func (w *Waiter[T]) Deadline() time.Duration { return w.deadline }

// Waiting reports whether w is in a list.
func (w *Waiter[T]) Waiting() bool { return w.list != nil }

// Push adds w, with deadline, after the waiters whose deadline is the same
// or earlier, and reports whether it did: it refuses w when the list is
// full or w is in a list already. A deadline at or after the last one is
// added at the back in O(1) express steps; any other is placed in
// O(log n) (the express lanes).
func (l *List[T]) Push(w *Waiter[T], deadline time.Duration) bool {
	if w.list != nil || l.Full() {
		return false
	}
	w.deadline, w.list = deadline, l
	l.pushes++
	lv := level(l.pushes)
	if cap(w.up) >= lv-1 {
		w.up = w.up[:lv-1]
		clear(w.up)
	} else {
		w.up = make([]lane[T], lv-1)
	}
	// after[i]: the last waiter at level i whose deadline is the same or
	// earlier (nil: w goes first at that level).
	var after [levels]*Waiter[T]
	if l.tail == nil || l.tail.deadline <= deadline {
		after[0] = l.tail
		for i := 1; i < lv; i++ {
			after[i] = l.tails[i]
		}
	} else {
		var x *Waiter[T] // the last waiter found so far with a deadline the same or earlier
		for i := levels - 1; i >= 1; i-- {
			next := l.heads[i]
			if x != nil {
				next = x.up[i-1].next
			}
			for next != nil && next.deadline <= deadline {
				x, next = next, next.up[i-1].next
			}
			after[i] = x
		}
		next := l.head
		if x != nil {
			next = x.next
		}
		for next != nil && next.deadline <= deadline {
			x, next = next, next.next
		}
		after[0] = x
	}
	w.prev = after[0]
	if w.prev == nil {
		w.next = l.head
		l.head = w
	} else {
		w.next = w.prev.next
		w.prev.next = w
	}
	if w.next == nil {
		l.tail = w
	} else {
		w.next.prev = w
	}
	for i := 1; i < lv; i++ {
		ln := &w.up[i-1]
		ln.prev = after[i]
		if ln.prev == nil {
			ln.next = l.heads[i]
			l.heads[i] = w
		} else {
			ln.next = ln.prev.up[i-1].next
			ln.prev.up[i-1].next = w
		}
		if ln.next == nil {
			l.tails[i] = w
		} else {
			ln.next.up[i-1].prev = w
		}
	}
	l.n++
	return true
}

// level returns the number of levels of the waiter of the n-th Push: 1,
// or more with probability 4^-k for k more (a mixed counter, so that the
// same pushes give the same list).
func level(n uint64) int {
	n ^= n >> 33 // splitmix64's finalizer
	n *= 0xff51afd7ed558ccd
	n ^= n >> 33
	n *= 0xc4ceb9fe1a85ec53
	n ^= n >> 33
	return 1 + min(bits.TrailingZeros64(n|1<<63)/2, levels-1)
}

// Remove takes w off l and reports whether it was on it.
func (l *List[T]) Remove(w *Waiter[T]) bool {
	if w.list != l {
		return false
	}
	if w.prev == nil {
		l.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		l.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	for i := range w.up {
		ln := &w.up[i]
		if ln.prev == nil {
			l.heads[i+1] = ln.next
		} else {
			ln.prev.up[i].next = ln.next
		}
		if ln.next == nil {
			l.tails[i+1] = ln.prev
		} else {
			ln.next.up[i].prev = ln.prev
		}
		*ln = lane[T]{}
	}
	w.prev, w.next, w.list = nil, nil, nil
	l.n--
	return true
}

// PopFront takes the waiter with the earliest deadline off l and returns
// it, or nil if l is empty: the call to hand the next permit to.
func (l *List[T]) PopFront() *Waiter[T] {
	w := l.head
	if w != nil {
		l.Remove(w)
	}
	return w
}

// Expire takes off l, earliest first, every waiter whose deadline is
// before cutoff, and calls fail with each after it is off the list: the
// calls that cannot make it (cutoff is now, or now plus the time the next
// permit is expected to take). fail may push waiters back onto l; those
// are not visited again in this call unless their deadline is before
// cutoff.
func (l *List[T]) Expire(cutoff time.Duration, fail func(*Waiter[T])) {
	for w := l.head; w != nil && w.deadline < cutoff; w = l.head {
		l.Remove(w)
		fail(w)
	}
}
