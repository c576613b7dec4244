package httpretry

import (
	"context"
	"strings"
	"unicode/utf8"

	"github.com/stormguard/stormguard/internal/guards"
)

// host is what a Transport keeps per destination host: its retry policy,
// with that host's budget and breaker. It is immutable once made.
type host = guards.Destination

// hosts is the bounded table of destination hosts, keyed by the lower-cased
// URL.Host.
type hosts struct{ t *guards.Table[*host] }

func newHosts(max int, mk func(string) (*host, error)) *hosts {
	t := guards.NewTable(max, mk)
	t.Forget = (*host).Forget // an evicted host's breaker leaves the observer's gauge
	t.Follow = (*host).Follow // a host back before that is told after it
	return &hosts{t}
}

// get returns the state of the host named name (case-insensitively),
// creating it if needed.
func (h *hosts) get(name string) (*host, error) {
	return h.t.Get(lowerHost(name))
}

// lowerHost returns name lower-cased as strings.ToLower does: name itself
// when it is ASCII without an upper-case letter (the usual host name, checked
// in one short pass), else strings.ToLower's result.
func lowerHost(name string) string {
	for i := 0; i < len(name); i++ {
		if c := name[i]; c-'A' < 26 || c >= utf8.RuneSelf {
			return strings.ToLower(name)
		}
	}
	return name
}

// len returns the number of hosts held.
func (h *hosts) len() int { return h.t.Len() }

// all returns the hosts held, in no particular order.
func (h *hosts) all() []*host {
	m := h.t.All()
	out := make([]*host, 0, len(m))
	for _, st := range m {
		out = append(out, st)
	}
	return out
}

// noWait is a context that is already canceled: a limiter's Acquire with
// it takes a free slot or refuses at once (a call without a deadline would
// wait for one). It is never modified.
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
