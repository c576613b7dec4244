package idempotency_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// TestEndToEnd: the retrying client with automatic keys
// (httpretry.WithAutoIdempotencyKey), through a proxy that resets 10% of
// requests before forwarding and drops 20% of the answers after the
// handler ran, against two servers sharing one MemoryStore: every one of
// idemtest.Payments (10,000 by default, 1,000 under -race; make test runs both) is applied exactly once by the
// handlers' ledger, and every call ends in success. It and
// TestEndToEndHostile run in parallel (each with a store of its own), as
// make test's no-race pass runs them at 10,000 payments.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	idemtest.RunTest(t, idemtest.Config{
		Stores:   []store.Store{mem, mem},
		Payments: idemtest.Payments(t),
	})
}

// TestEndToEndHostile: the same run with the server-side faults of
// idemtest.Hostile on top: answers cut mid-way (the server's client goes
// away while the handler writes), an http.TimeoutHandler in front of the
// middleware of one server, slow handlers that overrun it or give up
// without a word when their request is canceled. Every payment is applied
// once, and every answer and replay is the whole answer the handler
// produced.
func TestEndToEndHostile(t *testing.T) {
	t.Parallel()
	// Room for every answer: 10,000 of 16 KiB in one scope (the harness's
	// shared scope), which may take half the store.
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxBytes: 1 << 30})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	idemtest.RunTest(t, idemtest.Hostile(idemtest.Config{
		Stores:   []store.Store{mem, mem},
		Payments: idemtest.Payments(t),
	}))
}
