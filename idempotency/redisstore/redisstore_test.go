package redisstore_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

const (
	addrEnv = "STORMGUARD_REDIS_ADDR"
)

// roundTrips counts what the client sends to Redis: commands seen by a
// go-redis hook, and writes on the socket (each one request the client then
// waits on).
type roundTrips struct {
	commands, writes atomic.Int64
}

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{conn, &c.writes}, nil
	}
}

func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.commands.Add(1)
		return next(ctx, cmd)
	}
}

func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.commands.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (c *roundTrips) reset() {
	c.commands.Store(0)
	c.writes.Store(0)
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// client connects to the server named by STORMGUARD_REDIS_ADDR. Without the
// variable it skips t, unless STORMGUARD_REQUIRE_SERVICES=1; with it, an
// unreachable server fails t.
func client(t testing.TB, poolSize int) (*redis.Client, *roundTrips) {
	t.Helper()
	addr := storetest.ServiceAddress(t, addrEnv, "Redis", "127.0.0.1:6379")
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize})
	rt := &roundTrips{}
	c.AddHook(rt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		t.Fatalf("Redis at %s=%s unreachable: %v", addrEnv, addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c, rt
}

// newStore returns a store under a prefix of its own; its keys are deleted
// at cleanup.
func newStore(t testing.TB, c *redis.Client) *redisstore.Store {
	t.Helper()
	prefix := "stormguard-test:" + rand.Text() + ":"
	s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("cleanup scan: %v", err)
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("cleanup del: %v", err)
			}
		}
	})
	return s
}

func TestConformance(t *testing.T) {
	c, _ := client(t, 32)
	storetest.Run(t, func(t *testing.T) (store.Store, func(time.Duration)) {
		// Redis expires keys on its own clock: nothing to advance, the
		// suite uses short TTLs and polls.
		return newStore(t, c), nil
	})
}

// testID returns a store ID made of parts.
func testID(parts ...string) store.ID {
	return store.ID(sha256.Sum256([]byte(strings.Join(parts, "\x00"))))
}

func TestNewErrors(t *testing.T) {
	if _, err := redisstore.New(nil, redisstore.Config{}); err == nil {
		t.Error("New(nil client) = nil error")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redisstore.New(c, redisstore.Config{Replicas: -1}); err == nil {
		t.Error("New(Replicas -1) = nil error")
	}
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	defer ring.Close()
	if _, err := redisstore.New(ring, redisstore.Config{Replicas: 1}); err == nil {
		t.Error("New(a Ring, Replicas 1) = nil error: a Ring cannot wait for replicas")
	}
	if _, err := redisstore.New(ring, redisstore.Config{}); err != nil {
		t.Errorf("New(a Ring) error: %v", err)
	}
}

// TestReplicasUnconfirmed: with Replicas 1 on a Redis that has no replica,
// a claim is made but no replica confirms it: Begin fails, and the claim is
// released (the key is free), not left to the lock timeout. Completion and
// renewal fail likewise (and are tried again by the middleware).
func TestReplicasUnconfirmed(t *testing.T) {
	c, _ := client(t, 2)
	prefix := "stormguard-test:" + rand.Text() + ":"
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	plain, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	s, err := redisstore.New(c, redisstore.Config{Prefix: prefix, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	k := testID("s", idempotency.NewKey())
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := s.Begin(ctx, k, store.Fingerprint{}, time.Minute); err == nil || !strings.Contains(err.Error(), "replicas") {
		t.Fatalf("Begin with Replicas 1 and no replica: %v, want an error saying no replica confirmed it", err)
	}
	res, err := plain.Begin(context.Background(), k, store.Fingerprint{}, time.Minute)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin after the unconfirmed claim = %v, %v; want claimed (it was released)", res.Outcome, err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 201}, time.Hour); err == nil || errors.Is(err, store.ErrStaleOwner) {
		t.Fatalf("Complete with Replicas 1 and no replica: %v, want an error other than ErrStaleOwner", err)
	}
}

func TestKeysAreHashed(t *testing.T) {
	ctx := context.Background()
	c, _ := client(t, 2)
	s := newStore(t, c)
	raw := "order-4711-" + rand.Text()
	k := testID("tenant-a", raw)
	res, err := s.Begin(ctx, k, store.Fingerprint{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "*"+hex.EncodeToString(k[:])).Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("KEYS *%x = %v, %v; want one key", k, keys, err)
	}
	if n, err := c.Keys(ctx, "*"+raw+"*").Result(); err != nil || len(n) != 0 {
		t.Fatalf("KEYS *raw* = %v, %v; want none: the raw key must not reach Redis", n, err)
	}
	ttl, err := c.PTTL(ctx, keys[0]).Result()
	if err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("PTTL(completed key) = %v, %v; want about 1h (the retention)", ttl, err)
	}
}

func TestCorruptEntry(t *testing.T) {
	ctx := context.Background()
	c, _ := client(t, 2)
	prefix := "stormguard-test:" + rand.Text() + ":"
	s, _ := redisstore.New(c, redisstore.Config{Prefix: prefix})
	k := testID("s", "k")
	for _, v := range []string{"", "garbage", "\x01c" + string(make([]byte, 48)) + "SGR\x01junk", "\x02p" + string(make([]byte, 48))} {
		if err := c.Set(ctx, prefix+hex.EncodeToString(k[:]), v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Begin(ctx, k, store.Fingerprint{}, time.Minute); err == nil || !strings.Contains(err.Error(), "corrupt") {
			t.Errorf("Begin on entry %q error = %v, want a corrupt entry", v, err)
		}
	}
	c.Del(ctx, prefix+hex.EncodeToString(k[:]))
}

func TestUnavailable(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 2 * time.Second})
	defer c.Close()
	s, _ := redisstore.New(c, redisstore.Config{})
	if _, err := s.Begin(context.Background(), testID("s", "k"), store.Fingerprint{}, time.Minute); err == nil {
		t.Fatal("Begin against a closed port: nil error")
	}
}

func TestBadTTL(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	s, _ := redisstore.New(c, redisstore.Config{})
	k := testID("s", "k")
	if _, err := s.Begin(context.Background(), k, store.Fingerprint{}, time.Microsecond); err == nil {
		t.Error("Begin(lockTTL 1µs) = nil error")
	}
	if err := s.Complete(context.Background(), k, store.Owner{}, store.Record{Status: 200}, 0); err == nil {
		t.Error("Complete(retention 0) = nil error")
	}
	if err := s.Extend(context.Background(), k, store.Owner{}, 999*time.Microsecond); err == nil {
		t.Error("Extend(lockTTL 999µs) = nil error")
	}
}

// TestRoundTrips checks one command and one socket write per call once
// Redis has the scripts: Begin, Complete, replay, Release.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	c, rt := client(t, 1)
	s := newStore(t, c)
	warm(t, s)
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	rec := store.Record{Status: 201, Body: []byte(`{"id":1}`)}
	k := testID("s", idempotency.NewKey())
	var owner store.Owner
	check := func(name string, f func()) {
		t.Helper()
		rt.reset()
		f()
		if cmds, w := rt.commands.Load(), rt.writes.Load(); cmds != 1 || w != 1 {
			t.Errorf("%s: %d commands, %d writes; want 1, 1", name, cmds, w)
		}
	}
	check("Begin (new key)", func() {
		res, err := s.Begin(ctx, k, fp, time.Minute)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		owner = res.Owner
	})
	check("Complete", func() {
		if err := s.Complete(ctx, k, owner, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("Begin (replay)", func() {
		if res, err := s.Begin(ctx, k, fp, time.Minute); err != nil || res.Outcome != store.Completed {
			t.Fatalf("replay Begin = %v, %v", res.Outcome, err)
		}
	})
	k2 := testID("s", idempotency.NewKey())
	res, _ := s.Begin(ctx, k2, fp, time.Minute)
	check("Release", func() {
		if err := s.Release(ctx, k2, res.Owner); err != nil {
			t.Fatal(err)
		}
	})
}

// TestExtendSetsPTTL: Extend moves the lock's Redis TTL to the new lock
// timeout.
func TestExtendSetsPTTL(t *testing.T) {
	ctx := context.Background()
	c, _ := client(t, 2)
	s := newStore(t, c)
	k := testID("s", idempotency.NewKey())
	res, err := s.Begin(ctx, k, store.Fingerprint{}, time.Second)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin = %v, %v", res.Outcome, err)
	}
	if err := s.Extend(ctx, k, res.Owner, time.Hour); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	keys, err := c.Keys(ctx, "*"+hex.EncodeToString(k[:])).Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("KEYS *%x = %v, %v; want one key", k, keys, err)
	}
	if ttl, err := c.PTTL(ctx, keys[0]).Result(); err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
		t.Fatalf("PTTL(extended lock) = %v, %v; want about 1h", ttl, err)
	}
}
