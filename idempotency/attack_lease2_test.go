package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// lease26Store wraps a memory store (hidden behind an interface, so that
// the Guard treats it as a shared store) and misbehaves on Extend.
type lease26Store struct {
	store.Store
	mu          sync.Mutex
	extendDelay time.Duration   // each Extend answers this late (honours ctx)
	extendErr   error           // each Extend fails with this at once
	extends     []time.Duration // when each Extend was sent, since t0
	t0          time.Time
}

func (s *lease26Store) Extend(ctx context.Context, id store.ID, o store.Owner, ttl time.Duration) error {
	s.mu.Lock()
	s.extends = append(s.extends, time.Since(s.t0))
	delay, ferr := s.extendDelay, s.extendErr
	s.mu.Unlock()
	if ferr != nil {
		return ferr
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.Store.Extend(ctx, id, o, ttl)
}

func newLease26(t *testing.T) *lease26Store {
	t.Helper()
	m, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &lease26Store{Store: m, t0: time.Now()}
}

// runFor runs one request on g whose fn takes d (or ends when its context
// does) and returns fn's context cause (nil if not canceled) and when fn
// ended.
func runFor(t *testing.T, g *idempotency.Guard, key string, d time.Duration) (outcome store.Outcome, cause error, err error) {
	t.Helper()
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	outcome, _, err = g.Run(context.Background(), "s", key, fp, func(ctx context.Context) (store.Record, bool) {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return store.Record{}, false
		}
		return store.Record{Status: 201, Body: []byte("ok")}, true
	})
	return outcome, cause, err
}

// TestAttackLease2LostAtMarginOnFailingRenewals: every renewal fails at
// once: the lock is lost exactly a lock timeout less a twentieth after the
// claim, the cause wraps ErrLockLost and the store's error, and the key
// is not stored.
func TestAttackLease2LostAtMarginOnFailingRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const L = 3 * time.Second
		s := newLease26(t)
		boom := errors.New("boom")
		s.extendErr = boom
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(L))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var lostAt time.Duration
		fp := store.NewFingerprint("POST", "/x", [32]byte{})
		_, _, err = g.Run(context.Background(), "s", "k", fp, func(ctx context.Context) (store.Record, bool) {
			<-ctx.Done()
			lostAt = time.Since(start)
			if c := context.Cause(ctx); !errors.Is(c, idempotency.ErrLockLost) || !errors.Is(c, boom) {
				t.Errorf("cause %v: want ErrLockLost wrapping the store's error", c)
			}
			return store.Record{Status: 201}, true
		})
		if err != nil {
			t.Fatal(err)
		}
		if want := L - L/20; lostAt != want {
			t.Errorf("lock lost %v after the claim, want %v", lostAt, want)
		}
	})
}

// TestAttackLease2SlowRenewalWithinTimeKept: the first renewal answers
// late (more than the renewal period, less than the lock has left), then
// the store is fast again: the handler is not canceled and runs once.
func TestAttackLease2SlowRenewalWithinTimeKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const L = 1500 * time.Millisecond
		s := newLease26(t)
		s.extendDelay = 700 * time.Millisecond
		time.AfterFunc(1100*time.Millisecond, func() { s.mu.Lock(); s.extendDelay = 0; s.mu.Unlock() })
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(L))
		if err != nil {
			t.Fatal(err)
		}
		out, cause, err := runFor(t, g, "k", 2*time.Second)
		if err != nil || out != store.Claimed || cause != nil {
			t.Fatalf("Run = %v, %v; fn canceled: %v", out, err, cause)
		}
	})
}

// TestAttackLeaseSteadySlowStoreKeepsLock: a store that
// answers every renewal in 0.4 of the lock timeout (slower than the
// renewal period, far within the lock's time) confirms every renewal,
// yet the lock is lost at the second: after a slow renewal the next one
// is sent a third of the lock timeout after its answer, not after it was
// sent, so it has only about 0.2 of the lock timeout left, and is
// abandoned. Docs: the Guard "renews the lock about every third of this
// time", "a renewal that is slow ... is tried again, not taken as a loss".
func TestAttackLeaseSteadySlowStoreKeepsLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const L = 3 * time.Second
		s := newLease26(t)
		s.extendDelay = L * 4 / 10
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(L))
		if err != nil {
			t.Fatal(err)
		}
		out, cause, err := runFor(t, g, "k", 2*L)
		s.mu.Lock()
		sent := append([]time.Duration(nil), s.extends...)
		s.mu.Unlock()
		if err != nil || out != store.Claimed || cause != nil {
			t.Fatalf("store answering every renewal in %v (lock %v): Run = %v, %v; fn canceled: %v; renewals sent at %v",
				s.extendDelay, L, out, err, cause, sent)
		}
	})
}

// TestAttackLease2ConcurrentSameKey: many concurrent requests with one
// key on one Guard: exactly one runs, the others are told InProgress or
// replayed.
func TestAttackLease2ConcurrentSameKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newLease26(t)
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int32
		var wg sync.WaitGroup
		counts := map[store.Outcome]int{}
		var mu sync.Mutex
		fp := store.NewFingerprint("POST", "/x", [32]byte{})
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				time.Sleep(time.Duration(i) * 100 * time.Millisecond)
				out, _, err := g.Run(context.Background(), "s", "k", fp, func(ctx context.Context) (store.Record, bool) {
					runs.Add(1)
					time.Sleep(1500 * time.Millisecond) // renewed past the lock timeout
					return store.Record{Status: 201}, true
				})
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				counts[out]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		if runs.Load() != 1 || counts[store.Claimed] != 1 || counts[store.InProgress]+counts[store.Completed] != 19 {
			t.Fatalf("runs %d, outcomes %v", runs.Load(), counts)
		}
	})
}
