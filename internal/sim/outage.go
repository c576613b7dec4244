package sim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// OutagePolicy is how every client of the fleet retries in one run of
// [Outage]. The zero value retries nothing (Attempts 0 counts as 1).
type OutagePolicy struct {
	// Name labels the policy in results, e.g. "full+budget".
	Name string `json:"name"`
	// Interval, if positive, makes the client wait exactly Interval before
	// every retry, with no jitter: the fixed-interval retry loop of many
	// real clients, and the thundering herd. Zero means Backoff.
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
	// OutageConfig.Breaker): an attempt the breaker rejects is not sent,
	// and the request fails at once unless it waits (Wait).
	Breaker bool `json:"breaker"`
	// RetryAfter makes the client honour the provider's Retry-After: as a
	// floor on its next delay (spread above it, as package retry does),
	// and as the earliest probe of its breaker. Without it the client
	// never sees the header.
	RetryAfter bool `json:"retry_after"`
	// Wait makes a request that meets an open breaker wait for it while
	// its deadline (OutageConfig.Deadline) allows, instead of failing:
	// nothing is sent while it waits, it may be handed a probe, and it is
	// released in its turn when the breaker closes. It needs Breaker.
	Wait bool `json:"wait"`
	// Fleet makes the budget and the breaker (as Budget and Breaker ask)
	// one for the whole fleet instead of one per client, shared with a
	// delay: see OutageConfig.SyncEvery. It needs Budget or Breaker.
	Fleet bool `json:"fleet"`
}

// MaxOutageAttempts bounds OutagePolicy.Attempts.
const MaxOutageAttempts = 100

// DefaultOutagePolicies returns the policies the outage experiment
// compares, from the naive to the fully guarded:
//
//	fixed-1s                              every 1 s, up to 30 attempts (until the deadline)
//	fixed-1s+budget                       the same, with a per-client retry budget
//	exponential                           backoff without jitter, 3 attempts
//	full                                  full jitter, 3 attempts
//	full+budget                           + a per-client retry budget
//	full+budget+breaker                   + a per-client circuit breaker
//	full+budget+breaker+retry-after       + honouring the provider's Retry-After
//	full+budget+breaker+retry-after+wait  + waiting behind the open breaker
//	fleet+retry-after+wait                the same with one budget and one
//	                                      breaker for the whole fleet
func DefaultOutagePolicies() []OutagePolicy {
	return []OutagePolicy{
		{Name: "fixed-1s", Interval: time.Second, Attempts: 30},
		{Name: "fixed-1s+budget", Interval: time.Second, Attempts: 30, Budget: true},
		{Name: "exponential", Backoff: backoff.NoJitter, Attempts: 3},
		{Name: "full", Backoff: backoff.FullJitter, Attempts: 3},
		{Name: "full+budget", Backoff: backoff.FullJitter, Attempts: 3, Budget: true},
		{Name: "full+budget+breaker", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true},
		{Name: "full+budget+breaker+retry-after", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true, RetryAfter: true},
		{Name: "full+budget+breaker+retry-after+wait", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true, RetryAfter: true, Wait: true},
		{Name: "fleet+retry-after+wait", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true, RetryAfter: true, Wait: true, Fleet: true},
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
	// maxSyncGroups is the most sync groups a fleet is cut into.
	maxSyncGroups = 64
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
// uniformly chosen client). Each request has Deadline to succeed, retries
// included. A client waits at most Timeout for the answer to an attempt
// (and never past the deadline); then it counts the attempt as failed (a
// timeout carries no Retry-After).
//
// Every client retries with the library's own parts, not a copy of them:
// a [retry.Policy] per client (WithMaxAttempts, WithBackoff on a seeded
// random source, WithGuards with the client's guards), and
// after each failed attempt the policy's decision step, [retry.Policy.Plan],
// says how long to sleep or why to stop (attempts used up, the deadline,
// the budget, the breaker). The budget ([budget.Budget]) and the breaker
// ([breaker.Breaker]) run on the simulated clock and a seeded random
// source. Around them the model does what [retry.Policy.Do] does: the
// first attempt that is sent deposits into the budget; each attempt asks
// the breaker first; each outcome is reported to it (a failure with its
// Retry-After, through [breaker.Breaker.Fail]); an attempt cut off by the
// deadline is given back with [breaker.Breaker.Cancel]. A policy without
// RetryAfter gets the provider's 503s without their Retry-After.
//
// The breaker decides by its own rules: it trips on its window, or on its
// current bucket alone (Window/Buckets) once that holds MinCalls calls, and
// closes when a round's probes all succeed.
//
// Waiting (policies with Wait): [breaker.Breaker.Wait] parks a goroutine,
// and the breaker's probe rounds and the pacer that releases the waiting
// calls run on real timers. So the model keeps the waiting calls and
// their release itself, driving the breaker through Allow, Done, Fail,
// Cancel, State, Snapshot and OnStateChange, and follows the breaker's
// documentation and code:
//
//   - An attempt the breaker rejects waits, without being sent, if the
//     request has deadline left, the rejection is a half-open breaker's or
//     an open one's whose next probe round comes before the deadline, and
//     fewer than MaxWaiters calls wait; otherwise the request fails. A
//     waiting call whose deadline comes fails.
//   - A probe round starts when the open period ends (Snapshot's
//     HalfOpenIn), even if no new call arrives then, and its probes go to
//     the waiting calls first, earliest deadline first (Allow on their behalf, before
//     any new call asks). A call handed a probe that fails goes back to
//     waiting, behind the others, without spending an attempt or budget
//     (as the retry loop does).
//   - When the breaker closes, a pacer releases the waiting calls (earliest deadline first)
//     first, by the breaker's rule and with its arithmetic, on the
//     simulated clock. Its ceiling is ReleaseRate or, by default, the calls
//     the window held when the breaker tripped (read with Snapshot just
//     before each failure is reported) per second of the time they took
//     (the window, or the time since the breaker last closed or was built
//     if shorter, at least one bucket), at least Probes per OpenFor. Its
//     pace starts at a quarter of the ceiling (at least Probes per
//     OpenFor) and doubles every half second up to it. Every tick (one
//     call's slot at the current pace, within [10 ms, 1 s]) releases as
//     many calls as the pace has earned since the last, each at a
//     uniformly random point of the coming tick (drawn from the breakers'
//     random source); a failure the breaker counts in its closed window
//     while the pacer runs halves the pace, at most once per tick and not
//     below Probes per OpenFor, and the next tick does not double it. New
//     calls are not held back. If the breaker trips again, the pacer
//     stops and the calls not yet released wait again.
//
// A fleet (policies with Fleet) shares one budget and one breaker, the
// library's, as if they lived in a store that every client reads: a
// client's withdrawals (one retry each, granted at once, as leases of one)
// and the breaker's verdicts reach every client at once, but deposits and
// outcomes reach the shared budget and breaker only when the client syncs:
// every SyncEvery, clients cut into up to 64 groups that sync at evenly
// spread phases. So the fleet's window lags by up to SyncEvery, the
// budget's floor is one for the whole fleet, and the breaker sees the
// fleet's calls (it trips on the fleet's failure ratio, admits Probes
// probes per round for the whole fleet, and one pacer releases the
// fleet's waiting calls, slowed by the failures the fleet has synced).
// Left out: the time a client takes to learn
// of the fleet's verdicts (a real fleet learns at its next sync too),
// and a store that fails.
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
// down), and retries at more than one layer (see [Layers]).
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
	// Deadline is how long each request has to succeed, from its arrival,
	// retries and waits included (a context deadline); 0 means none (and
	// then no request waits behind a breaker). It must not be negative.
	Deadline time.Duration `json:"deadline_ns"`
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
	// that, for every window-aligned t' >= t with t'+RecoveryWindow <=
	// Horizon, at least RecoveryRatio of the original requests arriving
	// in [t', t'+RecoveryWindow) succeed: it is back and stays back.
	// RecoveryWindow must be a positive multiple of Window; RecoveryRatio
	// must be in (0, 1].
	RecoveryWindow time.Duration `json:"recovery_window_ns"`
	RecoveryRatio  float64       `json:"recovery_ratio"`
	// Base and Cap configure the policies' backoff (see package backoff);
	// Base must be positive and Cap at least Base.
	Base time.Duration `json:"base_ns"`
	Cap  time.Duration `json:"cap_ns"`
	// Budget configures the retry budgets, for policies with Budget set.
	Budget BudgetSettings `json:"budget"`
	// Breaker configures the circuit breakers, for policies with Breaker
	// set.
	Breaker BreakerSettings `json:"breaker"`
	// SyncEvery is how often each client of a fleet policy syncs its
	// deposits and outcomes into the fleet's shared budget and breaker;
	// it must be positive when a policy has Fleet set.
	SyncEvery time.Duration `json:"sync_every_ns"`
	// Policies are simulated in this order, each over the same arrivals;
	// empty means [DefaultOutagePolicies].
	Policies []OutagePolicy `json:"policies"`
	// Seed seeds the arrivals (math/rand/v2 PCG, stream 1, the same for
	// every policy), each policy's backoff draws (stream 2+i for the i-th
	// policy) and its breakers' jitter (stream 2^32+i).
	Seed uint64 `json:"seed"`
	// Progress, if set, is called after each policy's run with the number
	// of policies done and the total. It is not part of the result.
	Progress func(done, total int) `json:"-"`
}

// DefaultOutageConfig returns the high-volume fleet: 8 clients (say, the
// instances of a checkout service) sending 100 requests per second each,
// 800 per second in all, each request with a 20 s deadline, to a provider
// that completes 1000 per second with a queue of 2000 (two seconds of
// work) and fails from t=5 s to t=15 s, answering 503 with Retry-After 5 s
// (1 s when shedding). Clients time out after 1 s per attempt; backoff
// base 100 ms, cap 10 s; budgets as [DefaultBudgetSettings], breakers as
// [DefaultBreakerSettings]; fleets sync every second; 60 s horizon, 100 ms
// windows, recovered at 90% success over 1 s; seed 42; all of
// [DefaultOutagePolicies].
func DefaultOutageConfig() OutageConfig {
	return OutageConfig{
		Clients:        8,
		RatePerClient:  100,
		Capacity:       1000,
		Queue:          2000,
		Timeout:        time.Second,
		Deadline:       20 * time.Second,
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
		SyncEvery:      time.Second,
		Policies:       DefaultOutagePolicies(),
		Seed:           42,
	}
}

// DefaultLowVolumeOutageConfig returns [DefaultOutageConfig] with the same
// 800 requests per second coming from the seed's POS terminals instead:
// 8000 clients sending one request every 10 s each. Every terminal's
// budget floor (1 retry per second) dwarfs its 10% ratio, and its breaker
// never sees the minimum number of calls in a window, so per-client
// guards do little here; a fleet-shared budget and breaker do.
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
	// OutageSucceeded is the original requests made during the trigger
	// that succeeded (during it or after), and OutageGoodput their share
	// of OutageOffered: what patience buys.
	OutageSucceeded int     `json:"outage_succeeded"`
	OutageGoodput   float64 `json:"outage_goodput"`
	// AfterGoodput is the goodput of the original requests sent after the
	// trigger ended: near 1 if the provider recovered at once, near 0 if it
	// stayed down.
	AfterGoodput float64 `json:"after_goodput"`
	// P50 and P99 are the median and the 99th percentile of the time from
	// a request's arrival to its success, over the requests that
	// succeeded (0 if none did).
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`

	// Recovered reports whether the provider recovered (see
	// OutageConfig.RecoveryWindow) within the horizon, and RecoverAfter
	// how long after TriggerEnd; RecoverAfter is 0 when Recovered is false.
	Recovered    bool          `json:"recovered"`
	RecoverAfter time.Duration `json:"recover_after_ns"`

	// Retries is the attempts that were retries (Attempts minus the first
	// attempts that were sent).
	Retries int `json:"retries"`
	// BudgetDenied is the retries a budget refused; BreakerRejected the
	// requests that ended because of the breaker (rejected at once, or
	// after waiting until their deadline); Waited the times a request
	// began to wait behind the breaker; DeadlineExceeded the requests that
	// ran out of deadline otherwise; Shed the attempts the provider shed
	// with a full queue; and TimedOut the attempts whose client stopped
	// waiting for the answer (Timeout).
	BudgetDenied     int `json:"budget_denied"`
	BreakerRejected  int `json:"breaker_rejected"`
	Waited           int `json:"waited"`
	DeadlineExceeded int `json:"deadline_exceeded"`
	Shed             int `json:"shed"`
	TimedOut         int `json:"timed_out"`

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
	case c.Deadline < 0:
		return bad("deadline %v must not be negative", c.Deadline)
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
	case c.Base <= 0 || c.Cap < c.Base:
		return bad("backoff base %v must be positive and cap %v at least the base", c.Base, c.Cap)
	case c.SyncEvery < 0:
		return bad("sync interval %v must not be negative", c.SyncEvery)
	}
	if _, err := c.Budget.build(nil); err != nil {
		return err
	}
	if _, err := c.Breaker.build(func() time.Time { return epoch }, nil, nil, true); err != nil {
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
		case p.Wait && !p.Breaker:
			return bad("policy %s: waiting needs a breaker", p.Name)
		case p.Fleet && !p.Budget && !p.Breaker:
			return bad("policy %s: a fleet shares a budget or a breaker; it has neither", p.Name)
		case p.Fleet && c.SyncEvery == 0:
			return bad("policy %s: a fleet needs a positive sync interval", p.Name)
		}
		if _, err := p.backoff(c, nil); err != nil {
			return bad("policy %s: %w", p.Name, err)
		}
	}
	return nil
}

// backoff returns p's backoff in c with random source u.
func (p OutagePolicy) backoff(c *OutageConfig, u func() float64) (*backoff.Backoff, error) {
	if p.Interval > 0 { // exp(n) = min(cap, base·2^n) = Interval for every n
		return backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: p.Interval, Cap: p.Interval, Rand: u})
	}
	return backoff.New(backoff.Config{Strategy: p.Backoff, Base: c.Base, Cap: c.Cap, Rand: u})
}

// Outage event kinds.
const (
	outArrive   = iota // a new original request
	outSend            // a request's next attempt is due (after its sleep)
	outSuccess         // an attempt's success reaches the client
	outFailure         // an attempt's failure (a 503, a timeout) reaches the client
	outDeadline        // the request's deadline cuts its attempt in flight
	outWaitEnd         // the request's deadline, if it is still waiting
	outRelease         // a waiting request's turn after the breaker closed
	outRound           // a breaker's open period ends: a probe round is due
	outGrant           // a breaker half-opened: its probes go to the waiting calls
	outArm             // a breaker opened: arm a probe round for its waiting calls
	outPace            // a tick of a breaker's release pacer
	outSync            // a fleet sync group syncs
)

// Request states.
const (
	reqIdle      = iota // between attempts (sleeping, or about to send)
	reqWaiting          // waiting behind its breaker
	reqReleasing        // waiting, with a release scheduled
	reqFlight           // an attempt in flight
	reqDone             // succeeded or gave up
)

// What an attempt's failure was, for the error handed to the plan.
const (
	failTrigger = iota // the outage's 503
	failShed           // 503 from a full queue
	failTimeout        // no answer within Timeout
)

// outRequest is one original request and its retries.
type outRequest struct {
	plan     func(error, time.Duration) (time.Duration, retry.Reason) // the policy's decision step for this request
	permit   breaker.Permit                                           // of the attempt in flight (zero: none)
	arrived  time.Duration                                            // when the original request was made
	deadline time.Duration                                            // arrived + Deadline (if there is one)
	client   int32
	attempts int32  // attempts sent so far
	seq      uint32 // how many times it began to wait
	release  uint32 // the breaker's epoch its release was scheduled in
	gen      uint32 // the breaker's epoch permit was issued in
	state    uint8
	fail     uint8 // failTrigger, failShed or failTimeout: the last failure
}

// outUnit is what a request's client retries with: its policy and guards.
// Without guards one unit serves every client; with per-client guards each
// client has one; in a fleet each sync group has one.
type outUnit struct {
	pol   *retry.Policy
	dep   retry.Budget // what the first attempt deposits into; nil: no budget
	brk   *simBreaker  // nil: no breaker
	group int32        // the fleet sync group; -1 outside a fleet
}

// outOutcome is an outcome a fleet client has not synced yet.
type outOutcome struct {
	permit breaker.Permit
	gen    uint32 // the breaker's epoch permit was issued in
	ok     bool
	hint   time.Duration
}

// outFleet is the fleet's shared state and what each sync group has not
// synced yet.
type outFleet struct {
	budget   *budget.Budget // shared; nil if the policy has no budget
	deposits []int          // per group
	outcomes [][]outOutcome // per group
}

// groupBudget is a sync group's view of the fleet budget: deposits wait
// for the group's sync, withdrawals go to the shared budget at once.
type groupBudget struct {
	shared  *budget.Budget
	pending *int
}

func (g groupBudget) Deposit()       { *g.pending++ }
func (g groupBudget) Withdraw() bool { return g.shared.Withdraw() }

// provError is a failed attempt as the client sees it: a 503 (with the
// provider's Retry-After if the policy reads it) or a timeout. Both are
// retryable for retry.IsRetryable.
type provError struct {
	msg     string
	hint    time.Duration
	timeout bool
}

func (e *provError) Error() string             { return e.msg }
func (e *provError) RetryAfter() time.Duration { return e.hint }
func (e *provError) Timeout() bool             { return e.timeout }
func (e *provError) Temporary() bool           { return true }

// outRun is one policy's run: the state of the fleet and the provider.
type outRun struct {
	c    *OutageConfig
	p    OutagePolicy
	now  time.Duration
	q    eventQueue
	reqs []outRequest

	bo     *backoff.Backoff
	bu     func() float64 // the breakers' random source
	units  []*outUnit     // per client, per sync group, or one
	brks   []*simBreaker
	fleet  *outFleet
	groups int
	errs   [3]*provError // per fail kind, as the policy sees it

	service time.Duration // provider time per request
	backlog time.Duration // Queue requests' worth of work: the queue is full
	free    time.Duration // when the provider has finished its backlog

	offeredW []int           // original requests per window of arrival
	okW      []int           // ... of which succeeded
	latency  []time.Duration // of each success
	res      OutagePolicyResult
}

// outBuffers is the storage one policy's run leaves to the next.
type outBuffers struct {
	q       eventQueue
	reqs    []outRequest
	latency []time.Duration
}

func (c *OutageConfig) run(i int, p OutagePolicy, buf *outBuffers) (OutagePolicyResult, error) {
	if p.Attempts < 1 {
		p.Attempts = 1
	}
	bo, err := p.backoff(c, rand.New(rand.NewPCG(c.Seed, 2+uint64(i))).Float64)
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
		bu:       rand.New(rand.NewPCG(c.Seed, 1<<32+uint64(i))).Float64,
		service:  time.Duration(float64(time.Second) / c.Capacity),
		backlog:  time.Duration(min(float64(c.Queue)*float64(time.Second)/c.Capacity, float64(2*MaxOutageHorizon))),
		offeredW: make([]int, windows),
		okW:      make([]int, windows),
		latency:  buf.latency[:0],
		res: OutagePolicyResult{
			Policy:    p,
			Load:      make([]int, windows),
			Successes: make([]int, windows),
		},
	}
	r.errs = [3]*provError{
		failTrigger: {msg: "503 (outage)"},
		failShed:    {msg: "503 (queue full)"},
		failTimeout: {msg: "attempt timed out", timeout: true},
	}
	if p.RetryAfter {
		r.errs[failTrigger].hint, r.errs[failShed].hint = c.RetryAfter, c.ShedRetryAfter
	}
	if err := r.setup(); err != nil {
		return OutagePolicyResult{}, err
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
			r.arrive(int32(arrivals.IntN(c.Clients)))
			nextArrival()
		case outSend:
			r.attempt(e.who)
		case outSuccess:
			r.succeeded(e.who)
		case outFailure:
			r.failed(e.who)
		case outDeadline:
			r.cut(e.who)
		case outWaitEnd:
			r.waitEnd(e.who)
		case outRelease:
			r.release(e.who)
		case outRound:
			sb := r.brks[e.who]
			sb.armed = false
			r.grant(sb)
			r.arm(sb)
		case outGrant:
			r.grant(r.brks[e.who])
		case outArm:
			r.arm(r.brks[e.who])
		case outPace:
			r.paceTick(r.brks[e.who])
		case outSync:
			r.sync(e.who)
		}
	}
	r.finish()
	buf.q, buf.reqs, buf.latency = r.q, r.reqs, r.latency
	return r.res, nil
}

// setup builds the units: one policy for all clients without guards, one
// per client with per-client guards, one per sync group in a fleet.
func (r *outRun) setup() error {
	c, p := r.c, r.p
	if !p.Budget && !p.Breaker {
		u, err := r.unit(nil, nil, -1)
		r.units = []*outUnit{u}
		return err
	}
	if !p.Fleet {
		r.units = make([]*outUnit, c.Clients) // built on first use
		return nil
	}
	r.groups = min(c.Clients, maxSyncGroups)
	r.fleet = &outFleet{deposits: make([]int, r.groups), outcomes: make([][]outOutcome, r.groups)}
	if p.Budget {
		b, err := c.Budget.build(r.clock)
		if err != nil {
			return err
		}
		r.fleet.budget = b
	}
	var sb *simBreaker
	if p.Breaker {
		var err error
		if sb, err = r.newBreaker(); err != nil {
			return err
		}
		sb.perClient = make([]int32, c.Clients)
	}
	r.units = make([]*outUnit, r.groups)
	for g := range r.units {
		var dep retry.Budget
		if r.fleet.budget != nil {
			dep = groupBudget{shared: r.fleet.budget, pending: &r.fleet.deposits[g]}
		}
		u, err := r.unit(dep, sb, int32(g))
		if err != nil {
			return err
		}
		r.units[g] = u
		r.after(time.Duration(int64(c.SyncEvery)*int64(g)/int64(r.groups)), int32(g), outSync)
	}
	return nil
}

// clock is the simulated clock, for the budgets and the breakers.
func (r *outRun) clock() time.Time { return epoch.Add(r.now) }

// unit returns a unit retrying with budget dep and breaker sb (either may
// be nil) in fleet sync group group (-1: none).
func (r *outRun) unit(dep retry.Budget, sb *simBreaker, group int32) (*outUnit, error) {
	opts := []retry.Option{retry.WithMaxAttempts(r.p.Attempts), retry.WithBackoff(r.bo)}
	g := retry.Guards{Budget: dep}
	if sb != nil {
		g.Breaker = sb.b
	}
	opts = append(opts, retry.WithGuards(g))
	pol, err := retry.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: policy %s: %w", ErrInvalidConfig, r.p.Name, err)
	}
	return &outUnit{pol: pol, dep: dep, brk: sb, group: group}, nil
}

// newBreaker builds a breaker of the run's settings, on the simulated clock
// and the breakers' random source, whose state changes the model follows.
func (r *outRun) newBreaker() (*simBreaker, error) {
	sb := &simBreaker{idx: int32(len(r.brks))}
	b, err := r.c.Breaker.build(r.clock, r.bu, func(from, to breaker.State) { r.stateChanged(sb, from, to) }, r.p.Wait)
	if err != nil {
		return nil, err
	}
	sb.b, sb.cfg = b, b.Config()
	sb.built, sb.closedAt = r.now, r.now
	r.brks = append(r.brks, sb)
	return sb, nil
}

// unitOf returns the unit of client k, building a per-client one on first
// use.
func (r *outRun) unitOf(k int32) *outUnit {
	switch {
	case r.fleet != nil:
		return r.units[int(k)%r.groups]
	case !r.p.Budget && !r.p.Breaker:
		return r.units[0]
	}
	if u := r.units[k]; u != nil {
		return u
	}
	// Settings were validated: building a client's guards cannot fail.
	var dep retry.Budget
	if r.p.Budget {
		b, _ := r.c.Budget.build(r.clock)
		dep = b
	}
	var sb *simBreaker
	if r.p.Breaker {
		sb, _ = r.newBreaker()
	}
	u, _ := r.unit(dep, sb, -1)
	r.units[k] = u
	return u
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

// left returns the time left before request id's deadline, or 0 if it has
// none (as the decision step of retry.Policy.Plan takes it).
func (r *outRun) left(req *outRequest) time.Duration {
	if r.c.Deadline == 0 {
		return 0
	}
	return req.deadline - r.now
}

// expired reports whether req's deadline has passed.
func (r *outRun) expired(req *outRequest) bool {
	return r.c.Deadline > 0 && r.now >= req.deadline
}

// arrive makes a new original request of client k and sends its first
// attempt.
func (r *outRun) arrive(k int32) {
	id := int32(len(r.reqs))
	u := r.unitOf(k)
	r.reqs = append(r.reqs, outRequest{plan: u.pol.Plan(), client: k, arrived: r.now, deadline: r.now + r.c.Deadline})
	r.res.Offered++
	r.offeredW[r.window(r.now)]++
	if r.inTrigger(r.now) {
		r.res.OutageOffered++
	}
	r.attempt(id)
}

// attempt makes request id's next attempt now, as the retry loop does
// before each attempt: stop at the deadline, ask the breaker (and wait for
// it, if the policy does), then send.
func (r *outRun) attempt(id int32) {
	req := &r.reqs[id]
	req.state = reqIdle
	if r.expired(req) {
		r.giveUp(id, retry.Deadline)
		return
	}
	if sb := r.unitOf(req.client).brk; sb != nil {
		r.grant(sb) // the waiting calls get a due round's probes first
		p, err := sb.b.Allow()
		if err != nil {
			if !r.wait(id, sb, err) {
				r.giveUp(id, retry.CircuitOpen)
			}
			return
		}
		req.permit, req.gen = p, sb.epoch
	}
	r.transmit(id)
}

// transmit sends request id's attempt to the provider now, the breaker
// having admitted it.
func (r *outRun) transmit(id int32) {
	req := &r.reqs[id]
	u := r.unitOf(req.client)
	if req.attempts == 0 && u.dep != nil {
		u.dep.Deposit() // the first attempt that is sent deposits
	}
	req.attempts++
	req.state = reqFlight
	if req.attempts > 1 {
		r.res.Retries++
	}
	now := r.now
	w := r.window(now)
	r.res.Attempts++
	r.res.Load[w]++
	c := r.c
	if r.inTrigger(now) {
		r.res.OutageAttempts++
		req.fail = failTrigger
		r.failed(id) // a fast 503: the client hears of it at once
		return
	}
	if r.free < now {
		r.free = now
	}
	if r.free-now >= r.backlog {
		r.res.Shed++
		req.fail = failShed
		r.failed(id) // a fast 503: the client hears of it at once
		return
	}
	r.free += r.service
	finish := r.free
	switch {
	case finish-now <= c.Timeout && (c.Deadline == 0 || finish < req.deadline):
		if r.inTrigger(finish) {
			req.fail = failTrigger
			r.after(finish-now, id, outFailure)
		} else {
			r.res.Successes[w]++
			r.after(finish-now, id, outSuccess)
		}
	case c.Deadline > 0 && req.deadline-now < c.Timeout:
		// The call's deadline ends the attempt; the provider still does
		// the work later.
		r.after(req.deadline-now, id, outDeadline)
	default:
		// The client gives up on the attempt; the provider still does the
		// work later.
		r.res.TimedOut++
		req.fail = failTimeout
		r.after(c.Timeout, id, outFailure)
	}
}

// succeeded handles the success of request id's attempt.
func (r *outRun) succeeded(id int32) {
	req := &r.reqs[id]
	r.report(req, true, 0)
	req.state = reqDone
	r.res.Succeeded++
	r.okW[r.window(req.arrived)]++
	if r.inTrigger(req.arrived) {
		r.res.OutageSucceeded++
	}
	r.latency = append(r.latency, r.now-req.arrived)
}

// failed handles the failure of request id's latest attempt: retry or give
// up, as the policy's plan says.
func (r *outRun) failed(id int32) {
	req := &r.reqs[id]
	err := r.errs[req.fail]
	probe := req.permit.Probe()
	r.report(req, false, err.hint)
	if r.expired(req) {
		r.giveUp(id, retry.Deadline)
		return
	}
	if probe && r.c.Deadline > 0 {
		// A probe the breaker handed to this request failed: the
		// request goes back to waiting, spending no attempt of its plan
		// and no budget (as the retry loop does).
		r.attempt(id)
		return
	}
	sleep, stop := req.plan(err, r.left(req))
	if stop != 0 {
		r.giveUp(id, stop)
		return
	}
	req.state = reqIdle
	r.after(sleep, id, outSend)
}

// cut ends request id's attempt at its deadline: the breaker gets the
// permit back without an outcome, and the request gives up.
func (r *outRun) cut(id int32) {
	req := &r.reqs[id]
	if sb := r.unitOf(req.client).brk; sb != nil && req.permit != (breaker.Permit{}) {
		sb.b.Cancel(req.permit) // a probe's slot goes to a waiting call
		req.permit = breaker.Permit{}
		r.q.push(r.now, sb.idx, outGrant)
	}
	r.giveUp(id, retry.Deadline)
}

// giveUp ends request id without success, for reason.
func (r *outRun) giveUp(id int32, reason retry.Reason) {
	r.reqs[id].state = reqDone
	switch reason {
	case retry.BudgetExhausted:
		r.res.BudgetDenied++
	case retry.CircuitOpen:
		r.res.BreakerRejected++
	case retry.Deadline:
		r.res.DeadlineExceeded++
	}
}

// report tells req's breaker the outcome of its attempt, as the retry loop
// does (a failure with its Retry-After); in a fleet, at the next sync.
func (r *outRun) report(req *outRequest, ok bool, hint time.Duration) {
	u := r.unitOf(req.client)
	sb := u.brk
	if sb == nil {
		return
	}
	o := outOutcome{permit: req.permit, gen: req.gen, ok: ok, hint: hint}
	req.permit = breaker.Permit{}
	if u.group >= 0 {
		r.fleet.outcomes[u.group] = append(r.fleet.outcomes[u.group], o)
		return
	}
	r.record(sb, o)
}

// record reports an outcome to sb's breaker now. A failure that the
// breaker counts in its closed window while its pacer releases slows the
// pacer down, before the breaker may trip on it (as the breaker does).
func (r *outRun) record(sb *simBreaker, o outOutcome) {
	if o.ok {
		sb.b.Done(o.permit, true)
		return
	}
	if s := sb.b.Snapshot(); s.State == breaker.Closed {
		sb.calls = s.Calls + 1 // the window this failure may trip on
	}
	if !o.permit.Probe() && o.permit != (breaker.Permit{}) && o.gen == sb.epoch {
		sb.pace.slowDown(r.now) // a no-op unless the pacer releases
	}
	sb.b.Fail(o.permit, o.hint)
}

// sync is fleet sync group g's periodic sync: its deposits and outcomes
// reach the shared budget and breaker now.
func (r *outRun) sync(g int32) {
	fl := r.fleet
	if fl.budget != nil {
		for range fl.deposits[g] {
			fl.budget.Deposit()
		}
		fl.deposits[g] = 0
	}
	if sb := r.units[g].brk; sb != nil {
		for _, o := range fl.outcomes[g] {
			r.record(sb, o)
		}
	}
	fl.outcomes[g] = fl.outcomes[g][:0]
	r.after(r.c.SyncEvery, g, outSync)
}

// wait makes request id wait behind sb after the breaker rejected its
// attempt with err, if the policy waits and the breaker's rules allow it
// (see Breaker.Wait); it reports whether the request waits.
func (r *outRun) wait(id int32, sb *simBreaker, err error) bool {
	req := &r.reqs[id]
	left := r.left(req)
	waiting := sb.n
	if sb.perClient != nil {
		waiting = int(sb.perClient[req.client])
	}
	if !r.p.Wait || left <= 0 || sb.cfg.MaxWaiters <= 0 || waiting >= sb.cfg.MaxWaiters {
		return false
	}
	until, open, oerr := openWait(err)
	if oerr != nil || (open && until >= left) {
		return false
	}
	sb.compact()
	req.seq++
	req.state = reqWaiting
	sb.enqueue(waitEntry{id: id, seq: req.seq, deadline: req.deadline})
	sb.n++
	if sb.perClient != nil {
		sb.perClient[req.client]++
	}
	r.res.Waited++
	r.after(left, id, outWaitEnd)
	r.arm(sb)
	return true
}

// waiting reports whether entry e is a call still waiting.
func (r *outRun) waiting(e waitEntry) bool {
	req := &r.reqs[e.id]
	return req.seq == e.seq && (req.state == reqWaiting || req.state == reqReleasing)
}

// leave takes waiting request id off its breaker's list.
func (r *outRun) leave(id int32, sb *simBreaker) {
	req := &r.reqs[id]
	req.seq++ // its entry is stale from now on
	req.state = reqIdle
	sb.n--
	if sb.perClient != nil {
		sb.perClient[req.client]--
	}
}

// waitEnd ends request id's wait at its deadline, if it still waits.
func (r *outRun) waitEnd(id int32) {
	req := &r.reqs[id]
	if req.state != reqWaiting && req.state != reqReleasing {
		return
	}
	sb := r.unitOf(req.client).brk
	r.leave(id, sb)
	sb.compact()
	r.giveUp(id, retry.CircuitOpen)
}

// arm makes sure a probe round comes for sb's waiting calls when its open
// period ends, even if no new call arrives then.
func (r *outRun) arm(sb *simBreaker) {
	if sb.armed || sb.n == 0 {
		return
	}
	s := sb.b.Snapshot()
	if s.State != breaker.Open {
		return
	}
	sb.armed = true
	r.after(s.HalfOpenIn, sb.idx, outRound)
}

// grant hands the free probes of sb's round, if one is due or running, to
// its waiting calls, oldest first, and sends them.
func (r *outRun) grant(sb *simBreaker) {
	if sb.n == 0 || sb.b.State() == breaker.Closed { // State starts a due round
		return
	}
	for sb.head < len(sb.fifo) {
		e := sb.fifo[sb.head]
		if !r.waiting(e) {
			sb.head++
			continue
		}
		p, err := sb.b.Allow()
		if err != nil || !p.Probe() {
			break // probes taken, or closed meanwhile: a closed-state permit needs no giving back
		}
		sb.head++
		r.leave(e.id, sb)
		r.reqs[e.id].permit, r.reqs[e.id].gen = p, sb.epoch
		r.transmit(e.id)
	}
	sb.compact()
}

// release sends waiting request id in its turn after its breaker closed,
// unless the breaker has changed state since.
func (r *outRun) release(id int32) {
	req := &r.reqs[id]
	if req.state != reqReleasing {
		return
	}
	sb := r.unitOf(req.client).brk
	if req.release != sb.epoch {
		return // reopened: it waits again
	}
	p, err := sb.b.Allow()
	if err != nil {
		req.state = reqWaiting
		r.arm(sb)
		return
	}
	r.leave(id, sb)
	sb.compact()
	req.permit, req.gen = p, sb.epoch
	r.transmit(id)
}

// stateChanged follows a state change of sb's breaker. It runs inside the
// breaker's call that made the change (OnStateChange), so it only keeps
// books and schedules: what calls the breaker again runs as an event.
func (r *outRun) stateChanged(sb *simBreaker, from, to breaker.State) {
	sb.epoch++
	switch to {
	case breaker.Open:
		if from == breaker.Closed {
			sb.tripped(r.now)
		}
		sb.pace.on = false
		for i := sb.head; i < len(sb.fifo); i++ {
			if e := sb.fifo[i]; r.waiting(e) {
				r.reqs[e.id].state = reqWaiting // not released yet: wait again
			}
		}
		if sb.n > 0 {
			r.q.push(r.now, sb.idx, outArm)
		}
	case breaker.HalfOpen:
		if sb.n > 0 {
			r.q.push(r.now, sb.idx, outGrant)
		}
	case breaker.Closed:
		sb.closedAt = r.now
		// The pacer starts at the close, with a first tick at once.
		sb.pace.start(r.now, sb.built, sb.epoch, sb.releaseRate(), sb.cfg.Probes, sb.cfg.OpenFor)
		if r.releaseDue(sb) {
			sb.pace.on = true
			r.armPace(sb)
		}
	}
}

// releaseDue is a tick of sb's pacer: it releases the oldest waiting calls
// not yet released, as many as the pacer's credit allows, each at a
// uniformly random point of the coming tick, and reports whether some are
// left to release.
func (r *outRun) releaseDue(sb *simBreaker) bool {
	p := &sb.pace
	if p.epoch != sb.epoch {
		return false // the breaker opened since
	}
	span := p.advance(r.now)
	for sb.head < len(sb.fifo) && !r.waiting(sb.fifo[sb.head]) {
		sb.head++
	}
	left := false
	for i := sb.head; i < len(sb.fifo); i++ {
		e := sb.fifo[i]
		if !r.waiting(e) || r.reqs[e.id].state == reqReleasing {
			continue
		}
		if !p.take() {
			left = true
			break
		}
		req := &r.reqs[e.id]
		req.state, req.release = reqReleasing, sb.epoch
		r.after(time.Duration(r.bu()*span), e.id, outRelease)
	}
	p.settle(left)
	sb.compact()
	return left
}

// armPace schedules the next tick of sb's pacer.
func (r *outRun) armPace(sb *simBreaker) {
	d := sb.pace.tick()
	sb.pace.due = r.now + d
	r.after(d, sb.idx, outPace)
}

// paceTick runs the tick of sb's pacer that is due now, unless the pacer
// has stopped or restarted since it was scheduled.
func (r *outRun) paceTick(sb *simBreaker) {
	p := &sb.pace
	if !p.on || r.now != p.due {
		return
	}
	if r.releaseDue(sb) {
		r.armPace(sb)
		return
	}
	p.on = false
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
	res.OutageGoodput = ratio(res.OutageSucceeded, res.OutageOffered)
	for w, n := range res.Load {
		if n > res.Peak {
			res.Peak, res.PeakAt = n, time.Duration(w)*c.Window
		}
	}
	if n := len(r.latency); n > 0 {
		slices.Sort(r.latency)
		res.P50 = r.latency[(n-1)/2]
		res.P99 = r.latency[int(math.Ceil(0.99*float64(n)))-1]
	}
	from := int((c.TriggerEnd + c.Window - 1) / c.Window)
	var after, afterOK int
	for w := from; w < len(r.offeredW); w++ {
		after += r.offeredW[w]
		afterOK += r.okW[w]
	}
	res.AfterGoodput = ratio(afterOK, after)
	// Recovered from the earliest window w >= from such that every
	// recovery window starting at w or later (and ending by the horizon)
	// meets the ratio: found scanning backwards from the last one.
	span := int(c.RecoveryWindow / c.Window)
	rec := -1
	for w := len(r.offeredW) - span; w >= from; w-- {
		var n, ok int
		for k := w; k < w+span; k++ {
			n += r.offeredW[k]
			ok += r.okW[k]
		}
		if float64(ok) < c.RecoveryRatio*float64(n) {
			break
		}
		if n > 0 {
			rec = w
		}
	}
	if rec >= 0 {
		res.Recovered = true
		res.RecoverAfter = time.Duration(rec)*c.Window - c.TriggerEnd
	}
}

// WriteText writes the result as a table, one row per policy.
func (r *OutageResult) WriteText(w io.Writer) error {
	c := r.Config
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "fleet: %d clients x %g req/s = %g req/s offered, deadline %v; provider: %g req/s, queue %d, client timeout %v\n",
		c.Clients, c.RatePerClient, float64(c.Clients)*c.RatePerClient, c.Deadline, c.Capacity, c.Queue, c.Timeout)
	fmt.Fprintf(bw, "trigger: 503 (Retry-After %v) from %v to %v; horizon %v, windows of %v, fleet sync every %v, seed %d\n\n",
		c.RetryAfter, c.TriggerStart, c.TriggerEnd, c.Horizon, c.Window, c.SyncEvery, c.Seed)
	name := len("policy")
	for _, p := range r.Policies {
		name = max(name, len(p.Policy.Name))
	}
	fmt.Fprintf(bw, "%-*s %9s %13s %10s %8s %10s %8s %8s %10s\n", name, "policy", "peak/win", "attempts/off", "in outage",
		"goodput", "outage gp", "after", "p99", "recovered")
	for _, p := range r.Policies {
		rec := "never"
		if p.Recovered {
			rec = fmt.Sprintf("+%v", p.RecoverAfter)
		}
		fmt.Fprintf(bw, "%-*s %9d %12.2fx %9.2fx %7.1f%% %9.1f%% %7.1f%% %7.1fs %10s\n", name, p.Policy.Name, p.Peak,
			p.Amplification, p.OutageAmplification, 100*p.Goodput, 100*p.OutageGoodput, 100*p.AfterGoodput, p.P99.Seconds(), rec)
	}
	fmt.Fprintf(bw, "\n%s\nspan of %v (window-aligned, to the horizon) at least %g%% of the requests made in it succeed\n", strings.TrimSpace(`
peak/win: most attempts at the provider in one window; attempts/off: attempts per original request
over the horizon; in outage: the same during the trigger; goodput: original requests that succeeded;
outage gp: goodput of the requests made during the trigger; after: goodput of requests made after it;
p99: 99th percentile of the time to success; recovered: time after the trigger from which, in every`), c.RecoveryWindow, 100*c.RecoveryRatio)
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
