package sim

import "time"

// event is one scheduled happening of a discrete-event simulation: at time
// at, something of kind kind happens to entity who.
type event struct {
	at   time.Duration
	seq  uint64 // insertion order: breaks ties so runs are deterministic
	who  int32
	kind uint8
}

// before reports whether e comes before f: earlier time first, then the
// one scheduled first.
func (e *event) before(f *event) bool {
	if e.at != f.at {
		return e.at < f.at
	}
	return e.seq < f.seq
}

// eventQueue is a binary min-heap of events ordered by time, ties broken by
// insertion order. Its zero value is an empty queue. It is not safe for
// concurrent use; it keeps its storage across reset.
type eventQueue struct {
	h   []event
	seq uint64
}

func (q *eventQueue) reset() {
	q.h = q.h[:0]
	q.seq = 0
}

func (q *eventQueue) len() int { return len(q.h) }

func (q *eventQueue) push(at time.Duration, who int32, kind uint8) {
	q.seq++
	q.h = append(q.h, event{at: at, seq: q.seq, who: who, kind: kind})
	h := q.h
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(&h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

// pop removes and returns the earliest event; the queue must not be empty.
func (q *eventQueue) pop() event {
	h := q.h
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	q.h = h
	return top
}
