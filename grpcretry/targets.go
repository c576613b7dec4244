package grpcretry

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// target is what a Client keeps per target: its retry policy, with that
// target's budget and breaker. It is immutable once made, but for warned.
type target struct {
	name    string
	policy  *retry.Policy
	budget  retry.Budget
	breaker *breaker.Breaker
	logger  *slog.Logger
	warned  atomic.Bool // the stacked-retry warning was logged
}

// targets is a bounded table from target name to its state. Lookups read an
// immutable snapshot with one atomic load (no lock, no allocation); adding
// a target copies the snapshot under the mutex and, when the table is full,
// drops the target that entered first.
type targets struct {
	max  int
	make func(name string) (*target, error)
	snap atomic.Pointer[map[string]*target] // never modified once stored
	last atomic.Pointer[target]             // the target found last: most clients call one

	mu    sync.Mutex
	order []string // guarded by mu: names in insertion order, a ring once full
	next  int      // guarded by mu: the oldest entry of order once full
}

func newTargets(max int, mk func(string) (*target, error)) *targets {
	t := &targets{max: max, make: mk}
	t.snap.Store(&map[string]*target{})
	return t
}

// get returns the state of target name, creating it if needed.
func (t *targets) get(name string) (*target, error) {
	if st := t.last.Load(); st != nil && st.name == name {
		return st, nil
	}
	snap := t.snap.Load()
	if st := (*snap)[name]; st != nil {
		t.last.Store(st)
		if t.snap.Load() != snap { // a target was added (maybe st evicted) meanwhile
			t.last.Store(nil)
		}
		return st, nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.snap.Load()
	if st := old[name]; st != nil {
		return st, nil
	}
	st, err := t.make(name)
	if err != nil {
		return nil, err
	}
	m := make(map[string]*target, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if len(t.order) < t.max {
		t.order = append(t.order, name)
	} else {
		delete(m, t.order[t.next])
		t.order[t.next] = name
		t.next = (t.next + 1) % t.max
	}
	m[name] = st
	t.snap.Store(&m)
	t.last.Store(nil) // it may be the target just evicted
	return st, nil
}

// all returns the targets held, sorted by name.
func (t *targets) all() []*target {
	m := *t.snap.Load()
	out := make([]*target, 0, len(m))
	for _, st := range m {
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b *target) int { return strings.Compare(a.name, b.name) })
	return out
}

// newTarget builds the state of one target: its budget, its breaker, and
// the policy that uses them.
func (c *Client) newTarget(name string) (*target, error) {
	cfg := &c.cfg
	var logger *slog.Logger
	if cfg.logger != nil {
		logger = cfg.logger.With(slog.String("target", name))
	}
	var g Guards
	if cfg.guards != nil {
		var err error
		if g, err = cfg.guards(name); err != nil {
			return nil, fmt.Errorf("grpcretry: guards for target %q: %w", name, err)
		}
	} else {
		if cfg.budget != nil {
			bc := *cfg.budget
			if bc.Now == nil && c.clock != nil {
				bc.Now = c.clock.Now
			}
			b, err := budget.New(bc)
			if err != nil {
				return nil, err
			}
			g.Budget = b
		}
		if cfg.breaker != nil {
			bc := *cfg.breaker
			if bc.Now == nil && c.clock != nil {
				bc.Now = c.clock.Now
			}
			bc.OnStateChange = c.onStateChange(name, logger, bc.OnStateChange)
			b, err := breaker.New(bc)
			if err != nil {
				return nil, err
			}
			g.Breaker = b
		}
	}
	opts := append(slices.Clip(cfg.retry),
		retry.WithClassifier(retryable),
		retry.WithName(name),
		retry.WithObserver(cfg.observer),
		retry.WithLogger(logger),
		retry.WithBudget(g.Budget),
		retry.WithBreaker(g.Breaker),
	)
	p, err := retry.New(opts...)
	if err != nil {
		return nil, err
	}
	return &target{name: name, policy: p, budget: g.Budget, breaker: g.Breaker, logger: logger}, nil
}

// retryable is the policies' classifier: the attempts mark everything they
// may not retry, so an unmarked attempt error is retryable.
func retryable(err error) bool {
	_, ok := err.(*attemptError)
	return ok
}

// onStateChange returns the state-change callback of a target's breaker:
// the configured one, a Warn to the logger and an event to the observer,
// each with the target.
func (c *Client) onStateChange(name string, logger *slog.Logger, user func(from, to breaker.State)) func(from, to breaker.State) {
	obs := c.cfg.observer
	if logger == nil && obs == nil {
		return user
	}
	return func(from, to breaker.State) {
		if logger != nil {
			logger.LogAttrs(context.Background(), slog.LevelWarn, "grpcretry: circuit breaker state change",
				slog.String("from", from.String()), slog.String("to", to.String()))
		}
		if obs != nil {
			obs.Observe(context.Background(), observe.Event{Kind: observe.BreakerState, Name: name, From: from.String(), To: to.String()})
		}
		if user != nil {
			user(from, to)
		}
	}
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
		s := TargetState{Target: t.name}
		if st, ok := t.budget.(interface{ Stats() budget.Stats }); ok {
			s.Budget, s.HasBudget = st.Stats(), true
		}
		if t.breaker != nil {
			s.Breaker, s.HasBreaker = t.breaker.Snapshot(), true
		}
		out = append(out, s)
	}
	return out
}
