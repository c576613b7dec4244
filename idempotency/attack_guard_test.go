// Black-box attack on the protocol-neutral core (Guard) and the store
// contract (package idempotency/store), against their documentation.

package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
)

var grdFP = store.NewFingerprint("PUBLISH", "queue/charges", [32]byte{7})

var errGrdDown = errors.New("grd: store down")

// grdEvents collects a Guard's events.
type grdEvents struct {
	mu  sync.Mutex
	evs []observe.Event
}

func (o *grdEvents) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.evs = append(o.evs, e)
	o.mu.Unlock()
}

func (o *grdEvents) take() []observe.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	evs := o.evs
	o.evs = nil
	return evs
}

// grdFaultStore wraps a store; each hook, if set, is called before the
// inner store and, if it returns a non-nil error, that error is returned
// instead of calling the inner store. Calls are counted.
type grdFaultStore struct {
	inner store.Store

	mu                                   sync.Mutex
	begin, extend, complete, release     func(n int) error // n: 1 for the first call
	nBegin, nExtend, nComplete, nRelease int
}

func (s *grdFaultStore) hook(h func(int) error, n *int) error {
	s.mu.Lock()
	*n++
	c := *n
	s.mu.Unlock()
	if h == nil {
		return nil
	}
	return h(c)
}

func (s *grdFaultStore) counts() (b, e, c, r int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nBegin, s.nExtend, s.nComplete, s.nRelease
}

func (s *grdFaultStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	if err := s.hook(s.begin, &s.nBegin); err != nil {
		return store.Result{}, err
	}
	return s.inner.Begin(ctx, id, fp, ttl)
}

func (s *grdFaultStore) Extend(ctx context.Context, id store.ID, o store.Owner, ttl time.Duration) error {
	if err := s.hook(s.extend, &s.nExtend); err != nil {
		return err
	}
	return s.inner.Extend(ctx, id, o, ttl)
}

func (s *grdFaultStore) Complete(ctx context.Context, id store.ID, o store.Owner, rec store.Record, ret time.Duration) error {
	if err := s.hook(s.complete, &s.nComplete); err != nil {
		return err
	}
	return s.inner.Complete(ctx, id, o, rec, ret)
}

func (s *grdFaultStore) Release(ctx context.Context, id store.ID, o store.Owner) error {
	if err := s.hook(s.release, &s.nRelease); err != nil {
		return err
	}
	return s.inner.Release(ctx, id, o)
}

func grdMem(t testing.TB, cfg idempotency.MemoryConfig) *idempotency.MemoryStore {
	t.Helper()
	m, err := idempotency.NewMemoryStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func grdGuard(t testing.TB, s store.Store, opts ...idempotency.GuardOption) *idempotency.Guard {
	t.Helper()
	g, err := idempotency.NewGuard(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func grdRec(status int, body string) func(context.Context) (store.Record, bool) {
	return func(context.Context) (store.Record, bool) {
		return store.Record{Status: status, Body: []byte(body)}, true
	}
}

// Guard.Run: "runs fn at most once for the idempotency key key of the
// caller scope within the retention period"; "many Guards ... may share
// one store". 16 Guards, 256 goroutines, 8 keys over 2 scopes.
func TestAttackGuardConcurrentGuardsRunOnce(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		t.Run(fmt.Sprintf("wrapped=%v", wrapped), func(t *testing.T) {
			mem := grdMem(t, idempotency.MemoryConfig{})
			var s store.Store = mem
			if wrapped { // not a *MemoryStore: every call goes through the store timeout path
				s = &grdFaultStore{inner: mem}
			}
			guards := make([]*idempotency.Guard, 16)
			for i := range guards {
				guards[i] = grdGuard(t, s, idempotency.WithLockTimeout(10*time.Second))
			}
			var runs [2][4]atomic.Int32
			var outs sync.Map
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range 256 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					sc, k := i%2, (i/2)%4
					g := guards[i%len(guards)]
					o, rec, err := g.Run(context.Background(), fmt.Sprint("scope", sc), fmt.Sprint("key", k), grdFP,
						func(context.Context) (store.Record, bool) {
							runs[sc][k].Add(1)
							runtime.Gosched()
							return store.Record{Status: 200, Body: []byte(fmt.Sprint(sc, k))}, true
						})
					if err != nil {
						t.Errorf("Run: %v", err)
						return
					}
					if o == store.Completed && string(rec.Body) != fmt.Sprint(sc, k) {
						t.Errorf("scope%d key%d replayed %q", sc, k, rec.Body)
					}
					n, _ := outs.LoadOrStore(o, new(atomic.Int32))
					n.(*atomic.Int32).Add(1)
				}()
			}
			close(start)
			wg.Wait()
			for sc := range runs {
				for k := range runs[sc] {
					if n := runs[sc][k].Load(); n != 1 {
						t.Errorf("scope%d key%d: fn ran %d times, want 1", sc, k, n)
					}
				}
			}
			if n, ok := outs.Load(store.Claimed); !ok || n.(*atomic.Int32).Load() != 8 {
				t.Errorf("Claimed outcomes: %v, want 8", n)
			}
		})
	}
}

// Guard.Run: "If fn panics (or calls runtime.Goexit) the key is released
// and the panic goes on." One event is reported; the next Run claims.
func TestAttackGuardPanicAndGoexitRelease(t *testing.T) {
	for _, wrapped := range []bool{false, true} {
		mem := grdMem(t, idempotency.MemoryConfig{})
		var s store.Store = mem
		if wrapped {
			s = &grdFaultStore{inner: mem}
		}
		var obs grdEvents
		g := grdGuard(t, s, idempotency.WithObserver(&obs))
		type boom struct{}
		var got any
		func() {
			defer func() { got = recover() }()
			g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) { panic(boom{}) })
		}()
		if _, ok := got.(boom); !ok {
			t.Fatalf("wrapped=%v: recovered %v, want the fn's panic value", wrapped, got)
		}
		if evs := obs.take(); len(evs) != 1 {
			t.Errorf("wrapped=%v: %d events after a panic, want 1: %+v", wrapped, len(evs), evs)
		}
		// Goexit in a goroutine of our own.
		done := make(chan struct{})
		go func() {
			defer close(done)
			g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) {
				runtime.Goexit()
				return store.Record{}, true
			})
		}()
		<-done
		if evs := obs.take(); len(evs) != 1 {
			t.Errorf("wrapped=%v: %d events after a Goexit, want 1: %+v", wrapped, len(evs), evs)
		}
		o, rec, err := g.Run(context.Background(), "s", "k", grdFP, grdRec(201, "ok"))
		if o != store.Claimed || err != nil || rec.Status != 201 {
			t.Fatalf("wrapped=%v: Run after panic and Goexit = %q %v %v, want Claimed", wrapped, o, rec.Status, err)
		}
		o, rec, err = g.Run(context.Background(), "s", "k", grdFP, grdRec(500, "again"))
		if o != store.Completed || string(rec.Body) != "ok" || err != nil {
			t.Fatalf("wrapped=%v: replay = %q %q %v", wrapped, o, rec.Body, err)
		}
	}
}

// ErrLockLost and Guard.Run: fn's context is canceled with ErrLockLost
// (wrapping the store's error) when no renewal was confirmed for a lock
// timeout less a twentieth; a second Run claims only once the store's lock
// has ended; fn's late record is not stored; the second run's is.
func TestAttackGuardLockLostTimingAndSecondRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lock = 2 * time.Second
		mem := grdMem(t, idempotency.MemoryConfig{})
		fs := &grdFaultStore{inner: mem, extend: func(int) error { return errGrdDown }}
		var obs grdEvents
		g1 := grdGuard(t, fs, idempotency.WithLockTimeout(lock), idempotency.WithObserver(&obs))
		g2 := grdGuard(t, mem, idempotency.WithLockTimeout(lock))
		t0 := time.Now()
		var mu sync.Mutex
		var lostAt time.Duration
		var cause error
		var wg sync.WaitGroup
		wg.Add(1)
		var o1 store.Outcome
		var err1 error
		release := make(chan struct{})
		go func() {
			defer wg.Done()
			o1, _, err1 = g1.Run(context.Background(), "s", "k", grdFP, func(ctx context.Context) (store.Record, bool) {
				<-ctx.Done()
				mu.Lock()
				lostAt = time.Since(t0)
				cause = context.Cause(ctx)
				mu.Unlock()
				<-release // outlives its lock
				return store.Record{Status: 200, Body: []byte("first")}, true
			})
		}()
		time.Sleep(lock - lock/20 - time.Nanosecond)
		synctest.Wait()
		mu.Lock()
		c := cause
		mu.Unlock()
		if c != nil {
			t.Fatalf("fn canceled at %v, before the lock timeout less a twentieth (%v)", lostAt, lock-lock/20)
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if lostAt != lock-lock/20 || !errors.Is(cause, idempotency.ErrLockLost) || !errors.Is(cause, errGrdDown) {
			t.Fatalf("fn canceled at %v with %v; want at %v with ErrLockLost wrapping the store's error", lostAt, cause, lock-lock/20)
		}
		// Before the store's lock ends: in progress.
		time.Sleep(lock/20 - time.Nanosecond)
		if o, _, err := g2.Run(context.Background(), "s", "k", grdFP, grdRec(200, "second")); o != store.InProgress || err != nil {
			t.Fatalf("Run 1ns before the store's lock ends = %q %v, want InProgress", o, err)
		}
		time.Sleep(time.Nanosecond)
		if o, rec, err := g2.Run(context.Background(), "s", "k", grdFP, grdRec(200, "second")); o != store.Claimed || err != nil || string(rec.Body) != "second" {
			t.Fatalf("Run at the store's lock end = %q %v, want Claimed", o, err)
		}
		close(release)
		wg.Wait()
		if o1 != store.Claimed || err1 != nil {
			t.Errorf("first Run = %q %v, want Claimed, nil (failure reported, not returned)", o1, err1)
		}
		if o, rec, _ := g2.Run(context.Background(), "s", "k", grdFP, grdRec(200, "third")); o != store.Completed || string(rec.Body) != "second" {
			t.Fatalf("replay = %q %q, want Completed \"second\" (the late first record must not be stored)", o, rec.Body)
		}
		evs := obs.take()
		if len(evs) != 1 || evs[0].Outcome != "store-error" || !errors.Is(evs[0].Err, idempotency.ErrLockLost) {
			t.Errorf("events %+v, want one store-error wrapping ErrLockLost", evs)
		}
	})
}

// WithObserver: "store-error (a store call failed ...: the claim ..., or,
// after the handler ran, the completion or release, or the lock was
// lost)", "Err: the store's error for "store-error" (wrapping ErrLockLost
// when the lock was lost)". Here the handler returned, its completion
// fails while the store is down, and the renewals fail too: the lock is
// lost (a lock timeout less a twentieth without a confirmed renewal)
// while the record is being stored. The event's Err must wrap ErrLockLost.
func TestAttackGuardLockLostDuringCompletionReportsErrLockLost(t *testing.T) {
	for _, op := range []string{"complete", "release", "release-stale"} {
		t.Run(op, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const lock = 3 * time.Second
				mem := grdMem(t, idempotency.MemoryConfig{})
				fs := &grdFaultStore{inner: mem,
					extend:   func(int) error { return errGrdDown },
					complete: func(int) error { return errGrdDown },
					release:  func(int) error { return errGrdDown },
				}
				if op == "release-stale" {
					// The store says the caller no longer holds the lock.
					fs.extend = nil
					fs.release = func(int) error { return fmt.Errorf("grd: release: %w", store.ErrStaleOwner) }
				}
				var obs grdEvents
				g := grdGuard(t, fs, idempotency.WithLockTimeout(lock), idempotency.WithObserver(&obs))
				t0 := time.Now()
				o, _, err := g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) {
					return store.Record{Status: 200}, op == "complete"
				})
				took := time.Since(t0)
				if o != store.Claimed || err != nil {
					t.Fatalf("Run = %q %v", o, err)
				}
				if took > lock {
					t.Errorf("Run returned after %v, more than the lock timeout %v", took, lock)
				}
				evs := obs.take()
				if len(evs) != 1 || evs[0].Outcome != "store-error" {
					t.Fatalf("events %+v, want one store-error", evs)
				}
				if !errors.Is(evs[0].Err, idempotency.ErrLockLost) {
					t.Errorf("%s: the lock was lost while the key was being settled (Run took %v of a %v lock): event Err = %v; want it to wrap ErrLockLost",
						op, took, lock, evs[0].Err)
				}
			})
		})
	}
}

// Guard.Run with a store that fails at each step: the claim fails closed
// (ErrStoreUnavailable, fn not run); renewals that fail now and then do
// not lose the lock; a completion or release that fails is tried again
// with the lock held (a retry meanwhile is in progress, never run); a
// store with no room stores the record without its body, then without its
// header.
func TestAttackGuardStoreFaultsEachStep(t *testing.T) {
	const lock = 3 * time.Second
	t.Run("begin fails", func(t *testing.T) {
		for _, fail := range []func(int) error{
			func(int) error { return errGrdDown },
			func(int) error { return fmt.Errorf("grd: %w", store.ErrStoreFull) },
		} {
			fs := &grdFaultStore{inner: grdMem(t, idempotency.MemoryConfig{}), begin: fail}
			var obs grdEvents
			g := grdGuard(t, fs, idempotency.WithObserver(&obs))
			ran := false
			o, rec, err := g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) { ran = true; return store.Record{Status: 200}, true })
			if ran || o != "" || rec.Status != 0 || !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, fail(1)) && !errors.Is(err, store.ErrStoreFull) {
				t.Errorf("Run on a failing claim = %q %v %v, ran %v", o, rec.Status, err, ran)
			}
			if evs := obs.take(); len(evs) != 1 || evs[0].Outcome != "store-error" || !errors.Is(evs[0].Err, idempotency.ErrStoreUnavailable) {
				t.Errorf("events %+v", evs)
			}
		}
	})
	t.Run("begin gives no outcome", func(t *testing.T) {
		g := grdGuard(t, grdNoOutcome{})
		ran := false
		o, _, err := g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) { ran = true; return store.Record{Status: 200}, true })
		if ran || o != "" || !errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Errorf("Run = %q %v, ran %v; want ErrStoreUnavailable, not run", o, err, ran)
		}
	})
	t.Run("renewals fail now and then", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := grdMem(t, idempotency.MemoryConfig{})
			fs := &grdFaultStore{inner: mem, extend: func(n int) error {
				if n%3 != 0 { // two of three fail
					return errGrdDown
				}
				return nil
			}}
			g := grdGuard(t, fs, idempotency.WithLockTimeout(lock))
			var cause error
			o, _, err := g.Run(context.Background(), "s", "k", grdFP, func(ctx context.Context) (store.Record, bool) {
				select {
				case <-ctx.Done():
					cause = context.Cause(ctx)
				case <-time.After(10 * lock):
				}
				return store.Record{Status: 200, Body: []byte("long")}, true
			})
			if o != store.Claimed || err != nil || cause != nil {
				t.Fatalf("Run = %q %v, fn's context ended with %v; want the lock kept", o, err, cause)
			}
			if o, rec, _ := g.Run(context.Background(), "s", "k", grdFP, grdRec(200, "x")); o != store.Completed || string(rec.Body) != "long" {
				t.Fatalf("replay = %q %q", o, rec.Body)
			}
		})
	})
	t.Run("renewals every third of the lock timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			fs := &grdFaultStore{inner: grdMem(t, idempotency.MemoryConfig{})}
			g := grdGuard(t, fs, idempotency.WithLockTimeout(lock))
			g.Run(context.Background(), "s", "k", grdFP, func(ctx context.Context) (store.Record, bool) {
				time.Sleep(10*lock + lock/6)
				return store.Record{Status: 200}, true
			})
			if _, e, _, _ := fs.counts(); e != 30 {
				t.Errorf("%d renewals over 10 lock timeouts, want 30 (every third)", e)
			}
		})
	})
	for _, op := range []string{"complete", "release"} {
		t.Run(op+" fails for a while", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := grdMem(t, idempotency.MemoryConfig{})
				down := true
				var mu sync.Mutex
				hook := func(int) error {
					mu.Lock()
					defer mu.Unlock()
					if down {
						return errGrdDown
					}
					return nil
				}
				fs := &grdFaultStore{inner: mem}
				if op == "complete" {
					fs.complete = hook
				} else {
					fs.release = hook
				}
				var obs grdEvents
				g := grdGuard(t, fs, idempotency.WithLockTimeout(lock), idempotency.WithObserver(&obs))
				other := grdGuard(t, mem, idempotency.WithLockTimeout(lock))
				var runs atomic.Int32
				fn := func(context.Context) (store.Record, bool) {
					runs.Add(1)
					return store.Record{Status: 201, Body: []byte("done")}, op == "complete"
				}
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					if o, _, err := g.Run(context.Background(), "s", "k", grdFP, fn); o != store.Claimed || err != nil {
						t.Errorf("Run = %q %v", o, err)
					}
				}()
				// The store refuses the completion (or release) for
				// two thirds of a lock timeout; renewals work.
				time.Sleep(2 * lock / 3)
				if o, _, _ := other.Run(context.Background(), "s", "k", grdFP, fn); o != store.InProgress {
					t.Errorf("retry while the %s fails = %q, want InProgress", op, o)
				}
				mu.Lock()
				down = false
				mu.Unlock()
				wg.Wait()
				want := store.Completed
				if op == "release" {
					want = store.Claimed
				}
				if o, _, _ := other.Run(context.Background(), "s", "k", grdFP, fn); o != want {
					t.Errorf("retry after the store came back = %q, want %q", o, want)
				}
				if n := runs.Load(); (op == "complete" && n != 1) || (op == "release" && n != 2) {
					t.Errorf("fn ran %d times", n)
				}
				if evs := obs.take(); len(evs) != 1 || evs[0].Outcome != "new" {
					t.Errorf("events %+v, want one \"new\"", evs)
				}
			})
		})
	}
	t.Run("no room for body then header", func(t *testing.T) {
		for _, fulls := range []int{1, 2} {
			mem := grdMem(t, idempotency.MemoryConfig{})
			fs := &grdFaultStore{inner: mem, complete: func(n int) error {
				if n <= fulls {
					return fmt.Errorf("grd: %w", store.ErrStoreFull)
				}
				return nil
			}}
			g := grdGuard(t, fs)
			rec := store.Record{Status: 202, Header: http.Header{"X-A": {"1"}}, Body: []byte("big")}
			g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) { return rec, true })
			o, got, _ := g.Run(context.Background(), "s", "k", grdFP, grdRec(200, "x"))
			wantHdr := fulls == 1
			if o != store.Completed || got.Status != 202 || !got.BodyOmitted || len(got.Body) != 0 || (got.Header.Get("X-A") == "1") != wantHdr {
				t.Errorf("%d ErrStoreFull: replay = %q %+v", fulls, o, got)
			}
		}
	})
	t.Run("claim answered after the store timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			mem := grdMem(t, idempotency.MemoryConfig{})
			fs := &grdFaultStore{inner: mem, begin: func(n int) error {
				if n == 1 {
					time.Sleep(3 * time.Second) // ignores its context, then claims
				}
				return nil
			}}
			g := grdGuard(t, fs, idempotency.WithStoreTimeout(time.Second), idempotency.WithLockTimeout(time.Minute))
			t0 := time.Now()
			ran := false
			o, _, err := g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) { ran = true; return store.Record{Status: 200}, true })
			if ran || o != "" || !errors.Is(err, idempotency.ErrStoreUnavailable) || time.Since(t0) != time.Second {
				t.Fatalf("Run = %q %v after %v, ran %v; want ErrStoreUnavailable after the 1s store timeout", o, err, time.Since(t0), ran)
			}
			time.Sleep(3 * time.Second)
			synctest.Wait()
			o, _, err = g.Run(context.Background(), "s", "k", grdFP, grdRec(200, "x"))
			if o != store.Claimed || err != nil {
				t.Errorf("Run after the late claim landed = %q %v; want Claimed (the late claim released)", o, err)
			}
		})
	})
}

// grdNoOutcome is a store whose Begin answers nothing.
type grdNoOutcome struct{}

func (grdNoOutcome) Begin(context.Context, store.ID, store.Fingerprint, time.Duration) (store.Result, error) {
	return store.Result{}, nil
}
func (grdNoOutcome) Extend(context.Context, store.ID, store.Owner, time.Duration) error { return nil }
func (grdNoOutcome) Complete(context.Context, store.ID, store.Owner, store.Record, time.Duration) error {
	return nil
}
func (grdNoOutcome) Release(context.Context, store.ID, store.Owner) error { return nil }

// Guard.Run and the request's context: canceled before Run (the claim is
// released, the error wraps ctx's cause, fn does not run), canceled while
// fn runs (keep: stored; !keep: released).
func TestAttackGuardContextCanceled(t *testing.T) {
	mem := grdMem(t, idempotency.MemoryConfig{})
	g := grdGuard(t, mem)
	why := errors.New("grd: client left")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(why)
	ran := false
	o, _, err := g.Run(ctx, "s", "before", grdFP, func(context.Context) (store.Record, bool) { ran = true; return store.Record{Status: 200}, true })
	if ran || o != "" || !errors.Is(err, why) {
		t.Errorf("Run on a canceled ctx = %q %v, ran %v; want its cause, not run", o, err, ran)
	}
	if o, _, _ := g.Run(context.Background(), "s", "before", grdFP, grdRec(200, "x")); o != store.Claimed {
		t.Errorf("after a canceled Run: %q, want Claimed (released)", o)
	}
	for _, keep := range []bool{true, false} {
		ctx, cancel := context.WithCancelCause(context.Background())
		key := fmt.Sprint("mid", keep)
		o, _, err := g.Run(ctx, "s", key, grdFP, func(fctx context.Context) (store.Record, bool) {
			cancel(why)
			if !errors.Is(context.Cause(fctx), why) {
				t.Errorf("fn's context cause %v, want the request's", context.Cause(fctx))
			}
			return store.Record{Status: 200, Body: []byte("mid")}, keep
		})
		if o != store.Claimed || err != nil {
			t.Errorf("keep=%v: Run = %q %v", keep, o, err)
		}
		want := store.Completed
		if !keep {
			want = store.Claimed
		}
		if o, _, _ := g.Run(context.Background(), "s", key, grdFP, grdRec(200, "x")); o != want {
			t.Errorf("keep=%v: retry = %q, want %q", keep, o, want)
		}
	}
}

// Guard.Run: "store.Mismatch ...: the key is held or was completed for a
// request with a different fingerprint"; the same key under another scope
// is another key; retention expiry frees the key.
func TestAttackGuardMismatchScopesRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := grdMem(t, idempotency.MemoryConfig{})
		const ret = time.Hour
		g := grdGuard(t, mem, idempotency.WithRetention(ret), idempotency.WithLockTimeout(time.Minute))
		other := store.NewFingerprint("PUBLISH", "queue/charges", [32]byte{8})
		ctx := context.Background()
		hold := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.Run(ctx, "s", "k", grdFP, func(context.Context) (store.Record, bool) {
				<-hold
				return store.Record{Status: 200, Body: []byte("one")}, true
			})
		}()
		synctest.Wait()
		if o, _, _ := g.Run(ctx, "s", "k", other, grdRec(200, "x")); o != store.Mismatch {
			t.Errorf("other fingerprint while held = %q", o)
		}
		close(hold)
		wg.Wait()
		if o, _, _ := g.Run(ctx, "s", "k", other, grdRec(200, "x")); o != store.Mismatch {
			t.Errorf("other fingerprint once completed = %q", o)
		}
		if o, _, _ := g.Run(ctx, "s2", "k", other, grdRec(200, "x")); o != store.Claimed {
			t.Errorf("same key, other scope = %q, want Claimed", o)
		}
		time.Sleep(ret - time.Nanosecond)
		if o, rec, _ := g.Run(ctx, "s", "k", grdFP, grdRec(200, "x")); o != store.Completed || string(rec.Body) != "one" {
			t.Errorf("1ns before retention ends = %q %q", o, rec.Body)
		}
		time.Sleep(time.Nanosecond)
		if o, _, _ := g.Run(ctx, "s", "k", other, grdRec(200, "two")); o != store.Claimed {
			t.Errorf("at retention's end, other fingerprint = %q, want Claimed", o)
		}
	})
}

// Keys and scopes with odd bytes: each (scope, key) pair is its own key,
// whatever bytes it holds; none collides with another by moving bytes
// between scope and key.
func TestAttackGuardOddScopesAndKeys(t *testing.T) {
	g := grdGuard(t, grdMem(t, idempotency.MemoryConfig{}))
	long := strings.Repeat("k", 1<<20)
	pairs := [][2]string{
		{"", ""}, {"", "a"}, {"a", ""}, {"a", "b"}, {"ab", ""}, {"", "ab"},
		{"a\x00", "b"}, {"a", "\x00b"}, {"\xff\xfe", "\x00"}, {"\x00", "\xff\xfe"},
		{"scope", long}, {long, "key"}, {"é", "e\u0301"}, {"e\u0301", "é"},
		{"\x80", ""}, {"", "\x80"}, {"a,b", "c"}, {"a", ",bc"},
	}
	ctx := context.Background()
	for i, p := range pairs {
		body := fmt.Sprint(i)
		if o, _, err := g.Run(ctx, p[0], p[1], grdFP, grdRec(200, body)); o != store.Claimed || err != nil {
			t.Errorf("pair %d %q: first Run = %q %v, want Claimed", i, truncQ(p), o, err)
		}
	}
	for i, p := range pairs {
		if o, rec, _ := g.Run(ctx, p[0], p[1], grdFP, grdRec(200, "again")); o != store.Completed || string(rec.Body) != fmt.Sprint(i) {
			t.Errorf("pair %d %q: replay = %q %q", i, truncQ(p), o, rec.Body)
		}
	}
}

func truncQ(p [2]string) string {
	s := fmt.Sprintf("%q/%q", p[0], p[1])
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return s
}

// MemoryConfig.MaxBytes: "a body is kept only if its record, with the
// key's fixed cost, fits in half a shard: with 16 shards, a body of up to
// MaxBytes/32 less 160 bytes and the size of its header fields". Alone in
// an empty store, a body of exactly that is kept, one byte more is not.
// (The doc once said MaxBytes/32, and the store kept 160 bytes less.)
func TestAttackGuardMemoryBodyAtBound(t *testing.T) {
	for _, maxBytes := range []int64{0, 32 << 20} {
		if maxBytes == 0 {
			maxBytes = 64 << 20
		}
		bound := int(maxBytes/32 - 160)
		if !grdKept(t, grdMem(t, idempotency.MemoryConfig{MaxBytes: maxBytes}), bound) {
			t.Errorf("MaxBytes %d, empty store: a body of MaxBytes/32 - 160 = %d bytes not kept", maxBytes, bound)
		}
		if grdKept(t, grdMem(t, idempotency.MemoryConfig{MaxBytes: maxBytes}), bound+1) {
			t.Errorf("MaxBytes %d, empty store: a body of %d bytes kept, past the documented bound", maxBytes, bound+1)
		}
		g := grdGuard(t, grdMem(t, idempotency.MemoryConfig{MaxBytes: maxBytes}))
		body := bytes.Repeat([]byte("b"), bound)
		g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) {
			return store.Record{Status: 200, Body: body}, true
		})
		o, rec, _ := g.Run(context.Background(), "s", "k", grdFP, grdRec(200, "x"))
		if o != store.Completed || rec.BodyOmitted || len(rec.Body) != len(body) {
			t.Errorf("MaxBytes %d: replay %q, BodyOmitted %v, %d body bytes; want the %d-byte body kept",
				maxBytes, o, rec.BodyOmitted, len(rec.Body), bound)
		}
	}
}

func grdKept(t *testing.T, m *idempotency.MemoryStore, n int) bool {
	id := store.ID{1, 2, 3}
	res, err := m.Begin(context.Background(), id, grdFP, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return m.Complete(context.Background(), id, res.Owner, store.Record{Status: 200, Body: make([]byte, n)}, time.Hour) == nil
}

// ReportInvalid: one "invalid" event with the Guard's name; nothing for a
// nil or zero Guard; Run never reports "invalid".
func TestAttackGuardReportInvalid(t *testing.T) {
	var obs grdEvents
	g := grdGuard(t, grdMem(t, idempotency.MemoryConfig{}), idempotency.WithObserver(&obs), idempotency.WithName("q"))
	g.ReportInvalid(context.Background())
	if evs := obs.take(); len(evs) != 1 || evs[0] != (observe.Event{Kind: observe.Idempotency, Name: "q", Outcome: "invalid"}) {
		t.Errorf("events %+v", evs)
	}
	var nilG *idempotency.Guard
	nilG.ReportInvalid(context.Background())
	(&idempotency.Guard{}).ReportInvalid(context.Background())
	if o, _, err := nilG.Run(context.Background(), "s", "k", grdFP, grdRec(200, "")); o != "" || err == nil {
		t.Errorf("nil Guard Run = %q %v", o, err)
	}
	if o, _, err := g.Run(context.Background(), "s", "k", grdFP, nil); o != "" || err == nil {
		t.Errorf("nil fn Run = %q %v", o, err)
	}
}

// DecodeRecord: "garbage gives an error saying the record is corrupt,
// never a panic or an outsized allocation. The returned record does not
// alias data." A table of mutations of valid encodings, then random ones.
func TestAttackGuardDecodeRecordHostile(t *testing.T) {
	seeds := []store.Record{
		{Status: 200},
		{Status: 999, BodyOmitted: true},
		{Status: 201, Header: http.Header{"A": {"1", "22"}, "Bb": nil, "C": {""}}, Body: []byte("body")},
		{Status: 404, Header: http.Header{"\x00": {"\xff"}}, Body: bytes.Repeat([]byte{0x80}, 300)},
		{Status: 500, Header: http.Header{"X": {strings.Repeat("v", 200)}}, BodyOmitted: true},
	}
	var encs [][]byte
	for _, r := range seeds {
		b, err := r.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary(%+v): %v", r, err)
		}
		got, err := store.DecodeRecord(b)
		if err != nil || got.Status != r.Status || got.BodyOmitted != r.BodyOmitted || !bytes.Equal(got.Body, r.Body) || len(got.Header) != len(r.Header) {
			t.Fatalf("round trip of %+v = %+v, %v", r, got, err)
		}
		b2, _ := got.MarshalBinary()
		if !bytes.Equal(b, b2) {
			t.Errorf("re-encoding of %+v differs", r)
		}
		encs = append(encs, b)
	}
	decode := func(what string, b []byte) {
		t.Helper()
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("%s: DecodeRecord(%x) panicked: %v", what, b, p)
			}
		}()
		in := bytes.Clone(b)
		rec, err := store.DecodeRecord(in)
		if err != nil {
			if !strings.Contains(err.Error(), "corrupt") {
				t.Errorf("%s: error %q does not say the record is corrupt", what, err)
			}
			if rec.Status != 0 || rec.Header != nil || rec.Body != nil {
				t.Errorf("%s: error with a non-zero record %+v", what, rec)
			}
			return
		}
		// A decoded record is one MarshalBinary takes, and does not alias.
		if _, err := rec.MarshalBinary(); err != nil {
			t.Errorf("%s: DecodeRecord accepted %x, a record MarshalBinary refuses: %v", what, b, err)
		}
		for i := range in {
			in[i] ^= 0xff
		}
		rec2, _ := store.DecodeRecord(b)
		if rec.Status != rec2.Status || !bytes.Equal(rec.Body, rec2.Body) || fmt.Sprint(rec.Header) != fmt.Sprint(rec2.Header) {
			t.Errorf("%s: decoded record aliases its input", what)
		}
	}
	fixed := [][]byte{nil, {}, []byte("SGR"), []byte("SGR\x01"), []byte("SGR\x01\x00\xc8"), []byte("SGR\x01\x00\xc8\x00"),
		[]byte("SGR\x02\x00\xc8\x00\x00\x00"), []byte("SGR\x02\x00\xc8\x01\x00"), []byte("SGR\x03\x00\xc8\x00\x00"),
		[]byte("SGR\x01\xff\xff\x00\x00"), []byte("SGR\x01\x00\xc7\x00\x00"), []byte("SGR\x01\x03\xe8\x00\x00"),
		[]byte("SGR\x01\x00\xc8\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01\x00"),
		[]byte("SGR\x01\x00\xc8\x01\x01A\xff\xff\xff\xff\x0f\x00"),
		[]byte("SGR\x01\x00\xc8\x80\x00\x00"),                                          // non-minimal count
		[]byte("SGR\x01\x00\xc8\x02\x01A\x00\x01A\x00\x00"),                            // repeated name
		[]byte("SGR\x01\x00\xc8\x01\x00\x00\x00"),                                      // empty name
		[]byte("SGR\x02\x00\xc8\x01\x00\x03abc"),                                       // omitted with a body
		[]byte("SGR\x01\x00\xc8\x00\x00\x00"),                                          // trailing byte
		append([]byte("SGR\x01\x00\xc8\x00\xff\xff\xff\xff\x07"), make([]byte, 10)...), // body length far over
	}
	for i, b := range fixed {
		decode(fmt.Sprint("fixed ", i), b)
	}
	for ei, enc := range encs {
		for i := range enc {
			decode(fmt.Sprintf("seed %d truncated at %d", ei, i), enc[:i])
			for _, x := range []byte{0x00, 0x01, 0x7f, 0x80, 0xff} {
				b := bytes.Clone(enc)
				b[i] = x
				decode(fmt.Sprintf("seed %d byte %d = %#x", ei, i, x), b)
			}
			b := append(bytes.Clone(enc[:i]), enc[i+1:]...)
			decode(fmt.Sprintf("seed %d byte %d dropped", ei, i), b)
			b = append(bytes.Clone(enc[:i]), append([]byte{0x80}, enc[i:]...)...)
			decode(fmt.Sprintf("seed %d 0x80 inserted at %d", ei, i), b)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for n := range 50000 {
		enc := bytes.Clone(encs[r.IntN(len(encs))])
		for range 1 + r.IntN(4) {
			switch r.IntN(3) {
			case 0:
				enc[r.IntN(len(enc))] = byte(r.Uint32())
			case 1:
				if len(enc) > 8 {
					enc = enc[:len(enc)-1-r.IntN(len(enc)-8)]
				}
			case 2:
				enc = append(enc, byte(r.Uint32()))
			}
		}
		decode(fmt.Sprint("random ", n), enc)
	}
}

// store.Record.BodyOmitted: "the handler's body was not kept (over the
// size cap, or no room in the store): Body is empty and a replay says
// so". Guard.Run: the record is stored "without its body, then without
// its header, if the store has no room for them". A record that has no
// body and a header the store has no room for is stored without its
// header: nothing of a body was dropped, so the replay must not say that
// the body was omitted.
func TestAttackGuardNoBodyRecordNotMarkedBodyOmitted(t *testing.T) {
	for _, name := range []string{"memory", "fault"} {
		var s store.Store
		if name == "memory" {
			s = grdMem(t, idempotency.MemoryConfig{MaxEntries: 4, MaxBytes: 1024})
		} else {
			// The record whole (it has no body to leave out), refused
			// as full; then the status alone.
			s = &grdFaultStore{inner: grdMem(t, idempotency.MemoryConfig{}), complete: func(n int) error {
				if n <= 1 {
					return fmt.Errorf("grd: %w", store.ErrStoreFull)
				}
				return nil
			}}
		}
		g := grdGuard(t, s)
		rec := store.Record{Status: 204, Header: http.Header{"X-Big": {strings.Repeat("h", 2000)}}}
		g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) { return rec, true })
		o, got, err := g.Run(context.Background(), "s", "k", grdFP, grdRec(200, "again"))
		if o != store.Completed || err != nil || got.Status != 204 {
			t.Fatalf("%s: replay = %q %+v %v", name, o, got, err)
		}
		if got.BodyOmitted {
			t.Errorf("%s: a bodiless 204 whose header found no room is replayed with BodyOmitted (the middleware adds \"Idempotent-Body-Omitted: true\"); it had no body to omit", name)
		}
	}
}

// WithObserver: "Elapsed: the time spent in store calls for the request
// (claim, renewals, completion or release)". A store that takes 100 ms to
// claim, 20 ms per renewal and 50 ms to complete, fn that runs 10 s
// under a 3 s lock: renewals at 1.1, 2.12, ... 9.26 s (9 of them).
func TestAttackGuardElapsedCountsStoreTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &grdFaultStore{inner: grdMem(t, idempotency.MemoryConfig{}),
			begin:    func(int) error { time.Sleep(100 * time.Millisecond); return nil },
			extend:   func(int) error { time.Sleep(20 * time.Millisecond); return nil },
			complete: func(int) error { time.Sleep(50 * time.Millisecond); return nil },
		}
		var obs grdEvents
		g := grdGuard(t, fs, idempotency.WithLockTimeout(3*time.Second), idempotency.WithObserver(&obs))
		g.Run(context.Background(), "s", "k", grdFP, func(context.Context) (store.Record, bool) {
			time.Sleep(10 * time.Second)
			return store.Record{Status: 200}, true
		})
		_, e, _, _ := fs.counts()
		want := 100*time.Millisecond + time.Duration(e)*20*time.Millisecond + 50*time.Millisecond
		if evs := obs.take(); len(evs) != 1 || evs[0].Outcome != "new" || evs[0].Elapsed != want {
			t.Errorf("events %+v; want one \"new\" with Elapsed %v (%d renewals)", evs, want, e)
		}
		g.Run(context.Background(), "s", "k", grdFP, grdRec(200, ""))
		if evs := obs.take(); len(evs) != 1 || evs[0].Outcome != "replay" || evs[0].Elapsed != 100*time.Millisecond {
			t.Errorf("events %+v; want one \"replay\" with Elapsed 100ms", evs)
		}
	})
}
