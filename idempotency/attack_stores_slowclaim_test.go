// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// slowReply is a shared store whose Begin is executed at once but whose
// answer reaches the caller late (a slow network or a loaded server).
type slowReply struct {
	store.Store
	delay time.Duration
}

func (s slowReply) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	res, err := s.Store.Begin(ctx, id, fp, ttl)
	time.Sleep(s.delay)
	return res, err
}

// TestAttackClaimAnsweredAfterItsLockExpired: lock timeout 1.5 s (as in the
// docs' TestSlowRenewal), default store timeout 2 s; the claim's answer
// takes 1.7 s. The Guard knows the claim was sent 1.7 s ago, longer than a
// lock timeout, yet it runs fn; meanwhile another server claimed the
// expired key and ran it too.
func TestAttackClaimAnsweredAfterItsLockExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := &idempotency.MemoryStore{}
		ga, err := idempotency.NewGuard(slowReply{mem, 1700 * time.Millisecond}, idempotency.WithLockTimeout(1500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		gb, _ := idempotency.NewGuard(mem, idempotency.WithLockTimeout(1500*time.Millisecond))
		fp := store.NewFingerprint("POST", "/pay", [32]byte{})
		var runs atomic.Int32
		var aCanceledAtStart atomic.Bool
		fn := func(ctx context.Context) (store.Record, bool) {
			runs.Add(1)
			if ctx.Err() != nil {
				aCanceledAtStart.Store(true)
			}
			time.Sleep(100 * time.Millisecond) // the payment
			return store.Record{Status: 201}, true
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			out, _, err := ga.Run(context.Background(), "s", "key", fp, fn)
			t.Logf("server A: %q %v", out, err)
		}()
		time.Sleep(1600 * time.Millisecond) // the client's retry reaches server B
		out, _, err := gb.Run(context.Background(), "s", "key", fp, fn)
		t.Logf("server B at 1.6 s: %q %v", out, err)
		<-done
		if n := runs.Load(); n != 1 {
			t.Fatalf("the operation ran %d times (A's fn started with a canceled context: %v)", n, aCanceledAtStart.Load())
		}
	})
}
