package redisstore_test

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// TestEndToEnd: the retrying client with automatic keys, through a proxy
// that resets 10% of requests before forwarding and drops 20% of the
// answers after the handler ran, against two servers, each with its own
// redisstore.Store over its own client, sharing one Redis and one prefix:
// every one of idemtest.Payments (10,000 by default, 1,000 under -race; make test runs both) is applied exactly
// once.
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

// e2eStores returns two stores, each over its own client, sharing one new
// prefix (deleted at cleanup).
//
// The end-to-end runs and the cluster tests (TestClusterFailover,
// TestClusterLostWrite: a cluster of their own each, on free ports) call
// t.Parallel: each has keys or servers of its own and checks what was
// applied and answered, not how fast, and they mostly wait (on the proxy's
// faults, lock timeouts, failovers): 10 CPU-s in the package's 40-50 s
// under -race at main, one after the other.
func e2eStores(t *testing.T) []store.Store {
	t.Helper()
	const conns = 16 // per server
	c1, _ := client(t, conns)
	c2, _ := client(t, conns)
	prefix := "stormguard-e2e:" + rand.Text() + ":"
	t.Cleanup(func() { deletePrefix(t, c1, prefix) })
	var stores []store.Store
	for i, c := range []*redis.Client{c1, c2} {
		s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
		if err != nil {
			t.Fatalf("New(client %d): %v", i+1, err)
		}
		stores = append(stores, s)
	}
	return stores
}

// deletePrefix deletes every key under prefix.
func deletePrefix(t *testing.T, c *redis.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Errorf("cleanup scan: %v", err)
	}
	for len(keys) > 0 {
		n := min(len(keys), 1000)
		if err := c.Del(ctx, keys[:n]...).Err(); err != nil {
			t.Errorf("cleanup del: %v", err)
			return
		}
		keys = keys[n:]
	}
}
