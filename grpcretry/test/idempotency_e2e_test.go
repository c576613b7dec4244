package test

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/grpcretry/test/internal/keyedtest"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

// The end-to-end tests: keyedtest.Payments (2,000 by default) payments
// through grpcretry's client (a key per payment, retried), over proxies
// that reset 3% of what clients send before the server sees it and cut 5%
// after it did (every call in flight on the connection fails), against
// two servers guarded by the idempotency interceptor: every payment
// applied exactly once, every call ends in success with the answer its
// handler produced.

// TestIdempotencyEndToEndMemory: the two servers share one MemoryStore.
func TestIdempotencyEndToEndMemory(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	keyedtest.RunTest(t, keyedtest.Config{Stores: []store.Store{mem, mem}, Payments: keyedtest.Payments(t)})
}

// TestIdempotencyEndToEndPostgreSQL: each server has its own pgstore.Store
// over its own pool; they share one table. Skipped without
// STORMGUARD_POSTGRES_URL (a failure with STORMGUARD_REQUIRE_SERVICES=1).
func TestIdempotencyEndToEndPostgreSQL(t *testing.T) {
	url := storetest.ServiceAddress(t, "STORMGUARD_POSTGRES_URL", "PostgreSQL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	table := "stormguard_grpc_e2e_" + strings.ToLower(rand.Text()[:12])
	stores := make([]store.Store, 2)
	for i := range stores {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatalf("STORMGUARD_POSTGRES_URL: %v", err)
		}
		cfg.MaxConns = keyedtest.DefaultWorkers
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatalf("PostgreSQL pool: %v", err)
		}
		t.Cleanup(pool.Close)
		s, err := pgstore.New(pool, pgstore.Config{Table: table})
		if err != nil {
			t.Fatalf("pgstore.New: %v", err)
		}
		if i == 0 {
			if err := s.Migrate(t.Context()); err != nil {
				t.Fatalf("PostgreSQL at %s: Migrate: %v", url, err)
			}
			t.Cleanup(func() {
				if _, err := pool.Exec(context.Background(), "DROP TABLE "+table); err != nil {
					t.Errorf("drop table %s: %v", table, err)
				}
			})
		}
		stores[i] = s
	}
	keyedtest.RunTest(t, keyedtest.Config{Stores: stores, Payments: keyedtest.Payments(t)})
}

// TestIdempotencyEndToEndRedis: each server has its own redisstore.Store
// over its own client; they share one Redis and one new key prefix. Skipped
// without STORMGUARD_REDIS_ADDR (a failure with
// STORMGUARD_REQUIRE_SERVICES=1).
func TestIdempotencyEndToEndRedis(t *testing.T) {
	addr := storetest.ServiceAddress(t, "STORMGUARD_REDIS_ADDR", "Redis", "127.0.0.1:6379")
	prefix := "stormguard-grpc-e2e:" + rand.Text() + ":"
	stores := make([]store.Store, 2)
	for i := range stores {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: keyedtest.DefaultWorkers})
		t.Cleanup(func() { _ = c.Close() })
		if err := c.Ping(t.Context()).Err(); err != nil {
			t.Fatalf("Redis at %s: %v", addr, err)
		}
		s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
		if err != nil {
			t.Fatalf("redisstore.New: %v", err)
		}
		stores[i] = s
	}
	// The keys expire within a minute of the run: nothing to clean up.
	keyedtest.RunTest(t, keyedtest.Config{Stores: stores, Payments: keyedtest.Payments(t),
		Guard: []idempotency.GuardOption{idempotency.WithRetention(time.Minute)}})
}
