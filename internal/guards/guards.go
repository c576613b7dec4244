// Package guards holds what the protocol layers (httpretry per host,
// grpcretry per target) share: a bounded table of per-destination state, and
// the building of a destination's retry budget and circuit breaker from
// their configurations.
package guards

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// Table is a bounded map from a destination's name to its state. Lookups
// read an immutable snapshot through one atomic load: no lock, no
// allocation, no cache line written but the last-found cache. Adding a name
// (rare: once per destination, or after an eviction) takes the mutex and
// publishes a new snapshot with the name added and, when the table is full,
// the name added first removed; it costs O(max) for the copy. A Table is
// safe for concurrent use.
type Table[T any] struct {
	max  int
	make func(name string) (T, error)

	snap atomic.Pointer[map[string]T] // never modified once stored
	last atomic.Pointer[entry[T]]     // the name found last: most clients call one

	mu    sync.Mutex
	order []string // guarded by mu: names in insertion order, a ring once full
	next  int      // guarded by mu: the oldest entry of order once full
}

type entry[T any] struct {
	name string
	v    T
}

// NewTable returns a table of at most max names (max >= 1) whose state is
// built by mk on first use.
func NewTable[T any](max int, mk func(name string) (T, error)) *Table[T] {
	t := &Table[T]{max: max, make: mk}
	t.snap.Store(&map[string]T{})
	return t
}

// Get returns the state of name, building it if needed. An error from the
// builder is returned as is, and nothing is stored.
func (t *Table[T]) Get(name string) (T, error) {
	if e := t.last.Load(); e != nil && e.name == name {
		return e.v, nil
	}
	snap := t.snap.Load()
	if v, ok := (*snap)[name]; ok {
		t.last.Store(&entry[T]{name, v})
		if t.snap.Load() != snap { // a name was added (maybe this one evicted) meanwhile
			t.last.Store(nil)
		}
		return v, nil
	}
	return t.add(name)
}

func (t *Table[T]) add(name string) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.snap.Load()
	if v, ok := old[name]; ok {
		return v, nil
	}
	v, err := t.make(name)
	if err != nil {
		return v, err
	}
	m := make(map[string]T, len(old)+1)
	for k, x := range old {
		m[k] = x
	}
	if len(t.order) < t.max {
		t.order = append(t.order, name)
	} else {
		delete(m, t.order[t.next])
		t.order[t.next] = name
		t.next = (t.next + 1) % t.max
	}
	m[name] = v
	t.snap.Store(&m)
	t.last.Store(nil) // it may be the name just evicted
	return v, nil
}

// Len returns the number of names held.
func (t *Table[T]) Len() int { return len(*t.snap.Load()) }

// All returns the names held and their states, in no particular order.
func (t *Table[T]) All() map[string]T { return *t.snap.Load() }

// Spec describes the guards of one destination.
type Spec struct {
	// Name is the destination (host, target); Component prefixes log
	// messages ("httpretry").
	Name, Component string
	// Budget and Breaker are the configurations to build from; nil means
	// none.
	Budget  *budget.Config
	Breaker *breaker.Config
	// Clock, if not nil, is the retry policy's clock; the budget and the
	// breaker read it unless their configurations set Now.
	Clock retry.Clock
	// Logger (already labelled with the destination) and Observer hear of
	// the breaker's state changes; nil means silent.
	Logger   *slog.Logger
	Observer observe.Observer
}

// Build returns the guards of s (nil for those not configured). The
// breaker's state changes go to its configured callback, a Warn to the
// logger and a BreakerState event to the observer, each with the
// destination.
func Build(s Spec) (retry.Guards, error) {
	var g retry.Guards
	if s.Budget != nil {
		cfg := *s.Budget
		if cfg.Now == nil && s.Clock != nil {
			cfg.Now = s.Clock.Now
		}
		b, err := budget.New(cfg)
		if err != nil {
			return retry.Guards{}, err
		}
		g.Budget = b
	}
	if s.Breaker != nil {
		cfg := *s.Breaker
		if cfg.Now == nil && s.Clock != nil {
			cfg.Now = s.Clock.Now
		}
		cfg.OnStateChange = StateChange(s, cfg.OnStateChange)
		b, err := breaker.New(cfg)
		if err != nil {
			return retry.Guards{}, err
		}
		g.Breaker = b
	}
	return g, nil
}

// StateChange returns the state-change callback of a destination's
// breaker: user (if not nil), a Warn to s.Logger and an event to
// s.Observer. With neither logger nor observer it returns user.
func StateChange(s Spec, user func(from, to breaker.State)) func(from, to breaker.State) {
	logger, obs := s.Logger, s.Observer
	if logger == nil && obs == nil {
		return user
	}
	msg := s.Component + ": circuit breaker state change"
	return func(from, to breaker.State) {
		if logger != nil {
			logger.LogAttrs(context.Background(), slog.LevelWarn, msg,
				slog.String("from", from.String()), slog.String("to", to.String()))
		}
		if obs != nil {
			obs.Observe(context.Background(), observe.Event{Kind: observe.BreakerState, Name: s.Name, From: from.String(), To: to.String()})
		}
		if user != nil {
			user(from, to)
		}
	}
}

// Destination is one destination's guards and the retry policy that uses
// them. It is immutable once made.
type Destination struct {
	Name   string
	Policy *retry.Policy
	Guards retry.Guards
	Logger *slog.Logger // labelled with the destination; nil: silent
}

// Layer is what a protocol layer (httpretry, grpcretry) knows to build its
// destinations.
type Layer struct {
	// Component names the layer in errors and log messages ("httpretry");
	// Label is the destination's attribute in log records ("host").
	Component, Label string
	// Retry are the user's retry options; Classify is the layer's
	// classifier, set after them.
	Retry    []retry.Option
	Classify func(error) bool
	// Budget and Breaker are the configurations each destination's guards
	// are built from (nil: none), unless Supply gives them.
	Budget  *budget.Config
	Breaker *breaker.Config
	Supply  func(name string) (retry.Guards, error)
	// Clock is the retry policy's clock (nil: the system's); Logger (not
	// yet labelled) and Observer are the layer's.
	Clock    retry.Clock
	Logger   *slog.Logger
	Observer observe.Observer
}

// New builds the destination named name.
func (l *Layer) New(name string) (*Destination, error) {
	d := &Destination{Name: name}
	if l.Logger != nil {
		d.Logger = l.Logger.With(slog.String(l.Label, name))
	}
	var err error
	if l.Supply != nil {
		if d.Guards, err = l.Supply(name); err != nil {
			return nil, fmt.Errorf("%s: guards for %s %q: %w", l.Component, l.Label, name, err)
		}
	} else if d.Guards, err = Build(Spec{
		Name: name, Component: l.Component,
		Budget: l.Budget, Breaker: l.Breaker, Clock: l.Clock,
		Logger: d.Logger, Observer: l.Observer,
	}); err != nil {
		return nil, err
	}
	opts := append(slices.Clip(l.Retry),
		retry.WithClassifier(l.Classify),
		retry.WithName(name),
		retry.WithObserver(l.Observer),
		retry.WithLogger(d.Logger),
		retry.WithGuards(d.Guards),
	)
	if d.Policy, err = retry.New(opts...); err != nil {
		return nil, err
	}
	return d, nil
}
