package fleet

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// Budget is the fleet retry budget of one destination host: the Budget of
// the host's guards from [Fleet.Guards], a retry.Budget (with the
// WithdrawWithin method retry.Budget describes); a zero Budget counts
// nothing and refuses every retry. It is safe for
// concurrent use.
//
// Deposit is local: one atomic add, flushed by the background sync; it
// never waits, does no I/O and allocates nothing. Withdraw spends a retry
// from the process's lease of fleet retries; an empty lease asks Redis for
// more (one request in flight per host, waited for at most Timeout or the
// caller's time left), unless the last reply said the fleet's budget is
// spent. In local mode both go to the host's local budget.
//
// While the host's breaker is not closed (it opened, on its own calls or
// because the fleet's breaker did), Withdraw grants every retry without
// spending budget: such a retry is not sent until the breaker admits it,
// and the breaker admits a few probes per round and, once it closes,
// releases the calls that waited at its own pace. The budget bounds the
// retries a closed breaker lets through; charging it for retries an open
// breaker holds would fail, with the budget spent by the first second of an
// outage, the very calls that could have waited it out. A lease request
// whose reply shows the fleet's breaker open (it grants nothing then) opens
// this process's breaker if the sync has not yet.
type Budget struct {
	h *host
}

// Deposit records an original request (not a retry). In fleet mode it is
// one atomic add: the next sync flushes it to the fleet's window and to the
// local budget's (so that the local budget is ready when Redis goes away);
// in local mode it goes to the local budget at once.
func (b *Budget) Deposit() {
	if b.h == nil {
		return
	}
	if b.h.f.fleetMode() {
		b.h.requests.Add(1)
		if b.h.lim != nil && b.h.probeAt.Load() == probeNext {
			b.h.probeAt.CompareAndSwap(probeNext, max(b.h.f.since(), 1)) // the round's probe starts (see ProbeRound)
		}
		if b.h.lim != nil {
			b.h.f.kickFlight() // an attempt starts: the fleet's count (see flight.go)
		}
	} else {
		b.h.local.Deposit()
	}
}

// Withdraw reports whether one retry may be sent now, and if so records it:
// in fleet mode it spends a leased fleet retry, asking Redis for a lease if
// it holds none (waiting at most Timeout); in local mode (or when that
// round trip fails or takes longer than Timeout) it asks the local budget.
func (b *Budget) Withdraw() bool { return b.WithdrawWithin(0) }

// WithdrawWithin is Withdraw for a caller with left before its deadline
// (0: none; see retry.Budget): it waits for a lease at most the smaller
// of left and Timeout. In fleet mode, a retry the fleet cannot charge in
// time is refused: when left runs out before the lease's reply, the answer
// is no, not the local budget's (whose floor, in every process, would let
// a fleet of callers with short deadlines send the sum of the processes'
// floors), and the wait does not count as a Redis failure. The request
// goes on without the caller, and the retries it brings are kept for the
// next callers of this process (until the window slice they were counted
// in ends), so every retry sent in fleet mode was counted in the fleet's
// window before it was sent. A wait cut by Timeout while the request it
// waited for first is still out is a Redis failure: the fleet goes local,
// and the local budget decides. A caller that waited behind other lease
// requests of this process, each answered in time, is refused when
// Timeout has passed: Redis was not late.
func (b *Budget) WithdrawWithin(left time.Duration) bool {
	h := b.h
	switch {
	case h == nil:
		return false
	case h.brk.State() != breaker.Closed:
		return true // the breaker holds the retry: see the type's documentation
	case !h.f.fleetMode():
		return h.local.Withdraw()
	case h.lease.take(h.f.since()):
		h.spent()
		return true
	case h.denied.Load():
		return false
	}
	return h.refill(left)
}

// Stats returns the window b decides on: in fleet mode the fleet's, as of
// the last reply from Redis (Limit is the fleet's Ratio·Requests + floor),
// in local mode the local budget's. httpretry's Transport.Hosts reports it.
func (b *Budget) Stats() budget.Stats {
	h := b.h
	if h == nil {
		return budget.Stats{}
	}
	if !h.f.fleetMode() {
		return h.local.Stats()
	}
	q, r := h.fleetRequests.Load(), h.fleetRetries.Load()
	return budget.Stats{Requests: int(q), Retries: int(r), Limit: float64(h.f.set.ratio*float64(q)) + h.f.set.reserve}
}

// spent records a retry taken from the lease; the local budget hears of it
// too, so that its window is current when the fleet goes local.
func (h *host) spent() {
	h.used.Add(1)
	h.local.Withdraw()
}

// refill is [Budget.WithdrawWithin] for a caller that found h's lease
// empty: it waits for the host's one lease request in flight (starting it
// if there is none) and takes from the lease it brings, again until its
// wait is over.
func (h *host) refill(left time.Duration) bool {
	f := h.f
	var timer *time.Timer
	var first *leaseCall // the request this caller waited for first
	short := left > 0 && left < f.cfg.Timeout
	h.waiting.Add(1)
	defer h.waiting.Add(-1)
	for {
		switch { // as in WithdrawWithin, again after each reply
		case h.brk.State() != breaker.Closed:
			return true // the breaker holds the retry: see Budget's documentation
		case !f.fleetMode():
			return h.local.Withdraw()
		case h.lease.take(f.since()):
			h.spent()
			return true
		case h.denied.Load():
			return false
		}
		lc, mine, took := h.leaseRequest()
		if took {
			h.spent()
			return true
		}
		if lc == nil {
			continue // the fleet went local
		}
		if timer == nil {
			wait := f.cfg.Timeout
			if short {
				wait = left
			}
			timer = time.NewTimer(wait)
			defer timer.Stop()
			first = lc
		}
		select {
		case <-lc.done:
		case <-timer.C:
			if mine && !lc.claim.CompareAndSwap(claimWaiting, claimGone) {
				break // the reply came just now, with this caller's retry
			}
			if short || lc != first {
				// The caller's time is up, not Redis's (it waited behind
				// requests answered in time): refused.
				return false
			}
			f.failed(lc.trip, fmt.Errorf("fleet: lease for %q: %w", h.name, errTimeout))
			return h.local.Withdraw()
		}
		if mine && lc.claim.Load() == claimKept {
			h.spent()
			return true
		}
		if lc.err != nil {
			return h.local.Withdraw() // a Redis failure: the fleet is local now
		}
		if h.fleetState.Load() == fleetOpen {
			// The fleet's breaker is open (the script grants no lease
			// then), and the reply opened this process's breaker if it
			// had not heard: the retry waits for it.
			return h.brk.State() != breaker.Closed
		}
	}
}

// leaseCall is a lease request in flight.
type leaseCall struct {
	*trip
	// claim says whether the caller that started the request still
	// waits for it: the reply keeps one of the retries it brings for
	// that caller, whatever is left of their slice.
	claim atomic.Int32
}

const (
	claimWaiting = iota // the caller that started the request waits
	claimGone           // it stopped waiting: every retry goes into the lease
	claimKept           // the reply kept one retry for it
)

// leaseRequest returns h's lease request in flight, starting one if there
// is none (mine: this caller started it); or took, if h's lease held a
// retry (now spent); or neither, if the fleet is not in fleet mode (Close
// switches it to local first, so no request starts once Close has begun).
func (h *host) leaseRequest() (lc *leaseCall, mine, took bool) {
	f := h.f
	h.leaseMu.Lock()
	defer h.leaseMu.Unlock()
	if h.leasing != nil {
		return h.leasing, false, false
	}
	now := f.since()
	if h.lease.take(now) {
		return nil, false, true
	}
	if !f.fleetMode() {
		return nil, false, false
	}
	if h.lease.usedUp(now) {
		h.want.Store(min(2*h.want.Load(), maxLease))
	}
	h.expire(now, false)
	// At least one retry for each caller waiting now: a burst of callers
	// behind one request would otherwise wait for several round trips.
	want := max(h.want.Load(), min(h.waiting.Load(), maxWaitingLease))
	f.leaseCalls.Add(1)
	lc = &leaseCall{}
	lc.trip = f.start([]string{h.key}, append(f.set.args("l", 0), itoa(want)), func(v []int64, err error) error {
		return h.leased(lc, now, want, v, err)
	})
	h.leasing = lc
	return lc, true, false
}

// leased takes in the reply to lease request lc for want retries, sent at
// now, on the request's goroutine, whether or not a caller still waits. It
// keeps one retry for the caller that started the request if it still
// waits (it asked before the slice ended, and its retry is counted in it),
// and the others fill the lease until the slice ends (one installer at a
// time: there is one request in flight, and the lease was empty when it
// left), or go back with the next sync if the fleet has gone local
// meanwhile.
func (h *host) leased(lc *leaseCall, now, want int64, v []int64, err error) error {
	f := h.f
	var r leaseReply
	if err == nil {
		r, err = decodeLease(v, want)
	}
	h.leaseMu.Lock()
	if h.leasing == lc {
		h.leasing = nil
	}
	if err == nil {
		h.granted.Add(r.granted)
		h.window(r.requests, r.retries, r.state, r.epoch)
		n := r.granted
		switch {
		case n == 0:
			if r.state != fleetOpen {
				h.denied.Store(true) // the fleet's budget is spent
			}
		case !f.fleetMode():
			h.addReturn(r.slot, n)
		default:
			if lc.claim.CompareAndSwap(claimWaiting, claimKept) {
				n--
			}
			// The lease ends with the slice it was counted in. now was
			// read before the request left, so now+left is no later
			// than the slice's end.
			h.lease.install(n, r.slot, leaseDeadline(now, r.left))
		}
	}
	h.leaseMu.Unlock()
	if err != nil {
		f.failed(lc.trip, fmt.Errorf("fleet: lease for %q: %w", h.name, err))
		return err
	}
	if r.state == fleetOpen {
		h.steer(r.state, r.epoch, r.now) // open this process's breaker if it has not heard
	}
	return nil
}

// leaseDeadline returns the time on the process's clock (nanoseconds) at
// which a lease granted with leftUS microseconds left in its slice ends,
// for a request sent at now: now + leftUS, saturating.
func leaseDeadline(now, leftUS int64) int64 {
	if leftUS > (math.MaxInt64-max(now, 0))/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return now + leftUS*int64(time.Microsecond)
}

// lease is a process's leased fleet retries: a number of retries it may
// spend until a deadline, counted by the fleet in one slice. take is one
// compare-and-swap; install and expire keep the four words consistent:
// deadline and slot are written only while the word holds no retries, and
// every change of the word's retries from non-zero is a compare-and-swap,
// so a successful take or expire saw the deadline and slot of its own
// generation.
type lease struct {
	word     atomic.Uint64 // generation in the high 32 bits, retries left in the low 32
	deadline atomic.Int64  // process clock, ns: no retry may be taken at or after it
	slice    atomic.Int64  // the fleet slice the retries were counted in
	inc      atomic.Int64  // and the incarnation of the host's key then
}

// take spends one retry of the lease at now, and reports whether there
// was one.
func (l *lease) take(now int64) bool {
	for {
		w := l.word.Load()
		if uint32(w) == 0 || now >= l.deadline.Load() {
			return false
		}
		if l.word.CompareAndSwap(w, w-1) {
			return true
		}
	}
}

// expire empties the lease if its deadline is at or before now (or
// whatever its deadline, if all), and returns the retries it held and their
// slot; 0 if it held none or has not expired.
func (l *lease) expire(now int64, all bool) (n int64, s slot) {
	for {
		w := l.word.Load()
		if uint32(w) == 0 || (!all && now < l.deadline.Load()) {
			return 0, slot{}
		}
		s = slot{l.slice.Load(), l.inc.Load()}
		if l.word.CompareAndSwap(w, w&^math.MaxUint32) {
			return int64(uint32(w)), s
		}
	}
}

// usedUp reports whether the current lease was spent to the last retry
// before its deadline (so the next one should be bigger).
func (l *lease) usedUp(now int64) bool {
	w := l.word.Load()
	return w>>32 != 0 && uint32(w) == 0 && now < l.deadline.Load()
}

// install starts a new generation of n retries counted in slot s, valid
// until deadline. It requires the lease empty (expire it first) and one
// installer at a time.
func (l *lease) install(n int64, s slot, deadline int64) {
	n = min(max(n, 0), math.MaxUint32)
	l.slice.Store(s.slice)
	l.inc.Store(s.inc)
	l.deadline.Store(deadline)
	gen := l.word.Load()>>32 + 1
	l.word.Store(gen<<32 | uint64(n))
}

// left returns the retries the lease holds at now (0 once expired).
func (l *lease) left(now int64) int64 {
	w := l.word.Load()
	if now >= l.deadline.Load() {
		return 0
	}
	return int64(uint32(w))
}
