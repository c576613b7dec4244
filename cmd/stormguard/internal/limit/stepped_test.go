package limit

import (
	"container/heap"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
)

// done is an attempt in flight: when it ends and its permit.
type done struct {
	at      time.Duration
	p       Permit
	dropped bool
}

type doneHeap []done

func (h doneHeap) Len() int           { return len(h) }
func (h doneHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h doneHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *doneHeap) Push(x any)        { *h = append(*h, x.(done)) }
func (h *doneHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// drive runs callers that always have an attempt to send against a
// destination of servers that each serve one attempt in service (answered
// from the time a server is free; hung: never answered, the attempt times
// out at timeout as a drop) for d from now, lets the attempts in flight
// end, and returns the time then and the highest limit seen.
func drive(s *Stepped[int], now, d time.Duration, callers, servers int, service, timeout time.Duration, hung bool) (time.Duration, int) {
	var h doneHeap
	free := make([]time.Duration, servers)
	send := func() bool {
		p, ok := s.TryAcquire(now)
		if !ok {
			return false
		}
		if hung {
			heap.Push(&h, done{now + timeout, p, true})
			return true
		}
		k := 0
		for i := range free {
			if free[i] < free[k] {
				k = i
			}
		}
		free[k] = max(free[k], now) + service
		if free[k]-now >= timeout {
			heap.Push(&h, done{now + timeout, p, true})
		} else {
			heap.Push(&h, done{free[k], p, false})
		}
		return true
	}
	high := s.Limit()
	end := now + d
	for idle := callers; idle > 0 && send(); idle-- {
	}
	for h.Len() > 0 && now < end {
		e := heap.Pop(&h).(done)
		now = e.at
		s.Release(now, e.p, e.dropped, nil, nil)
		high = max(high, s.Limit())
		for s.InFlight() < callers && send() {
		}
	}
	for h.Len() > 0 { // the attempts in flight end; no new ones
		e := heap.Pop(&h).(done)
		now = e.at
		s.Release(now, e.p, e.dropped, nil, nil)
		high = max(high, s.Limit())
	}
	return now, high
}

// TestSteppedLearns: against 50 servers of 10 ms (capacity 50 in flight)
// loaded by 400 callers, a cold limiter finds the capacity within a
// second and holds near it; a hang takes it down to 1 and never raises
// it; after the hang it finds the capacity again.
func TestSteppedLearns(t *testing.T) {
	s := New[int](0, time.Second, 0)
	now, _ := drive(s, 0, time.Second, 400, 50, 10*time.Millisecond, time.Second, false)
	if l := s.Limit(); l < 50 || l > 80 {
		t.Fatalf("after 1 s at 50 servers: limit %d, want 50 to 80", l)
	}
	if b := s.Baseline(); b != 10*time.Millisecond {
		t.Errorf("baseline %v, want 10ms", b)
	}
	before := s.Limit()
	now, high := drive(s, now, 10*time.Second, 400, 50, 10*time.Millisecond, time.Second, true)
	if s.Limit() != 1 || high > before {
		t.Errorf("after a 10 s hang: limit %d (highest %d, before %d); want 1, never above before", s.Limit(), high, before)
	}
	drive(s, now, time.Second, 400, 50, 10*time.Millisecond, time.Second, false)
	if l := s.Limit(); l < 50 || l > 80 {
		t.Errorf("1 s after the hang: limit %d, want 50 to 80", l)
	}
}

// TestSteppedWaits: over the limit, calls wait earliest deadline first and
// are granted as slots come back; the refusals are package limit's.
func TestSteppedWaits(t *testing.T) {
	s := New[int](1, time.Second, 3)
	p, ok := s.TryAcquire(0)
	if !ok {
		t.Fatal("a cold limiter of Max 1 refused its first permit")
	}
	if _, ok := s.TryAcquire(0); ok {
		t.Fatal("a second permit over the limit of 1")
	}
	var granted []int
	grant := func(v int, _ Permit) { granted = append(granted, v) }
	fail := func(v int) { t.Errorf("waiter %d found hopeless", v) }
	open := &waitq.Waiter[int]{Value: 9}
	if at, err := s.Wait(0, 0, open, grant, fail); err != nil || at != math.MaxInt64 {
		t.Errorf("Wait without a deadline = %v, %v; want it waiting, never giving up", at, err)
	}
	late, early := &waitq.Waiter[int]{Value: 1}, &waitq.Waiter[int]{Value: 2}
	if at, err := s.Wait(0, 5*time.Second, late, grant, fail); err != nil || at != 5*time.Second {
		t.Fatalf("Wait(deadline 5s) = %v, %v; want to give up at 5s (no baseline yet)", at, err)
	}
	if _, err := s.Wait(0, 3*time.Second, early, grant, fail); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Wait(0, 4*time.Second, &waitq.Waiter[int]{Value: 3}, grant, fail); !errors.Is(err, ErrTooMany) {
		t.Errorf("a fourth waiter beyond Waiting 3 = %v, want ErrTooMany", err)
	}
	if _, err := s.Wait(0, 0, &waitq.Waiter[int]{Value: 4}, grant, fail); !errors.Is(err, ErrTooMany) {
		t.Errorf("a fourth waiter, without a deadline, beyond Waiting 3 = %v, want ErrTooMany", err)
	}
	s.Release(10*time.Millisecond, p, false, grant, nil)
	if len(granted) != 1 || granted[0] != 2 || s.Waiting() != 2 || s.InFlight() != 1 {
		t.Errorf("after a release: granted %v, %d waiting, %d in flight; want the earliest deadline (2), 2, 1", granted, s.Waiting(), s.InFlight())
	}
	if !s.Leave(late) || s.Leave(late) {
		t.Error("Leave: want true for a waiter, then false")
	}
	s.Release(20*time.Millisecond, Permit{ok: true}, false, grant, nil)
	if len(granted) != 2 || granted[1] != 9 || s.Waiting() != 0 {
		t.Errorf("after a second release: granted %v, %d waiting; want the call without a deadline (9) next, none waiting", granted, s.Waiting())
	}
	off := New[int](1, 0, -1)
	off.TryAcquire(0)
	if _, err := off.Wait(0, time.Second, &waitq.Waiter[int]{}, grant, fail); !errors.Is(err, ErrNoWaiting) {
		t.Errorf("Wait with waiting off = %v, want ErrNoWaiting", err)
	}
	if _, err := off.Wait(0, 0, &waitq.Waiter[int]{}, grant, fail); !errors.Is(err, ErrNoWaiting) {
		t.Errorf("Wait without a deadline, waiting off = %v, want ErrNoWaiting", err)
	}
}
