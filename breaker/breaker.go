package breaker

import (
	"errors"
	"fmt"
	"math"
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

// Default settings, as returned by [DefaultConfig].
const (
	DefaultFailureRatio = 0.5
	DefaultWindow       = 10 * time.Second
	DefaultBuckets      = 10
	DefaultMinCalls     = 20
	DefaultOpenFor      = 30 * time.Second
	DefaultProbes       = 5
)

// Limits on a [Config], checked by [New].
const (
	// MaxBuckets is the largest number of buckets a window may have. The
	// window is summed after every closed-state outcome, so its cost grows
	// with Buckets.
	MaxBuckets = 3600
	// MinBucket is the shortest bucket, Window/Buckets.
	MinBucket = time.Millisecond
)

// Config is the plain-data description of a breaker. Build a [Breaker] from
// it with [New]. Its zero value is not valid; start from [DefaultConfig].
type Config struct {
	// FailureRatio is the fraction of failed calls in the window, in
	// (0, 1], at or above which the breaker trips.
	FailureRatio float64
	// Window is the length of the sliding window of closed-state outcomes.
	// It must be a positive multiple of Buckets nanoseconds, with
	// Window/Buckets at least [MinBucket].
	Window time.Duration
	// Buckets is the number of buckets the window is cut into, from 1 to
	// [MaxBuckets]. The window covers the current bucket and the
	// Buckets−1 before it.
	Buckets int
	// MinCalls is the number of calls the window must hold before the
	// breaker may trip; at least 1.
	MinCalls int
	// OpenFor is how long the breaker stays open after tripping from
	// Closed; it must be positive.
	OpenFor time.Duration
	// MaxOpenFor bounds the growth of the open period. 0 means no growth:
	// every open period is OpenFor. Otherwise it must be at least OpenFor,
	// and each consecutive trip (a failed probe, without closing in
	// between) doubles the open period, up to MaxOpenFor.
	MaxOpenFor time.Duration
	// Probes is the number of calls HalfOpen admits; all of them must
	// succeed to close the breaker. At least 1.
	Probes int
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
	// concurrent use.
	Now func() time.Time
}

// DefaultConfig returns FailureRatio 0.5 over a 10 s window in 10 buckets,
// MinCalls 20, OpenFor 30 s without growth, 5 probes, and the real clock.
func DefaultConfig() Config {
	return Config{
		FailureRatio: DefaultFailureRatio,
		Window:       DefaultWindow,
		Buckets:      DefaultBuckets,
		MinCalls:     DefaultMinCalls,
		OpenFor:      DefaultOpenFor,
		Probes:       DefaultProbes,
	}
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
// given back with [Breaker.Done] or [Breaker.Cancel]. It is a small value;
// it records the generation it was issued in and whether it is a half-open
// probe. The zero Permit is never valid: Done and Cancel ignore it.
type Permit struct {
	gen   uint64
	probe bool
}

// Probe reports whether p is a half-open probe.
func (p Permit) Probe() bool { return p.probe }

// The state word: generation above two bits of State.
const stateBits = 2

func word(gen uint64, s State) uint64 { return gen<<stateBits | uint64(s) }
func stateOf(w uint64) State          { return State(w & (1<<stateBits - 1)) }
func genOf(w uint64) uint64           { return w >> stateBits }

// bucket holds the counters of one bucket, each tagged with the bucket
// number.
type bucket struct{ succ, fail atomic.Uint64 }

// event is a state change waiting for its callback.
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
	probes    int
	now       func() time.Time
	isFailure func(error) bool
	onChange  func(from, to State)
	base      time.Time

	// state is the generation and State, changed only with mu held.
	_     [64]byte
	state atomic.Uint64
	// openUntil is when the current open period ends, in nanoseconds since
	// base; stored before state becomes Open.
	openUntil atomic.Int64
	_         [48]byte

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
	pending    []event       // state changes whose callback has not run
	delivering bool          // a goroutine is running callbacks
}

// New validates c and returns a closed Breaker. It returns an error
// wrapping [ErrInvalidConfig] if FailureRatio is not in (0, 1], Window is
// not a positive multiple of Buckets nanoseconds of at least [MinBucket]
// each, Buckets is outside [1, MaxBuckets], MinCalls or Probes is below 1,
// OpenFor is not positive, or MaxOpenFor is neither 0 nor at least OpenFor.
// A Breaker that was built never fails or panics later (except by
// re-raising a closure's panic).
func New(c Config) (*Breaker, error) {
	switch {
	case !(c.FailureRatio > 0 && c.FailureRatio <= 1):
		return nil, fmt.Errorf("%w: failure ratio %v must be in (0, 1]", ErrInvalidConfig, c.FailureRatio)
	case c.Window <= 0:
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
	case c.OpenFor <= 0:
		return nil, fmt.Errorf("%w: open for %v must be positive", ErrInvalidConfig, c.OpenFor)
	case c.MaxOpenFor != 0 && c.MaxOpenFor < c.OpenFor:
		return nil, fmt.Errorf("%w: max open for %v must be 0 or at least open for %v", ErrInvalidConfig, c.MaxOpenFor, c.OpenFor)
	case c.Probes < 1:
		return nil, fmt.Errorf("%w: probes %d must be at least 1", ErrInvalidConfig, c.Probes)
	}
	b := &Breaker{
		cfg:       c,
		ratio:     c.FailureRatio,
		bucket:    c.Window / time.Duration(c.Buckets),
		buckets:   int64(c.Buckets),
		minCalls:  uint64(c.MinCalls),
		probes:    c.Probes,
		now:       c.Now,
		isFailure: c.IsFailure,
		onChange:  c.OnStateChange,
		counts:    make([]bucket, c.Buckets),
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

// Config returns the configuration b was built from (IsFailure, OnStateChange
// and Now as given, possibly nil).
func (b *Breaker) Config() Config { return b.cfg }

// since returns t as nanoseconds since base (saturating).
func (b *Breaker) since(t time.Time) int64 { return int64(t.Sub(b.base)) }

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

// Allow asks to make one call. It returns a [Permit] to give back with
// [Breaker.Done] (or [Breaker.Cancel]) once the outcome is known, or an
// [*OpenError] if the breaker rejects the call, in which case the call must
// not be made. While the breaker is closed, Allow takes no lock and
// allocates nothing; a rejection allocates its error.
func (b *Breaker) Allow() (Permit, error) {
	w := b.state.Load()
	if stateOf(w) == Closed {
		return Permit{gen: genOf(w)}, nil
	}
	return b.allowSlow(w)
}

func (b *Breaker) allowSlow(w uint64) (Permit, error) {
	now := b.now()
	for {
		switch stateOf(w) {
		case Closed:
			return Permit{gen: genOf(w)}, nil
		case Open:
			if wait := b.openUntil.Load() - b.since(now); wait > 0 {
				return Permit{}, &OpenError{State: Open, Wait: time.Duration(wait)}
			}
			b.mu.Lock()
			b.halfOpenLocked(w, now)
			b.mu.Unlock()
			b.deliver()
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

// Done records the outcome of the call p was issued for: success or not.
// It ignores the zero Permit and a permit of an older generation (the
// breaker changed state since p was issued): such an outcome changes
// nothing.
//
// While the breaker is closed, Done records the outcome in the current
// bucket and trips the breaker if the window now holds at least MinCalls
// calls with failures >= FailureRatio·calls; it takes no lock and allocates
// nothing unless it trips the breaker. A half-open probe's success counts
// towards closing; its failure reopens the breaker.
//
// Each permit must be given back once. Giving one back twice is a bug in
// the caller: a closed-state permit would count twice, a probe's second
// Done as another probe outcome.
func (b *Breaker) Done(p Permit, success bool) {
	w := b.state.Load()
	if genOf(w) != p.gen || p.gen == 0 {
		return // stale, or the zero Permit
	}
	if !p.probe {
		if stateOf(w) == Closed {
			b.record(p.gen, success)
		}
		return
	}
	b.mu.Lock()
	if b.state.Load() != word(p.gen, HalfOpen) {
		b.mu.Unlock()
		return
	}
	if success {
		b.succeeded++
		if b.succeeded >= b.probes {
			b.reopens = 0
			b.setLocked(HalfOpen, Closed)
		}
	} else {
		b.reopens++
		b.openLocked(HalfOpen, b.now())
	}
	b.mu.Unlock()
	b.deliver()
}

// Cancel gives p back without an outcome, for a call that was never made or
// whose outcome says nothing about the dependency (the caller went away). A
// half-open probe's slot is freed for another probe; a closed-state permit
// needs nothing. Stale and zero permits are ignored.
func (b *Breaker) Cancel(p Permit) {
	if !p.probe || genOf(b.state.Load()) != p.gen {
		return
	}
	b.mu.Lock()
	if b.state.Load() == word(p.gen, HalfOpen) && b.admitted > b.succeeded {
		b.admitted--
	}
	b.mu.Unlock()
}

// record counts a closed-state outcome of generation gen and trips the
// breaker if the window calls for it.
func (b *Breaker) record(gen uint64, success bool) {
	now := b.now()
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
	calls, failures := b.window(e)
	if calls >= b.minCalls && float64(failures) >= b.ratio*float64(calls) {
		b.mu.Lock()
		if b.state.Load() == word(gen, Closed) {
			b.reopens = 0
			b.openLocked(Closed, now)
		}
		b.mu.Unlock()
		b.deliver()
	}
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

// openLocked opens the breaker from state from, for OpenFor doubled once
// per earlier consecutive trip (b.reopens), up to MaxOpenFor. It requires
// mu held.
func (b *Breaker) openLocked(from State, now time.Time) {
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
	b.openPeriod = d
	until := b.since(now)
	if until > math.MaxInt64-int64(d) {
		until = math.MaxInt64
	} else {
		until += int64(d)
	}
	b.openUntil.Store(until)
	b.setLocked(from, Open)
}

// halfOpenLocked moves the breaker from Open to HalfOpen if its state is
// still w and the open period is over at now. It requires mu held.
func (b *Breaker) halfOpenLocked(w uint64, now time.Time) {
	if b.state.Load() != w || stateOf(w) != Open || b.openUntil.Load() > b.since(now) {
		return
	}
	b.admitted, b.succeeded = 0, 0
	b.setLocked(Open, HalfOpen)
}

// setLocked starts a new generation in state to and queues the callback.
// It requires mu held.
func (b *Breaker) setLocked(from, to State) {
	gen := genOf(b.state.Load()) + 1
	b.state.Store(word(gen, to))
	if b.onChange != nil {
		b.pending = append(b.pending, event{from, to})
	}
}

// deliver runs queued callbacks, in order, without holding mu, unless
// another goroutine is already doing so.
func (b *Breaker) deliver() {
	if b.onChange == nil {
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

// call runs one callback; if it panics, the next state change delivers
// the rest of the queue.
func (b *Breaker) call(ev event) {
	ok := false
	defer func() {
		if !ok {
			b.mu.Lock()
			b.delivering = false
			b.mu.Unlock()
		}
	}()
	b.onChange(ev.from, ev.to)
	ok = true
}

// State returns the breaker's state. If the breaker is open and its open
// period is over, State moves it to HalfOpen first (and runs the callback,
// outside the lock), so State never reports an Open breaker that would
// admit a call.
func (b *Breaker) State() State {
	w := b.state.Load()
	if stateOf(w) == Open {
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
	// number that succeeded, in this half-open generation (0 unless State
	// is HalfOpen).
	Probes, ProbeSuccesses int
	// OpenFor is the length of the current open period, or of the last one
	// (0 if the breaker never opened).
	OpenFor time.Duration
	// HalfOpenIn is how long until the breaker half-opens (0 unless State
	// is Open).
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
	s := Snapshot{State: stateOf(w), Generation: genOf(w), OpenFor: b.openPeriod}
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
