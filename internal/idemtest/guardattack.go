package idemtest

// Guard.Run on a real store, found by a black-box attack and kept for both
// stores (RunGuardAttacks), which only build their stores.

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// RunGuardAttacks runs Guard.Run's scenarios on the store newStore returns
// (a new one for each, on the same server): a handler whose renewals all
// fail is told ErrLockLost before another Guard claims its key, and fn runs
// at most once per key with many Guards on one store.
func RunGuardAttacks(t *testing.T, newStore func(t *testing.T) store.Store) {
	t.Run("lock lost before reclaim", func(t *testing.T) { guardLockLostBeforeReclaim(t, newStore(t)) })
	t.Run("runs once on a shared store", func(t *testing.T) { guardsRunOnceOnSharedStore(t, newStore(t)) })
}

// grdNoExtend fails every renewal (the store is fine otherwise).
type grdNoExtend struct{ store.Store }

var errGrdDown = errors.New("grd: renewal refused")

func (grdNoExtend) Extend(context.Context, store.ID, store.Owner, time.Duration) error {
	return errGrdDown
}

// guardLockLostBeforeReclaim: ErrLockLost / Guard.Run on a shared store, in two processes' worth of
// Guards: a handler whose renewals all fail is told (ErrLockLost, wrapping
// the store's error) before another Guard can claim its key; it outlives
// its lock; its late record is not stored; the second run's is.
func guardLockLostBeforeReclaim(t *testing.T, s store.Store) {
	const lock = 500 * time.Millisecond
	g1, err := idempotency.NewGuard(grdNoExtend{s}, idempotency.WithLockTimeout(lock))
	if err != nil {
		t.Fatal(err)
	}
	g2, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(lock))
	if err != nil {
		t.Fatal(err)
	}
	fp := store.NewFingerprint("PUBLISH", "q", [32]byte{3})
	key := idempotency.NewKey()
	var mu sync.Mutex
	var lostAt, claimAt time.Time
	var cause error
	started := make(chan struct{})
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		o, _, err := g1.Run(context.Background(), "tenant", key, fp, func(ctx context.Context) (store.Record, bool) {
			close(started)
			<-ctx.Done()
			mu.Lock()
			lostAt, cause = time.Now(), context.Cause(ctx)
			mu.Unlock()
			<-release
			return store.Record{Status: 200, Body: []byte("first")}, true
		})
		if o != store.Claimed || err != nil {
			t.Errorf("first Run = %q %v", o, err)
		}
	}()
	<-started
	deadline := time.Now().Add(10 * lock)
	for {
		o, _, err := g2.Run(context.Background(), "tenant", key, fp, func(context.Context) (store.Record, bool) {
			mu.Lock()
			claimAt = time.Now()
			mu.Unlock()
			return store.Record{Status: 200, Body: []byte("second")}, true
		})
		if err != nil {
			t.Fatalf("second Run: %v", err)
		}
		if o == store.Claimed {
			break
		}
		if o != store.InProgress || time.Now().After(deadline) {
			t.Fatalf("second Run = %q", o)
		}
		time.Sleep(2 * time.Millisecond)
	}
	mu.Lock()
	if lostAt.IsZero() || !lostAt.Before(claimAt) || !errors.Is(cause, idempotency.ErrLockLost) || !errors.Is(cause, errGrdDown) {
		t.Errorf("first handler told at %v with %v; second claimed at %v; want ErrLockLost (wrapping the store's error) before the claim", lostAt, cause, claimAt)
	}
	mu.Unlock()
	close(release)
	<-done
	o, rec, err := g2.Run(context.Background(), "tenant", key, fp, func(context.Context) (store.Record, bool) {
		t.Error("third run")
		return store.Record{Status: 200}, true
	})
	if o != store.Completed || string(rec.Body) != "second" || err != nil {
		t.Errorf("replay = %q %q %v, want the second record", o, rec.Body, err)
	}
}

// guardsRunOnceOnSharedStore: Guard.Run: fn runs at most once per key, with many Guards on one shared
// store and handlers that run longer than the lock timeout (kept by
// renewals); odd scopes and keys; a record at the encoding's edges. A
// claim may fail closed (a pool that is still dialing answers late): fn
// then does not run.
func guardsRunOnceOnSharedStore(t *testing.T, s store.Store) {
	const lock = time.Second
	guards := make([]*idempotency.Guard, 8)
	for i := range guards {
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(lock))
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = g
	}
	fp := store.NewFingerprint("PUBLISH", "q", [32]byte{4})
	scopes := []string{"\x00", "\xff\xfe", ""}
	keys := []string{"", "\x00k", strings.Repeat("\xff", 4096)}
	rec := store.Record{Status: 999, Header: http.Header{"\x00": {"", "\xff"}, "A": nil}, Body: bytes.Repeat([]byte{0}, 1<<16)}
	var runs [3][3]atomic.Int32
	var wg sync.WaitGroup
	for i := range 72 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc, k := i%3, (i/3)%3
			o, got, err := guards[i%len(guards)].Run(context.Background(), scopes[sc], keys[k], fp, func(ctx context.Context) (store.Record, bool) {
				runs[sc][k].Add(1)
				select {
				case <-time.After(lock + lock/2):
				case <-ctx.Done():
					t.Errorf("handler canceled: %v", context.Cause(ctx))
				}
				return rec, true
			})
			if err != nil {
				if !errors.Is(err, idempotency.ErrStoreUnavailable) {
					t.Errorf("Run: %v", err)
				}
				return
			}
			if o == store.Completed && (got.Status != 999 || !bytes.Equal(got.Body, rec.Body) || len(got.Header) != 2 || len(got.Header["\x00"]) != 2) {
				t.Errorf("replay %d %d bytes %v", got.Status, len(got.Body), got.Header)
			}
		}()
	}
	wg.Wait()
	for sc := range runs {
		for k := range runs[sc] {
			if n := runs[sc][k].Load(); n > 1 {
				t.Errorf("scope %d key %d: fn ran %d times, want at most 1", sc, k, n)
			}
		}
	}
}
