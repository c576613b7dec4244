package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// The outage experiment: its policies, its configuration (the model is
// documented at OutageConfig) and their validation.

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
	// Limit gives every client its own concurrency limiter, package
	// limit's zero Config with the attempt timeout (OutageConfig.Timeout)
	// as its Timeout, as httpretry.WithLimit builds one per host; a
	// breaker beside it releases its waiting calls at once (ReleaseRate
	// -1, unless BreakerSettings.ReleaseRate is set), as the transport's
	// layer does, and the limiter paces them. See OutageConfig. It cannot
	// be combined with Fleet.
	Limit bool `json:"limit,omitempty"`
}

// RecommendedOutagePolicy is the name of the policy of
// [DefaultOutagePolicies] that the project recommends: per-client budget,
// breaker, Retry-After, waiting, and the concurrency limiter.
const RecommendedOutagePolicy = "full+budget+breaker+retry-after+wait+limit"

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
//	full+budget+breaker+retry-after+wait+limit
//	                                      per-client guards, waiting, and a
//	                                      per-client concurrency limiter
//	                                      (recommended)
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
		{Name: RecommendedOutagePolicy, Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true, RetryAfter: true, Wait: true, Limit: true},
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

// OutageConfig describes the outage experiment: the project's story of a
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
// and the breaker steps its probe rounds and its release on real timers.
// So the model keeps the waiting calls itself, in the breaker's own wait
// order (package waitq: earliest deadline first, arrival order among equal
// deadlines), releases them with the breaker's own pacer (package pace),
// stepped on the simulated clock (this module's copies of the root
// module's internal/waitq and internal/pace, kept equal by their tests),
// and drives the breaker through Allow, Done, Fail, Cancel, Trip, State,
// Snapshot and OnStateChange, as the breaker's documentation says:
//
//   - An attempt the breaker rejects waits, without being sent, if the
//     request has deadline left, the rejection is a half-open breaker's or
//     an open one's whose next probe round comes before the deadline, and
//     fewer than MaxWaiters calls wait; otherwise the request fails. A
//     waiting call whose deadline comes fails.
//   - A probe round starts when the open period ends (Snapshot's
//     HalfOpenIn), even if no new call arrives then, and its probes go to
//     the waiting calls first, earliest deadline first (Allow on their
//     behalf, before any new call asks). A call handed a probe that fails
//     goes back to waiting, without spending an attempt or budget (as the
//     retry loop does).
//   - When the breaker closes, the pacer releases the waiting calls,
//     earliest deadline first. Its ceiling is the breaker's (see
//     breaker.Config.ReleaseRate): ReleaseRate or, by default, the calls
//     the window held when the breaker tripped (read with Snapshot just
//     before each failure is reported) per second of the time they took
//     (the window, or the time since the breaker last closed or was built
//     if shorter, at least one bucket), at least Probes per OpenFor. Every
//     tick releases the calls the pacer allows, each at a uniformly random
//     point of the coming tick (drawn from the breakers' random source); a
//     failure the breaker counts in its closed window while the pacer runs
//     slows it down, and trips the breaker once the window holds Probes
//     calls that cross the failure ratio (the breaker's rule while it
//     releases, which the model applies through Trip). New calls are not
//     held back. If the breaker trips again, the pacer stops and the calls
//     not yet released wait again.
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
	// TriggerStart and TriggerEnd bound the trigger: with TriggerError,
	// every attempt in [TriggerStart, TriggerEnd) gets a 503. 0 <=
	// TriggerStart <= TriggerEnd <= Horizon.
	TriggerStart time.Duration `json:"trigger_start_ns"`
	TriggerEnd   time.Duration `json:"trigger_end_ns"`
	// Trigger is what happens at the provider during the trigger; the
	// zero value is TriggerError, the 503s.
	Trigger Trigger `json:"trigger"`
	// Workers is the provider's servers, in [0, MaxOutageWorkers]: each
	// serves one attempt at a time in Workers/Capacity seconds; 0 means
	// one. TriggerCut needs at least 5.
	Workers int `json:"workers,omitempty"`
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
	// A request still pending at the horizon counts as failed.
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
// [DefaultBreakerSettings]; fleets sync every second; 90 s horizon, 100 ms
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
		Horizon:        90 * time.Second,
		Window:         100 * time.Millisecond,
		RecoveryWindow: time.Second,
		RecoveryRatio:  0.9,
		Base:           100 * time.Millisecond,
		Cap:            10 * time.Second,
		Budget:         DefaultBudgetSettings(),
		Breaker:        DefaultBreakerSettings(),
		SyncEvery:      time.Second,
		Policies:       DefaultOutagePolicies(),
		Seed:           42,
	}
}

// DefaultLowVolumeOutageConfig returns [DefaultOutageConfig] with the same
// 800 requests per second coming from the story's POS terminals instead:
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
	case c.Workers < 0 || c.Workers > MaxOutageWorkers:
		return bad("workers %d must be in [0, %d]", c.Workers, MaxOutageWorkers)
	case c.Trigger > TriggerCut:
		return bad("unknown trigger %d", c.Trigger)
	case c.Trigger == TriggerCut && c.Workers < slowFactor:
		return bad("a capacity cut needs at least %d workers, not %d", slowFactor, c.Workers)
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
		case p.Fleet && p.Limit:
			return bad("policy %s: the fleet has no shared limiter: a limiter is per client", p.Name)
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
