package pgstore_test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// TestEndToEnd: the retrying client with automatic keys, through a proxy
// that resets 10% of requests before forwarding and drops 20% of the
// answers after the handler ran, against two servers, each with its own
// pgstore.Store over its own pool, sharing one table: every one of
// idemtest.Payments (10,000 by default) is applied exactly once.
func TestEndToEnd(t *testing.T) {
	const conns = 16 // per server
	p1, _ := pool(t, conns)
	p2, _ := pool(t, conns)
	table := "sg_idem_e2e_" + strings.ToLower(rand.Text())
	s1, err := pgstore.New(p1, pgstore.Config{Table: table})
	if err != nil {
		t.Fatalf("New(pool 1): %v", err)
	}
	if err := s1.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() {
		if err := s1.DropTable(context.Background()); err != nil {
			t.Errorf("DropTable: %v", err)
		}
	})
	s2, err := pgstore.New(p2, pgstore.Config{Table: table})
	if err != nil {
		t.Fatalf("New(pool 2): %v", err)
	}
	idemtest.RunTest(t, idemtest.Config{
		Stores:   []idempotency.Store{s1, s2},
		Payments: idemtest.Payments(t),
	})
}
