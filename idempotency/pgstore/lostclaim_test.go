package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// TestBeginReportsLostClaimOwner: a Begin that fails once its statement
// was sent returns the claim's owner token with the error
// (store.Result.Owner), and one that sent nothing returns none: a context
// already over, a pool with no connection to give before the deadline, a
// statement still waiting on a row lock at the deadline (pgx then asks
// the server to cancel it, which may come too late).
func TestBeginReportsLostClaimOwner(t *testing.T) {
	p, _ := pool(t, 2)
	s, table := newTable(t, p)
	ctx := context.Background()
	fp := store.NewFingerprint("POST", "/pay", [32]byte{4})
	id := store.ID{9}
	// The key's row, an expired lock, so that a claim waits on its row lock.
	if _, err := s.Begin(ctx, id, fp, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)

	for _, c := range []struct {
		name      string
		setup     func(t *testing.T) func() // returns the undo
		wantOwner bool
	}{
		{"context already over", nil, false},
		{"no connection in the pool", func(t *testing.T) func() {
			c1, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := p.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return func() { c1.Release(); c2.Release() }
		}, false},
		{"statement in flight at the deadline", func(t *testing.T) func() {
			tx, err := p.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, "SELECT 1 FROM "+table+" FOR UPDATE"); err != nil {
				t.Fatal(err)
			}
			return func() { _ = tx.Rollback(ctx) }
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			undo := func() {}
			if c.setup != nil {
				undo = c.setup(t)
			}
			bctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			if c.setup == nil {
				cancel()
			}
			res, err := s.Begin(bctx, id, fp, time.Minute)
			cancel()
			undo()
			t.Logf("Begin: %+v, %v", res.Owner, err)
			if err == nil {
				t.Fatalf("Begin succeeded (%q), want an error", res.Outcome)
			}
			if got := res.Owner != (store.Owner{}); got != c.wantOwner || res.Outcome != "" {
				t.Errorf("Begin failed with outcome %q, owner reported %v; want no outcome, owner reported %v", res.Outcome, got, c.wantOwner)
			}
		})
	}
}
