package idempotency_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// leaseFaultStore wraps a real store and misbehaves on chosen calls, on the
// synctest clock.
type leaseFaultStore struct {
	store.Store
	// hangExtend: Extend answers nothing until its context ends (a store
	// this server cannot reach; other servers still can).
	hangExtend atomic.Bool
	// slowExtend: Extend is answered this late (time.Duration).
	slowExtend atomic.Int64
	// slowBegin: Begin is answered this late (time.Duration), whatever
	// its context says (the claim is made first).
	slowBegin atomic.Int64
	// failExtend: Extend fails at once (a blip).
	failExtend atomic.Bool
	// onExtend, if set, runs at the start of each Extend.
	onExtend func()
	inflight atomic.Int32
	extends  atomic.Int32
}

func (s *leaseFaultStore) Extend(ctx context.Context, id store.ID, o store.Owner, ttl time.Duration) error {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	s.extends.Add(1)
	if s.onExtend != nil {
		s.onExtend()
	}
	if s.failExtend.Load() {
		return errors.New("lease test: store blip")
	}
	if s.hangExtend.Load() {
		<-ctx.Done()
		return ctx.Err()
	}
	if d := time.Duration(s.slowExtend.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Extend(ctx, id, o, ttl)
}

func (s *leaseFaultStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	res, err := s.Store.Begin(ctx, id, fp, ttl)
	if d := time.Duration(s.slowBegin.Load()); d > 0 {
		time.Sleep(d)
	}
	return res, err
}

func leaseMem(t *testing.T) *idempotency.MemoryStore {
	t.Helper()
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return mem
}

var leaseFP = store.NewFingerprint("POST", "/pay", sha256.Sum256([]byte("x")))

// DOC (idempotency/guard.go, ErrLockLost; Guard.Run; WithLockTimeout):
// the operation's context is canceled with ErrLockLost when "no renewal
// was confirmed for a whole lock timeout. Another request may claim the
// key, so the operation should stop". Server A cannot reach the store
// (its renewals time out after the default 2 s store timeout) while
// server B can: once A's lock has run out (1 min after the claim) B may
// claim the key and run the operation. A's operation must have been told
// to stop by then; otherwise two runs of one key overlap.
func TestAttackIdempLockLostLateOverlap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := leaseMem(t)
		sa := &leaseFaultStore{Store: mem}
		sa.hangExtend.Store(true)
		sb := &leaseFaultStore{Store: mem}
		ga, err := idempotency.NewGuard(sa) // defaults: lock 1 min, store timeout 2 s
		if err != nil {
			t.Fatal(err)
		}
		gb, err := idempotency.NewGuard(sb)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var aCanceledAt atomic.Int64 // ns since start, 0 = not yet
		aDone := make(chan struct{})
		release := make(chan struct{})
		go func() {
			defer close(aDone)
			_, _, _ = ga.Run(context.Background(), "tenant", "key-1", leaseFP, func(ctx context.Context) (store.Record, bool) {
				<-ctx.Done()
				aCanceledAt.Store(int64(time.Since(start)))
				<-release
				return store.Record{Status: 201}, true
			})
		}()
		// Just after A's lock ran out in the store (claimed at start, 1 min).
		time.Sleep(time.Minute + 500*time.Millisecond)
		var aAliveWhenBRan bool
		bRan := false
		out, _, err := gb.Run(context.Background(), "tenant", "key-1", leaseFP, func(ctx context.Context) (store.Record, bool) {
			bRan = true
			aAliveWhenBRan = aCanceledAt.Load() == 0
			return store.Record{Status: 201}, true
		})
		time.Sleep(5 * time.Second)
		close(release)
		<-aDone
		t.Logf("B at %v: outcome %q err %v ran %v; A's context canceled at %v", time.Minute+500*time.Millisecond, out, err, bRan, time.Duration(aCanceledAt.Load()))
		if bRan && aAliveWhenBRan {
			t.Errorf("B's operation ran at 1m0.5s while A's operation, whose lock ended at 1m0s without a confirmed renewal, was still running with a live context (canceled only at %v): two runs of one key overlap", time.Duration(aCanceledAt.Load()))
		}
	})
}

// DOC (docs/idempotency.md, "A store that fails as the answer is stored"):
// "Guard.Run (so the middleware's handler) returns once the record is
// stored ... no goroutine outlives the request, and when the middleware
// returns the store holds what it says." A renewal slow to be answered
// (500 ms, under the store timeout) is still in flight when the handler
// returns and the record is stored.
func TestAttackIdempRenewalOutlivesRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := leaseMem(t)
		s := &leaseFaultStore{Store: mem}
		s.slowExtend.Store(int64(500 * time.Millisecond))
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := g.Run(context.Background(), "tenant", "key-2", leaseFP, func(ctx context.Context) (store.Record, bool) {
			time.Sleep(1100 * time.Millisecond) // the first renewal starts at 1 s
			return store.Record{Status: 201}, true
		})
		n := s.inflight.Load()
		if out != store.Claimed || err != nil {
			t.Fatalf("Run: %q %v", out, err)
		}
		if n != 0 {
			t.Errorf("Run returned with %d store call(s) of the request still in flight (a renewal goroutine outlives the request)", n)
		}
		time.Sleep(time.Second) // (before the fix: let the renewal end, or the bubble panics)
	})
}

// DOC (idempotency/guard.go, Guard.Run): Run returns "ctx's cause when ctx
// ended while the key was claimed (the claim is released, tried again like
// a completion)". The claim is answered late (25 s of a 1 min lock, so the
// Guard confirms it with a renewal before running fn) and the request is
// canceled while that renewal is under way. The key must be released: a
// retry with the same key runs the operation, not 409 until the lock
// timeout.
func TestAttackIdempCanceledDuringLateClaimConfirm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := leaseMem(t)
		s := &leaseFaultStore{Store: mem}
		s.slowBegin.Store(int64(25 * time.Second))
		s.slowExtend.Store(int64(time.Second))
		g, err := idempotency.NewGuard(s, idempotency.WithStoreTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.onExtend = func() { time.AfterFunc(100*time.Millisecond, cancel) }
		ran := 0
		out, _, err := g.Run(ctx, "tenant", "key-3", leaseFP, func(context.Context) (store.Record, bool) {
			ran++
			return store.Record{Status: 201}, true
		})
		t.Logf("first: outcome %q, err %v, ran %d", out, err, ran)
		if !errors.Is(err, context.Canceled) || ran != 0 {
			t.Errorf("first: err %v, ran %d; want ctx's cause (context.Canceled), fn not run", err, ran)
		}
		s.slowBegin.Store(0)
		s.slowExtend.Store(0)
		s.onExtend = nil
		time.Sleep(2 * time.Second) // the client retries a little later
		out2, _, err2 := g.Run(context.Background(), "tenant", "key-3", leaseFP, func(context.Context) (store.Record, bool) {
			ran++
			return store.Record{Status: 201}, true
		})
		t.Logf("retry 2 s later: outcome %q, err %v, ran %d", out2, err2, ran)
		if ran != 1 || out2 != store.Claimed {
			t.Errorf("the request was canceled while its late claim was being confirmed; the retry got %q (err %v) and the operation ran %d times: the claim was not released (promised: released, tried again like a completion)", out2, err2, ran)
		}
	})
}

// Same, with no cancellation: the confirming renewal of a late claim
// meets a blip (fails at once). Run answers ErrStoreUnavailable (503,
// "retry with the same key"), but the claim is kept: the retry 2 s later
// is told "in progress" (409) although nothing runs, until the lock
// timeout.
func TestAttackIdempLateClaimBlipLeavesKeyLocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := leaseMem(t)
		s := &leaseFaultStore{Store: mem}
		s.slowBegin.Store(int64(25 * time.Second))
		s.failExtend.Store(true)
		g, err := idempotency.NewGuard(s, idempotency.WithStoreTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		ran := 0
		out, _, err := g.Run(context.Background(), "tenant", "key-4", leaseFP, func(context.Context) (store.Record, bool) {
			ran++
			return store.Record{Status: 201}, true
		})
		t.Logf("first: outcome %q, err %v (unavailable: %v), ran %d", out, err, errors.Is(err, idempotency.ErrStoreUnavailable), ran)
		s.slowBegin.Store(0)
		s.failExtend.Store(false)
		time.Sleep(2 * time.Second)
		out2, _, err2 := g.Run(context.Background(), "tenant", "key-4", leaseFP, func(context.Context) (store.Record, bool) {
			ran++
			return store.Record{Status: 201}, true
		})
		t.Logf("retry 2 s later: outcome %q, err %v, ran %d", out2, err2, ran)
		if out2 == store.InProgress && ran == 0 {
			t.Errorf("after a 503 (store unavailable, nothing ran) the retry with the same key is told %q although no request holds the key: the unconfirmed late claim was never released", out2)
		}
	})
}
