// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// ratkSlow wraps a store: Begin answers after beginDelay, Extend is recorded.
type ratkSlow struct {
	store.Store
	beginDelay time.Duration
	extendErr  error
	mu         sync.Mutex
	log        []string
}

func (s *ratkSlow) add(e string) { s.mu.Lock(); s.log = append(s.log, e); s.mu.Unlock() }
func (s *ratkSlow) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	r, err := s.Store.Begin(ctx, id, fp, ttl)
	time.Sleep(s.beginDelay)
	s.add("begin")
	return r, err
}
func (s *ratkSlow) Extend(ctx context.Context, id store.ID, o store.Owner, ttl time.Duration) error {
	s.add(fmt.Sprintf("extend %v", ttl))
	if s.extendErr != nil {
		return s.extendErr
	}
	return s.Store.Extend(ctx, id, o, ttl)
}
func (s *ratkSlow) events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.log...)
}

func ratkRunLate(t *testing.T, lt, delay time.Duration, extendErr error) (ran bool, log []string, err error) {
	synctest.Test(t, func(t *testing.T) {
		ms, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		s := &ratkSlow{Store: ms, beginDelay: delay, extendErr: extendErr}
		g, gerr := idempotency.NewGuard(s, idempotency.WithLockTimeout(lt), idempotency.WithStoreTimeout(10*lt))
		if gerr != nil {
			t.Fatal(gerr)
		}
		_, _, err = g.Run(context.Background(), "s", "k", store.Fingerprint{}, func(ctx context.Context) (store.Record, bool) {
			ran = true
			s.add("fn")
			return store.Record{Status: 200}, true
		})
		log = s.events()
	})
	return
}

func TestReattackLateClaimAtThird(t *testing.T) {
	lt := 3 * time.Second
	ran, log, err := ratkRunLate(t, lt, lt/3, nil)
	if err != nil || !ran {
		t.Fatalf("ran %v err %v", ran, err)
	}
	if len(log) < 3 || log[1] != "extend "+lt.String() || log[2] != "fn" {
		t.Errorf("want begin, extend, fn; got %v", log)
	}
	// Just under a third: no renewal needed.
	ran, log, err = ratkRunLate(t, lt, lt/3-time.Nanosecond, nil)
	if err != nil || !ran || log[1] != "fn" {
		t.Errorf("under a third: ran %v err %v log %v", ran, err, log)
	}
	// At the lock timeout: no time left, fn must not run.
	ran, log, err = ratkRunLate(t, lt, lt, nil)
	if ran || !errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("at the lock timeout: ran %v err %v log %v", ran, err, log)
	}
	// The renewal fails: fn must not run.
	ran, log, err = ratkRunLate(t, lt, lt/2, errors.New("down"))
	if ran || !errors.Is(err, idempotency.ErrStoreUnavailable) {
		t.Errorf("renewal fails: ran %v err %v log %v", ran, err, log)
	}
	// The renewal says stale owner: fn must not run.
	ran, log, err = ratkRunLate(t, lt, lt/2, store.ErrStaleOwner)
	if ran || err == nil {
		t.Errorf("renewal stale: ran %v err %v log %v", ran, err, log)
	}
}

// Lock timeout of 1 ms (the minimum): a third is 333.333 µs.
func TestReattackLateClaimTinyLock(t *testing.T) {
	lt := time.Millisecond
	ran, log, err := ratkRunLate(t, lt, lt/3, nil)
	if err != nil || !ran || len(log) < 3 || log[2] != "fn" {
		t.Errorf("ran %v err %v log %v", ran, err, log)
	}
}

// A record no store takes releases the key at once: a retry runs fn again.
func TestReattackUnstorableReleases(t *testing.T) {
	for _, rec := range []store.Record{
		{Status: 0},
		{Status: 199},
		{Status: 1000},
		{Status: -1},
		{Status: 200, BodyOmitted: true, Body: []byte("x")},
		{Status: 200, Header: http.Header{"": {"v"}}},
		{Status: 200, Header: http.Header{"": nil}},
	} {
		t.Run(fmt.Sprint(rec.Status, rec.BodyOmitted, len(rec.Header)), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for _, mk := range []func() store.Store{
					func() store.Store { s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{}); return s },
					func() store.Store {
						s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
						return &ratkSlow{Store: s}
					},
				} {
					g, _ := idempotency.NewGuard(mk())
					runs := 0
					for i := 0; i < 2; i++ {
						start := time.Now()
						out, _, err := g.Run(context.Background(), "s", "k", store.Fingerprint{}, func(context.Context) (store.Record, bool) {
							runs++
							return rec, true
						})
						if err != nil || out != store.Claimed {
							t.Errorf("run %d: %v %v", i, out, err)
						}
						if el := time.Since(start); el > time.Second {
							t.Errorf("run %d took %v", i, el)
						}
					}
					if runs != 2 {
						t.Errorf("fn ran %d times, want 2 (key released)", runs)
					}
				}
			})
		})
	}
}

// MemoryStore: at least 4 keys; a scope that took its half leaves a key
// for another.
func TestReattackMemoryFour(t *testing.T) {
	for _, n := range []int{3} {
		if _, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: n}); err == nil {
			t.Errorf("MaxEntries %d accepted", n)
		}
	}
	if _, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxBytes: 639}); err == nil {
		t.Errorf("MaxBytes 639 accepted")
	}
	for _, cfg := range []idempotency.MemoryConfig{{MaxEntries: 4}, {MaxBytes: 640}, {MaxEntries: 4, MaxBytes: 640}, {MaxEntries: 5}, {MaxBytes: 800}} {
		s, err := idempotency.NewMemoryStore(cfg)
		if err != nil {
			t.Fatalf("%+v: %v", cfg, err)
		}
		g, _ := idempotency.NewGuard(s)
		got := map[string]int{}
		for _, scope := range []string{"a", "b"} {
			for i := 0; i < 10; i++ {
				_, _, err := g.Run(context.Background(), scope, fmt.Sprint("key", i), store.Fingerprint{}, func(context.Context) (store.Record, bool) {
					return store.Record{Status: 200}, true
				})
				if err != nil {
					break
				}
				got[scope]++
			}
		}
		if got["a"] < 1 || got["b"] < 1 {
			t.Errorf("%+v: keys per scope %v", cfg, got)
		}
		t.Logf("%+v: %v", cfg, got)
	}
}
