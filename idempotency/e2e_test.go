package idempotency_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// TestEndToEnd: the retrying client with automatic keys
// (httpretry.WithAutoIdempotencyKey), through a proxy that resets 10% of
// requests before forwarding and drops 20% of the answers after the
// handler ran, against two servers sharing one MemoryStore: every one of
// idemtest.Payments (10,000 by default) is applied exactly once by the
// handlers' ledger, and every call ends in success.
func TestEndToEnd(t *testing.T) {
	store, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	idemtest.RunTest(t, idemtest.Config{
		Stores:   []idempotency.Store{store, store},
		Payments: idemtest.Payments(t),
	})
}
