// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package redisstore_test

import (
	"context"
	"crypto/rand"
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

// TestAttackLockTimeoutRoundedDown: WithLockTimeout accepts any duration of at
// least 1 ms, and the Guard keeps the lock "until no renewal was confirmed
// for a whole lock timeout"; Redis rounds the TTL down to whole ms. With
// a lock timeout of 2.999 ms and renewals that cannot reach Redis, another
// request claims the key and runs its handler less than a lock timeout
// after the first claim, while the first handler still runs with a live
// context (its Guard has not lost the lock).
func TestAttackLockTimeoutRoundedDown(t *testing.T) { atkRounding(t, 2999*time.Microsecond) }

// Control: a whole-millisecond lock timeout, nothing rounded.
func TestAttackLockTimeoutWholeMsControl(t *testing.T) { atkRounding(t, 3*time.Millisecond) }

func atkRounding(t *testing.T, lt time.Duration) {
	direct, _ := client(t, 4)
	addr := storetest.ServiceAddress(t, addrEnv, "Redis", "127.0.0.1:6379")

	violations, claimedByB := 0, 0
	for attempt := range 30 {
		prefix := "stormguard-attack-stores:" + rand.Text() + ":"
		t.Cleanup(func() { deletePrefix(t, direct, prefix) })
		p, err := idemtest.NewTCPProxy(addr)
		if err != nil {
			t.Fatal(err)
		}
		ca := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1})
		if err := ca.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		sa, _ := redisstore.New(ca, redisstore.Config{Prefix: prefix})
		sb, _ := redisstore.New(direct, redisstore.Config{Prefix: prefix})
		ga, err := idempotency.NewGuard(sa, idempotency.WithLockTimeout(lt), idempotency.WithStoreTimeout(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		gb, _ := idempotency.NewGuard(sb, idempotency.WithLockTimeout(time.Minute))
		key := idempotency.NewKey()
		fp := store.NewFingerprint("POST", "/pay", [32]byte{})
		rec := store.Record{Status: 201, Body: []byte("paid")}

		var aCtx atomic.Value
		aStarted, aDone, bRan := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var tB time.Time
		var aCauseAtB error
		aCanceledAtB := true
		var runs atomic.Int32
		tStart := time.Now()
		go func() {
			defer close(aDone)
			_, _, _ = ga.Run(context.Background(), "s", key, fp, func(ctx context.Context) (store.Record, bool) {
				runs.Add(1)
				p.Blackhole(true) // renewals (and the completion) no longer reach Redis
				aCtx.Store(ctx)
				close(aStarted)
				select {
				case <-bRan:
				case <-time.After(30 * time.Millisecond):
				}
				return rec, true
			})
		}()
		// A's claim answered late (a third of the lock timeout: about a
		// millisecond, under -race or a loaded machine) is confirmed before
		// its handler runs, and may not be: then A does not run at all.
		select {
		case <-aStarted:
		case <-aDone:
			p.Close()
			ca.Close()
			continue
		}
		for time.Since(tStart) < 20*time.Millisecond {
			out, _, err := gb.Run(context.Background(), "s", key, fp, func(context.Context) (store.Record, bool) {
				runs.Add(1)
				tB = time.Now()
				actx := aCtx.Load().(context.Context)
				aCanceledAtB = actx.Err() != nil
				aCauseAtB = context.Cause(actx)
				close(bRan)
				return rec, true
			})
			if err == nil && out == store.Claimed {
				claimedByB++
				break
			}
		}
		<-aDone
		p.Close()
		ca.Close()
		if !tB.IsZero() && tB.Sub(tStart) < lt && !aCanceledAtB {
			violations++
			t.Logf("attempt %d: second run %v after the first Run began (lock timeout %v), first handler's context live (cause %v), runs %d",
				attempt, tB.Sub(tStart), lt, aCauseAtB, runs.Load())
		}
	}
	if violations > 0 {
		t.Fatalf("%d of 30 attempts: the handler ran a second time within one lock timeout of the first claim, with the first still holding its lock in its Guard's view (B claimed in %d)", violations, claimedByB)
	}
	t.Logf("no violation; B claimed in %d of 30", claimedByB)
}
