package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
)

// TestLostClaimReleased: on a Redis of its own that stalls 400 ms (DEBUG
// SLEEP: what a slow command, a fork or a swapped page does to the single
// thread), a claim times out after it was sent, and lands after Begin
// failed (Redis reads it once awake, before it sees the connection closed). Begin reports the
// claim's owner token with its error (store.Result.Owner), and nothing
// when nothing was sent (a context already over, a dial refused); the
// Guard answers "store unavailable" without running and releases the
// late claim, so that the client's retry runs within seconds, not at the
// lock timeout (30 s), where it was answered "in progress" until then.
func TestLostClaimReleased(t *testing.T) {
	c := ownRedis(t, "--enable-debug-command", "yes")
	admin := redis.NewClient(&redis.Options{Addr: c.Options().Addr})
	t.Cleanup(func() { admin.Close() })
	ctx := context.Background()
	s, err := redisstore.New(c, redisstore.Config{Prefix: "lost:"})
	if err != nil {
		t.Fatal(err)
	}
	fp := store.NewFingerprint("POST", "/pay", [32]byte{5})
	// stall stalls the server 400 ms from now.
	stall := func() {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- admin.Do(ctx, "DEBUG", "SLEEP", "0.4").Err() }()
		time.Sleep(20 * time.Millisecond) // the sleep under way
		t.Cleanup(func() {
			if err := <-done; err != nil {
				t.Errorf("DEBUG SLEEP: %v", err)
			}
		})
	}

	t.Run("context already over", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		res, err := s.Begin(cctx, store.ID{1}, fp, time.Minute)
		if err == nil || res.Owner != (store.Owner{}) {
			t.Errorf("Begin: owner %x, %v; want an error and no owner", res.Owner, err)
		}
	})
	t.Run("dial refused", func(t *testing.T) {
		closed := "127.0.0.1:" + strconv.Itoa(freePort(t))
		expectRefusedDials(closed)
		dc := redis.NewClient(&redis.Options{Addr: closed, MaxRetries: -1})
		defer dc.Close()
		ds, _ := redisstore.New(dc, redisstore.Config{Prefix: "lost:"})
		res, err := ds.Begin(ctx, store.ID{2}, fp, time.Minute)
		if err == nil || res.Owner != (store.Owner{}) {
			t.Errorf("Begin: owner %x, %v; want an error and no owner", res.Owner, err)
		}
	})
	t.Run("claim sent to a stalled server", func(t *testing.T) {
		stall()
		bctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		res, err := s.Begin(bctx, store.ID{3}, fp, time.Minute)
		cancel()
		if err == nil || res.Owner == (store.Owner{}) {
			t.Fatalf("Begin: owner %x, %v; want an error and the claim's owner", res.Owner, err)
		}
		time.Sleep(500 * time.Millisecond) // the stall is over: the claim ran
		if err := s.Release(ctx, store.ID{3}, res.Owner); err != nil {
			t.Errorf("Release of the reported owner after the stall: %v; want the late claim released", err)
		}
	})
	t.Run("Guard", func(t *testing.T) {
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(30*time.Second), idempotency.WithStoreTimeout(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		fn := func(context.Context) (store.Record, bool) {
			runs.Add(1)
			return store.Record{Status: 201}, true
		}
		key := idempotency.NewKey()
		stall()
		start := time.Now()
		out, _, err := g.Run(ctx, "s", key, fp, fn)
		if !errors.Is(err, idempotency.ErrStoreUnavailable) || runs.Load() != 0 {
			t.Fatalf("first Run: %q, %v, %d runs; want ErrStoreUnavailable, no run", out, err, runs.Load())
		}
		inProgress := 0
		for time.Since(start) < 10*time.Second {
			time.Sleep(50 * time.Millisecond)
			out, _, err = g.Run(ctx, "s", key, fp, fn)
			if err == nil && out != store.InProgress {
				break
			}
			if out == store.InProgress {
				inProgress++
			}
		}
		t.Logf("the retry: %q, %v, %v after the first Run began, after %d answers \"in progress\"", out, err, time.Since(start).Round(time.Millisecond), inProgress)
		if out != store.Claimed || runs.Load() != 1 || inProgress == 0 {
			t.Errorf("the retry: %q, %v, %d runs, %d in progress; want claimed within 10 s (lock timeout 30 s), once, after the late claim was seen", out, err, runs.Load(), inProgress)
		}
	})
}
