package limit

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/waitq"
)

// ErrLimited matches (with errors.Is) every refusal of [Limiter.Acquire]:
// the limit is reached and the call cannot wait (waiting off or full, or
// its deadline too near to be met), its deadline passed or its context
// ended while it waited, or the throttle rejected it. The error wraps ErrLimited with the reason
// (and the context's error when the context ended).
var ErrLimited = errors.New("limit: refused")

// The refusals that need no context: prebuilt, so that failing fast
// allocates nothing.
var (
	errNoWaiting = fmt.Errorf("%w: limit reached and waiting is off", ErrLimited)
	errTooMany   = fmt.Errorf("%w: limit reached and too many calls are waiting", ErrLimited)
	// The same for a call that finds no token at the rate set by SetRate.
	errNoTokenNoWaiting = fmt.Errorf("%w: no token at the rate in force and waiting is off", ErrLimited)
	errNoTokenTooMany   = fmt.Errorf("%w: no token at the rate in force and too many calls are waiting", ErrLimited)
	errThrottled        = fmt.Errorf("%w: throttled, the destination accepts too few requests", ErrLimited)
	// A call that would wait with its context already done.
	errDoneCanceled = fmt.Errorf("%w: limit reached and the context was canceled: %w", ErrLimited, context.Canceled)
	errDoneDeadline = fmt.Errorf("%w: limit reached and the context's deadline had passed: %w", ErrLimited, context.DeadlineExceeded)
	// The same for want of a token at the rate in force.
	errNoTokenDoneCanceled = fmt.Errorf("%w: no token at the rate in force and the context was canceled: %w", ErrLimited, context.Canceled)
	errNoTokenDoneDeadline = fmt.Errorf("%w: no token at the rate in force and the context's deadline had passed: %w", ErrLimited, context.DeadlineExceeded)
)

// waitError returns the refusal of a call whose context ended while it
// waited: it wraps ErrLimited, the context's error and, when the context
// was ended with one, its cause.
func waitError(ctx context.Context) error {
	what := "context ended while waiting for a slot"
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		what = "deadline passed while waiting for a slot"
	}
	if cause := context.Cause(ctx); cause != nil && cause != ctx.Err() {
		return fmt.Errorf("%w: %s: %w (%w)", ErrLimited, what, ctx.Err(), cause)
	}
	return fmt.Errorf("%w: %s: %w", ErrLimited, what, ctx.Err())
}

// Limiter bounds the attempts in flight to one destination by a limit it
// learns (see the package doc). Share one Limiter among every call to the
// destination in the process. It is safe for concurrent use; a waiting
// call holds no lock and starts no goroutine.
type Limiter struct {
	// Hot: read and written on every call.
	// state holds the attempts in flight (low 32 bits) and the number of
	// permits acquired, modulo 2^32 (high 32 bits).
	state    atomic.Uint64
	lim      atomic.Int64  // the limit, rounded
	mask     atomic.Uint32 // a loaded call is sampled when seq&mask == 0, another when seq&(mask|15) == 0
	nwait    atomic.Int64  // len(waiters), for the release's fast check
	drops    atomic.Int64  // permits released as dropped in this window
	utilized atomic.Bool   // in-flight reached half the limit in this window
	_        [24]byte

	throttle *throttle // nil: off
	base     time.Time
	seed     uint64 // the wall clock at New, ns: mixed into the rate gate's drawn delays (tokenDelay)
	waiting  bool
	capped   atomic.Int64 // the cap set by SetCap; negative: none
	gated    atomic.Bool  // the throttle or the rate gate is on: Acquire skips its inlined fast path

	// The rate gate (SetRate, rate.go): time per token in ns (0: off),
	// tolerance, the next token's theoretical arrival (ns since base).
	riv, rtau, rtat atomic.Int64

	maxWait int // Config.Waiting: the calls that may wait, both lists together

	mu    sync.Mutex
	learn learner // guarded by mu
	seq0  uint32  // the sequence number at the window's start
	// waiters are the calls with a deadline, earliest first; open the
	// calls without one, in arrival order; contested counts the grants
	// made to waiters while calls waited in both (see grantLocked).
	waiters   waitq.List[waiter]
	open      waitq.List[waiter]
	contested int
	rtimer    *time.Timer   // guarded by mu: the rate gate's one timer (nil until needed)
	rarmed    time.Duration // guarded by mu: when rtimer fires (0: not armed)
	repSum    time.Duration // guarded by mu: latency samples since the last SetRate
	repN      int64         // guarded by mu
	repMin    time.Duration // guarded by mu: the fastest of them (0: none)
	repNoTok  int           // guarded by mu: calls refused for want of a token since the last SetRate
}

const (
	permitOK        = 1
	permitSampled   = 2 // a latency sample
	permitThrottled = 4 // an attempt the throttle admitted: its outcome counts there
	permitFlagBits  = 3
)

// Permit is one attempt's slot, to give back with [Limiter.Release]. It is
// a small value: Acquire allocates nothing for it. The zero Permit holds
// no slot; releasing it does nothing.
type Permit struct {
	// bits holds the permit's flags (permitOK, permitSampled,
	// permitThrottled) in its low three bits and, for a latency sample,
	// when the slot was granted, since the limiter's base, above them: one
	// word, so that passing a Permit costs a register.
	bits int64
}

// permit returns a Permit with flags, granted at start (for a sample).
func permit(start time.Duration, flags uint8) Permit {
	return Permit{bits: int64(start)<<permitFlagBits | int64(flags)}
}

func (p Permit) flags() uint8         { return uint8(p.bits & (1<<permitFlagBits - 1)) }
func (p Permit) start() time.Duration { return time.Duration(p.bits >> permitFlagBits) }

func newLimiter(c Config) *Limiter {
	now := time.Now()
	l := &Limiter{base: now, seed: uint64(now.UnixNano()), learn: newLearner(c.Max, c.Timeout), waiting: c.Waiting > 0}
	l.maxWait = c.Waiting
	l.capped.Store(-1)
	if c.Throttle > 0 {
		l.throttle = newThrottle(c.Throttle, uint64(time.Now().UnixNano()))
		l.gated.Store(true)
	}
	l.setLimit(l.learn.limit)
	return l
}

func (l *Limiter) since() time.Duration { return time.Since(l.base) }

// setLimit publishes a new limit to the fast path. Calls with mu held (or
// before l is shared).
func (l *Limiter) setLimit(f float64) {
	n := int64(math.Round(f))
	if c := l.capped.Load(); c >= 0 && n > c {
		n = c
	}
	l.lim.Store(n)
	// Sample 32 to 64 calls per round trip of a loaded limiter (all
	// below a limit of 64).
	m := uint32(1)
	for int64(m)*64 <= n {
		m <<= 1
	}
	l.mask.Store(m - 1)
}

// Acquire returns a slot for one attempt, to give back with
// [Limiter.Release] when the attempt ends. When the limit is reached (or
// calls are waiting already), the call waits for a slot: calls with a
// deadline earliest deadline first, then calls without one in arrival
// order, except that while both wait one slot in 8 goes to the oldest call
// without a deadline (so that it is not starved by deadline calls that
// keep coming). Every refusal wraps [ErrLimited] and says why: at once
// when waiting is off, Config.Waiting calls wait already (with and
// without a deadline), or the call cannot make its deadline (its deadline
// is nearer than the destination's fastest answer, or more calls wait
// ahead of it than twice the rate the destination is served at, measured,
// serves before then); while waiting, when its deadline comes within the
// fastest answer (with no latency measured yet: at its deadline), when a
// release finds it cannot make it any more, or when ctx ends (the error
// then also wraps ctx's error). A call without a deadline is never
// refused as hopeless: it waits until a slot comes or ctx ends. With
// Config.Throttle set, it may first reject the call locally
// ("throttled"). A call that would wait with ctx already done is refused
// at once, with an error wrapping ErrLimited and ctx's error (a done
// context asks for a slot only if one is free: no allocation), and
// the slot a done context gets is no latency sample (nor, with
// Config.Throttle, a request of the throttle's count; the throttle refuses
// a done context whenever it rejects any share of the calls): the way to take a
// slot for a copy that its caller may cancel early, such as a hedge, whose
// time says nothing of the destination (a hedge canceled 1 ms after it
// went would otherwise set the baseline latency to 1 ms).
// When a slot is free and nobody waits, Acquire takes no lock and
// allocates nothing; it is safe for concurrent use.
func (l *Limiter) Acquire(ctx context.Context) (Permit, error) {
	// The fast path, small enough to be inlined: no throttle nor rate
	// gate, nobody waiting, the in-flight attempts below half the limit (not a
	// utilized window) and this attempt not one of the latency samples
	// (see acquire): one compare-and-swap.
	if !l.gated.Load() && l.nwait.Load() == 0 {
		s := l.state.Load()
		if 2*(int64(uint32(s))+1) < l.lim.Load() && uint32(s>>32)&(l.mask.Load()|15) != 0 && l.state.CompareAndSwap(s, s+1<<32+1) {
			return Permit{bits: permitOK}, nil
		}
	}
	return l.acquire(ctx)
}

// acquire is Acquire off its fast path: the throttle, the rate gate, a
// sample, a utilized window, a lost compare-and-swap, the limit reached.
func (l *Limiter) acquire(ctx context.Context) (Permit, error) {
	var flags uint8 = permitOK
	var now time.Duration
	if l.throttle != nil {
		now = l.since()
		if ctx.Err() != nil {
			// A done context's call (a hedge's): refused while the
			// throttle rejects any share, not by a lot, and no request of
			// its count.
			if l.throttle.rejecting(now) {
				return Permit{}, errThrottled
			}
		} else if !l.throttle.admit(now) {
			return Permit{}, errThrottled
		}
		flags |= permitThrottled // not a latency sample: the sampling below decides that
	}
	if l.nwait.Load() == 0 {
		iv := l.riv.Load()
		if iv > 0 && !l.takeToken(l.since(), iv, false) {
			p, err := l.waitFor(ctx, flags)
			return p, l.noToken(err)
		}
		lim := l.lim.Load()
		for s := l.state.Load(); int64(uint32(s)) < lim; s = l.state.Load() {
			if !l.state.CompareAndSwap(s, s+1<<32+1) {
				continue
			}
			in, seq := int64(uint32(s))+1, uint32(s>>32)
			if 2*in >= lim {
				if !l.utilized.Load() {
					l.utilized.Store(true)
				}
				if seq&l.mask.Load() == 0 {
					flags |= permitSampled
				}
			} else if seq&(l.mask.Load()|15) == 0 {
				flags |= permitSampled
			}
			if flags&(permitSampled|permitThrottled) != 0 && ctx.Err() != nil {
				flags &^= permitSampled | permitThrottled // a done context's slot: no sample (see Acquire)
			}
			if flags&permitSampled != 0 && now == 0 {
				now = l.since()
			}
			return permit(now, flags), nil
		}
		if iv > 0 {
			l.giveToken(iv) // no slot: the token goes back
		}
		return l.waitFor(ctx, flags)
	}
	p, err := l.waitFor(ctx, flags)
	if err == errTooMany && l.riv.Load() > 0 && int64(uint32(l.state.Load())) < l.lim.Load() {
		// The calls ahead wait for tokens, not for slots (one is free): a
		// refusal for want of a token, counted as demand the gate refused.
		return p, l.noToken(err)
	}
	return p, err
}

// noToken is the error of a call that found no token, given err, what
// waitFor returned for it: a refusal at once (the call could not wait) is
// said to be for want of a token and counted as demand the gate refused.
// A call that waited is counted where it fails; a done context's (a
// hedge's, say) asked only for a free slot and token, and is no demand.
func (l *Limiter) noToken(err error) error {
	var refusal error
	switch err {
	case errNoWaiting:
		refusal = errNoTokenNoWaiting
	case errTooMany:
		refusal = errNoTokenTooMany
	case errDoneCanceled:
		return errNoTokenDoneCanceled // no demand: see above
	case errDoneDeadline:
		return errNoTokenDoneDeadline
	default:
		return err
	}
	l.mu.Lock()
	l.repNoTok++
	l.mu.Unlock()
	return refusal
}

// waitFor is the slow end of acquire: a call that must wait.
func (l *Limiter) waitFor(ctx context.Context, flags uint8) (Permit, error) {
	if err := ctx.Err(); err != nil {
		l.undoThrottle()
		if errors.Is(err, context.DeadlineExceeded) {
			return Permit{}, errDoneDeadline
		}
		return Permit{}, errDoneCanceled
	}
	return l.wait(ctx, flags)
}

// Release gives back p's slot. dropped reports that the attempt timed out,
// was cancelled, or got an overload answer (a 503, a 429, a shed
// response): such an attempt is never a latency sample, and drops lower
// the limit. Release each Permit once, to the Limiter that gave it: a
// second Release, or one to another Limiter, corrupts its count of
// attempts in flight: while others are in flight, undetected, one more
// attempt than the limit may then run; with none in flight it is ignored
// (the count never goes below zero). Another Limiter's sampled Permit is
// also read as a latency sample on the wrong clock (possibly negative),
// which corrupts the baseline and the limit. A zero Permit is ignored.
// Release is safe for concurrent use and allocates nothing.
func (l *Limiter) Release(p Permit, dropped bool) {
	if p.bits == permitOK && !dropped {
		// The fast path: not a sample, not a drop.
		if !l.dec() {
			return // a Release with none in flight: ignored
		}
		if l.nwait.Load() > 0 {
			l.grant()
		}
		return
	}
	l.release(p, dropped)
}

// dec takes one attempt off the count in flight, and reports false (and
// changes nothing) if none is in flight: a compare-and-swap, so that the
// count is never seen below zero (an add undone afterwards let a
// concurrent Release keep its own decrement, and a concurrent Acquire see
// four billion attempts in flight and wait for a grant that never came).
func (l *Limiter) dec() bool {
	for {
		s := l.state.Load()
		if uint32(s) == 0 {
			return false
		}
		if l.state.CompareAndSwap(s, s-1) {
			return true
		}
	}
}

// release is Release off its fast path.
func (l *Limiter) release(p Permit, dropped bool) {
	if p.flags()&permitOK == 0 {
		return
	}
	if !l.dec() {
		return // a Release with none in flight: ignored
	}
	if dropped {
		l.drops.Add(1)
	}
	if p.flags()&permitThrottled != 0 && l.throttle != nil {
		l.throttle.done(l.since(), !dropped)
	}
	if p.flags()&permitSampled != 0 {
		l.sampled(p, dropped)
	}
	if l.nwait.Load() > 0 {
		l.grant()
	}
}

// grant hands the free slots to waiting calls.
func (l *Limiter) grant() {
	l.mu.Lock()
	l.grantLocked()
	l.mu.Unlock()
}

// sampled records a sampled attempt and ends the window when it is due.
func (l *Limiter) sampled(p Permit, dropped bool) {
	now := l.since()
	l.mu.Lock()
	if !dropped {
		d := now - p.start()
		l.learn.sample(d)
		l.repSum += d
		if l.repN == 0 || d < l.repMin {
			l.repMin = d
		}
		l.repN++
	}
	if l.learn.due(now, l.drops.Load()) {
		st := l.state.Load()
		seq := uint32(st >> 32)
		attempts := int64(seq - l.seq0)
		l.seq0 = seq
		f := l.learn.window(now, attempts, int64(uint32(st)), l.drops.Swap(0), l.utilized.Swap(false))
		l.setLimit(f)
		l.grantLocked()
		l.expireLocked(now)
	}
	l.mu.Unlock()
}

// Limit returns the current limit: the most attempts that may be in
// flight, from 1 to Config.Max, or lower under a cap ([Limiter.SetCap]).
// It changes about once per round trip.
func (l *Limiter) Limit() int { return int(l.lim.Load()) }

// SetCap caps the limit at n from outside (a fleet's share of a
// fleet-wide limit): the limit in force is the lower of the learned limit
// and n. n = 0 lets no new attempt start (calls wait, as over any limit,
// within their deadlines); a negative n removes the cap. The learned
// limit goes on learning underneath (a cap that binds does not stop it
// growing while its windows are used), and attempts already in flight
// above a lowered cap end normally. A raised cap grants waiting calls at
// once. SetCap returns the attempts in flight and the calls waiting at
// that moment (the cap unchanged, SetCap(n) with the same n reads them).
// It takes the Limiter's lock and is safe for concurrent use.
func (l *Limiter) SetCap(n int) (inFlight, waiting int) {
	c := int64(n)
	if c < 0 {
		c = -1
	}
	l.mu.Lock()
	if l.capped.Load() != c {
		l.capped.Store(c)
		l.learn.capped = float64(c)
		l.setLimit(l.learn.limit)
		l.grantLocked()
	}
	inFlight, waiting = int(uint32(l.state.Load())), l.waiters.Len()+l.open.Len()
	l.mu.Unlock()
	return inFlight, waiting
}
