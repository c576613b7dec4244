package pgstore_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
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
// Their sessions commit without waiting for the WAL to reach the disk
// (synchronous_commit off, see asyncCommit).
//
// The two end-to-end runs call t.Parallel: each has a table of its own and
// checks what was applied and answered, not how fast, and they wait on the
// proxy's faults and lock timeouts more than they compute; the no-race
// pass of make test runs them at 10,000 payments each.
func e2eStores(t *testing.T) []store.Store {
	t.Helper()
	const conns = 16 // per server
	p1, _ := pool(t, conns, asyncCommit)
	p2, _ := pool(t, conns, asyncCommit)
	s1, table := newTable(t, p1)
	s2, err := pgstore.New(p2, pgstore.Config{Table: table})
	if err != nil {
		t.Fatalf("New(pool 2): %v", err)
	}
	return []store.Store{s1, s2}
}

// asyncCommit sets synchronous_commit off for the pool's sessions: a
// commit returns once its WAL is written, before it is flushed to disk.
// What other sessions see, and when, is unchanged (every statement still
// sees every commit before it, with the same locks and isolation); only
// a crash of PostgreSQL could lose the last commits, and no end-to-end run
// crashes it. The end-to-end runs check the store's statements under
// concurrency and faults, not PostgreSQL's durability; at 10,000 payments
// (about 40,000 commits) the flushes cost a quarter of the plain run's
// CPU, PostgreSQL's and the test's together (19.1 against 13.8 CPU-s).
func asyncCommit(cfg *pgxpool.Config) {
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
}
