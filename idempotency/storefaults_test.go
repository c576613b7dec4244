package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// faultyStore is a memory store behind a network the test controls, on
// the synctest clock: while down, every call fails at once; while delay is
// set, every call is answered that late, or fails when its context ends
// first.
type faultyStore struct {
	*idempotency.MemoryStore
	down  atomic.Bool
	delay atomic.Int64 // time.Duration
	// afterBegin, if set before the store is used, runs after each
	// successful Begin.
	afterBegin func()
}

func newFaultyStore(t *testing.T) *faultyStore {
	t.Helper()
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return &faultyStore{MemoryStore: mem}
}

// fault waits out the delay (or ctx) and returns errDown while the store
// is down.
func (s *faultyStore) fault(ctx context.Context) error {
	if d := time.Duration(s.delay.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.down.Load() {
		return errDown
	}
	return nil
}

func (s *faultyStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	if err := s.fault(ctx); err != nil {
		return store.Result{}, err
	}
	res, err := s.MemoryStore.Begin(ctx, id, fp, ttl)
	if err == nil && s.afterBegin != nil {
		s.afterBegin()
	}
	return res, err
}

func (s *faultyStore) Complete(ctx context.Context, id store.ID, o store.Owner, rec store.Record, d time.Duration) error {
	if err := s.fault(ctx); err != nil {
		return err
	}
	return s.MemoryStore.Complete(ctx, id, o, rec, d)
}

func (s *faultyStore) Extend(ctx context.Context, id store.ID, o store.Owner, d time.Duration) error {
	if err := s.fault(ctx); err != nil {
		return err
	}
	return s.MemoryStore.Extend(ctx, id, o, d)
}

func (s *faultyStore) Release(ctx context.Context, id store.ID, o store.Owner) error {
	if err := s.fault(ctx); err != nil {
		return err
	}
	return s.MemoryStore.Release(ctx, id, o)
}

// TestCompletionBlip: the store is down for 400 ms just as the handler's
// answer is stored (lock timeout 1 s): the answer is stored once the store
// is back, and a retry after the lock timeout is a replay, not a second
// run.
func TestCompletionBlip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFaultyStore(t)
		idemtest.CompletionBlip(t, s, s.down.Store)
	})
}

// TestSlowRenewal: a renewal answered after the renewal period but
// before the lock's end keeps the lock: the handler is not canceled and
// runs once.
func TestSlowRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFaultyStore(t)
		idemtest.SlowRenewal(t, s, func(d time.Duration) { s.delay.Store(int64(d)) })
	})
}

// TestLockLostWhenItsTimeIsGone: renewals that fail (the store is down)
// are tried again; the lock is lost, and the handler canceled with
// ErrLockLost, only once no renewal was confirmed for a whole lock
// timeout less a twentieth, not before, and then at once.
func TestLockLostWhenItsTimeIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFaultyStore(t)
		const lock = time.Minute
		var lostAfter time.Duration
		var cause error
		h := newMiddleware(t, s, idempotency.WithLockTimeout(lock))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			s.down.Store(true) // every renewal fails from now on
			<-r.Context().Done()
			lostAfter, cause = time.Since(start), context.Cause(r.Context())
		}))
		call{keys: key("k")}.do(h)
		// Lost a twentieth of the lock timeout before its end (the margin
		// that tells the handler before the store's lock ends), not before
		// and not after.
		if !errors.Is(cause, idempotency.ErrLockLost) || lostAfter != lock-lock/20 {
			t.Fatalf("handler canceled after %v with %v; want ErrLockLost after %v, a twentieth of the lock's %v before its end", lostAfter, cause, lock-lock/20, lock)
		}
	})
}

// TestReleaseBlip: the store is down for 400 ms just as the key of a
// response that is not stored (a 500) is released: the release is tried
// again until it lands, so a retry right after runs the handler, instead
// of being told "in progress" until the lock timeout.
func TestReleaseBlip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFaultyStore(t)
		var runs atomic.Int64
		h := newMiddleware(t, s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				w.WriteHeader(http.StatusInternalServerError)
				s.down.Store(true)
				time.AfterFunc(400*time.Millisecond, func() { s.down.Store(false) })
				return
			}
			w.WriteHeader(http.StatusCreated)
		}))
		c := call{keys: key("k")}
		if rec := c.do(h); rec.Code != http.StatusInternalServerError {
			t.Fatalf("first call: %d, want the handler's 500", rec.Code)
		}
		if rec := c.do(h); rec.Code != http.StatusCreated || runs.Load() != 2 {
			t.Fatalf("retry right after: %d, handler runs %d; want 201 from a second run (the key was released)", rec.Code, runs.Load())
		}
	})
}

// TestCanceledClaimReleaseBlip: the request is canceled while its claim is
// in flight, and the store is down for 400 ms just as the claim lands: the
// claim's release is tried again until it lands, so the key is free for
// the retry, not locked until the lock timeout.
func TestCanceledClaimReleaseBlip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newFaultyStore(t)
		// The claim is slow, and the store goes down as it lands.
		s.delay.Store(int64(100 * time.Millisecond))
		s.afterBegin = func() {
			if s.delay.Swap(0) != 0 {
				s.down.Store(true)
				time.AfterFunc(400*time.Millisecond, func() { s.down.Store(false) })
			}
		}
		var l ledger
		h := newMiddleware(t, s)(&l)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel) // the client leaves
		req := call{keys: key("k")}.request().WithContext(ctx)
		h.ServeHTTP(httptest.NewRecorder(), req)
		if rec := (call{keys: key("k")}).do(h); rec.Code != http.StatusCreated || l.runs.Load() != 1 {
			t.Fatalf("retry after the canceled claim: %d %q, handler runs %d; want a fresh 201 (the claim was released)", rec.Code, rec.Body, l.runs.Load())
		}
	})
}
