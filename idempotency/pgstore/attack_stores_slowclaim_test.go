// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package pgstore_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// TestAttackClaimSlowerThanLockTimeout: PostgreSQL takes longer than the lock
// timeout to answer a claim (here it waits for a row lock another session
// holds; a loaded server does the same), within the store timeout. The
// row's lock is set from statement_timestamp(), so the claim the Guard
// receives has already expired: another server claims the key and runs
// the operation, and the first server runs it as well, its context live.
func TestAttackClaimSlowerThanLockTimeout(t *testing.T) {
	p, _ := pool(t, 8)
	s, table := newTable(t, p)
	ctx := context.Background()
	const lockTimeout = 500 * time.Millisecond
	ga, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(lockTimeout)) // store timeout: default 2 s
	if err != nil {
		t.Fatal(err)
	}
	gb, _ := idempotency.NewGuard(s, idempotency.WithLockTimeout(lockTimeout))
	fp := store.NewFingerprint("POST", "/pay", [32]byte{})
	key := idempotency.NewKey()

	// The key's row exists: an earlier request's record, kept 1 ms, expired.
	gc, _ := idempotency.NewGuard(s, idempotency.WithRetention(time.Millisecond))
	if _, _, err := gc.Run(ctx, "s", key, fp, func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }); err != nil {
		t.Fatal(err)
	}
	for {
		var live int
		if err := p.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE expires_at > now()").Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live == 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Another session holds the row (the table's only one) for 700 ms.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+table+" FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(700*time.Millisecond, func() { tx.Commit(context.Background()) })

	var runs atomic.Int32
	aRunning := make(chan struct{})
	var aCtxLiveWhenBRan atomic.Bool
	var aCtx atomic.Value
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		out, _, err := ga.Run(ctx, "s", key, fp, func(ctx context.Context) (store.Record, bool) {
			runs.Add(1)
			aCtx.Store(ctx)
			t.Logf("server A's operation starts %v after its Run began (lock timeout %v)", time.Since(start), lockTimeout)
			close(aRunning)
			time.Sleep(200 * time.Millisecond) // the payment takes a while
			return store.Record{Status: 201}, true
		})
		t.Logf("server A: %q %v", out, err)
	}()
	// A's claim is answered after its lock timeout: A must not run (it
	// says so), or, if it runs, B must not. Either way B is the retry.
	select {
	case <-aRunning:
	case <-done:
	}
	out, _, err := gb.Run(ctx, "s", key, fp, func(context.Context) (store.Record, bool) {
		runs.Add(1)
		if c, ok := aCtx.Load().(context.Context); ok {
			aCtxLiveWhenBRan.Store(c.Err() == nil)
		}
		return store.Record{Status: 201}, true
	})
	t.Logf("server B (the client's retry): %q %v", out, err)
	<-done
	if n := runs.Load(); n != 1 {
		t.Fatalf("the operation ran %d times (A's context still live when B ran: %v)", n, aCtxLiveWhenBRan.Load())
	}
}
