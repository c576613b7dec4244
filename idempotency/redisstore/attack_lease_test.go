package redisstore_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// DOC (idempotency/guard.go, ErrLockLost): the operation's context is
// canceled with ErrLockLost when "no renewal was confirmed for a whole
// lock timeout. Another request may claim the key, so the operation
// should stop." Two servers share one Redis; server A's link to Redis
// goes silent (a TCP proxy black-holes it) right after A claimed the key,
// server B's link works. Lock 2.4 s, store timeout 240 ms: A's renewals
// (every 800 ms, retried every 200 ms) time out, the last one ends at
// 2.36 s and the next is not sent until 2.56 s, so A's operation is told
// to stop only then, while Redis expired the lock at 2.4 s and B claimed
// the key at about 2.47 s: both operations run at once.
func TestAttackIdempRedisLockLostLateOverlap(t *testing.T) {
	addr := storetest.ServiceAddress(t, addrEnv, "Redis", "127.0.0.1:6379")
	direct, _ := client(t, 4)
	prefix := "stormguard-test:" + rand.Text() + ":"
	t.Cleanup(func() { deletePrefix(t, direct, prefix) })
	p, err := idemtest.NewTCPProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ca := redis.NewClient(&redis.Options{Addr: p.Addr()})
	t.Cleanup(func() { ca.Close() })
	sa, err := redisstore.New(ca, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := redisstore.New(direct, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	const lock, st = 2400 * time.Millisecond, 240 * time.Millisecond
	ga, err := idempotency.NewGuard(sa, idempotency.WithLockTimeout(lock), idempotency.WithStoreTimeout(st))
	if err != nil {
		t.Fatal(err)
	}
	gb, err := idempotency.NewGuard(sb, idempotency.WithLockTimeout(lock), idempotency.WithStoreTimeout(st))
	if err != nil {
		t.Fatal(err)
	}
	fp := store.NewFingerprint("POST", "/pay", sha256.Sum256([]byte("x")))
	var start time.Time
	var aCanceledAt atomic.Int64
	var actx context.Context
	claimed := make(chan struct{})
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		_, _, _ = ga.Run(context.Background(), "tenant", "k", fp, func(ctx context.Context) (store.Record, bool) {
			start, actx = time.Now(), ctx
			p.Blackhole(true)
			close(claimed)
			<-ctx.Done()
			aCanceledAt.Store(int64(time.Since(start)))
			return store.Record{Status: 201}, true
		})
	}()
	<-claimed
	var out store.Outcome
	var bAt time.Duration
	aAlive := false
	deadline := start.Add(lock + 100*time.Millisecond)
	for time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		out, _, err = gb.Run(context.Background(), "tenant", "k", fp, func(context.Context) (store.Record, bool) {
			bAt = time.Since(start)
			aAlive = actx.Err() == nil
			return store.Record{Status: 201}, true
		})
		if out != store.InProgress {
			break
		}
	}
	<-aDone
	t.Logf("B: outcome %q err %v at %v; A's context canceled at %v", out, err, bAt, time.Duration(aCanceledAt.Load()))
	if out == store.Claimed && aAlive {
		t.Errorf("B's operation ran at %v while A's, whose lock ran out at %v without a confirmed renewal, still ran with a live context (canceled at %v)", bAt, lock, time.Duration(aCanceledAt.Load()))
	}
}
