package httpretry

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// host is what a Transport keeps per destination host: its retry policy,
// with that host's budget and breaker. It is immutable once made.
type host struct {
	name    string
	policy  *retry.Policy
	budget  retry.Budget
	breaker *breaker.Breaker
}

// hosts is a bounded map from destination host to its state. Lookups read
// an immutable snapshot through one atomic load: no lock, no allocation,
// no cache line written. Adding a host (rare: once per host, or after an
// eviction) takes the mutex and publishes a new snapshot with the host
// added and, when the table is full, the host added first removed; it
// costs O(max) for the copy.
type hosts struct {
	max  int
	make func(name string) (*host, error)

	snap atomic.Pointer[map[string]*host] // never modified once stored

	mu    sync.Mutex
	order []string // guarded by mu: ring of keys in insertion order
	next  int      // guarded by mu: oldest entry of order once full
}

func newHosts(max int, mk func(string) (*host, error)) *hosts {
	h := &hosts{max: max, make: mk}
	h.snap.Store(&map[string]*host{})
	return h
}

// get returns the state of the host named name (case-insensitively),
// creating it if needed.
func (h *hosts) get(name string) (*host, error) {
	key := strings.ToLower(name) // no allocation when already lower case
	if st := (*h.snap.Load())[key]; st != nil {
		return st, nil
	}
	return h.add(key)
}

func (h *hosts) add(key string) (*host, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.snap.Load()
	if st := old[key]; st != nil {
		return st, nil
	}
	st, err := h.make(key)
	if err != nil {
		return nil, err
	}
	m := make(map[string]*host, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if len(h.order) < h.max {
		h.order = append(h.order, key)
	} else {
		delete(m, h.order[h.next])
		h.order[h.next] = key
		h.next = (h.next + 1) % h.max
	}
	m[key] = st
	h.snap.Store(&m)
	return st, nil
}

// len returns the number of hosts held.
func (h *hosts) len() int { return len(*h.snap.Load()) }

// all returns the hosts held, in no particular order.
func (h *hosts) all() []*host {
	m := *h.snap.Load()
	out := make([]*host, 0, len(m))
	for _, st := range m {
		out = append(out, st)
	}
	return out
}
