package breaker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/tagged"
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

// Defaults of a [Config]'s zero fields.
const (
	DefaultFailureRatio = 0.5
	DefaultWindow       = 10 * time.Second
	DefaultBuckets      = 10
	DefaultMinCalls     = 20
	DefaultOpenFor      = time.Second
	DefaultProbes       = 3
	DefaultMaxWaiters   = 10_000
)

// Limits on a [Config], checked by [New].
const (
	// MaxBuckets is the largest number of buckets a window may have. A
	// failure sums the window, so its cost grows with Buckets.
	MaxBuckets = 3600
	// MinBucket is the shortest bucket, Window/Buckets.
	MinBucket = time.Millisecond
)

// Config is the plain-data description of a breaker. Build a [Breaker] from
// it with [New]. Zero fields take the defaults, so Config{} trips at 50%
// failures over 10 s (at least 20 calls), probes with 3 calls about every
// second while open, and holds up to 10,000 waiting calls;
// breaker.Config{OpenFor: 5 * time.Second} changes only the probe interval.
type Config struct {
	// FailureRatio is the fraction of failed calls, in (0, 1], at or above
	// which the breaker trips; 0 means [DefaultFailureRatio]. It is checked
	// after each failure over the window, and over the current bucket alone
	// (Window/Buckets, 1 s by default) when that holds MinCalls calls: a
	// dependency that goes down trips the breaker within about a bucket,
	// not after half a window of failures outweighs its healthy past.
	FailureRatio float64
	// Window is the length of the sliding window of closed-state outcomes;
	// 0 means [DefaultWindow]. It must be a multiple of Buckets
	// nanoseconds, with Window/Buckets at least [MinBucket].
	Window time.Duration
	// Buckets is the number of buckets the window is cut into, from 1 to
	// [MaxBuckets]; 0 means [DefaultBuckets]. The window covers the current
	// bucket and the Buckets−1 before it.
	Buckets int
	// MinCalls is the number of calls the window must hold before the
	// breaker may trip; 0 means [DefaultMinCalls].
	MinCalls int
	// OpenFor is the probe interval: how long the breaker stays open after
	// it trips, or after a failed probe, before it lets probes through
	// again; 0 means [DefaultOpenFor] (1 s). Each open period is OpenFor
	// jittered by ±20%, so that breakers that tripped together do not
	// probe together, and never shorter than a Retry-After the dependency
	// sent with the failure that opened it (see [Breaker.Fail]).
	OpenFor time.Duration
	// MaxOpenFor bounds the growth of the open period. 0 means no growth:
	// every open period is OpenFor. Otherwise it must be at least OpenFor,
	// and each consecutive failed probe doubles the open period, up to
	// MaxOpenFor, so that a dependency that stays down is probed less and
	// less often.
	MaxOpenFor time.Duration
	// Probes is the number of calls a probe round admits; all of them
	// must succeed to close the breaker; 0 means [DefaultProbes].
	Probes int
	// MaxWaiters bounds the calls that may wait at once in [Breaker.Wait]
	// for the breaker to admit them; beyond it a call is rejected at once.
	// 0 means [DefaultMaxWaiters]; a negative value turns waiting off.
	MaxWaiters int
	// ReleaseRate is the most waiting calls per second released when the
	// breaker closes, earliest deadline first, so that a recovering dependency meets
	// its backlog at a pace it can serve rather than as one spike. The
	// release starts at a quarter of it and doubles every half second up
	// to it; a failure while it runs halves the pace. 0 means the rate of
	// calls the breaker saw before it tripped (the pace the dependency
	// served before the outage), at least Probes per OpenFor; a negative
	// value releases every waiting call at once. New calls are not held
	// back while the backlog drains.
	ReleaseRate float64
	// IsFailure reports whether an error returned by the closure given to
	// [Breaker.Execute] or [Do] counts as a failure. Nil means any non-nil
	// error is a failure. It is not used by [Breaker.Done], which is told
	// the outcome. It must be safe for concurrent use.
	IsFailure func(error) bool
	// OnStateChange, if not nil, is called after each state change with the
	// old and the new state; never while the breaker's lock is held, one
	// call at a time, in order (see the package documentation).
	OnStateChange func(from, to State)
	// Now returns the current time; nil means the monotonic clock
	// (time.Now's reading when New ran, advanced by time.Since: cheaper
	// than time.Now and immune to wall-clock steps). It must be safe for
	// concurrent use. The timers of [Breaker.Wait] run on real time (or a
	// testing/synctest bubble's).
	Now func() time.Time
	// Rand returns uniformly distributed numbers in [0, 1) for the jitter
	// of open periods and releases; nil means the Go runtime's generator.
	// A Rand pinned at 0.5 makes every open period exactly OpenFor. It
	// must be safe for concurrent use.
	Rand func() float64
	// Shared, if not nil, connects the breaker to breakers in other
	// processes (see [Shared]). Nil means the breaker decides alone.
	Shared Shared
}

// Shared connects a [Breaker] to the breakers of other processes that call
// the same dependency, so that a fleet of low-volume clients trips, probes
// and recovers as one. A fleet implementation counts outcomes locally,
// exchanges them in the background, and steers the breaker with
// [Breaker.Trip] and [Breaker.Reset]; it must never block the caller.
type Shared interface {
	// Outcome is told every closed-state outcome. It is on the hot path:
	// it must not block, do I/O or allocate.
	Outcome(success bool)
	// ProbeRound is asked, when a probe round is due, whether this process
	// may probe in it (the fleet hands out a few probe permits per round).
	// false keeps the breaker open for another probe interval. It may do
	// a short round trip; the breaker holds no lock while it runs.
	ProbeRound() bool
	// StateChanged is told every state change, like Config.OnStateChange
	// (outside the lock, one at a time, in order).
	StateChanged(from, to State)
}

var (
	// ErrInvalidConfig is wrapped by every error [New] returns.
	ErrInvalidConfig = errors.New("breaker: invalid config")
	// ErrOpen matches (with errors.Is) every rejection: an [*OpenError]
	// from an open breaker, and from a half-open one whose probes are all
	// taken.
	ErrOpen = errors.New("breaker: open")
	// ErrTooManyProbes matches the rejections of a half-open breaker whose
	// probes are all taken. It wraps [ErrOpen].
	ErrTooManyProbes = fmt.Errorf("%w: half-open, all probes taken", ErrOpen)
)

// OpenError is the error [Breaker.Allow], [Breaker.Execute] and [Do] return
// when they reject a call. It matches [ErrOpen] with errors.Is, and
// [ErrTooManyProbes] too when State is HalfOpen.
type OpenError struct {
	// State is the state that rejected the call: Open, or HalfOpen when
	// all probes were taken.
	State State
	// Wait is how long after the rejection the breaker half-opens; 0 when
	// State is HalfOpen (the next call may be admitted as soon as a probe
	// finishes badly, or the breaker closes).
	Wait time.Duration
}

// Error describes the rejection, e.g. "breaker: open, half-open in 12.5s".
func (e *OpenError) Error() string {
	if e.State == HalfOpen {
		return "breaker: half-open, all probes taken"
	}
	return "breaker: open, half-open in " + e.Wait.String()
}

// RetryAfter returns Wait: how long a caller should wait before trying
// again. It makes an OpenError a server-style hint for retry loops.
func (e *OpenError) RetryAfter() time.Duration { return e.Wait }

// Is reports whether target is [ErrOpen], or [ErrTooManyProbes] for a
// half-open rejection.
func (e *OpenError) Is(target error) bool {
	return target == ErrOpen || (target == ErrTooManyProbes && e.State == HalfOpen)
}

// An *OpenError is a retry hint (the interface package retry looks for).
var _ interface{ RetryAfter() time.Duration } = (*OpenError)(nil)

// Permit is the right to make one call, returned by [Breaker.Allow] and
// [Breaker.Wait] and given back with [Breaker.Done], [Breaker.Fail] or
// [Breaker.Cancel]. It is a small value; it records the generation it was
// issued in and whether it is a probe. The zero Permit is never valid:
// Done, Fail and Cancel ignore it.
type Permit struct {
	gen   uint64
	probe bool
}

// Probe reports whether p is a probe.
func (p Permit) Probe() bool { return p.probe }

// The state word: generation above two bits of State.
const stateBits = 2

func word(gen uint64, s State) uint64 { return gen<<stateBits | uint64(s) }
func stateOf(w uint64) State          { return State(w & (1<<stateBits - 1)) }
func genOf(w uint64) uint64           { return w >> stateBits }

// bucket holds the counters of one bucket, each tagged with the bucket
// number.
type bucket struct{ succ, fail atomic.Uint64 }

// event is a state change waiting for its callbacks.
type event struct{ from, to State }

// Breaker is a circuit breaker. Build one with [New]; the zero value is not
// usable. A Breaker is safe for concurrent use.
type Breaker struct {
	// Immutable after New.
	cfg        Config
	ratio      float64
	bucket     time.Duration
	buckets    int64
	minCalls   uint64
	probes     int
	maxWaiters int // 0: no waiting
	now        func() time.Time
	rand       func() float64 // nil: math/rand/v2
	isFailure  func(error) bool
	onChange   func(from, to State)
	shared     Shared
	base       time.Time

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

	// counts[i] counts the outcomes of the bucket e with e mod Buckets = i.
	// Bucket numbers include generation·Buckets, so a new closed
	// generation starts with an empty window.
	counts []bucket

	mu sync.Mutex
	// Guarded by mu.
	reopens    int           // consecutive trips since the breaker last closed
	openPeriod time.Duration // length of the current (or last) open period
	admitted   int           // probes admitted in this half-open generation
	succeeded  int           // probes that succeeded in it
	rate       float64       // release rate for the next close, calls per second
	closedAt   int64         // when the breaker last closed (or was built), nanoseconds since base
	pace       pacer         // the release of the waiting calls after a close
	waiters    waitList      // calls waiting in Wait, earliest deadline first
	roundArmed bool          // a timer will start the next probe round for the waiters
	pending    []event       // state changes whose callbacks have not run
	delivering bool          // a goroutine is running callbacks
}

// New validates c and returns a closed Breaker. Zero fields take the
// defaults (see [Config]). It returns an error wrapping [ErrInvalidConfig]
// if FailureRatio is not in (0, 1], Window, Buckets, MinCalls, OpenFor or
// Probes is negative, Buckets exceeds [MaxBuckets], Window is not a
// multiple of Buckets nanoseconds of at least [MinBucket] each, MaxOpenFor
// is neither 0 nor at least OpenFor, or ReleaseRate is NaN. A Breaker that
// was built never fails or panics later (except by re-raising a closure's
// panic).
func New(c Config) (*Breaker, error) {
	if c.FailureRatio == 0 {
		c.FailureRatio = DefaultFailureRatio
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Buckets == 0 {
		c.Buckets = DefaultBuckets
	}
	if c.MinCalls == 0 {
		c.MinCalls = DefaultMinCalls
	}
	if c.OpenFor == 0 {
		c.OpenFor = DefaultOpenFor
	}
	if c.Probes == 0 {
		c.Probes = DefaultProbes
	}
	if c.MaxWaiters == 0 {
		c.MaxWaiters = DefaultMaxWaiters
	}
	switch {
	case !(c.FailureRatio > 0 && c.FailureRatio <= 1):
		return nil, fmt.Errorf("%w: failure ratio %v must be in (0, 1]", ErrInvalidConfig, c.FailureRatio)
	case c.Window < 0:
		return nil, fmt.Errorf("%w: window %v must be positive", ErrInvalidConfig, c.Window)
	case c.Buckets < 1 || c.Buckets > MaxBuckets:
		return nil, fmt.Errorf("%w: buckets %d must be in [1, %d]", ErrInvalidConfig, c.Buckets, MaxBuckets)
	case c.Window%time.Duration(c.Buckets) != 0:
		return nil, fmt.Errorf("%w: window %v is not a multiple of %d buckets", ErrInvalidConfig, c.Window, c.Buckets)
	case c.Window/time.Duration(c.Buckets) < MinBucket:
		return nil, fmt.Errorf("%w: bucket %v (window %v / %d buckets) is shorter than %v",
			ErrInvalidConfig, c.Window/time.Duration(c.Buckets), c.Window, c.Buckets, MinBucket)
	case c.MinCalls < 1:
		return nil, fmt.Errorf("%w: min calls %d must be at least 1", ErrInvalidConfig, c.MinCalls)
	case c.OpenFor < 0:
		return nil, fmt.Errorf("%w: open for %v must be positive", ErrInvalidConfig, c.OpenFor)
	case c.MaxOpenFor != 0 && c.MaxOpenFor < c.OpenFor:
		return nil, fmt.Errorf("%w: max open for %v must be 0 or at least open for %v", ErrInvalidConfig, c.MaxOpenFor, c.OpenFor)
	case c.Probes < 1:
		return nil, fmt.Errorf("%w: probes %d must be at least 1", ErrInvalidConfig, c.Probes)
	case math.IsNaN(c.ReleaseRate):
		return nil, fmt.Errorf("%w: release rate is NaN", ErrInvalidConfig)
	}
	b := &Breaker{
		cfg:        c,
		ratio:      c.FailureRatio,
		bucket:     c.Window / time.Duration(c.Buckets),
		buckets:    int64(c.Buckets),
		minCalls:   uint64(c.MinCalls),
		probes:     c.Probes,
		maxWaiters: max(c.MaxWaiters, 0),
		now:        c.Now,
		rand:       c.Rand,
		isFailure:  c.IsFailure,
		onChange:   c.OnStateChange,
		shared:     c.Shared,
		counts:     make([]bucket, c.Buckets),
	}
	if b.now == nil {
		b.now = clock.Monotonic()
	}
	if b.isFailure == nil {
		b.isFailure = func(err error) bool { return err != nil }
	}
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

// since returns t as nanoseconds since base (saturating).
func (b *Breaker) since(t time.Time) int64 { return int64(t.Sub(b.base)) }

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

// bucketOf returns the bucket number of time t in closed generation gen.
func (b *Breaker) bucketOf(t time.Time, gen uint64) int64 {
	d := t.Sub(b.base)
	e := int64(d / b.bucket)
	if d < 0 && d%b.bucket != 0 {
		e-- // floor
	}
	// Generations are at least 3 apart between closed states, so the
	// buckets of an older closed generation are at least 3 windows behind.
	return e + int64(gen)*b.buckets
}

func (b *Breaker) index(e int64) int64 {
	i := e % b.buckets
	if i < 0 {
		i += b.buckets
	}
	return i
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
		return Permit{gen: genOf(w)}, nil
	}
	return b.allowSlow(w)
}

func (b *Breaker) allowSlow(w uint64) (Permit, error) {
	for {
		switch stateOf(w) {
		case Closed:
			return Permit{gen: genOf(w)}, nil
		case Open:
			now := b.now()
			if wait := b.openUntil.Load() - b.since(now); wait > 0 {
				return Permit{}, &OpenError{State: Open, Wait: time.Duration(wait)}
			}
			if !b.startRound(w, now) {
				return Permit{}, &OpenError{State: Open, Wait: time.Duration(max(b.openUntil.Load()-b.since(now), 0))}
			}
		default: // HalfOpen
			b.mu.Lock()
			if b.state.Load() == w {
				if b.admitted < b.probes {
					b.admitted++
					b.mu.Unlock()
					return Permit{gen: genOf(w), probe: true}, nil
				}
				b.mu.Unlock()
				return Permit{}, &OpenError{State: HalfOpen}
			}
			b.mu.Unlock()
		}
		w = b.state.Load()
	}
}

// startRound starts the probe round that is due in open state word w:
// the breaker half-opens, and waiting calls get the probe permits first.
// With a Shared fleet that refuses the round, the breaker stays open for
// another probe interval. It reports false if the breaker is still open
// (refused, or another goroutine is asking the fleet).
func (b *Breaker) startRound(w uint64, now time.Time) bool {
	if b.shared != nil {
		if !b.asking.CompareAndSwap(false, true) {
			return b.state.Load() != w
		}
		ok := b.shared.ProbeRound()
		b.asking.Store(false)
		if !ok {
			b.mu.Lock()
			if b.state.Load() == w && b.openUntil.Load() <= b.since(now) {
				b.openUntil.Store(b.since(now) + int64(b.jitter(b.openPeriod)))
				b.armRoundLocked(now)
			}
			b.mu.Unlock()
			return false
		}
	}
	b.mu.Lock()
	b.halfOpenLocked(w, now)
	b.mu.Unlock()
	b.deliver()
	return true
}

// Done records the outcome of the call p was issued for: success or not.
// It ignores the zero Permit and a permit of an older generation (the
// breaker changed state since p was issued): such an outcome changes
// nothing.
//
// While the breaker is closed, Done records the outcome in the current
// bucket; a failure trips the breaker if the window now holds at least
// MinCalls calls with failures >= FailureRatio·calls (Probes calls, while
// the calls that waited are being released after a close). It takes no lock
// and allocates nothing unless it trips the breaker. A probe's success
// counts towards closing; its failure reopens the breaker.
//
// Each permit must be given back once. Giving one back twice is a bug in
// the caller: a closed-state permit would count twice, a probe's second
// Done as another probe outcome.
func (b *Breaker) Done(p Permit, success bool) {
	b.done(p, success, 0, time.Time{})
}

// DoneAt is [Breaker.Done] for an outcome known at time t, for a caller that
// has read the clock anyway (a retry loop reads it once per call for its
// budget and its breaker): a closed-state success is counted in t's bucket
// without reading the breaker's clock. t must come from the breaker's clock
// (its Config.Now, or the monotonic clock when Now is nil); anything else is
// read as Done.
func (b *Breaker) DoneAt(p Permit, success bool, t time.Time) {
	b.done(p, success, 0, t)
}

// Fail records a failure of the call p was issued for, like Done(p, false),
// whose answer asked to wait retryAfter before calling again (an HTTP
// Retry-After, a gRPC pushback). If the failure opens the breaker, no
// probe round starts sooner than retryAfter, spread by up to half of it
// again so that breakers told the same do not probe in step. retryAfter 0
// is Done(p, false).
func (b *Breaker) Fail(p Permit, retryAfter time.Duration) {
	b.done(p, false, max(retryAfter, 0), time.Time{})
}

func (b *Breaker) done(p Permit, success bool, hint time.Duration, at time.Time) {
	w := b.state.Load()
	if genOf(w) != p.gen || p.gen == 0 {
		return // stale, or the zero Permit
	}
	if !p.probe {
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
	if !p.probe || genOf(b.state.Load()) != p.gen {
		return
	}
	b.mu.Lock()
	b.cancelProbeLocked(p)
	b.mu.Unlock()
}

// cancelProbeLocked frees the slot of probe p and hands it to the oldest
// waiting call, if any. It requires mu held.
func (b *Breaker) cancelProbeLocked(p Permit) {
	if b.state.Load() == word(p.gen, HalfOpen) && b.admitted > b.succeeded {
		b.admitted--
		b.grantProbesLocked()
	}
}

// record counts a closed-state outcome of generation gen and, for a
// failure, trips the breaker if the window calls for it. A success cannot
// trip it, so it costs one counter update and no window sum; at, if not
// zero, is the time of a success (the caller read the clock).
func (b *Breaker) record(gen uint64, success bool, hint time.Duration, at time.Time) {
	if b.shared != nil {
		b.shared.Outcome(success)
	}
	now := at
	if !success || now.IsZero() {
		now = b.now()
	}
	e := b.bucketOf(now, gen)
	ctr := &b.counts[b.index(e)].succ
	if !success {
		ctr = &b.counts[b.index(e)].fail
	}
	tag := tagged.Tag(e)
	for {
		old := ctr.Load()
		otag, n := tagged.Unpack(old)
		var next uint64
		switch d := tagged.Diff(tag, otag); {
		case d == 0:
			if n == tagged.MaxCount {
				next = old // saturated: count no more, but still evaluate
			} else {
				next = old + 1
			}
		case d > 0:
			next = tagged.Pack(e, 1) // the counter held an expired bucket
		default:
			return // the counter holds a later bucket: this outcome is too old
		}
		if next == old || ctr.CompareAndSwap(old, next) {
			break
		}
	}
	if success {
		return
	}
	if b.releasing.Load() {
		b.mu.Lock()
		b.pace.slowDown(b.since(now), gen)
		b.mu.Unlock()
	}
	minCalls := b.minCalls
	calls, failures := b.window(e)
	if !b.trips(calls, failures, minCalls) {
		if bc, bf := b.bucketCounts(e); !b.trips(bc, bf, minCalls) {
			return
		}
	}
	b.mu.Lock()
	if b.state.Load() == word(gen, Closed) {
		b.rate = b.releaseRate(calls, now)
		b.reopens = 0
		b.openLocked(Closed, now, hint)
	}
	b.mu.Unlock()
	b.deliver()
}

// trips reports whether calls outcomes with failures among them, at least
// minCalls of them, cross the failure ratio.
func (b *Breaker) trips(calls, failures, minCalls uint64) bool {
	return calls >= minCalls && float64(failures) >= b.ratio*float64(calls)
}

// bucketCounts returns the calls and failures of bucket e alone.
func (b *Breaker) bucketCounts(e int64) (calls, failures uint64) {
	c, tag := &b.counts[b.index(e)], tagged.Tag(e)
	if t, n := tagged.Unpack(c.succ.Load()); t == tag {
		calls += n
	}
	if t, n := tagged.Unpack(c.fail.Load()); t == tag {
		calls += n
		failures += n
	}
	return calls, failures
}

// releaseRate returns the pace, in calls per second, at which waiting
// calls are released after the next close, for a trip at now with calls in
// the window. It requires mu held.
func (b *Breaker) releaseRate(calls uint64, now time.Time) float64 {
	switch r := b.cfg.ReleaseRate; {
	case r < 0:
		return math.Inf(1)
	case r > 0:
		return r
	}
	// The window holds the calls since the breaker closed, if that is
	// less than a window ago: divide by the time they took, not by the
	// whole window.
	span := min(b.cfg.Window, max(time.Duration(b.since(now)-b.closedAt), b.bucket))
	floor := float64(b.probes) / b.cfg.OpenFor.Seconds()
	return max(float64(calls)/span.Seconds(), floor)
}

// window returns the calls and failures in the window ending in bucket cur.
func (b *Breaker) window(cur int64) (calls, failures uint64) {
	e := cur - b.buckets + 1
	for i := b.index(e); e <= cur; e++ {
		c, tag := &b.counts[i], tagged.Tag(e)
		if t, n := tagged.Unpack(c.succ.Load()); t == tag {
			calls += n
		}
		if t, n := tagged.Unpack(c.fail.Load()); t == tag {
			calls += n
			failures += n
		}
		if i++; i == int64(len(b.counts)) {
			i = 0
		}
	}
	return calls, failures
}

// jitter returns d spread uniformly over ±20%.
func (b *Breaker) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*b.u()))
}

// openLocked opens the breaker from state from, for OpenFor doubled once
// per earlier consecutive trip (b.reopens), up to MaxOpenFor, jittered, and
// at least hint spread by up to half of it. Waiting calls whose release was
// scheduled go back to waiting. It requires mu held.
func (b *Breaker) openLocked(from State, now time.Time, hint time.Duration) {
	d := b.cfg.OpenFor
	if limit := b.cfg.MaxOpenFor; limit > 0 {
		for range b.reopens {
			if d >= limit/2 {
				d = limit
				break
			}
			d *= 2
		}
		d = min(d, limit)
	}
	d = b.jitter(d)
	if hint > 0 {
		if h := hint + time.Duration(b.u()*float64(hint/2)); h > d {
			d = h
		}
	}
	b.openPeriod = d
	until := b.since(now)
	if until > math.MaxInt64-int64(d) {
		until = math.MaxInt64
	} else {
		until += int64(d)
	}
	b.openUntil.Store(until)
	b.stopPacerLocked()
	b.setLocked(from, Open)
	for w := b.waiters.head; w != nil; w = w.next {
		if w.release != 0 {
			w.release = 0
			w.signal()
		}
	}
	b.armRoundLocked(now)
}

// halfOpenLocked moves the breaker from Open to HalfOpen if its state is
// still w and the open period is over at now, and hands the probes to the
// waiting calls with the earliest deadlines. It requires mu held.
func (b *Breaker) halfOpenLocked(w uint64, now time.Time) {
	if b.state.Load() != w || stateOf(w) != Open || b.openUntil.Load() > b.since(now) {
		return
	}
	b.admitted, b.succeeded = 0, 0
	b.setLocked(Open, HalfOpen)
	b.grantProbesLocked()
}

// closeLocked closes the breaker from state from and starts the pacer that
// releases the waiting calls, earliest deadline first. It requires mu held.
func (b *Breaker) closeLocked(from State, now time.Time) {
	b.reopens = 0
	b.closedAt = b.since(now)
	b.setLocked(from, Closed)
	rate := b.rate
	if rate == 0 {
		rate = b.releaseRate(0, now)
	}
	floor := min(rate, float64(b.probes)/b.cfg.OpenFor.Seconds())
	start := rate
	if !math.IsInf(rate, 1) {
		start = max(rate/4, floor)
	}
	b.pace = pacer{gen: genOf(b.state.Load()), max: rate, rate: start, credit: 1, last: b.since(now), floor: floor}
	if b.releaseLocked(now) {
		b.releasing.Store(true)
		b.armPacerLocked()
	}
}

// pacer releases the calls that waited through an open period, after the
// breaker closes, earliest deadline first, at rate calls per second: it starts at a
// quarter of the rate the breaker saw before it tripped (max) and doubles
// every half second up to max (a slow start: the dependency is recovering,
// its capacity beyond its usual load is unknown); a failure while it
// releases halves the rate (at most once per tick, down to floor). Its
// fields are guarded by mu.
type pacer struct {
	gen              uint64  // the closed generation it releases for
	rate, max, floor float64 // calls per second
	credit           float64 // calls it may release now
	last, cut        int64   // last tick, last slow-down; nanoseconds since base
	timer            *time.Timer
	cutSinceLastTick bool
}

// paceDoubling is how long a clean release takes to double its rate.
const paceDoubling = 500 * time.Millisecond

// tick returns the pacer's tick: one call's slot at the current rate,
// within [10 ms, 1 s].
func (p *pacer) tick() time.Duration {
	if math.IsInf(p.rate, 1) || p.rate <= 0 {
		return 10 * time.Millisecond
	}
	return min(max(time.Duration(float64(time.Second)/p.rate), 10*time.Millisecond), time.Second)
}

// slowDown halves the rate after a failure at now in closed generation gen,
// at most once per tick.
func (p *pacer) slowDown(now int64, gen uint64) {
	if gen != p.gen || now-p.cut < int64(p.tick()) {
		return
	}
	p.cut, p.cutSinceLastTick = now, true
	if math.IsInf(p.rate, 1) {
		p.rate = p.max
		return
	}
	p.rate = max(p.rate/2, p.floor)
}

// releaseLocked releases the waiting calls the pacer's credit allows, each
// at a random point of the coming tick, and reports whether some are left
// to release. It requires mu held.
func (b *Breaker) releaseLocked(now time.Time) bool {
	p := &b.pace
	if b.state.Load() != word(p.gen, Closed) {
		return false
	}
	t := b.since(now)
	if math.IsInf(p.rate, 1) {
		p.credit = math.Inf(1)
	} else {
		p.credit += p.rate * float64(t-p.last) / float64(time.Second)
	}
	if !p.cutSinceLastTick && p.rate < p.max && t > p.last {
		p.rate = min(p.max, p.rate*math.Exp2(float64(t-p.last)/float64(paceDoubling)))
	}
	p.last = t
	p.cutSinceLastTick = false
	tick := float64(p.tick())
	if math.IsInf(p.rate, 1) {
		tick = 0 // all at once
	}
	left := false
	for w := b.waiters.head; w != nil; w = w.next {
		if w.granted || w.release != 0 {
			continue
		}
		if p.credit < 1 {
			left = true
			break
		}
		p.credit--
		w.release, w.releaseGen = t+int64(b.u()*tick)+1, p.gen
		w.signal()
	}
	if !left {
		p.credit = min(p.credit, 1)
	}
	return left
}

// armPacerLocked schedules the pacer's next tick. It requires mu held.
func (b *Breaker) armPacerLocked() {
	d := b.pace.tick()
	if b.pace.timer == nil {
		b.pace.timer = time.AfterFunc(d, b.paceDue)
	} else {
		b.pace.timer.Reset(d)
	}
}

// paceDue runs on the pacer's timer.
func (b *Breaker) paceDue() {
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.releasing.Load() {
		return
	}
	if b.releaseLocked(now) {
		b.armPacerLocked()
		return
	}
	b.releasing.Store(false)
}

// stopPacerLocked stops releasing (the breaker opens again, or closes
// anew). It requires mu held.
func (b *Breaker) stopPacerLocked() {
	b.releasing.Store(false)
	if b.pace.timer != nil {
		b.pace.timer.Stop()
	}
}

// grantProbesLocked hands the free probes of the current half-open round
// to the waiting calls with the earliest deadlines. It requires mu held.
func (b *Breaker) grantProbesLocked() {
	s := b.state.Load()
	if stateOf(s) != HalfOpen {
		return
	}
	for w := b.waiters.head; w != nil && b.admitted < b.probes; w = w.next {
		if !w.granted {
			w.granted, w.permit = true, Permit{gen: genOf(s), probe: true}
			b.admitted++
			w.signal()
		}
	}
}

// armRoundLocked makes sure that a probe round starts for the waiting
// calls when the open period ends, even if no other call arrives then. It
// requires mu held.
func (b *Breaker) armRoundLocked(now time.Time) {
	if b.waiters.n == 0 || b.roundArmed || stateOf(b.state.Load()) != Open {
		return
	}
	b.roundArmed = true
	time.AfterFunc(time.Duration(b.openUntil.Load()-b.since(now)), b.roundDue)
}

// roundDue runs on the round timer's goroutine when an open period ends
// while calls are waiting.
func (b *Breaker) roundDue() {
	b.mu.Lock()
	b.roundArmed = false
	w := b.state.Load()
	b.mu.Unlock()
	if stateOf(w) != Open {
		return
	}
	now := b.now()
	if b.openUntil.Load() > b.since(now) || !b.startRound(w, now) {
		b.mu.Lock()
		b.armRoundLocked(b.now())
		b.mu.Unlock()
	}
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

// call runs the callbacks of one state change; if one panics, the next
// state change delivers the rest of the queue.
func (b *Breaker) call(ev event) {
	ok := false
	defer func() {
		if !ok {
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	if b.shared != nil {
		b.shared.StateChanged(ev.from, ev.to)
	}
	if b.onChange != nil {
		b.onChange(ev.from, ev.to)
	}
	ok = true
}

// State returns the breaker's state. If the breaker is open and its open
// period is over, State moves it to HalfOpen first (and runs the callbacks,
// outside the lock), so State never reports an Open breaker that would
// admit a call; with a [Shared] fleet, that move waits for a call, which
// asks the fleet first.
func (b *Breaker) State() State {
	w := b.state.Load()
	if stateOf(w) == Open && b.shared == nil {
		now := b.now()
		if b.openUntil.Load() <= b.since(now) {
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
	// Generation counts state changes; it starts at 1 and grows by one on
	// every change.
	Generation uint64
	// Calls and Failures are the outcomes in the closed-state window (0
	// unless State is Closed).
	Calls, Failures int
	// Probes is the number of probes admitted and ProbeSuccesses the
	// number that succeeded, in this half-open round (0 unless State is
	// HalfOpen).
	Probes, ProbeSuccesses int
	// Waiters is the number of calls waiting in [Breaker.Wait], those
	// already scheduled for release included.
	Waiters int
	// OpenFor is the length of the current open period, or of the last one
	// (0 if the breaker never opened).
	OpenFor time.Duration
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
	s := Snapshot{State: stateOf(w), Generation: genOf(w), OpenFor: b.openPeriod, Waiters: b.waiters.n}
	switch s.State {
	case Closed:
		calls, failures := b.window(b.bucketOf(now, s.Generation))
		s.Calls, s.Failures = int(calls), int(failures)
	case HalfOpen:
		s.Probes, s.ProbeSuccesses = b.admitted, b.succeeded
	case Open:
		s.HalfOpenIn = time.Duration(max(b.openUntil.Load()-b.since(now), 0))
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
		calls, _ := b.window(b.bucketOf(now, genOf(w)))
		b.rate = b.releaseRate(calls, now)
		b.reopens = 0
		b.openLocked(Closed, now, retryAfter)
	case HalfOpen:
		b.reopens++
		b.openLocked(HalfOpen, now, retryAfter)
	case Open:
		if retryAfter > 0 {
			h := b.since(now) + int64(retryAfter) + int64(b.u()*float64(retryAfter/2))
			if h > b.openUntil.Load() {
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

// Wait is [Breaker.Allow] for a caller that can wait up to maxWait (the
// time its deadline leaves) to be admitted. A closed breaker admits at
// once. An open one makes the call wait, without sending it, when the next
// probe round comes before maxWait ends and fewer than MaxWaiters calls are
// waiting already: the call may be handed one of the round's probes (oldest
// waiting calls first), or, once the breaker closes, is released in its
// turn (earliest deadline first, at the release rate; see [Config].ReleaseRate). If
// the breaker reopens first, the call keeps waiting.
//
// Wait returns a [Permit] to give back as with Allow, or the
// [*OpenError] of the rejection when the call cannot wait (maxWait <= 0,
// the next round comes too late, too many waiters, waiting turned off), or
// when ctx ends or maxWait passes before the call is admitted. A waiting
// call holds no lock and starts no goroutine; its timers run on real time
// (or a testing/synctest bubble's). While the breaker is closed, Wait costs
// what Allow costs.
func (b *Breaker) Wait(ctx context.Context, maxWait time.Duration) (Permit, error) {
	w := b.state.Load()
	if stateOf(w) == Closed {
		return Permit{gen: genOf(w)}, nil
	}
	p, err := b.allowSlow(w)
	if err == nil || maxWait <= 0 || b.maxWaiters == 0 || ctx.Err() != nil {
		return p, err
	}
	if oe, ok := err.(*OpenError); ok && oe.State == Open && oe.Wait >= maxWait {
		return p, err
	}
	return b.wait(ctx, maxWait, err)
}

// waiter is a call waiting in Wait. Its fields are guarded by the
// breaker's mu.
type waiter struct {
	ch         chan struct{} // a buffered wake-up: something changed
	prev, next *waiter
	granted    bool   // permit holds a probe for this call
	permit     Permit // the probe, when granted
	release    int64  // when closed: the release time, nanoseconds since base + 1; 0 if none
	releaseGen uint64 // the closed generation release belongs to
	deadline   int64  // when the call stops waiting, nanoseconds since base
}

func (w *waiter) signal() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// waitList is a doubly linked list of waiters, earliest deadline first.
type waitList struct {
	head, tail *waiter
	n          int
}

// push inserts w in deadline order, after the waiters whose deadline is the
// same or earlier: probes and releases go to the calls that have the least
// time left first (calls that arrive together with the same time left keep
// their arrival order). Deadlines mostly grow with arrival, so the search
// from the tail is short.
func (l *waitList) push(w *waiter) {
	after := l.tail
	for after != nil && after.deadline > w.deadline {
		after = after.prev
	}
	w.prev = after
	if after == nil {
		w.next = l.head
		l.head = w
	} else {
		w.next = after.next
		after.next = w
	}
	if w.next == nil {
		l.tail = w
	} else {
		w.next.prev = w
	}
	l.n++
}

func (l *waitList) remove(w *waiter) {
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
	w.prev, w.next = nil, nil
	l.n--
}

// wait parks the call until it is admitted, ctx ends or maxWait passes.
// rejection is what it returns if it gives up at once.
func (b *Breaker) wait(ctx context.Context, maxWait time.Duration, rejection error) (Permit, error) {
	w := &waiter{ch: make(chan struct{}, 1), deadline: b.since(b.now()) + int64(maxWait)}
	b.mu.Lock()
	if b.waiters.n >= b.maxWaiters {
		b.mu.Unlock()
		return Permit{}, rejection
	}
	b.waiters.push(w)
	b.grantProbesLocked()
	b.armRoundLocked(b.now())
	b.mu.Unlock()

	deadline := time.NewTimer(maxWait)
	defer deadline.Stop()
	var release *time.Timer
	var releaseC <-chan time.Time
	defer func() {
		if release != nil {
			release.Stop()
		}
	}()
	for {
		b.mu.Lock()
		s := b.state.Load()
		switch {
		case w.granted:
			b.waiters.remove(w)
			b.mu.Unlock()
			return w.permit, nil
		case stateOf(s) == Closed && (w.release == 0 || w.releaseGen != genOf(s)):
			if b.releasing.Load() && b.pace.gen == genOf(s) {
				releaseC = nil // the pacer will come to it
				break
			}
			// Closed and nothing paces the release (it joined as the
			// breaker closed): it goes now.
			b.waiters.remove(w)
			b.mu.Unlock()
			return Permit{gen: genOf(s)}, nil
		case stateOf(s) == Closed:
			left := w.release - 1 - b.since(b.now())
			if left <= 0 {
				b.waiters.remove(w)
				b.mu.Unlock()
				return Permit{gen: w.releaseGen}, nil
			}
			if release == nil {
				release = time.NewTimer(time.Duration(left))
			} else {
				release.Reset(time.Duration(left))
			}
			releaseC = release.C
		default:
			releaseC = nil
		}
		b.mu.Unlock()
		select {
		case <-w.ch:
		case <-releaseC:
		case <-ctx.Done():
			return Permit{}, b.leave(w)
		case <-deadline.C:
			return Permit{}, b.leave(w)
		}
	}
}

// leave takes a waiting call that gives up off the list (giving back a
// probe it was granted meanwhile) and returns its rejection.
func (b *Breaker) leave(w *waiter) error {
	now := b.now()
	b.mu.Lock()
	b.waiters.remove(w)
	if w.granted {
		b.cancelProbeLocked(w.permit)
	}
	s := b.state.Load()
	err := &OpenError{State: stateOf(s)}
	if err.State == Open {
		err.Wait = time.Duration(max(b.openUntil.Load()-b.since(now), 0))
	}
	b.mu.Unlock()
	return err
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
	done = true
	b.Done(p, !b.isFailure(err))
	return err
}

// Do is [Breaker.Execute] for a function that returns a value: it calls fn
// if b allows it, records the outcome, and returns fn's results; if b
// rejects the call it returns the zero T and an [*OpenError]. A panic in
// fn is recorded as a failure and continues.
func Do[T any](b *Breaker, fn func() (T, error)) (T, error) {
	p, err := b.Allow()
	if err != nil {
		var zero T
		return zero, err
	}
	done := false
	defer func() {
		if !done {
			b.Done(p, false)
		}
	}()
	v, err := fn()
	done = true
	b.Done(p, !b.isFailure(err))
	return v, err
}
