package fleet

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// Budget is the fleet retry budget of one destination host: a retry.Budget
// for retry.WithBudget or httpretry.Guards. Get one from [Fleet.Budget]; a
// zero Budget counts nothing and refuses every retry. It is safe for
// concurrent use.
//
// Deposit is local: one atomic add, flushed by the background sync; it
// never waits, does no I/O and allocates nothing. Withdraw spends a retry
// from the process's lease of fleet retries; an empty lease asks Redis for
// more (one round trip of at most Timeout), unless the last reply said the
// fleet's budget is spent. In local mode both go to the host's local
// budget.
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
	} else {
		b.h.local.Deposit()
	}
}

// Withdraw reports whether one retry may be sent now, and if so records it:
// in fleet mode it spends a leased fleet retry, asking Redis for a lease if
// it holds none; in local mode (or when that round trip fails) it asks the
// local budget.
func (b *Budget) Withdraw() bool { return b.WithdrawWithin(0) }

// WithdrawWithin is Withdraw for a caller with left before its deadline
// (0: none; retry.BudgetWithin): a lease round trip waits at most the
// smaller of left and Timeout. A round trip cut short by the caller's left
// (not by Timeout) decides this retry on the local budget and does not
// count as a Redis failure.
func (b *Budget) WithdrawWithin(left time.Duration) bool {
	h := b.h
	if h == nil {
		return false
	}
	if h.brk.State() != breaker.Closed {
		return true // the breaker holds the retry: see the type's documentation
	}
	if !h.f.fleetMode() {
		return h.local.Withdraw()
	}
	if h.lease.take(h.f.since()) {
		h.spent()
		return true
	}
	if h.denied.Load() {
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

// Host returns the destination host b belongs to ("" for a zero Budget).
func (b *Budget) Host() string {
	if b.h == nil {
		return ""
	}
	return b.h.name
}

// spent records a retry taken from the lease; the local budget hears of it
// too, so that its window is current when the fleet goes local.
func (h *host) spent() {
	h.used.Add(1)
	h.local.Withdraw()
}

// refill asks the fleet for a new lease and spends one of its retries. One
// lease request runs at a time; callers that wait for it use its lease.
func (h *host) refill(left time.Duration) bool {
	h.refillMu.Lock()
	defer h.refillMu.Unlock()
	f := h.f
	if !f.fleetMode() {
		return h.local.Withdraw()
	}
	now := f.since()
	if h.lease.take(now) {
		h.spent()
		return true
	}
	if h.denied.Load() {
		return false
	}
	if h.lease.usedUp(now) {
		h.want.Store(min(2*h.want.Load(), f.maxLease))
	}
	h.expire(now, false)
	want := h.want.Load()
	f.leaseCalls.Add(1)
	wait := f.cfg.Timeout
	short := left > 0 && left < wait
	if short {
		wait = left
	}
	v, err := f.callWithin([]string{h.key}, append(f.set.args("l", 0), itoa(want)), func(v []int64, err error) {
		// The caller stopped waiting: whatever was granted goes back.
		if err == nil {
			if r, err := decodeLease(v, want); err == nil && r.granted > 0 {
				h.granted.Add(r.granted)
				h.addReturn(r.slice, r.granted)
			}
		}
	}, wait)
	var r leaseReply
	if err == nil {
		r, err = decodeLease(v, want)
	}
	if short && errors.Is(err, ErrTimeout) {
		return h.local.Withdraw() // the caller's time ran out, not Redis
	}
	if err != nil {
		f.failed(fmt.Errorf("fleet: lease for %q: %w", h.name, err))
		return h.local.Withdraw()
	}
	h.window(r.requests, r.retries, r.state, r.epoch)
	if r.state == fleetOpen {
		// The fleet's breaker is open (the script grants no lease then):
		// open this process's breaker too if it has not heard, and the
		// retry waits for it.
		h.steer(r.state, r.epoch)
		return h.brk.State() != breaker.Closed
	}
	if r.granted == 0 {
		h.denied.Store(true)
		return false
	}
	h.granted.Add(r.granted)
	// The lease ends with the slice it was counted in. now was read before
	// the request left, so now+left is no later than the slice's end.
	h.lease.install(r.granted-1, r.slice, leaseDeadline(now, r.left))
	h.spent()
	return true
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
// compare-and-swap; install and expire keep the three words consistent:
// deadline and slice are written only while the word holds no retries, and
// every change of the word's retries from non-zero is a compare-and-swap,
// so a successful take or expire saw the deadline and slice of its own
// generation.
type lease struct {
	word     atomic.Uint64 // generation in the high 32 bits, retries left in the low 32
	deadline atomic.Int64  // process clock, ns: no retry may be taken at or after it
	slice    atomic.Int64  // the fleet slice the retries were counted in
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
// slice; 0 if it held none or has not expired.
func (l *lease) expire(now int64, all bool) (n, slice int64) {
	for {
		w := l.word.Load()
		if uint32(w) == 0 || (!all && now < l.deadline.Load()) {
			return 0, 0
		}
		s := l.slice.Load()
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

// install starts a new generation of n retries counted in slice, valid
// until deadline. It requires the lease empty (expire it first) and one
// installer at a time.
func (l *lease) install(n, slice, deadline int64) {
	n = min(max(n, 0), math.MaxUint32)
	l.slice.Store(slice)
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
