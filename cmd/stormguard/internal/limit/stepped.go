// Package limit is the simulator's model of the root module's package
// limit (the concurrency limiter that learns a destination's capacity),
// stepped on the simulated clock.
//
// learn.go is a copy, byte for byte, of the root's limit/learn.go: the
// learning core (slow start, gradient, drops, latency ceiling, held
// baseline), which reads no clock. TestLearnIsTheLibrarys keeps it equal.
//
// The rest of the root package (limit.go, wait.go: the lock-free fast
// path, the waiting calls parked on channels and timers) cannot be stepped
// on a simulated clock, so [Stepped] is a model of it, transcribed rule
// for rule: the limit a permit is checked against, which attempts are
// latency samples (every attempt while the limit is under 64 and at least
// half of it is in flight; about 32 to 64 per round trip above; one in 16
// when less than half is in flight), when a window ends and what it is
// told, the earliest-deadline-first wait list and the first-come list of
// calls without a deadline behind it (one grant in 8 to the latter while
// both wait), bounded together by Config.Waiting, a release that hands its
// slot to the first waiter, and the fail-fast rules of a call that cannot
// make its deadline. It leaves out the throttle
// (Config.Throttle, off by default) and the races of concurrent callers.
package limit

import (
	"errors"
	"math"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/waitq"
)

// Refusals of [Stepped.Wait] and of a waiting call, as package limit words
// them.
var (
	ErrNoWaiting = errors.New("limit: refused: limit reached and waiting is off")
	ErrTooMany   = errors.New("limit: refused: limit reached and too many calls are waiting")
	ErrTooClose  = errors.New("limit: refused: the deadline leaves less than the destination's fastest answer")
	ErrNoTurn    = errors.New("limit: refused: no slot expected before the deadline")
)

// Defaults of package limit's Config.
const (
	DefaultMax     = 1000
	DefaultWaiting = 10_000
	// maxWalk bounds the waiters the hopeless checks walk at a time.
	maxWalk = 4096
	// openShare: while calls with and without a deadline wait, one grant
	// in openShare goes to the oldest call without one.
	openShare = 8
)

// Permit is one attempt's slot, as package limit's: when it was taken, if
// its latency is sampled.
type Permit struct {
	start   time.Duration
	ok      bool
	sampled bool
}

// Stepped is a limiter of package limit stepped on a caller's clock: every
// method takes the time now, since an origin the caller picks, and none
// reads a clock. Waiting calls are the caller's: it gets their values back
// when a release grants them a slot or finds them hopeless. Not safe for
// concurrent use.
type Stepped[T any] struct {
	learn    learner
	lim      int64
	mask     uint32
	inflight int64
	seq      uint32 // permits acquired, modulo 2^32
	seq0     uint32 // seq at the window's start
	drops    int64  // permits released as dropped in this window
	utilized bool   // in-flight reached half the limit in this window
	waiting  bool
	maxWait  int
	waiters  waitq.List[T] // calls with a deadline, earliest first
	open     waitq.List[T] // calls without one, in arrival order
	// contested counts the grants to waiters with a deadline while calls
	// without one waited too.
	contested int
}

// New returns a cold limiter of package limit's Config{Max: max, Timeout:
// timeout, Waiting: waiting} (zero fields take the library's defaults;
// max must be in [0, 2^30] and timeout not negative, which the caller
// checks).
func New[T any](max int, timeout time.Duration, waiting int) *Stepped[T] {
	if max == 0 {
		max = DefaultMax
	}
	if waiting == 0 {
		waiting = DefaultWaiting
	}
	s := &Stepped[T]{learn: newLearner(max, timeout), waiting: waiting > 0, maxWait: waiting}
	s.setLimit(s.learn.limit)
	return s
}

// setLimit publishes a new limit, and the sampling mask that goes with it.
func (s *Stepped[T]) setLimit(f float64) {
	n := int64(math.Round(f))
	s.lim = n
	m := uint32(1)
	for int64(m)*64 <= n {
		m <<= 1
	}
	s.mask = m - 1
}

// Limit returns the current limit.
func (s *Stepped[T]) Limit() int { return int(s.lim) }

// InFlight returns the permits held.
func (s *Stepped[T]) InFlight() int { return int(s.inflight) }

// Waiting returns the number of waiting calls.
func (s *Stepped[T]) Waiting() int { return s.waiters.Len() + s.open.Len() }

// Baseline returns the learned no-load latency (0: none yet).
func (s *Stepped[T]) Baseline() time.Duration { return s.learn.base.value }

// TryAcquire is Acquire's fast path at now: a slot if one is free and no
// call waits.
func (s *Stepped[T]) TryAcquire(now time.Duration) (Permit, bool) {
	if s.Waiting() > 0 || s.inflight >= s.lim {
		return Permit{}, false
	}
	s.inflight++
	in, seq := s.inflight, s.seq
	s.seq++
	p := Permit{ok: true}
	if 2*in >= s.lim {
		s.utilized = true
		p.sampled = seq&s.mask == 0
	} else {
		p.sampled = seq&(s.mask|15) == 0
	}
	if p.sampled {
		p.start = now
	}
	return p, true
}

// Wait parks w (the caller's node, its Value set) at now for a slot within
// deadline (0: none), as Acquire does when the limit is reached: it
// refuses at once when waiting is off or full, the deadline is within the
// baseline latency, or more calls with a deadline wait ahead than twice
// the limit's measured rate serves in time. Otherwise it returns the time
// at which the call gives up if still waiting (its deadline less the
// baseline; the deadline with no baseline yet; math.MaxInt64, never, for
// a call without a deadline, which waits behind the calls with one), and
// grant hands out what is free now (possibly to w).
func (s *Stepped[T]) Wait(now, deadline time.Duration, w *waitq.Waiter[T], grant func(T, Permit), hopeless func(T)) (time.Duration, error) {
	if !s.waiting {
		return 0, ErrNoWaiting
	}
	if deadline == 0 {
		if s.Waiting() >= s.maxWait {
			return 0, ErrTooMany
		}
		s.open.Push(w, math.MaxInt64)
		s.grant(now, grant, hopeless)
		return math.MaxInt64, nil
	}
	left := deadline - now
	b := s.learn.base.value
	if b > 0 && left <= b {
		return 0, ErrTooClose
	}
	if s.Waiting() >= s.maxWait {
		return 0, ErrTooMany
	}
	s.waiters.Push(w, waitq.Deadline(now, left))
	if gap := s.gap(); gap > 0 {
		behind := 0
		for n := w.Next(); n != nil && behind <= maxWalk; n = n.Next() {
			behind++
		}
		ahead := s.waiters.Len() - 1 - behind
		if behind > maxWalk { // a lower bound on those ahead, as limit's wait.go counts it
			ahead = 0
			for n := w.Prev(); n != nil && ahead <= maxWalk; n = n.Prev() {
				ahead++
			}
		}
		if time.Duration(ahead+1)*gap+b >= left {
			s.waiters.Remove(w)
			return 0, ErrNoTurn
		}
	}
	s.grant(now, grant, hopeless)
	return deadline - b, nil
}

// Leave takes waiting call w off the list (its give-up time came) and
// reports whether it was on it.
func (s *Stepped[T]) Leave(w *waitq.Waiter[T]) bool { return s.waiters.Remove(w) || s.open.Remove(w) }

// Release gives p back at now, dropped or a latency sample, as package
// limit's Release does: it may end the learning window, and it hands free
// slots to waiters (grant) and fails those that cannot make their
// deadline any more (hopeless, with ErrNoTurn).
func (s *Stepped[T]) Release(now time.Duration, p Permit, dropped bool, grant func(T, Permit), hopeless func(T)) {
	if !p.ok {
		return
	}
	s.inflight--
	if dropped {
		s.drops++
	}
	if p.sampled {
		if !dropped {
			s.learn.sample(now - p.start)
		}
		if s.learn.due(now, s.drops) {
			attempts := int64(s.seq - s.seq0)
			s.seq0 = s.seq
			drops := s.drops
			s.drops = 0
			utilized := s.utilized
			s.utilized = false
			s.setLimit(s.learn.window(now, attempts, s.inflight, drops, utilized))
			s.grant(now, grant, hopeless)
			s.expire(now, hopeless)
		}
	}
	if s.Waiting() > 0 {
		s.grant(now, grant, hopeless)
	}
}

// gap is the expected time between two slots at twice the rate the
// destination is served at (learner.served), 0 while no latency is
// known; while slow start or recovery may still raise the limit, the
// limit it counts is the highest it can reach (Config.Max, or the cap).
func (s *Stepped[T]) gap() time.Duration {
	c := &s.learn
	lim := float64(s.lim)
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

// expire fails the first waiters (up to maxWalk) whose turn is expected
// after their deadline less the baseline.
func (s *Stepped[T]) expire(now time.Duration, hopeless func(T)) {
	gap := s.gap()
	if gap == 0 {
		return
	}
	b := s.learn.base.value
	i := 0
	for w := s.waiters.Front(); w != nil && i < maxWalk; {
		next := w.Next()
		if w.Deadline() < now+time.Duration(i+1)*gap+b {
			s.waiters.Remove(w)
			hopeless(w.Value)
		} else {
			i++
		}
		w = next
	}
}

// grant hands free slots to the waiters, earliest deadline first, then
// the calls without a deadline in arrival order (one grant in openShare
// to them while both wait); a waiter's permit is sampled as the loaded
// fast path's. A call with a deadline whose turn comes with less time
// left than twice the destination's latency (the smoothed latency or the
// last window's mean, the lower; at least the baseline) while a call with
// that much time left (or one without a deadline) waits after it, and
// the free slots are fewer than the waiters, is hopeless instead, as in
// package limit.
func (s *Stepped[T]) grant(now time.Duration, grant func(T, Permit), hopeless func(T)) {
	for s.inflight < s.lim {
		d, o := s.waiters.Front(), s.open.Front()
		w, list := d, &s.waiters
		if o != nil && (d == nil || s.contested >= openShare-1) {
			w, list = o, &s.open
		}
		if w == nil {
			return
		}
		if need := now + max(s.learn.base.value, 2*min(s.learn.srtt, s.learn.recent)); list == &s.waiters &&
			s.lim-s.inflight < int64(s.Waiting()) && w.Deadline() < need &&
			(o != nil || (w.Next() != nil && s.waiters.Back().Deadline() >= need)) {
			s.waiters.Remove(w)
			hopeless(w.Value)
			continue
		}
		if d != nil && o != nil {
			if list == &s.open {
				s.contested = 0
			} else {
				s.contested++
			}
		}
		s.inflight++
		s.seq++
		s.utilized = true
		list.Remove(w)
		p := Permit{ok: true, sampled: s.seq&s.mask == 0}
		if p.sampled {
			p.start = now
		}
		grant(w.Value, p)
	}
}
