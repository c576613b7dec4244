package idemtest_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// BenchmarkRun measures one logical payment end to end (client transport,
// lossy proxy, two servers sharing a MemoryStore, default fault rates):
// ns/op and allocs/op are per payment, all three processes' sides
// included, set-up amortised over b.N payments.
func BenchmarkRun(b *testing.B) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		b.Fatalf("NewMemoryStore: %v", err)
	}
	b.ReportAllocs()
	res, err := idemtest.Run(b.Context(), idemtest.Config{Stores: []store.Store{mem, mem}, Payments: b.N})
	if err != nil {
		b.Fatalf("Run: %v", err)
	}
	if res.Duplicates != 0 || res.Lost != 0 || res.Failed != 0 {
		b.Fatalf("Run(%d payments): %d duplicates, %d lost, %d failed; want 0", b.N, res.Duplicates, res.Lost, res.Failed)
	}
	b.ReportMetric(float64(res.Proxy.Requests)/float64(b.N), "requests/op")
}
