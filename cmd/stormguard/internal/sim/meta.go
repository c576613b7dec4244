package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// The metastability matrix: client setups against a provider near its
// capacity, one run per trigger.

// MetaConfig describes the metastability matrix ([Meta]): a fleet offering
// Rho of a provider's capacity, whose queue holds QueueSeconds of work and
// serves the work of callers who left, hit for TriggerFor by each trigger
// in turn (see [Trigger]), once per client setup. Each run is an [Outage]
// run (the model is documented at [OutageConfig]) with the fleet's rate
// Rho·Capacity split evenly over Clients, Queue = QueueSeconds·Capacity,
// the provider's Retry-After as DefaultOutageConfig's (5 s with the
// trigger's 503s, 1 s when it sheds), backoff base 100 ms and cap 10 s,
// the library's default budget and breaker, 100 ms windows, and recovery
// at RecoveryRatio over 1 s. Its figures are [Phases].
type MetaConfig struct {
	// Rho is the offered load as a share of Capacity, in (0, 2].
	Rho float64 `json:"rho"`
	// Clients is the number of clients sharing the load, in [1,
	// MaxOutageClients]: each has its own guards.
	Clients int `json:"clients"`
	// Capacity is the requests per second the provider serves (mu); it
	// must be positive and finite.
	Capacity float64 `json:"capacity_per_s"`
	// Workers is the provider's servers (see OutageConfig.Workers), at
	// least 5 for the capacity cut; each attempt takes Workers/Capacity
	// seconds of one.
	Workers int `json:"workers"`
	// QueueSeconds is the work the provider's queue holds, in seconds of
	// its capacity; QueueSeconds·Capacity must be at least 1.
	QueueSeconds float64 `json:"queue_s"`
	// Timeout is the clients' attempt timeout and Deadline each request's
	// deadline; both must be positive.
	Timeout  time.Duration `json:"timeout_ns"`
	Deadline time.Duration `json:"deadline_ns"`
	// TriggerStart and TriggerFor place the trigger:
	// [TriggerStart, TriggerStart+TriggerFor), within Horizon.
	TriggerStart time.Duration `json:"trigger_start_ns"`
	TriggerFor   time.Duration `json:"trigger_for_ns"`
	// Horizon is the simulated time of each run.
	Horizon time.Duration `json:"horizon_ns"`
	// RecoveryRatio is the goodput a recovered provider holds to the
	// horizon (see Phases.Recovered), in (0, 1].
	RecoveryRatio float64 `json:"recovery_ratio"`
	// Triggers are run in this order; empty means [Triggers].
	Triggers []Trigger `json:"triggers"`
	// Policies are the client setups, run in this order in each trigger's
	// run; empty means [MetaPolicies].
	Policies []OutagePolicy `json:"policies"`
	// Seed seeds every run (see OutageConfig.Seed): each trigger's run has
	// the same arrivals.
	Seed uint64 `json:"seed"`
	// Progress, if set, is called after each policy's run with the number
	// of runs done and the total. It is not part of the result.
	Progress func(done, total int) `json:"-"`
}

// MetaPolicies returns the client setups of the matrix:
//
//	fixed-1s    a naive loop: every 1 s until the deadline (at most 30 attempts)
//	backoff     retry with full-jitter backoff only, up to 10 attempts
//	stormguard  3 attempts, full jitter, each client's own budget and breaker
//	            (the library's defaults), honouring Retry-After, no waiting: a
//	            call the open breaker rejects fails
//	+wait       the same, waiting behind the open breaker within the deadline,
//	            released at the rate seen before the trip: what retry.Policy
//	            does with a breaker and no limiter for a call with a deadline
//	+limit      + the concurrency limiter (package limit): the breaker releases
//	            at once and the limiter's slots pace the calls (a transport
//	            with a limiter configured by WithLimit)
func MetaPolicies() []OutagePolicy {
	sg := OutagePolicy{Name: "stormguard", Backoff: backoff.FullJitter, Attempts: 3, Budget: true, Breaker: true, RetryAfter: true}
	wait, lim := sg, sg
	wait.Name, wait.Wait = "+wait", true
	lim.Name, lim.Wait, lim.Limit = "+limit", true, true
	return []OutagePolicy{
		{Name: "fixed-1s", Interval: time.Second, Attempts: 30},
		{Name: "backoff", Backoff: backoff.FullJitter, Attempts: 10},
		sg, wait, lim,
	}
}

// DefaultMetaConfig returns the matrix of the live scenario,
// simulated: load 0.9 of a provider serving 1000 requests per second with
// 50 workers (50 ms per request) and a queue of 2 s of work, 8 clients, a
// 1 s attempt timeout and a 20 s deadline, each trigger for 10 s at 15 s
// of a 60 s run, recovery at 95%, seed 42.
func DefaultMetaConfig() MetaConfig {
	return MetaConfig{
		Rho:           0.9,
		Clients:       8,
		Capacity:      1000,
		Workers:       50,
		QueueSeconds:  2,
		Timeout:       time.Second,
		Deadline:      20 * time.Second,
		TriggerStart:  15 * time.Second,
		TriggerFor:    10 * time.Second,
		Horizon:       60 * time.Second,
		RecoveryRatio: 0.95,
		Seed:          42,
	}
}

// MetaResult is the outcome of [Meta].
type MetaResult struct {
	// Config is the configuration that ran, defaults filled in.
	Config MetaConfig `json:"config"`
	// Window is the width of the runs' windows (OutagePolicyResult.Load
	// and the others).
	Window time.Duration `json:"window_ns"`
	// Runs holds one run per trigger, in the config's order.
	Runs []MetaRun `json:"runs"`
}

// MetaRun is one trigger's run: the outage experiment's result of each
// policy, in the config's order, Phases holding the matrix's figures.
type MetaRun struct {
	Trigger  Trigger              `json:"trigger"`
	Policies []OutagePolicyResult `json:"results"`
}

// outage returns the outage experiment of c's trigger t.
func (c *MetaConfig) outage(t Trigger) OutageConfig {
	o := DefaultOutageConfig()
	o.Clients = c.Clients
	o.RatePerClient = c.Rho * c.Capacity / float64(c.Clients)
	o.Capacity = c.Capacity
	o.Workers = c.Workers
	o.Queue = int(math.Round(c.QueueSeconds * c.Capacity))
	o.Timeout, o.Deadline = c.Timeout, c.Deadline
	o.TriggerStart, o.TriggerEnd = c.TriggerStart, c.TriggerStart+c.TriggerFor
	o.Trigger = t
	o.Horizon = c.Horizon
	o.RecoveryRatio = c.RecoveryRatio
	o.Policies = c.Policies
	o.Seed = c.Seed
	return o
}

// Meta runs the metastability matrix described at [MetaConfig]. It is
// deterministic for a given config, returns an error wrapping
// [ErrInvalidConfig] for settings it cannot run, and is safe for
// concurrent use; one call runs on one goroutine.
func Meta(c MetaConfig) (*MetaResult, error) {
	if len(c.Triggers) == 0 {
		c.Triggers = Triggers()
	}
	if len(c.Policies) == 0 {
		c.Policies = MetaPolicies()
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case !(c.Rho > 0 && c.Rho <= 2):
		return nil, bad("rho %v must be in (0, 2]", c.Rho)
	case !(c.Capacity > 0) || math.IsInf(c.Capacity, 0):
		return nil, bad("capacity %v must be positive and finite", c.Capacity)
	case !(c.QueueSeconds*c.Capacity >= 1) || c.QueueSeconds*c.Capacity > math.MaxInt32:
		return nil, bad("a queue of %v s at %v/s must hold at least one request", c.QueueSeconds, c.Capacity)
	case c.Timeout <= 0 || c.Deadline <= 0:
		return nil, bad("timeout %v and deadline %v must be positive", c.Timeout, c.Deadline)
	case c.TriggerStart < 0 || c.TriggerFor < 0 || c.TriggerFor > c.Horizon || c.TriggerStart > c.Horizon-c.TriggerFor:
		return nil, bad("trigger of %v at %v must lie within the horizon %v", c.TriggerFor, c.TriggerStart, c.Horizon)
	}
	for _, t := range c.Triggers { // every run's settings, before any runs
		o := c.outage(t)
		if err := o.validate(); err != nil {
			return nil, err
		}
	}
	res := &MetaResult{Config: c, Window: DefaultOutageConfig().Window, Runs: make([]MetaRun, 0, len(c.Triggers))}
	res.Config.Progress = nil
	for i, t := range c.Triggers {
		o := c.outage(t)
		if c.Progress != nil {
			o.Progress = func(done, total int) { c.Progress(i*total+done, len(c.Triggers)*total) }
		}
		r, err := Outage(o)
		if err != nil {
			return nil, err
		}
		res.Runs = append(res.Runs, MetaRun{Trigger: t, Policies: r.Policies})
	}
	return res, nil
}
