package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
)

// OutagePolicy is how every client of the fleet retries in one run of
// [Outage]. The zero value retries nothing (Attempts 0 counts as 1).
type OutagePolicy struct {
	// Name labels the policy in results, e.g. "full+budget".
	Name string `json:"name"`
	// Interval, if positive, makes the client wait exactly Interval before
	// every retry, with no backoff and no jitter: the fixed-interval retry
	// loop of many real clients, and the thundering herd. Zero means
	// Backoff.
	Interval time.Duration `json:"interval_ns"`
	// Backoff is the backoff strategy, with the config's Base and Cap,
	// used when Interval is zero.
	Backoff backoff.Strategy `json:"backoff"`
	// Attempts is the limit of tries per request, the first included; it
	// must be in [1, MaxOutageAttempts] (0 counts as 1).
	Attempts int `json:"attempts"`
	// Budget gives every client its own retry budget (package budget,
	// OutageConfig.Budget): a retry the budget refuses is not sent, and the
	// request fails.
	Budget bool `json:"budget"`
	// Breaker gives every client its own circuit breaker (package breaker,
	// OutageConfig.Breaker): an attempt the open breaker rejects is not
	// sent, and the request fails at once, without further retries.
	Breaker bool `json:"breaker"`
	// RetryAfter makes the client honour the provider's Retry-After as a
	// floor on its next delay: it never retries sooner than asked.
	RetryAfter bool `json:"retry_after"`
}

// MaxOutageAttempts bounds OutagePolicy.Attempts.
const MaxOutageAttempts = 100

// DefaultOutagePolicies returns the policies the outage experiment
// compares, from the naive to the fully guarded:
//
//	fixed-1s                         every 1 s, up to 30 attempts (a terminal that keeps trying for about half a minute)
//	fixed-1s+budget                  the same, with a per-client retry budget
//	exponential                      backoff without jitter, 3 attempts
//	full                             full jitter, 3 attempts
//	full+budget                      + a per-client retry budget
//	full+budget+breaker              + a per-client circuit breaker
//	full+budget+breaker+retry-after  + honouring the provider's Retry-After
func DefaultOutagePolicies() []OutagePolicy {
	return []OutagePolicy{
		{Name: "fixed-1s", Interval: time.Second, Attempts: 30},
		{Name: "fixed-1s+budget", Interval: time.Second, Attempts: 30, Budget: true},
		{Name: "exponential", Backoff: backoff.NoJitter, Attempts: 3},
		{Name: "full", Backoff: backoff.FullJitter, Attempts: 3},
		{Name: "full+budget", Backoff: backoff.FullJitter, Attempts: 3, Budget: true},
		{Name: "full+budget+breaker", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true},
		{Name: "full+budget+breaker+retry-after", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true, RetryAfter: true},
	}
}

// Limits on an [OutageConfig], so that a run stays within memory and time.
const (
	// MaxOutageRequests bounds Clients·RatePerClient·Horizon, the expected
	// number of original requests.
	MaxOutageRequests = 2_000_000
	// MaxOutageClients bounds Clients.
	MaxOutageClients = 100_000
	// MaxOutageWindows bounds Horizon/Window.
	MaxOutageWindows = 1_000_000
	// MaxOutageHorizon bounds Horizon.
	MaxOutageHorizon = 24 * time.Hour
)

// OutageConfig describes the outage experiment: the seed's story of a
// fleet of POS terminals and a payment provider that returns 503 for ten
// seconds.
//
// # The model
//
// It is a deterministic discrete-event simulation, and a model: it keeps
// what makes a short outage long and leaves the rest out.
//
// Clients: Clients clients each send original requests as a Poisson stream
// of RatePerClient requests per second (the fleet's arrivals are one
// Poisson stream of Clients·RatePerClient, each request going to a
// uniformly chosen client). On a failure a client retries as its
// [OutagePolicy] says, through the library's own parts: the delays come
// from package backoff, each client has its own [budget.Budget] and
// [breaker.Breaker] driven by the simulated clock. A client waits at most
// Timeout for an answer to an attempt; then it counts the attempt as
// failed (a timeout carries no Retry-After).
//
// Provider: one FIFO server that completes Capacity requests per second,
// one at a time, in front of which at most Queue requests wait. An attempt
// that finds Queue requests waiting is shed at once with a 503 (costing the
// provider nothing) that carries ShedRetryAfter. An attempt that is queued
// costs the provider 1/Capacity of work even if its client has timed out
// by the time it is served: nothing cancels it. That wasted work is what
// makes the failure metastable: once the queue is longer than Timeout's
// worth of work, every answer comes too late, every client retries, and as
// long as the retry load alone exceeds Capacity the queue stays full after
// the trigger has gone. During the trigger, [TriggerStart, TriggerEnd),
// the provider answers every attempt at once with a 503 carrying
// RetryAfter (and queued work that would finish then fails too).
//
// Left out: network latency and its variance, connection limits, the cost
// of a rejection, requests the provider could drop from its queue once
// their client has gone (a server that does that is much harder to keep
// down), retries at more than one layer (see [Layers]), client-side
// deadlines other than the attempt limit, and any fleet-wide coordination.
type OutageConfig struct {
	// Clients is the number of clients in the fleet, in [1,
	// MaxOutageClients].
	Clients int `json:"clients"`
	// RatePerClient is each client's original requests per second; it
	// must be positive and finite.
	RatePerClient float64 `json:"rate_per_client"`
	// Capacity is the requests per second the provider completes; it
	// must be positive and finite.
	Capacity float64 `json:"capacity_per_s"`
	// Queue is how many requests may wait for the provider; it must be
	// positive.
	Queue int `json:"queue"`
	// Timeout is how long a client waits for the answer to one attempt;
	// it must be positive.
	Timeout time.Duration `json:"timeout_ns"`
	// TriggerStart and TriggerEnd bound the outage itself: every attempt
	// in [TriggerStart, TriggerEnd) gets a 503. 0 <= TriggerStart <=
	// TriggerEnd <= Horizon.
	TriggerStart time.Duration `json:"trigger_start_ns"`
	TriggerEnd   time.Duration `json:"trigger_end_ns"`
	// RetryAfter is the Retry-After the provider sends with the 503s of
	// the trigger; 0 means it sends none. It must not be negative.
	RetryAfter time.Duration `json:"retry_after_ns"`
	// ShedRetryAfter is the Retry-After the provider sends when it sheds
	// an attempt because its queue is full; 0 means none. It must not be
	// negative.
	ShedRetryAfter time.Duration `json:"shed_retry_after_ns"`
	// Horizon is the simulated time, in (0, MaxOutageHorizon]; nothing
	// happens after it.
	Horizon time.Duration `json:"horizon_ns"`
	// Window is the width of a load-counting window; it must be positive
	// and at most Horizon, and Horizon/Window at most MaxOutageWindows.
	Window time.Duration `json:"window_ns"`
	// RecoveryWindow and RecoveryRatio define recovery: the provider has
	// recovered at the first window-aligned time t >= TriggerEnd such
	// that at least RecoveryRatio of the original requests arriving in
	// [t, t+RecoveryWindow) succeed. RecoveryWindow must be a positive
	// multiple of Window; RecoveryRatio must be in (0, 1].
	RecoveryWindow time.Duration `json:"recovery_window_ns"`
	RecoveryRatio  float64       `json:"recovery_ratio"`
	// Base and Cap configure the policies' backoff (see package backoff).
	Base time.Duration `json:"base_ns"`
	Cap  time.Duration `json:"cap_ns"`
	// Budget configures each client's retry budget, for policies with
	// Budget set.
	Budget BudgetSettings `json:"budget"`
	// Breaker configures each client's circuit breaker, for policies with
	// Breaker set.
	Breaker BreakerSettings `json:"breaker"`
	// Policies are simulated in this order, each over the same arrivals;
	// empty means [DefaultOutagePolicies].
	Policies []OutagePolicy `json:"policies"`
	// Seed seeds the arrivals (math/rand/v2 PCG, stream 1, the same for
	// every policy) and each policy's backoff draws (stream 2+i for the
	// i-th policy).
	Seed uint64 `json:"seed"`
	// Progress, if set, is called after each policy's run with the number
	// of policies done and the total. It is not part of the result.
	Progress func(done, total int) `json:"-"`
}

// DefaultOutageConfig returns the high-volume fleet: 8 clients (say, the
// instances of a checkout service) sending 100 requests per second each,
// 800 per second in all, to a provider that completes 1000 per second with
// a queue of 2000 (two seconds of work) and fails from t=5 s to t=15 s,
// answering 503 with Retry-After 5 s (1 s when shedding). Clients time out
// after 1 s; backoff base 100 ms, cap 10 s; budgets as
// [DefaultBudgetSettings], breakers as [DefaultBreakerSettings]; 60 s
// horizon, 100 ms windows, recovered at 90% success over 1 s; seed 42; all
// of [DefaultOutagePolicies].
func DefaultOutageConfig() OutageConfig {
	return OutageConfig{
		Clients:        8,
		RatePerClient:  100,
		Capacity:       1000,
		Queue:          2000,
		Timeout:        time.Second,
		TriggerStart:   5 * time.Second,
		TriggerEnd:     15 * time.Second,
		RetryAfter:     5 * time.Second,
		ShedRetryAfter: time.Second,
		Horizon:        60 * time.Second,
		Window:         100 * time.Millisecond,
		RecoveryWindow: time.Second,
		RecoveryRatio:  0.9,
		Base:           backoff.DefaultBase,
		Cap:            backoff.DefaultCap,
		Budget:         DefaultBudgetSettings(),
		Breaker:        DefaultBreakerSettings(),
		Policies:       DefaultOutagePolicies(),
		Seed:           42,
	}
}

// DefaultLowVolumeOutageConfig returns [DefaultOutageConfig] with the same
// 800 requests per second coming from the seed's POS terminals instead:
// 8000 clients sending one request every 10 s each. Every terminal's
// budget floor (1 retry per second) dwarfs its 10% ratio, and its breaker
// never sees the minimum number of calls in a window, so per-client
// guards do little here; the provider's Retry-After is what spreads them.
func DefaultLowVolumeOutageConfig() OutageConfig {
	c := DefaultOutageConfig()
	c.Clients = 8000
	c.RatePerClient = 0.1
	return c
}

// OutageResult is the outcome of [Outage].
type OutageResult struct {
	// Config is the configuration that ran, with defaults filled in.
	Config OutageConfig `json:"config"`
	// Policies holds one result per policy, in the config's order.
	Policies []OutagePolicyResult `json:"results"`
}

// OutagePolicyResult is what one policy's fleet did to the provider and
// what it got back. "Attempts" are tries that reached the provider; tries
// an open breaker rejected or a budget refused never do.
type OutagePolicyResult struct {
	// Policy is the policy that ran.
	Policy OutagePolicy `json:"policy"`

	// Offered is the number of original requests (not retries) sent over
	// the horizon; Attempts is the attempts that reached the provider.
	Offered  int `json:"offered"`
	Attempts int `json:"attempts"`
	// Amplification is Attempts/Offered.
	Amplification float64 `json:"amplification"`

	// OutageOffered and OutageAttempts count the same during the trigger,
	// [TriggerStart, TriggerEnd); OutageAmplification is their ratio.
	OutageOffered       int     `json:"outage_offered"`
	OutageAttempts      int     `json:"outage_attempts"`
	OutageAmplification float64 `json:"outage_amplification"`

	// Peak is the largest number of attempts in one Window, and PeakAt
	// the start of the first window that holds it.
	Peak   int           `json:"peak"`
	PeakAt time.Duration `json:"peak_at_ns"`

	// Succeeded is the original requests that succeeded (on any attempt);
	// Goodput is Succeeded/Offered. Requests still pending at the horizon
	// count as failed.
	Succeeded int     `json:"succeeded"`
	Goodput   float64 `json:"goodput"`
	// AfterGoodput is the goodput of the original requests sent after the
	// trigger ended: near 1 if the provider recovered at once, near 0 if it
	// stayed down.
	AfterGoodput float64 `json:"after_goodput"`

	// Recovered reports whether the provider recovered (see
	// OutageConfig.RecoveryWindow) within the horizon, and RecoverAfter
	// how long after TriggerEnd; RecoverAfter is 0 when Recovered is false.
	Recovered    bool          `json:"recovered"`
	RecoverAfter time.Duration `json:"recover_after_ns"`

	// Retries is the attempts that were retries (Attempts minus the first
	// attempts that were sent).
	Retries int `json:"retries"`
	// BudgetDenied is the retries a budget refused, BreakerRejected the
	// attempts an open breaker rejected, Shed the attempts the provider
	// shed with a full queue, and TimedOut the attempts whose client
	// stopped waiting.
	BudgetDenied    int `json:"budget_denied"`
	BreakerRejected int `json:"breaker_rejected"`
	Shed            int `json:"shed"`
	TimedOut        int `json:"timed_out"`

	// Load is the attempts that reached the provider in each Window, from
	// t=0; Successes is, per window of arrival, the attempts that
	// succeeded.
	Load      []int `json:"load"`
	Successes []int `json:"successes"`
}

// Outage runs the outage experiment described at [OutageConfig], once per
// policy over the same arrivals. It is deterministic for a given config,
// and returns an error wrapping [ErrInvalidConfig] for settings it cannot
// run. It shares no state between calls, so it is safe for concurrent use;
// one call runs on one goroutine.
func Outage(c OutageConfig) (*OutageResult, error) {
	if len(c.Policies) == 0 {
		c.Policies = DefaultOutagePolicies()
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	res := &OutageResult{Config: c, Policies: make([]OutagePolicyResult, 0, len(c.Policies))}
	res.Config.Progress = nil // the result is plain data
	var buf outBuffers
	for i, p := range c.Policies {
		r, err := c.run(i, p, &buf)
		if err != nil {
			return nil, err
		}
		res.Policies = append(res.Policies, r)
		if c.Progress != nil {
			c.Progress(i+1, len(c.Policies))
		}
	}
	return res, nil
}

func (c *OutageConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	finite := func(x float64) bool { return x > 0 && !math.IsInf(x, 0) }
	switch {
	case c.Clients < 1 || c.Clients > MaxOutageClients:
		return bad("clients %d must be in [1, %d]", c.Clients, MaxOutageClients)
	case !finite(c.RatePerClient):
		return bad("rate per client %v must be positive and finite", c.RatePerClient)
	case !finite(c.Capacity):
		return bad("capacity %v must be positive and finite", c.Capacity)
	case c.Queue < 1:
		return bad("queue %d must be positive", c.Queue)
	case c.Timeout <= 0:
		return bad("timeout %v must be positive", c.Timeout)
	case c.Horizon <= 0 || c.Horizon > MaxOutageHorizon:
		return bad("horizon %v must be in (0, %v]", c.Horizon, MaxOutageHorizon)
	case c.TriggerStart < 0 || c.TriggerStart > c.TriggerEnd || c.TriggerEnd > c.Horizon:
		return bad("trigger [%v, %v) must lie in [0, horizon %v]", c.TriggerStart, c.TriggerEnd, c.Horizon)
	case c.RetryAfter < 0 || c.ShedRetryAfter < 0:
		return bad("retry-after %v and shed retry-after %v must not be negative", c.RetryAfter, c.ShedRetryAfter)
	case c.Window <= 0 || c.Window > c.Horizon || c.Horizon/c.Window > MaxOutageWindows:
		return bad("window %v must be positive, at most the horizon %v and at least 1/%d of it", c.Window, c.Horizon, MaxOutageWindows)
	case c.RecoveryWindow <= 0 || c.RecoveryWindow%c.Window != 0:
		return bad("recovery window %v must be a positive multiple of the window %v", c.RecoveryWindow, c.Window)
	case !(c.RecoveryRatio > 0 && c.RecoveryRatio <= 1):
		return bad("recovery ratio %v must be in (0, 1]", c.RecoveryRatio)
	case float64(c.Clients)*c.RatePerClient*c.Horizon.Seconds() > MaxOutageRequests:
		return bad("%d clients at %v/s for %v is more than %d requests", c.Clients, c.RatePerClient, c.Horizon, MaxOutageRequests)
	case time.Duration(float64(time.Second)/c.Capacity) <= 0:
		return bad("capacity %v is above one request per nanosecond", c.Capacity)
	}
	if _, err := backoff.New(backoff.Config{Base: c.Base, Cap: c.Cap}); err != nil {
		return bad("%w", err)
	}
	if _, err := c.Budget.build(epoch); err != nil {
		return err
	}
	if _, err := c.Breaker.build(func() time.Time { return epoch }); err != nil {
		return err
	}
	for _, p := range c.Policies {
		switch {
		case p.Name == "":
			return bad("policy without a name")
		case p.Interval < 0:
			return bad("policy %s: interval %v must not be negative", p.Name, p.Interval)
		case p.Attempts < 0 || p.Attempts > MaxOutageAttempts:
			return bad("policy %s: attempts %d must be in [1, %d]", p.Name, p.Attempts, MaxOutageAttempts)
		}
		if _, err := backoff.New(backoff.Config{Strategy: p.Backoff, Base: c.Base, Cap: c.Cap}); err != nil {
			return bad("policy %s: %w", p.Name, err)
		}
	}
	return nil
}

// Outage event kinds.
const (
	outArrive  = iota // a new original request
	outSend           // an attempt is sent
	outSuccess        // an attempt's success reaches the client
	outFailure        // an attempt's failure reaches the client
)

// outRequest is one original request and its retries.
type outRequest struct {
	client   int32
	attempts int32          // attempts sent so far
	arrived  time.Duration  // when the original request was made
	prev     time.Duration  // previous backoff delay (decorrelated)
	ra       time.Duration  // Retry-After of the last failure, 0 if none
	permit   breaker.Permit // permit of the attempt in flight
	hasPerm  bool
}

// outRun is one policy's run: the state of the fleet and the provider.
type outRun struct {
	c      *OutageConfig
	p      OutagePolicy
	now    time.Duration
	q      eventQueue
	reqs   []outRequest
	bo     *backoff.Backoff
	budget []*budget.Budget
	brk    []*breaker.Breaker

	service time.Duration // provider time per request
	backlog time.Duration // Queue requests' worth of work: the queue is full
	free    time.Duration // when the provider has finished its backlog

	offeredW []int // original requests per window of arrival
	okW      []int // ... of which succeeded
	res      OutagePolicyResult
}

// outBuffers is the storage one policy's run leaves to the next.
type outBuffers struct {
	q    eventQueue
	reqs []outRequest
}

func (c *OutageConfig) run(i int, p OutagePolicy, buf *outBuffers) (OutagePolicyResult, error) {
	if p.Attempts < 1 {
		p.Attempts = 1
	}
	bo, err := backoff.New(backoff.Config{
		Strategy: p.Backoff, Base: c.Base, Cap: c.Cap,
		Rand: rand.New(rand.NewPCG(c.Seed, 2+uint64(i))).Float64,
	})
	if err != nil {
		return OutagePolicyResult{}, fmt.Errorf("%w: policy %s: %w", ErrInvalidConfig, p.Name, err)
	}
	windows := int((c.Horizon + c.Window - 1) / c.Window)
	if buf.reqs == nil {
		expected := float64(c.Clients) * c.RatePerClient * c.Horizon.Seconds()
		buf.reqs = make([]outRequest, 0, int(expected+4*math.Sqrt(expected)+16))
	}
	buf.q.reset()
	r := &outRun{
		c:        c,
		p:        p,
		q:        buf.q,
		reqs:     buf.reqs[:0],
		bo:       bo,
		service:  time.Duration(float64(time.Second) / c.Capacity),
		backlog:  time.Duration(min(float64(c.Queue)*float64(time.Second)/c.Capacity, float64(2*MaxOutageHorizon))),
		offeredW: make([]int, windows),
		okW:      make([]int, windows),
		res: OutagePolicyResult{
			Policy:    p,
			Load:      make([]int, windows),
			Successes: make([]int, windows),
		},
	}
	clock := func() time.Time { return epoch.Add(r.now) }
	if p.Budget {
		r.budget = make([]*budget.Budget, c.Clients)
		for k := range r.budget {
			if r.budget[k], err = c.Budget.build(epoch); err != nil {
				return OutagePolicyResult{}, err
			}
		}
	}
	if p.Breaker {
		r.brk = make([]*breaker.Breaker, c.Clients)
		for k := range r.brk {
			if r.brk[k], err = c.Breaker.build(clock); err != nil {
				return OutagePolicyResult{}, err
			}
		}
	}
	arrivals := rand.New(rand.NewPCG(c.Seed, 1))
	mean := float64(time.Second) / (float64(c.Clients) * c.RatePerClient)
	// nextArrival schedules the next original request, in float64 so that
	// a very long gap cannot overflow.
	nextArrival := func() {
		if gap := arrivals.ExpFloat64() * mean; gap < float64(c.Horizon-r.now) {
			r.q.push(r.now+time.Duration(gap), -1, outArrive)
		}
	}
	nextArrival()
	for r.q.len() > 0 {
		e := r.q.pop()
		r.now = e.at
		switch e.kind {
		case outArrive:
			id := int32(len(r.reqs))
			client := int32(arrivals.IntN(c.Clients))
			r.reqs = append(r.reqs, outRequest{client: client, arrived: r.now})
			r.res.Offered++
			r.offeredW[r.window(r.now)]++
			if r.inTrigger(r.now) {
				r.res.OutageOffered++
			}
			if r.budget != nil {
				r.budget[client].DepositAt(epoch.Add(r.now))
			}
			r.send(id)
			nextArrival()
		case outSend:
			r.send(e.who)
		case outSuccess:
			req := &r.reqs[e.who]
			if req.hasPerm {
				r.brk[req.client].Done(req.permit, true)
				req.hasPerm = false
			}
			r.res.Succeeded++
			r.okW[r.window(req.arrived)]++
		case outFailure:
			r.failed(e.who)
		}
	}
	r.finish()
	buf.q, buf.reqs = r.q, r.reqs
	return r.res, nil
}

// window returns the index of the window holding t < Horizon.
func (r *outRun) window(t time.Duration) int { return int(t / r.c.Window) }

func (r *outRun) inTrigger(t time.Duration) bool {
	return t >= r.c.TriggerStart && t < r.c.TriggerEnd
}

// after schedules an event d from now, unless it falls at or after the
// horizon (so no sum can overflow).
func (r *outRun) after(d time.Duration, id int32, kind uint8) {
	if d < r.c.Horizon-r.now {
		r.q.push(r.now+max(d, 0), id, kind)
	}
}

// send sends the next attempt of request id now.
func (r *outRun) send(id int32) {
	req := &r.reqs[id]
	if r.brk != nil {
		p, err := r.brk[req.client].Allow()
		if err != nil { // errors.Is(err, breaker.ErrOpen): rejected without a call
			r.res.BreakerRejected++
			return // fail fast: the request is over
		}
		req.permit, req.hasPerm = p, true
	}
	req.attempts++
	if req.attempts > 1 {
		r.res.Retries++
	}
	now := r.now
	w := r.window(now)
	r.res.Attempts++
	r.res.Load[w]++
	if r.inTrigger(now) {
		r.res.OutageAttempts++
	}
	c := r.c
	if r.inTrigger(now) {
		req.ra = c.RetryAfter
		r.failed(id) // a fast 503: the client hears of it at once
		return
	}
	if r.free < now {
		r.free = now
	}
	if r.free-now >= r.backlog {
		r.res.Shed++
		req.ra = c.ShedRetryAfter
		r.failed(id) // a fast 503: the client hears of it at once
		return
	}
	r.free += r.service
	finish := r.free
	switch {
	case finish-now > c.Timeout:
		// The client gives up; the provider still does the work later.
		r.res.TimedOut++
		req.ra = 0
		r.after(c.Timeout, id, outFailure)
	case r.inTrigger(finish):
		req.ra = c.RetryAfter
		r.after(finish-now, id, outFailure)
	default:
		r.res.Successes[w]++
		r.after(finish-now, id, outSuccess)
	}
}

// failed handles the failure of request id's latest attempt: retry or give
// up, as the policy says.
func (r *outRun) failed(id int32) {
	req := &r.reqs[id]
	if req.hasPerm {
		r.brk[req.client].Done(req.permit, false)
		req.hasPerm = false
	}
	if int(req.attempts) >= r.p.Attempts {
		return
	}
	if r.budget != nil && !r.budget[req.client].WithdrawAt(epoch.Add(r.now)) {
		r.res.BudgetDenied++
		return
	}
	var d time.Duration
	if r.p.Interval > 0 {
		d = r.p.Interval
	} else {
		d = r.bo.Delay(int(req.attempts), req.prev)
		req.prev = d
	}
	if r.p.RetryAfter && req.ra > d {
		d = req.ra
	}
	r.after(d, id, outSend)
}

// finish computes the summary figures from the counters.
func (r *outRun) finish() {
	c, res := r.c, &r.res
	ratio := func(a, b int) float64 {
		if b == 0 {
			return 0
		}
		return float64(a) / float64(b)
	}
	res.Amplification = ratio(res.Attempts, res.Offered)
	res.OutageAmplification = ratio(res.OutageAttempts, res.OutageOffered)
	res.Goodput = ratio(res.Succeeded, res.Offered)
	for w, n := range res.Load {
		if n > res.Peak {
			res.Peak, res.PeakAt = n, time.Duration(w)*c.Window
		}
	}
	from := int((c.TriggerEnd + c.Window - 1) / c.Window)
	var after, afterOK int
	for w := from; w < len(r.offeredW); w++ {
		after += r.offeredW[w]
		afterOK += r.okW[w]
	}
	res.AfterGoodput = ratio(afterOK, after)
	span := int(c.RecoveryWindow / c.Window)
	for w := from; w+span <= len(r.offeredW); w++ {
		var n, ok int
		for k := w; k < w+span; k++ {
			n += r.offeredW[k]
			ok += r.okW[k]
		}
		if n > 0 && float64(ok) >= c.RecoveryRatio*float64(n) {
			res.Recovered = true
			res.RecoverAfter = time.Duration(w)*c.Window - c.TriggerEnd
			break
		}
	}
}

// WriteText writes the result as a table, one row per policy.
func (r *OutageResult) WriteText(w io.Writer) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "fleet: %d clients x %g req/s = %g req/s offered; provider: %g req/s, queue %d, client timeout %v\n",
		c.Clients, c.RatePerClient, float64(c.Clients)*c.RatePerClient, c.Capacity, c.Queue, c.Timeout)
	fmt.Fprintf(bw, "trigger: 503 (Retry-After %v) from %v to %v; horizon %v, windows of %v, seed %d\n\n",
		c.RetryAfter, c.TriggerStart, c.TriggerEnd, c.Horizon, c.Window, c.Seed)
	name := len("policy")
	for _, p := range r.Policies {
		name = max(name, len(p.Policy.Name))
	}
	fmt.Fprintf(bw, "%-*s %10s %12s %12s %10s %10s %14s\n", name, "policy", "peak/win", "attempts/off", "in outage", "goodput", "after", "recovered")
	for _, p := range r.Policies {
		rec := "never"
		if p.Recovered {
			rec = fmt.Sprintf("+%v", p.RecoverAfter)
		}
		fmt.Fprintf(bw, "%-*s %10d %11.2fx %11.2fx %9.1f%% %9.1f%% %14s\n", name, p.Policy.Name, p.Peak,
			p.Amplification, p.OutageAmplification, 100*p.Goodput, 100*p.AfterGoodput, rec)
	}
	fmt.Fprintf(bw, "\n%s %g%% of requests succeed over %v\n", strings.TrimSpace(`
peak/win: most attempts at the provider in one window; attempts/off: attempts per original request
over the horizon; in outage: the same during the trigger; goodput: original requests that succeeded;
after: goodput of requests sent after the trigger; recovered: time after the trigger until`), 100*c.RecoveryRatio, c.RecoveryWindow)
	return bw.Flush()
}

// WriteLoad writes the load over time as a table: one row per interval of
// length every (from t=0), one column per policy, each cell the attempts
// that reached the provider in that interval. every must be a positive
// multiple of the config's Window; otherwise WriteLoad writes nothing and
// returns an error wrapping [ErrInvalidConfig].
func (r *OutageResult) WriteLoad(w io.Writer, every time.Duration) error {
	c := r.Config
	if every <= 0 || every%c.Window != 0 {
		return fmt.Errorf("%w: interval %v must be a positive multiple of the window %v", ErrInvalidConfig, every, c.Window)
	}
	step := int(every / c.Window)
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "attempts at the provider per %v (trigger from %v to %v)\n%8s", every, c.TriggerStart, c.TriggerEnd, "t")
	width := make([]int, len(r.Policies))
	for i, p := range r.Policies {
		width[i] = max(len(p.Policy.Name), 7)
		fmt.Fprintf(bw, " %*s", width[i], p.Policy.Name)
	}
	fmt.Fprintln(bw)
	windows := 0
	for _, p := range r.Policies {
		windows = max(windows, len(p.Load))
	}
	for from := 0; from < windows; from += step {
		fmt.Fprintf(bw, "%8v", time.Duration(from)*c.Window)
		for i, p := range r.Policies {
			n := 0
			for k := from; k < from+step && k < len(p.Load); k++ {
				n += p.Load[k]
			}
			fmt.Fprintf(bw, " %*d", width[i], n)
		}
		fmt.Fprintln(bw)
	}
	return bw.Flush()
}
