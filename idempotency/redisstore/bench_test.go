package redisstore_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
)

// BenchmarkNewRequest is what a new request costs the store: Begin (claim)
// then Complete. roundtrips/op counts socket writes to Redis over the whole
// run; commands/op counts commands seen by a go-redis hook.
func BenchmarkNewRequest(b *testing.B) {
	c, rt := client(b, 1)
	s := newStore(b, c)
	benchNewRequests(b, s, rt.reset)
	b.ReportMetric(float64(rt.writes.Load())/float64(b.N), "roundtrips/op")
	b.ReportMetric(float64(rt.commands.Load())/float64(b.N), "commands/op")
}

// BenchmarkReplay is what a replayed request costs the store: one Begin
// that finds the stored record.
func BenchmarkReplay(b *testing.B) {
	ctx := context.Background()
	c, rt := client(b, 1)
	s := newStore(b, c)
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
	b.ReportMetric(float64(rt.commands.Load())/float64(b.N), "commands/op")
}

// warm has Redis cache the store's scripts: it runs a claim, a renewal, a
// completion and a release on keys of its own (the first EVALSHA of each
// script meets NOSCRIPT and falls back to EVAL, which caches it).
func warm(tb testing.TB, s *redisstore.Store) {
	tb.Helper()
	ctx := context.Background()
	for _, done := range []bool{true, false} {
		k := testID("warm", idempotency.NewKey())
		res, err := s.Begin(ctx, k, store.Fingerprint{}, time.Minute)
		if err == nil {
			err = s.Extend(ctx, k, res.Owner, time.Minute)
		}
		if err == nil && done {
			err = s.Complete(ctx, k, res.Owner, store.Record{Status: 200}, time.Minute)
		} else if err == nil {
			err = s.Release(ctx, k, res.Owner)
		}
		if err != nil {
			tb.Fatalf("warm: %v", err)
		}
	}
}

// BenchmarkClusterNewRequest is what a new request costs the store on a
// Redis Cluster the benchmark starts (3 masters, a replica each, on
// loopback): Begin then Complete, through a *redis.ClusterClient, without
// waiting for replicas and with Replicas 1 (each write followed by WAIT 1
// on its master's connection).
func BenchmarkClusterNewRequest(b *testing.B) {
	c := startCluster(b, 3)
	cc := c.client()
	for _, replicas := range []int{0, 1} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			s, err := redisstore.New(cc, redisstore.Config{Prefix: "bench:" + rand.Text() + ":", Replicas: replicas})
			if err != nil {
				b.Fatal(err)
			}
			benchNewRequests(b, s, nil)
		})
	}
}

// benchNewRequests has s claim and complete b.N new keys, timed; reset, if
// not nil, runs just before the timer starts.
func benchNewRequests(b *testing.B, s *redisstore.Store, reset func()) {
	ctx := context.Background()
	warm(b, s)
	fp := store.NewFingerprint("POST", "/payments", [32]byte{})
	rec := store.Record{Status: 201, Body: []byte(`{"id":"pay_123","status":"captured"}`)}
	keys := make([]store.ID, b.N)
	for i := range keys {
		keys[i] = testID("tenant", idempotency.NewKey())
	}
	if reset != nil {
		reset()
	}
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
}
