package grpcretry

import (
	"slices"
	"strings"
	"sync/atomic"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/guards"
)

// target is what a Client keeps per target: its retry policy, with that
// target's budget and breaker. It is immutable once made, but for warned.
type target struct {
	*guards.Destination
	warned atomic.Bool // the stacked-retry warning was logged
}

// targets is the bounded table of targets.
type targets struct{ t *guards.Table[*target] }

func newTargets(max int, mk func(string) (*target, error)) *targets {
	return &targets{guards.NewTable(max, mk)}
}

// get returns the state of target name, creating it if needed.
func (t *targets) get(name string) (*target, error) { return t.t.Get(name) }

// all returns the targets held, sorted by name.
func (t *targets) all() []*target {
	m := t.t.All()
	out := make([]*target, 0, len(m))
	for _, st := range m {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *target) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// newTarget builds the state of one target: its budget, its breaker, and
// the policy that uses them.
func (c *Client) newTarget(name string) (*target, error) {
	d, err := c.layer.New(name)
	if err != nil {
		return nil, err
	}
	return &target{Destination: d}, nil
}

// retryable is the policies' classifier: the attempts mark everything they
// may not retry, so an unmarked attempt error is retryable.
func retryable(err error) bool {
	_, ok := err.(*attemptError)
	return ok
}

// TargetState is a target's guards as a [Client] holds them.
type TargetState struct {
	// Target is the target, as grpc.ClientConn.Target returns it.
	Target string
	// Budget is the target's retry budget window, if the target has a
	// budget that reports one (a [*budget.Budget] does); HasBudget says so.
	Budget    budget.Stats
	HasBudget bool
	// Breaker is the target's circuit breaker, if it has one; HasBreaker
	// says so.
	Breaker    breaker.Snapshot
	HasBreaker bool
}

// Targets returns the state of every target the client holds, sorted by
// target. It is safe to call at any time; each target's figures are read
// one after another, not as one atomic snapshot.
func (c *Client) Targets() []TargetState {
	ts := c.targets.all()
	out := make([]TargetState, 0, len(ts))
	for _, t := range ts {
		s := TargetState{Target: t.Name}
		if st, ok := t.Guards.Budget.(interface{ Stats() budget.Stats }); ok {
			s.Budget, s.HasBudget = st.Stats(), true
		}
		if b := t.Guards.Breaker; b != nil {
			s.Breaker, s.HasBreaker = b.Snapshot(), true
		}
		out = append(out, s)
	}
	return out
}
