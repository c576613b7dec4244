package pgstore_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// TestEndToEnd: the retrying client with automatic keys, through a proxy
// that resets 10% of requests before forwarding and drops 20% of the
// answers after the handler ran, against two servers, each with its own
// pgstore.Store over its own pool, sharing one table: every one of
// idemtest.Payments (10,000 by default, 1,000 under -race; make test runs both) is applied exactly once.
func TestEndToEnd(t *testing.T) {
	t.Parallel() // see e2eStores
	idemtest.RunTest(t, idemtest.Config{Stores: e2eStores(t), Payments: idemtest.Payments(t)})
}

// TestEndToEndHostile: the same with the server-side faults of
// idemtest.Hostile (answers cut mid-way, an http.TimeoutHandler in front of
// one server, slow handlers): every payment applied once, and every answer
// and replay the whole answer the handler produced.
func TestEndToEndHostile(t *testing.T) {
	t.Parallel() // see e2eStores
	idemtest.RunTest(t, idemtest.Hostile(idemtest.Config{Stores: e2eStores(t), Payments: idemtest.Payments(t)}))
}

// e2eStores returns two stores, each over its own pool, sharing one new
// table (dropped at cleanup).
//
// The two end-to-end runs call t.Parallel: each has a table of its own and
// checks what was applied and answered, not how fast, and they wait on the
// proxy's faults and lock timeouts more than they compute; the no-race
// pass of make test runs them at 10,000 payments each.
func e2eStores(t *testing.T) []store.Store {
	t.Helper()
	const conns = 16 // per server
	p1, _ := pool(t, conns)
	p2, _ := pool(t, conns)
	s1, table := newTable(t, p1)
	s2, err := pgstore.New(p2, pgstore.Config{Table: table})
	if err != nil {
		t.Fatalf("New(pool 2): %v", err)
	}
	return []store.Store{s1, s2}
}
