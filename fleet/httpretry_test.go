package fleet

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
)

// TestHTTPRetryGuards wires fleets into httpretry transports, one per
// process, against a server that answers 503: each process sends too few
// requests to trip its own breaker, the fleet trips all of them, and then
// no request reaches the server; the transports report the fleet's budget.
func TestHTTPRetryGuards(t *testing.T) {
	rc := redisClient(t)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	cfg := Config{Name: uniqueName(t), SyncEvery: 20 * time.Millisecond, Timeout: 2 * time.Second, MinCalls: 20,
		Breaker: breaker.Config{MinCalls: 100, OpenFor: time.Hour}}
	cleanup(t, rc, cfg.Name)
	fleets := newFleets(t, rc, 5, cfg)
	var clients []*http.Client
	var transports []*httpretry.Transport
	for _, f := range fleets {
		rt, err := httpretry.NewTransport(nil, httpretry.WithGuards(f.Guards))
		if err != nil {
			t.Fatal(err)
		}
		transports = append(transports, rt)
		clients = append(clients, &http.Client{Transport: rt})
	}
	get := func(c *http.Client) {
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
	}
	for _, c := range clients {
		for range 4 {
			get(c)
		}
	}
	if !eventually(2*time.Second, func() bool {
		for _, f := range fleets {
			if b, _ := f.hostBreaker(srv.Listener.Addr().String()); b.State() != breaker.Open {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the fleet did not open every breaker after %d failed attempts", hits.Load())
	}
	before := hits.Load()
	for _, c := range clients {
		for range 10 {
			get(c)
		}
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d requests reached the server through open fleet breakers", n)
	}
	hs := transports[0].Hosts()
	var window budget.Stats
	for _, g := range hs {
		if b, ok := g.Budget.(interface{ Stats() budget.Stats }); ok {
			window = b.Stats()
		}
	}
	if len(hs) != 1 || window.Requests == 0 {
		t.Errorf("Transport.Hosts() = %+v, want the fleet budget, with its window", hs)
	}
	t.Logf("%d attempts reached the server before the fleet tripped (5 processes, 20 requests); fleet budget %+v", before, window)
}
