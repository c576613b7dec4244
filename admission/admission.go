package admission

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/observe"
)

// Outcome is what a [Controller] decided for one request. The zero value is
// [Admitted].
type Outcome uint8

const (
	// Admitted means the request may run; the caller holds a [Permit].
	Admitted Outcome = iota
	// RetryRefused means the request was a retry beyond the window's retry
	// ratio and floor. It is refused before anything else, with the
	// don't-retry signal.
	RetryRefused
	// QueueFull means MaxInFlight requests were in progress and the queue
	// was full (or there is none), or that a queued retry gave its place
	// to an original that found the queue full.
	QueueFull
	// QueueTimeout means the request waited its time in the queue
	// (MaxQueueWait, or less under a standing queue: see the package
	// documentation) without getting a slot.
	QueueTimeout
	// Canceled means the request's caller is gone or will be before it can
	// run: its context ended while it waited in the queue, or its deadline
	// (the context's, or one its fields sent) had passed on arrival, came
	// while it waited, or left it no more time than the queue's recent delay.
	// A refusal for the deadline carries the don't-retry signal.
	Canceled

	numOutcomes
)

var outcomeNames = [numOutcomes]string{
	Admitted:     "admitted",
	RetryRefused: "retry-refused",
	QueueFull:    "queue-full",
	QueueTimeout: "queue-timeout",
	Canceled:     "canceled",
}

// String returns the outcome's short name ("admitted", "retry-refused",
// "queue-full", "queue-timeout", "canceled"), or "Outcome(N)" for an
// unknown value.
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Decision describes one admission decision: what [Controller.Acquire]
// returns beside the [Permit]. It is plain data.
type Decision struct {
	// Outcome says whether the request was admitted and, if not, why.
	Outcome Outcome
	// RetryAfter is how long a refused client should wait before it tries
	// again: RetryAfterBase + U·RetryAfterSpread, drawn afresh for every
	// refusal so that refused clients do not come back together. 0 when
	// admitted. HTTP sends it as whole seconds (see [Controller.Wrap]).
	RetryAfter time.Duration
	// DontRetry reports whether the refusal should carry the don't-retry
	// signal: always for [RetryRefused], for a drop for the caller's
	// deadline, and for any other refusal of a request that was already a
	// retry, except a marked probe's (see [Controller.AcquireProbe]).
	// False when admitted.
	DontRetry bool
}

// Permit is an admitted request's slot of work in progress. Give it back
// with [Permit.Release] exactly once, when the request is done. The zero
// Permit (what a refusal returns) holds nothing.
type Permit struct {
	c *Controller
	// With an adaptive limit only: when the request got its slot and its
	// caller's deadline (0: none), in nanoseconds since c.epoch (small, so
	// that a Permit and a Decision are returned in registers), and its
	// context (nil: none).
	start int64
	dl    int64
	ctx   context.Context
}

// Release gives the slot back, handing it to the oldest queued request if
// any. It clears p, so a second Release of the same variable does nothing;
// releasing a copy of a released Permit frees a slot twice, so do not copy
// Permits. Release of the zero Permit does nothing. It allocates nothing.
func (p *Permit) Release() {
	c := p.c
	if c == nil {
		return
	}
	p.c = nil
	if c.lim != nil {
		var dl time.Time
		if p.dl != 0 {
			dl = c.epoch.Add(time.Duration(p.dl))
		}
		c.lim.sample(p.ctx, c.now(), c.epoch.Add(time.Duration(p.start)), dl, c.inFlight.Load(), &c.maxInFlight)
	}
	c.freeSlot()
}

// Controller decides, for every request a server receives, whether it runs
// now, waits for a slot, or is refused. Build one with [New]; the zero value
// is usable and behaves as New(Config{}) (the defaults), built on first use.
// A Controller is safe for concurrent use and must not be copied after
// first use.
type Controller struct {
	once sync.Once

	// Immutable after once.
	cfg      Config
	budget   *budget.Budget
	now      func() time.Time // the monotonic clock
	epoch    time.Time        // now() when built: what Permit's times count from
	lim      *limiter         // nil: a fixed limit
	keys     *keyTable        // idempotency keys seen (HTTP)
	clients  *clientTable     // per-client windows; nil without Config.Client
	maxQueue int
	maxWait  time.Duration
	ratio    float64 // retries per original, >= 0
	reserve  float64 // the floor's retries per window, >= 0
	raBase   time.Duration
	raSpread time.Duration    // 0: no jitter
	obs      observe.Observer // nil: none
	rnd      func() float64   // nil: math/rand/v2
	http     httpValues

	rndMu sync.Mutex // serialises calls to rnd

	// inFlight counts the permits out; nwait counts the requests in the
	// queue or about to decide whether to join it; maxInFlight is the limit
	// in force (fixed, or the adaptive limit's). They are read on every
	// admission, so they share a cache line of their own.
	_           [64]byte
	inFlight    atomic.Int64
	nwait       atomic.Int64
	maxInFlight atomic.Int64
	_           [40]byte

	// The queue, one list per class (originals, retries: see queue.go),
	// each oldest first. qlen is the two lists' length, for Stats and the
	// bound MaxQueue.
	mu     sync.Mutex
	queues [classes]list.List // of *waiter; guarded by mu
	// lastGood is when each list was last seen empty or last gave a slot
	// to a request that had waited no longer than the delay control's
	// target (queue.go); guarded by mu.
	lastGood [classes]time.Time
	// grants counts the slots the queue handed over, and turn is the mean
	// time between two of them while requests waited (queue.go's turn);
	// guarded by mu.
	grants uint64
	turn   time.Duration
	// lastTurn is when the queue last handed a slot over, or began to hold
	// requests if it has not since: the turn in progress (queue.go's
	// standingWait); guarded by mu.
	lastTurn time.Time
	qlen     atomic.Int64
	sojourn  [classes]atomic.Int64 // how long the last waiter of each class given a slot waited, ns

	// Counters for Stats, off the queue's cache line.
	_         [64]byte
	originals atomic.Uint64
	retries   atomic.Uint64
	outcomes  [numOutcomes]atomic.Uint64 // final decisions, by Outcome
}

// waiter is a request in the queue.
type waiter struct {
	elem  *list.Element // its place in the queue; guarded by Controller.mu
	ready chan struct{} // receives once the waiter is granted a slot or evicted
	since time.Time     // when it joined the queue
	at    uint64        // Controller.grants when it joined
	class uint8         // classOriginal or classRetry
	state waiterState   // guarded by Controller.mu; final once ready receives
}

// waiterState is what became of a waiter.
type waiterState uint8

const (
	waiting waiterState = iota
	granted             // given a slot
	evicted             // a retry whose place an original took (the queue was full)
)

// New validates c and returns a Controller whose window begins now. Zero
// fields take the defaults (see [Config]). It returns an error that says
// which if a field is out of range. A Controller that was built never fails
// or panics later.
func New(c Config) (*Controller, error) {
	eff, err := c.withDefaults()
	if err != nil {
		return nil, err
	}
	ctl := &Controller{}
	ctl.once.Do(func() { err = ctl.setup(eff) })
	if err != nil {
		return nil, err
	}
	return ctl, nil
}

// init builds a zero Controller with the defaults on first use.
func (c *Controller) init() {
	c.once.Do(func() {
		eff, err := Config{}.withDefaults()
		if err == nil {
			err = c.setup(eff)
		}
		if err != nil { // the defaults are valid; a test guards this
			panic("admission: default config: " + err.Error())
		}
	})
}

// setup fills c from an effective config.
func (c *Controller) setup(eff Config) error {
	now := clock.Monotonic()
	b, err := budget.New(budget.Config{ // negative means none there too
		Ratio:        eff.RetryRatio,
		MinPerSecond: eff.MinRetriesPerSecond,
		Window:       eff.Window,
		Slices:       slices,
		Now:          now,
	})
	if err != nil {
		return invalid("Window: %w", err)
	}
	c.cfg = eff
	c.budget = b
	c.now = now
	c.epoch = now()
	c.maxInFlight.Store(math.MaxInt64)
	if eff.MaxInFlight > 0 {
		c.maxInFlight.Store(int64(eff.MaxInFlight))
	}
	if eff.LatencyCeiling > 0 {
		c.lim = newLimiter(eff)
	}
	c.keys = newKeyTable(now(), eff.Window, eff.RetryAfterBase+max(eff.RetryAfterSpread, 0))
	if eff.Client != nil {
		c.clients = newClientTable(now(), eff.Window, max(eff.RetryRatio, 0), max(eff.MinRetriesPerSecond, 0)*eff.Window.Seconds())
	}
	c.maxQueue = max(eff.MaxQueue, 0)
	c.maxWait = eff.MaxQueueWait
	c.ratio = max(eff.RetryRatio, 0)
	c.reserve = max(eff.MinRetriesPerSecond, 0) * eff.Window.Seconds()
	c.raBase = eff.RetryAfterBase
	c.raSpread = max(eff.RetryAfterSpread, 0)
	c.obs = eff.Observer
	c.rnd = eff.Rand
	c.http = newHTTPValues(eff.RetryAfterBase+c.raSpread, eff.MaxInFlight)
	return nil
}

// Acquire decides whether a request may run now. attempt is the request's
// attempt number as its client counts it: 1 (or anything below 2) for an
// original, 2 or more for a retry. ctx's deadline, if it has one, is the
// caller's (gRPC's server context carries it); nil ctx never ends.
//
// A request whose caller's deadline has passed is dropped at once, before
// anything else, as [Canceled] with the don't-retry signal: nobody waits
// for its answer. An original is then counted in the window. A retry is
// admitted by the window only while retries + 1 <= RetryRatio·originals +
// MinRetriesPerSecond·Window.Seconds() over the window (the rule of package
// budget); otherwise it is refused at once with [RetryRefused]. A request
// that passed that check runs if fewer than MaxInFlight are in progress
// (and, for a retry, nobody is queued; for an original, no original is);
// otherwise it waits in the queue, originals before retries and first come
// first served within each (see the package documentation), until a slot
// frees ([Admitted]), its time in the queue is over ([QueueTimeout]: see
// the package documentation for the queue's delay control) or ctx ends or
// its deadline comes ([Canceled]); if the queue is full it is refused at
// once ([QueueFull]). A request with a deadline that leaves it no more time
// than the last request of its class given a slot from the queue waited is
// dropped at once ([Canceled], with the don't-retry signal): it would be
// answered after its caller left. The deadline is the one the request
// carries: with a client's attempt timeout, the attempt's, so that a call
// whose attempts are shorter than the queue's wait ends at the drop even
// with time left (a retry would meet the same queue).
//
// If d.Outcome is [Admitted], the caller must call p.Release() when the
// request is done; otherwise p is the zero Permit and d says why, how long
// the client should wait (d.RetryAfter) and whether to tell it not to
// retry (d.DontRetry). A retry that passed the ratio check but was then
// refused for lack of a slot still counts as a retry in the window.
//
// Acquire is safe for concurrent use. Without queueing it takes no lock
// and allocates nothing; a request that queues allocates its waiter, its
// place in the queue and a timer (a few hundred bytes).
func (c *Controller) Acquire(ctx context.Context, attempt int) (Permit, Decision) {
	c.init()
	return c.acquire(ctx, attempt, false, ctxDeadline(ctx), nil)
}

// AcquireProbe is [Controller.Acquire] for a request its client marked as
// a circuit breaker's probe (package wire's ProbeHeader; "stormguard-probe"
// over gRPC): an attempt sent to find out whether this server is back, or
// the first send of a call that waited behind the client's open breaker.
// An original (attempt below 2) is handled exactly as by Acquire. A retry
// so marked is counted in Stats as a retry, and
//   - takes an idle slot (one free at once, nobody queued) without the
//     retry ratio: it neither spends nor earns allowance, so that a server
//     that came back is seen to be back by the clients that wait for it,
//     whatever retries other clients spent the allowance on;
//   - otherwise is a retry like any other if the ratio admits it (it may
//     queue), and is refused at once ([QueueFull]) if not.
//
// A refusal of a marked retry carries RetryAfterBase as its Retry-After (no
// jitter: the client's breaker spreads its own rounds) and no don't-retry
// signal: the client's call goes back to waiting for its breaker's next
// round instead of failing. A drop for its caller's deadline ([Canceled]:
// passed on arrival, or coming before its turn) carries the signal, as
// every deadline drop does: that caller has no time left to wait. The bound on the mark: a client that marks
// every retry as a probe gets past the ratio only onto slots nobody else is
// using, never through the queue.
func (c *Controller) AcquireProbe(ctx context.Context, attempt int) (Permit, Decision) {
	c.init()
	return c.acquire(ctx, attempt, true, ctxDeadline(ctx), nil)
}

// ctxDeadline returns ctx's deadline, zero if it has none (or ctx is nil).
func ctxDeadline(ctx context.Context) time.Time {
	if ctx == nil {
		return time.Time{}
	}
	dl, _ := ctx.Deadline()
	return dl
}

// acquire is Acquire and AcquireProbe; dl is the caller's deadline (zero:
// none), as read from ctx or the request's fields; cl is the bucket of the
// request's client in c.clients (nil: no per-client accounting). c must
// have been built (c.init).
func (c *Controller) acquire(ctx context.Context, attempt int, probe bool, dl time.Time, cl *clientBucket) (Permit, Decision) {
	if attempt < 1 {
		attempt = 1
	}
	if attempt == 1 {
		c.originals.Add(1)
	} else {
		c.retries.Add(1)
	}
	// The decision in the making is built only off the plain admitted path.
	if !dl.IsZero() && !c.now().Before(dl) {
		// The caller has left: do nothing for it.
		return Permit{}, c.refuse(ctx, decision{attempt: attempt, dl: dl, deadline: true, probe: probe && attempt >= 2}, Canceled)
	}
	if ctx != nil && ctx.Err() != nil {
		// Canceled before it came (its deadline, by a clock of its own,
		// or its caller): as the passed deadline, whatever the load.
		return Permit{}, c.refuse(ctx, decision{attempt: attempt, dl: dl, deadline: errors.Is(ctx.Err(), context.DeadlineExceeded), probe: probe && attempt >= 2}, Canceled)
	}
	marked := false // a marked probe that found no idle slot
	switch {
	case attempt == 1:
		c.budget.Deposit() // the budget reads c.now, its clock
		if cl != nil {
			c.clients.deposit(cl, c.now())
		}
	case probe:
		if c.nwait.Load() == 0 && c.tryInc() {
			return c.admit(ctx, &decision{attempt: attempt, dl: dl}) // an idle slot: no allowance spent
		}
		marked = true
		if !c.withdraw(cl) {
			return Permit{}, c.refuse(ctx, decision{attempt: attempt, dl: dl, probe: true}, QueueFull)
		}
		// Within the ratio: a retry like any other, that may queue.
	case !c.withdraw(cl):
		return Permit{}, c.refuse(ctx, decision{attempt: attempt, dl: dl}, RetryRefused)
	}
	if c.nwait.Load() == 0 && c.tryInc() {
		if c.obs == nil && c.lim == nil { // nothing to report or time
			c.outcomes[Admitted].Add(1)
			return Permit{c: c}, Decision{}
		}
		return c.admit(ctx, &decision{attempt: attempt, dl: dl, probe: marked})
	}
	return c.wait(ctx, decision{attempt: attempt, dl: dl, probe: marked}, dl)
}

// withdraw reports whether a retry is within the ratio, and counts it if
// so: within its client's own (cl, if not nil) and the global window's.
// A retry the global window refuses is not counted against its client.
func (c *Controller) withdraw(cl *clientBucket) bool {
	if cl == nil {
		return c.budget.Withdraw()
	}
	slice, ok := c.clients.reserve(cl, c.now())
	if !ok {
		return false
	}
	if !c.budget.Withdraw() {
		c.clients.unreserve(cl, slice)
		return false
	}
	return true
}

// tryInc takes a slot if one is free.
func (c *Controller) tryInc() bool {
	for {
		n := c.inFlight.Load()
		if n >= c.maxInFlight.Load() {
			return false
		}
		if c.inFlight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// decision is a Decision in the making, with the request's attempt number
// and how long it waited in the queue.
type decision struct {
	Decision
	attempt  int
	waited   time.Duration
	dl       time.Time // the caller's deadline; zero: none
	deadline bool      // refused because the caller's deadline passed or cannot be met
	probe    bool      // a marked probe refused for lack of an idle slot
}

// admit returns a granted decision; the caller took the slot.
func (c *Controller) admit(ctx context.Context, d *decision) (Permit, Decision) {
	c.outcomes[Admitted].Add(1)
	if c.obs != nil {
		c.reportAdmitted(ctx, d)
	}
	if c.lim != nil {
		p := Permit{c: c, start: int64(c.now().Sub(c.epoch)), ctx: ctx}
		if !d.dl.IsZero() {
			// Admitted, so after c.epoch: never 0. A Sub that saturates
			// (a deadline centuries away) still orders after any now.
			p.dl = max(int64(d.dl.Sub(c.epoch)), 1)
		}
		return p, d.Decision
	}
	return Permit{c: c}, d.Decision
}

// reportAdmitted reports d's admission to the observer. An observer that
// panics (or calls runtime.Goexit) gives the slot the request took back:
// the request does not run, and the panic goes on.
func (c *Controller) reportAdmitted(ctx context.Context, d *decision) {
	reported := false
	defer func() {
		if !reported {
			c.outcomes[Admitted].Add(^uint64(0)) // no permit after all: not admitted
			c.freeSlot()
		}
	}()
	c.report(ctx, d, "admitted")
	reported = true
}

// freeSlot gives back a slot taken by a request that does not run (or no
// longer runs) and hands it to the next in line.
func (c *Controller) freeSlot() {
	c.inFlight.Add(-1)
	if c.nwait.Load() > 0 {
		c.handOff()
	}
}

// refuse fills in a refusal, counts and reports it.
func (c *Controller) refuse(ctx context.Context, d decision, o Outcome) Decision {
	c.outcomes[o].Add(1)
	d.Outcome = o
	switch {
	case d.probe:
		d.RetryAfter = c.raBase
		d.DontRetry = d.deadline && o == Canceled // a deadline drop, like any other
	default:
		d.RetryAfter = c.retryAfter()
		d.DontRetry = o == RetryRefused || d.attempt >= 2 || d.deadline
	}
	if c.obs != nil {
		outcome := "shed-busy"
		if o == RetryRefused {
			outcome = "shed-retry"
		}
		c.report(ctx, &d, outcome)
	}
	return d.Decision
}

// report tells the observer of a decision; requires c.obs != nil. A
// refusal's own outcome name is the event's Reason.
func (c *Controller) report(ctx context.Context, d *decision, outcome string) {
	if ctx == nil {
		ctx = context.Background()
	}
	e := observe.Event{Kind: observe.Admission, Name: c.cfg.Name, Attempt: d.attempt, Outcome: outcome, Elapsed: d.waited, Delay: d.RetryAfter}
	if d.Outcome != Admitted {
		e.Reason = d.Outcome.String()
		if d.deadline {
			e.Reason = "deadline"
		}
	}
	c.obs.Observe(ctx, e)
}

// retryAfter draws a refusal's Retry-After.
func (c *Controller) retryAfter() time.Duration {
	if c.raSpread == 0 {
		return c.raBase
	}
	var u float64
	if c.rnd == nil {
		u = rand.Float64()
	} else {
		u = c.callRand()
	}
	if !(u >= 0) { // also NaN from a faulty source
		u = 0
	} else if u >= 1 {
		u = math.Nextafter(1, 0)
	}
	return c.raBase + time.Duration(u*float64(c.raSpread))
}

// callRand returns a draw of Config.Rand, one call at a time; a Rand that
// panics leaves the next draw free to go (the panic goes on).
func (c *Controller) callRand() float64 {
	c.rndMu.Lock()
	defer c.rndMu.Unlock()
	return c.rnd()
}

// Stats is a snapshot of a [Controller]'s counters. The totals count from
// the Controller's start.
type Stats struct {
	// InFlight is the number of permits out now (requests in progress);
	// Queued the number of requests waiting in the queue now.
	InFlight, Queued int
	// Originals and Retries are the requests seen: attempt 1, attempt 2
	// or more (admitted or not).
	Originals, Retries uint64
	// Outcomes counts the requests by their final decision, indexed by
	// [Outcome]: Outcomes[Admitted] were given a permit (queued first or
	// not), Outcomes[RetryRefused] were retries refused by the retry
	// ratio, and so on. A request whose Config.Observer panicked on its
	// "admitted" or "queued" event has no outcome (it got no permit and
	// did not run): the outcomes may then sum to less than Originals plus
	// Retries.
	Outcomes [5]uint64
}

// Stats returns a snapshot of c's counters. Under concurrent use they are
// read one after another, not as one atomic snapshot. It allocates nothing.
func (c *Controller) Stats() Stats {
	c.init()
	s := Stats{
		InFlight:  int(c.inFlight.Load()),
		Queued:    int(c.qlen.Load()),
		Originals: c.originals.Load(),
		Retries:   c.retries.Load(),
	}
	for o := range s.Outcomes {
		s.Outcomes[o] = c.outcomes[o].Load()
	}
	return s
}

// Outcomes has a counter per Outcome.
var _ [numOutcomes]uint64 = Stats{}.Outcomes
