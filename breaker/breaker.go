package breaker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/sat"
	"github.com/stormguard/stormguard/internal/tagged"
	"github.com/stormguard/stormguard/internal/timed"
	"github.com/stormguard/stormguard/internal/waitq"
)

// State is the state of a [Breaker]. The zero value is [Closed].
type State uint8

const (
	// Closed lets every call through and counts outcomes.
	Closed State = iota
	// HalfOpen admits a few probe calls to test the dependency.
	HalfOpen
	// Open rejects every call at once.
	Open

	numStates
)

var stateNames = [numStates]string{Closed: "closed", HalfOpen: "half-open", Open: "open"}

// String returns "closed", "half-open" or "open", or "State(N)" for an
// unknown value.
func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Permit is the right to make one call, returned by [Breaker.Allow] and
// [Breaker.Wait] and given back with [Breaker.Done], [Breaker.Fail] or
// [Breaker.Cancel]. It is a small value; it records the generation it was
// issued in and whether it is a probe. The zero Permit is never valid:
// Done, Fail and Cancel ignore it.
type Permit struct {
	gen uint64
	// bits holds in bit 0 whether p is a probe and, above it, when p was
	// issued, since base, + 1 (0 unless Config.SlowCall is set): two
	// words, so that passing a Permit costs what it did before SlowCall.
	bits int64
}

// isProbe is Permit.bits of a probe.
const isProbe = 1

// Probe reports whether p is a probe.
func (p Permit) Probe() bool { return p.bits&isProbe != 0 }

// issued returns when p was issued, since base, + 1; 0 if not recorded.
func (p Permit) issued() time.Duration { return time.Duration(p.bits >> 1) }

// The state word: generation above two bits of State.
const stateBits = 2

func word(gen uint64, s State) uint64 { return gen<<stateBits | uint64(s) }
func stateOf(w uint64) State          { return State(w & (1<<stateBits - 1)) }
func genOf(w uint64) uint64           { return w >> stateBits }

// event is a state change waiting for its callbacks.
type event struct{ from, to State }

// Breaker is a circuit breaker. Build one with [New]; the zero value is not
// usable. A Breaker is safe for concurrent use.
type Breaker struct {
	// Immutable after New.
	cfg       Config
	ratio     float64
	bucket    time.Duration
	buckets   int64
	minCalls  uint64
	consec    uint64 // ConsecutiveFailures; 0: off
	probes    int
	now       func() time.Time
	rand      func() float64 // nil: math/rand/v2
	isFailure func(error) bool
	slow      time.Duration // Config.SlowCall; 0: off
	onChange  func(from, to State)
	shared    Shared
	base      time.Time

	// state is the generation and State, changed only with mu held.
	_     [64]byte
	state atomic.Uint64
	// openUntil is when the current open period ends, in nanoseconds since
	// base; stored before state becomes Open.
	openUntil atomic.Int64
	// releasing is set while a pacer releases the calls that waited
	// through the last open period: a failure then slows it down.
	releasing atomic.Bool
	// asking is set while one goroutine asks Shared.ProbeRound.
	asking atomic.Bool
	_      [40]byte

	// peaks: the highest window rate a failure found below the ratio in
	// each of the last two window-aligned periods (see notePeak).
	peaks    [2]atomic.Uint64
	closedAt atomic.Int64 // the last close (or New), ns since base; stored with mu held
	reclosed atomic.Bool  // closed after a trip or Reset: closedAt is a close, not New

	// streak is the run of consecutive closed-state failures
	// (ConsecutiveFailures), tagged with the generation it belongs to:
	// generation<<32 | count. A success stores 0.
	streak atomic.Uint64

	// counts[i] counts the outcomes of the bucket e with e mod Buckets = i.
	// Bucket numbers include generation·Buckets, so a new closed
	// generation starts with an empty window.
	counts []bucket

	mu sync.Mutex
	// Guarded by mu.
	reopens   int     // consecutive trips since the breaker last closed
	admitted  int     // probes admitted in this half-open generation
	succeeded int     // probes that succeeded in it
	rate      float64 // release ceiling for the next close, calls per second
	rel       release // the release of the waiting calls after a close
	// waiters are the calls waiting in Wait, earliest deadline first; its
	// Max is MaxWaiters, 0 when waiting is off (Wait checks it first).
	waiters    waitq.List[waiter]
	roundArmed bool          // a timer will start the next probe round for the waiters
	roundAt    time.Duration // when that timer fires, since base
	roundTimer *time.Timer   // that timer (built at the first arming, then reset)
	pending    []event       // state changes whose callbacks have not run
	delivering bool          // a goroutine is running callbacks
}

// New validates c and returns a closed Breaker. Zero fields take the
// defaults (see [Config]). It returns an error, its text starting
// "breaker: invalid config: ", if and only if FailureRatio is not in
// (0, 1], Window, Buckets, MinCalls, ConsecutiveFailures, OpenFor or
// Probes is negative, Buckets exceeds 3600, ConsecutiveFailures exceeds
// 4294967295, Window is not a multiple of Buckets nanoseconds of at least 1 ms each,
// MaxOpenFor is neither 0 nor at least OpenFor, SlowCall is negative, or
// ReleaseRate is NaN. A Breaker that was built never fails or panics later,
// except by re-raising the panic of a function of the caller's (a closure
// given to Execute, Config.IsFailure, OnStateChange, a Shared method) on
// the goroutine of the call that ran it; on the breaker's own timer
// goroutine, where no caller could recover it, such a panic is recovered
// and dropped (a Shared.ProbeRound that panics there counts as a refusal).
// OnStateChange is told of a change even if Shared.StateChanged panics on
// it, and changes queued behind a callback that panicked are delivered on
// a goroutine of their own.
func New(c Config) (*Breaker, error) {
	c, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	b := &Breaker{
		cfg:       c,
		ratio:     c.FailureRatio,
		bucket:    c.Window / time.Duration(c.Buckets),
		buckets:   int64(c.Buckets),
		minCalls:  uint64(c.MinCalls),
		consec:    uint64(c.ConsecutiveFailures),
		probes:    c.Probes,
		now:       c.Now,
		rand:      c.Rand,
		isFailure: c.IsFailure,
		slow:      c.SlowCall,
		onChange:  c.OnStateChange,
		shared:    c.Shared,
		counts:    make([]bucket, c.Buckets),
	}
	if b.now == nil {
		b.now = clock.Monotonic()
	}
	if b.isFailure == nil {
		b.isFailure = func(err error) bool { return err != nil }
	}
	b.waiters.Max = max(c.MaxWaiters, 0)
	b.base = b.now()
	empty := tagged.Pack(tagged.Never, 0)
	for i := range b.counts {
		b.counts[i].succ.Store(empty)
		b.counts[i].fail.Store(empty)
	}
	b.state.Store(word(1, Closed)) // generation 1: the zero Permit is never valid
	return b, nil
}

// Config returns the configuration b was built from, with the defaults
// filled in (IsFailure, OnStateChange, Now, Rand and Shared as given,
// possibly nil).
func (b *Breaker) Config() Config { return b.cfg }

// since returns t as the time since base (saturating).
func (b *Breaker) since(t time.Time) time.Duration { return t.Sub(b.base) }

// u returns a uniformly distributed number in [0, 1).
func (b *Breaker) u() float64 {
	if b.rand == nil {
		return rand.Float64()
	}
	v := b.rand()
	if !(v >= 0) {
		return 0
	}
	return min(v, 1-0x1p-53)
}

// Allow asks to make one call now. It returns a [Permit] to give back with
// [Breaker.Done] (or [Breaker.Fail], [Breaker.Cancel]) once the outcome is
// known, or an [*OpenError] if the breaker rejects the call, in which case
// the call must not be made. It never waits; see [Breaker.Wait]. While the
// breaker is closed, Allow takes no lock and allocates nothing; a
// rejection allocates its error.
func (b *Breaker) Allow() (Permit, error) {
	w := b.state.Load()
	if stateOf(w) == Closed {
		if b.slow > 0 {
			return b.stamp(Permit{gen: genOf(w)}), nil
		}
		return Permit{gen: genOf(w)}, nil
	}
	p, err := b.allowSlow(w)
	if b.slow > 0 {
		p = b.stamp(p)
	}
	return p, err
}

// stamp records in p, a permit about to be handed out (the zero Permit of
// a rejection is left as it is), when it was issued: slow calls count as
// failures (Config.SlowCall is set).
func (b *Breaker) stamp(p Permit) Permit {
	if p.gen != 0 {
		p.bits |= int64(b.since(b.now())+1) << 1
	}
	return p
}

// restamp returns p issued now: with Config.SlowCall, a call is timed from
// when its attempt starts, not from a wait between its admission and its
// attempt (the retry loop's wait for a concurrency limiter's slot, see
// internal/timed). A permit without a stamp is returned as it is.
func (b *Breaker) restamp(p Permit) Permit {
	if b.slow <= 0 || p.gen == 0 {
		return p
	}
	p.bits &= isProbe
	return b.stamp(p)
}

// current reports whether p was issued in b's current generation (no
// state change since): see internal/timed.
func (b *Breaker) current(p Permit) bool {
	return p.gen != 0 && genOf(b.state.Load()) == p.gen
}

func init() {
	timed.Restamp = (*Breaker).restamp
	timed.Current = (*Breaker).current
}

func (b *Breaker) allowSlow(w uint64) (Permit, error) {
	for {
		switch stateOf(w) {
		case Closed:
			return Permit{gen: genOf(w)}, nil
		case Open:
			now := b.now()
			if wait := b.openIn(now); wait > 0 {
				return Permit{}, &OpenError{State: Open, Wait: wait}
			}
			if !b.startRound(w, now) {
				return Permit{}, &OpenError{State: Open, Wait: b.openIn(b.now())} // after the fleet's answer
			}
		default: // HalfOpen
			b.mu.Lock()
			if b.state.Load() == w {
				if b.admitted < b.probes {
					b.admitted++
					b.mu.Unlock()
					return Permit{gen: genOf(w), bits: isProbe}, nil
				}
				b.mu.Unlock()
				return Permit{}, &OpenError{State: HalfOpen}
			}
			b.mu.Unlock()
		}
		w = b.state.Load()
	}
}

// Done records the outcome of the call p was issued for: success or not.
// It ignores the zero Permit and a permit of an older generation (the
// breaker changed state since p was issued): such an outcome changes
// nothing.
//
// While the breaker is closed, Done records the outcome in the current
// bucket; a failure trips the breaker if the window now holds at least
// MinCalls calls with failures >= FailureRatio·calls, or the current bucket
// alone does, or (with Config.ConsecutiveFailures) it ends a run of that
// many failures. While the calls that waited are being released after a
// close, Probes calls in the window are enough, failures at least
// FailureRatio of them (the window then holds only the calls since the
// close: with the defaults, 2 failures of the first 3 calls released say
// that the dependency is down again, as the probe round's 3 calls said it
// was up). It takes no
// lock and allocates nothing unless it trips the breaker, or reports a
// failure while that release runs (the failure slows the release down,
// under the breaker's lock). A probe's success
// counts towards closing; its failure reopens the breaker. With
// Config.SlowCall set, a success that came SlowCall or more after its
// permit was issued counts as a failure.
//
// Each permit must be given back once. Giving one back twice is a bug in
// the caller: a closed-state permit would count twice, a probe's second
// Done as another probe outcome.
func (b *Breaker) Done(p Permit, success bool) {
	b.done(p, success, 0)
}

// Fail records a failure of the call p was issued for, like Done(p, false),
// whose answer asked to wait retryAfter before calling again (an HTTP
// Retry-After, a gRPC pushback). If the failure opens the breaker, no
// probe round starts sooner than retryAfter, spread by up to half of it
// again so that breakers told the same do not probe in step; a
// retryAfter near the largest Duration keeps the breaker open that long
// (the sum saturates; it never wraps round to a short wait). retryAfter 0
// is Done(p, false).
func (b *Breaker) Fail(p Permit, retryAfter time.Duration) {
	b.done(p, false, max(retryAfter, 0))
}

func (b *Breaker) done(p Permit, success bool, hint time.Duration) {
	var at time.Time // zero: record reads the clock
	w := b.state.Load()
	if p.bits == 0 {
		// A closed-state permit without a SlowCall stamp, the hot path:
		// one comparison finds it current (the generation starts at 1, so
		// the zero Permit never matches) and the breaker still closed.
		if w == word(p.gen, Closed) {
			b.record(p.gen, success, hint, at)
		}
		return
	}
	if genOf(w) != p.gen || p.gen == 0 {
		return // stale, or the zero Permit
	}
	if success && p.bits>>1 != 0 {
		// Slow calls count as failures: the call ends now.
		at = b.now()
		success = b.since(at)-(p.issued()-1) < b.slow
	}
	if !p.Probe() {
		if stateOf(w) == Closed {
			b.record(p.gen, success, hint, at)
		}
		return
	}
	b.mu.Lock()
	if b.state.Load() != word(p.gen, HalfOpen) {
		b.mu.Unlock()
		return
	}
	now := b.now()
	if success {
		b.succeeded++
		if b.succeeded >= b.probes {
			b.closeLocked(HalfOpen, now)
		}
	} else {
		b.reopens++
		b.openLocked(HalfOpen, now, hint)
	}
	b.mu.Unlock()
	b.deliver()
}

// Cancel gives p back without an outcome, for a call that was never made or
// whose outcome says nothing about the dependency (the caller went away). A
// probe's slot is freed for another probe (a waiting call first); a
// closed-state permit needs nothing. Stale and zero permits are ignored.
func (b *Breaker) Cancel(p Permit) {
	if !p.Probe() || genOf(b.state.Load()) != p.gen {
		return
	}
	b.mu.Lock()
	b.cancelProbeLocked(p)
	b.mu.Unlock()
}

// setLocked starts a new generation in state to and queues the callbacks.
// It requires mu held.
func (b *Breaker) setLocked(from, to State) {
	gen := genOf(b.state.Load()) + 1
	b.state.Store(word(gen, to))
	if b.onChange != nil || b.shared != nil {
		b.pending = append(b.pending, event{from, to})
	}
}

// deliver runs queued callbacks, in order, without holding mu, unless
// another goroutine is already doing so.
func (b *Breaker) deliver() {
	if b.onChange == nil && b.shared == nil {
		return
	}
	b.mu.Lock()
	if b.delivering {
		b.mu.Unlock()
		return
	}
	b.delivering = true
	for len(b.pending) > 0 {
		ev := b.pending[0]
		b.pending = slices.Delete(b.pending, 0, 1)
		b.mu.Unlock()
		b.call(ev)
		b.mu.Lock()
	}
	b.delivering = false
	b.mu.Unlock()
}

// call runs the callbacks of one state change. If one panics (the panic
// goes on), the rest of the queue is delivered on a goroutine of its own:
// a change queued behind it is not lost.
func (b *Breaker) call(ev event) {
	ok := false
	defer func() {
		if !ok {
			b.mu.Lock()
			b.delivering = false
			rest := len(b.pending) > 0
			b.mu.Unlock()
			if rest {
				go b.deliver()
			}
		}
	}()
	b.callbacks(ev)
	ok = true
}

// callbacks tells Shared and then OnStateChange of ev; OnStateChange is
// told even if StateChanged panics.
func (b *Breaker) callbacks(ev event) {
	if b.shared != nil {
		if b.onChange != nil {
			defer b.onChange(ev.from, ev.to)
		}
		b.shared.StateChanged(ev.from, ev.to)
		return
	}
	b.onChange(ev.from, ev.to)
}

// State returns the breaker's state. If the breaker is open and its open
// period is over, State moves it to HalfOpen first (and runs the callbacks,
// outside the lock), so State never reports an Open breaker that would
// admit a call; with a [Shared] fleet, that move waits for a call, which
// asks the fleet first.
func (b *Breaker) State() State {
	if w := b.state.Load(); stateOf(w) != Open {
		return stateOf(w) // small enough to be inlined: the closed breaker's path
	}
	return b.openState()
}

// openState is State for a breaker that was open when State read it: the
// probe round starts if its open period is over.
func (b *Breaker) openState() State {
	w := b.state.Load()
	if stateOf(w) == Open && b.shared == nil {
		now := b.now()
		if b.openIn(now) == 0 {
			b.mu.Lock()
			b.halfOpenLocked(w, now)
			b.mu.Unlock()
			b.deliver()
			w = b.state.Load()
		}
	}
	return stateOf(w)
}

// Snapshot is a breaker's state for observability.
type Snapshot struct {
	// State is the current state.
	State State
	// Calls and Failures are the outcomes in the closed-state window (0
	// unless State is Closed). A bucket counts its successes and its
	// failures apart, each up to 16,777,215 (so it may hold about twice
	// that many calls); one that fills either count halves both, which
	// keeps their ratio: the counts of so busy a window are then lower
	// than the calls made.
	Calls, Failures int
	// Waiters is the number of calls waiting in [Breaker.Wait], those
	// already scheduled for release included.
	Waiters int
	// HalfOpenIn is how long until the next probe round (0 unless State is
	// Open).
	HalfOpenIn time.Duration
}

// Snapshot returns the breaker's state and counters, after the same
// Open-to-HalfOpen check as [Breaker.State]. Under concurrent use the
// counters are read one after another, not as one atomic snapshot.
func (b *Breaker) Snapshot() Snapshot {
	b.State() // half-open if due
	now := b.now()
	b.mu.Lock()
	w := b.state.Load()
	s := Snapshot{State: stateOf(w), Waiters: b.waiters.Len()}
	switch s.State {
	case Closed:
		calls, failures := b.window(b.bucketOf(now, genOf(w)))
		s.Calls, s.Failures = int(calls), int(failures)
	case Open:
		s.HalfOpenIn = b.openIn(now)
	}
	b.mu.Unlock()
	return s
}

// Trip opens the breaker now, as if its own window had tripped it: for a
// verdict reached elsewhere (a [Shared] fleet saw the dependency failing, an
// operator). The next probe round comes after the usual open period, and no
// sooner than retryAfter (spread like [Breaker.Fail]'s). An open breaker
// only moves its next round later, if retryAfter asks; a half-open one
// reopens.
func (b *Breaker) Trip(retryAfter time.Duration) {
	now := b.now()
	b.mu.Lock()
	w := b.state.Load()
	switch stateOf(w) {
	case Closed:
		e := b.bucketOf(now, genOf(w))
		calls, _ := b.window(e)
		b.rate = b.tripRate(calls, now, e)
		b.reopens = 0
		b.openLocked(Closed, now, retryAfter)
	case HalfOpen:
		b.reopens++
		b.openLocked(HalfOpen, now, retryAfter)
	case Open:
		if retryAfter > 0 {
			if h := int64(sat.Add(b.since(now), b.spread(retryAfter))); h > b.openUntil.Load() {
				b.openUntil.Store(h)
			}
		}
	}
	b.mu.Unlock()
	b.deliver()
}

// Reset closes the breaker now, with an empty window, as if its probes had
// succeeded: for a recovery found elsewhere (another process of a [Shared]
// fleet probed successfully, an operator). Waiting calls are released at the
// release rate. A closed breaker is left as it is.
func (b *Breaker) Reset() {
	now := b.now()
	b.mu.Lock()
	if s := stateOf(b.state.Load()); s != Closed {
		b.closeLocked(s, now)
	}
	b.mu.Unlock()
	b.deliver()
}

// Execute calls fn if the breaker allows it and records the outcome:
// IsFailure(err) (by default err != nil) is a failure. It returns fn's
// error, or an [*OpenError] without calling fn if the breaker rejects the
// call. If fn panics, the call is recorded as a failure and the panic
// continues (it is not recovered). While the breaker is closed, Execute
// itself takes no lock and allocates nothing.
func (b *Breaker) Execute(fn func() error) error {
	p, err := b.Allow()
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done { // fn panicked or called runtime.Goexit
			b.Done(p, false)
		}
	}()
	err = fn()
	ok := !b.isFailure(err) // a panic of IsFailure's gives the permit back as a failure, as fn's does
	done = true
	b.Done(p, ok)
	return err
}
