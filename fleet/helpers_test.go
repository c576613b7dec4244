package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/retry"
)

const redisAddrEnv = "STORMGUARD_REDIS_ADDR"

// redisAddr returns the address of the Redis the tests use, skipping t
// without one (failing it if STORMGUARD_REQUIRE_SERVICES=1).
func redisAddr(t testing.TB) string {
	t.Helper()
	return storetest.ServiceAddress(t, redisAddrEnv, "Redis", "127.0.0.1:6379")
}

// newClient returns a client of addr that gives up on a round trip at its
// context's deadline and does not retry by itself, closed with t.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, PoolSize: 32})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisClient connects to the test Redis, and fails t if it does not
// answer.
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := newClient(t, redisAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s: %v", redisAddr(t), err)
	}
	return c
}

// uniqueName returns a fleet name no other test run uses.
func uniqueName(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test-" + hex.EncodeToString(b[:])
}

// cleanup deletes the keys of fleet name when t ends.
func cleanup(t testing.TB, c redis.UniversalClient, prefix, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if prefix == "" {
			prefix = DefaultPrefix
		}
		keys, _ := c.Keys(ctx, prefix+"{"+name+"}:*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
}

// eventually polls cond every 5 ms until it holds or d has passed (real
// time: for tests where Redis is involved), and reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// policy returns a retry policy on the fleet guards of host, with opts.
func policy(t testing.TB, f *Fleet, host string, opts ...retry.Option) *retry.Policy {
	t.Helper()
	g, err := f.Guards(host)
	if err != nil {
		t.Fatal(err)
	}
	p, err := retry.New(append([]retry.Option{retry.WithBudget(g.Budget), retry.WithBreaker(g.Breaker)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// until runs fn over and over on a goroutine of wg until stop is closed.
func until(wg *sync.WaitGroup, stop <-chan struct{}, fn func()) {
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			fn()
		}
	})
}

// sumRing returns the requests and retries a fleet hash holds, in every
// slice.
func sumRing(h map[string]int64) (q, r int64) {
	for f, v := range h {
		switch {
		case strings.HasPrefix(f, "bq"):
			q += v
		case strings.HasPrefix(f, "br"):
			r += v
		}
	}
	return q, r
}

// mustNew builds a fleet on be, closed with t.
func mustNew(t testing.TB, be backend, c Config) *Fleet {
	t.Helper()
	f, err := newFleet(be, c)
	if err != nil {
		t.Fatalf("newFleet(%+v): %v", c, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
