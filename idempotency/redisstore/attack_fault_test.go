package redisstore_test

// Black-box fault attack (AREA idemfault): a TCP proxy the test controls sits
// between the store client and the server; it cuts, delays or blackholes the
// link at chosen moments while requests with the same key run concurrently
// (the scenarios: internal/idemtest's RunFaults).

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/internal/idemtest"
)

var fltSeq atomic.Int64

// fltStores returns a store reaching Redis through a fresh proxy (a
// go-redis client with its default options), a second store on the same
// prefix directly, and the proxy.
func fltStores(t *testing.T) (proxied, direct store.Store, p *idemtest.FaultProxy) {
	addr := storetest.ServiceAddress(t, "STORMGUARD_REDIS_ADDR", "Redis", "127.0.0.1:6379")
	p = idemtest.NewFaultProxy(t, addr)
	dc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	pc := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { p.Close(); pc.Close() })
	prefix := fmt.Sprintf("flt-idemfault:%d:%d:", time.Now().UnixNano(), fltSeq.Add(1))
	t.Cleanup(func() {
		ctx := context.Background()
		iter := dc.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			dc.Del(ctx, iter.Val())
		}
		dc.Close()
	})
	ds, err := redisstore.New(dc, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := redisstore.New(pc, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return ps, ds, p
}

// TestAttackFault runs the fault scenarios (internal/idemtest.RunFaults)
// on this store through a TCP proxy.
func TestAttackFault(t *testing.T) {
	idemtest.RunFaults(t, fltStores)
}
