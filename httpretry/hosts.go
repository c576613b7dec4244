package httpretry

import (
	"strings"
	"sync"

	"github.com/stormguard/stormguard/retry"
)

// host is what a Transport keeps per destination host: two retry policies
// sharing that host's budget and breaker, one for requests that may be
// retried and a one-attempt one for those that may not (so their failures
// still reach the breaker). It is immutable once made.
type host struct {
	retrying *retry.Policy
	single   *retry.Policy
}

// hosts is a bounded map from destination host to its state. Lookups of a
// known host take the read lock and allocate nothing; adding a host takes
// the write lock and, when the table is full, forgets the host that was
// added first.
type hosts struct {
	max  int
	make func(name string) (*host, error)

	mu    sync.RWMutex
	m     map[string]*host // guarded by mu
	order []string         // guarded by mu: ring of keys in insertion order
	next  int              // guarded by mu: oldest entry of order once full
}

func newHosts(max int, mk func(string) (*host, error)) *hosts {
	return &hosts{max: max, make: mk, m: make(map[string]*host)}
}

// get returns the state of the host named name (case-insensitively),
// creating it if needed.
func (h *hosts) get(name string) (*host, error) {
	key := strings.ToLower(name) // no allocation when already lower case
	h.mu.RLock()
	st := h.m[key]
	h.mu.RUnlock()
	if st != nil {
		return st, nil
	}
	return h.add(key)
}

func (h *hosts) add(key string) (*host, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.m[key]; st != nil {
		return st, nil
	}
	st, err := h.make(key)
	if err != nil {
		return nil, err
	}
	if len(h.order) < h.max {
		h.order = append(h.order, key)
	} else {
		delete(h.m, h.order[h.next])
		h.order[h.next] = key
		h.next = (h.next + 1) % h.max
	}
	h.m[key] = st
	return st, nil
}

// len returns the number of hosts held.
func (h *hosts) len() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.m)
}
