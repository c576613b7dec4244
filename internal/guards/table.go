// Package guards holds what the protocol layers (httpretry per host,
// grpcretry per target) share: a bounded table of per-destination state,
// and the one place that builds a destination's guards and the retry policy
// that uses them.
//
// The package is kept in two copies, internal/guards of the root module and
// grpcretry/internal/guards, equal byte for byte (the root module's
// internal/copycheck's TestRepositoryCopies checks): a module must not import another module's
// internal package, whose changes would break its released versions.
package guards

import (
	"sync"
	"sync/atomic"
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

	mu      sync.Mutex
	order   []string            // guarded by mu: names in insertion order, a ring once full
	next    int                 // guarded by mu: the oldest entry of order once full
	leaving map[string]*left[T] // guarded by mu: names evicted whose Forget has not returned

	// Forget, if not nil, is called with the state of a name evicted to
	// make room, after the table let it go (outside its lock). Follow, if
	// not nil, is called (under the table's lock, before anybody can use
	// it) with the state built for a name that comes back while the Forget
	// of its evicted state has not returned yet, and that state: so that
	// the new state can have the old one forgotten first. Set them before
	// the table is used.
	Forget func(T)
	Follow func(next, prev T)
}

// left is a state evicted whose Forget has not returned.
type left[T any] struct{ v T }

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
	v, gone, goneName, err := t.addLocked(name)
	if gone != nil {
		t.Forget(gone.v)
		t.mu.Lock()
		if t.leaving[goneName] == gone {
			delete(t.leaving, goneName)
		}
		t.mu.Unlock()
	}
	return v, err
}

// addLocked adds name under the lock and returns its state and, if a name
// was evicted to make room and Forget is set, that name and its state,
// recorded as leaving until Forget returns.
func (t *Table[T]) addLocked(name string) (v T, gone *left[T], goneName string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.snap.Load()
	if v, ok := old[name]; ok {
		return v, nil, "", nil
	}
	v, err = t.make(name)
	if err != nil {
		return v, nil, "", err
	}
	if prev, ok := t.leaving[name]; ok && t.Follow != nil {
		t.Follow(v, prev.v)
	}
	m := make(map[string]T, len(old)+1)
	for k, x := range old {
		m[k] = x
	}
	if len(t.order) < t.max {
		t.order = append(t.order, name)
	} else {
		goneName = t.order[t.next]
		if t.Forget != nil {
			gone = &left[T]{m[goneName]}
			if t.leaving == nil {
				t.leaving = make(map[string]*left[T])
			}
			t.leaving[goneName] = gone
		}
		delete(m, goneName)
		t.order[t.next] = name
		t.next = (t.next + 1) % t.max
	}
	m[name] = v
	t.snap.Store(&m)
	t.last.Store(nil) // it may be the name just evicted
	return v, gone, goneName, nil
}

// Len returns the number of names held.
func (t *Table[T]) Len() int { return len(*t.snap.Load()) }

// All returns the names held and their states, in no particular order.
func (t *Table[T]) All() map[string]T { return *t.snap.Load() }
