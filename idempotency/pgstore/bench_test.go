package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// BenchmarkNewRequest is what a new request costs the store: Begin (claim)
// then Complete. roundtrips/op counts socket writes to the server, measured
// over the whole run (statements are prepared on first use).
func BenchmarkNewRequest(b *testing.B) {
	ctx := context.Background()
	p, rt := pool(b, 1)
	s := newStore(b, p)
	fp := store.NewFingerprint("POST", "/payments", [32]byte{})
	rec := store.Record{Status: 201, Body: []byte(`{"id":"pay_123","status":"captured"}`)}
	keys := make([]store.ID, b.N)
	for i := range keys {
		keys[i] = testID("tenant", idempotency.NewKey())
	}
	warm(b, s)
	rt.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		res, err := s.Begin(ctx, keys[i], fp, time.Minute)
		if err != nil || res.Outcome != store.Claimed {
			b.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		if err := s.Complete(ctx, keys[i], res.Owner, rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rt.writes.Load())/float64(b.N), "roundtrips/op")
}

// BenchmarkReplay is what a replayed request costs the store: one Begin
// that finds the stored record.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	p, rt := pool(b, 1)
	s := newStore(b, p)
	fp := store.NewFingerprint("POST", "/payments", [32]byte{})
	rec := store.Record{Status: 201, Body: []byte(`{"id":"pay_123","status":"captured"}`)}
	k := testID("tenant", idempotency.NewKey())
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
		b.Fatal(err)
	}
	warm(b, s)
	rt.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		res, err := s.Begin(ctx, k, fp, time.Minute)
		if err != nil || res.Outcome != store.Completed {
			b.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rt.writes.Load())/float64(b.N), "roundtrips/op")
}

// warm prepares the statements on the pool's connection.
func warm(b *testing.B, s store.Store) {
	b.Helper()
	ctx := context.Background()
	k := testID("warm", idempotency.NewKey())
	res, err := s.Begin(ctx, k, store.Fingerprint{}, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 200}, time.Hour); err != nil {
		b.Fatal(err)
	}
}
