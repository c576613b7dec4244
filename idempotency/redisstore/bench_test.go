package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
)

// BenchmarkNewRequest is what a new request costs the store: Begin (claim)
// then Complete. roundtrips/op counts socket writes to Redis over the whole
// run; commands/op counts commands seen by a go-redis hook.
func BenchmarkNewRequest(b *testing.B) {
	ctx := context.Background()
	c, rt := client(b, 1)
	s := newStore(b, c)
	if err := s.LoadScripts(ctx); err != nil {
		b.Fatal(err)
	}
	fp := idempotency.NewFingerprint("POST", "/payments", [32]byte{})
	rec := idempotency.Record{Status: 201, Body: []byte(`{"id":"pay_123","status":"captured"}`)}
	keys := make([]idempotency.Key, b.N)
	for i := range keys {
		keys[i] = idempotency.HashKey("tenant", idempotency.NewKey())
	}
	rt.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		res, err := s.Begin(ctx, keys[i], fp, time.Minute)
		if err != nil || res.Outcome != idempotency.Claimed {
			b.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		if err := s.Complete(ctx, keys[i], res.Owner, rec, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rt.writes.Load())/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(rt.commands.Load())/float64(b.N), "commands/op")
}

// BenchmarkReplay is what a replayed request costs the store: one Begin
// that finds the stored record.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	c, rt := client(b, 1)
	s := newStore(b, c)
	fp := idempotency.NewFingerprint("POST", "/payments", [32]byte{})
	rec := idempotency.Record{Status: 201, Body: []byte(`{"id":"pay_123","status":"captured"}`)}
	k := idempotency.HashKey("tenant", idempotency.NewKey())
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
		b.Fatal(err)
	}
	rt.reset()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		res, err := s.Begin(ctx, k, fp, time.Minute)
		if err != nil || res.Outcome != idempotency.Completed {
			b.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rt.writes.Load())/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(rt.commands.Load())/float64(b.N), "commands/op")
}
