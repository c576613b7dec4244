package sim

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/limit"
	"github.com/stormguard/stormguard/retry"
)

// The clients' guards in the outage experiment: a retry policy with a
// budget and a breaker per client, per fleet sync group or for all, and a
// fleet's sync.

// outUnit is what a request's client retries with: its policy and guards.
// Without guards one unit serves every client; with per-client guards each
// client has one; in a fleet each sync group has one.
type outUnit struct {
	pol   *retry.Policy
	dep   retry.Budget          // what the first attempt deposits into; nil: no budget
	brk   *simBreaker           // nil: no breaker
	lim   *limit.Stepped[int32] // nil: no limiter
	group int32                 // the fleet sync group; -1 outside a fleet
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

// setup builds the units: one policy for all clients without guards, one
// per client with per-client guards, one per sync group in a fleet.
func (r *outRun) setup() error {
	c, p := r.c, r.p
	if !p.Budget && !p.Breaker && !p.Limit {
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
	s := r.c.Breaker
	if r.p.Limit && s.ReleaseRate == 0 {
		s.ReleaseRate = -1 // the limiter paces the release, as the transports' layer sets it
	}
	b, err := s.build(r.clock, r.bu, func(from, to breaker.State) { r.stateChanged(sb, from, to) }, r.p.Wait)
	if err != nil {
		return nil, err
	}
	sb.b, sb.cfg = b, b.Config()
	sb.closedAt = r.now
	r.brks = append(r.brks, sb)
	return sb, nil
}

// unitOf returns the unit of client k, building a per-client one on first
// use.
func (r *outRun) unitOf(k int32) *outUnit {
	switch {
	case r.fleet != nil:
		return r.units[int(k)%r.groups]
	case !r.p.Budget && !r.p.Breaker && !r.p.Limit:
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
	if r.p.Limit {
		u.lim = limit.New[int32](0, r.c.Timeout, 0)
	}
	r.units[k] = u
	return u
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
// breaker counts in its closed window while the pacer releases slows the
// pacer down, before the breaker may trip on it, and trips the breaker
// once the window holds Probes calls that cross the failure ratio (the
// breaker's rules while it releases; it does not know of the model's
// release, so the model applies the second one with Trip, which opens it
// as its own trip would).
func (r *outRun) record(sb *simBreaker, o outOutcome) {
	if o.ok {
		sb.b.Done(o.permit, true)
		return
	}
	if s := sb.b.Snapshot(); s.State == breaker.Closed {
		sb.calls = s.Calls + 1 // the window this failure may trip on
	}
	counted := sb.releasing && !o.permit.Probe() && o.permit != (breaker.Permit{}) && o.gen == sb.epoch
	if counted {
		sb.pace.SlowDown(r.now)
	}
	sb.b.Fail(o.permit, o.hint)
	if counted && sb.releasing { // Fail did not trip it
		s := sb.b.Snapshot()
		if s.State == breaker.Closed && s.Calls >= sb.cfg.Probes && float64(s.Failures) >= sb.cfg.FailureRatio*float64(s.Calls) {
			sb.b.Trip(o.hint)
		}
	}
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
