package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
)

// guardFP is the fingerprint of the Guard tests' requests.
var guardFP = store.NewFingerprint("op", "/charge", [32]byte{1})

func newGuard(t *testing.T, mem store.Store, opts ...idempotency.GuardOption) *idempotency.Guard {
	t.Helper()
	g, err := idempotency.NewGuard(orMemory(t, mem), opts...)
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	return g
}

func TestNewGuardErrors(t *testing.T) {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	tests := []struct {
		name string
		mem  store.Store
		opts []idempotency.GuardOption
		want string // in the error
	}{
		{"nil store", nil, nil, "nil store"},
		{"nil *MemoryStore", (*idempotency.MemoryStore)(nil), nil, "nil store"},
		{"WithLockTimeout(0)", mem, []idempotency.GuardOption{idempotency.WithLockTimeout(0)}, "WithLockTimeout(0s)"},
		{"WithLockTimeout(999µs)", mem, []idempotency.GuardOption{idempotency.WithLockTimeout(999 * time.Microsecond)}, "at least 1ms"},
		{"WithRetention(-1s)", mem, []idempotency.GuardOption{idempotency.WithRetention(-time.Second)}, "WithRetention"},
		{"WithRetention(500µs)", mem, []idempotency.GuardOption{idempotency.WithRetention(500 * time.Microsecond)}, "at least 1ms"},
		{"WithStoreTimeout(0)", mem, []idempotency.GuardOption{idempotency.WithStoreTimeout(0)}, "WithStoreTimeout"},
		{"WithLogger(nil)", mem, []idempotency.GuardOption{idempotency.WithLogger(nil)}, "WithLogger(nil)"},
	}
	for _, tc := range tests {
		_, err := idempotency.NewGuard(tc.mem, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewGuard(%s) error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := idempotency.NewGuard(mem, idempotency.GuardOption{}, idempotency.WithName("x"), idempotency.WithObserver(nil),
		idempotency.WithLockTimeout(time.Millisecond), idempotency.WithRetention(time.Hour), idempotency.WithStoreTimeout(time.Second)); err != nil {
		t.Errorf("NewGuard(core options) error: %v", err)
	}
}

// TestOptionsTyped: the options of the core configure the middleware too;
// an HTTP option given to NewGuard would not compile (it is an Option, not
// a GuardOption), which this test cannot show but its types do.
func TestOptionsTyped(t *testing.T) {
	core := []idempotency.GuardOption{idempotency.WithLockTimeout(time.Second), idempotency.WithName("orders")}
	opts := []idempotency.Option{sharedScope, nil}
	for _, o := range core {
		opts = append(opts, o)
	}
	if _, err := idempotency.NewMiddleware(orMemory(t, nil), opts...); err != nil {
		t.Fatalf("NewMiddleware(HTTP and core options): %v", err)
	}
	var _ idempotency.Option = idempotency.GuardOption{}
}

// TestGuardRun: Run's outcomes, one call after another on one key.
func TestGuardRun(t *testing.T) {
	g := newGuard(t, nil)
	ctx := context.Background()
	var runs atomic.Int64
	op := func(status int, keep bool) func(context.Context) (store.Record, bool) {
		return func(context.Context) (store.Record, bool) {
			n := runs.Add(1)
			return store.Record{Status: status, Body: fmt.Appendf(nil, "run %d", n)}, keep
		}
	}
	steps := []struct {
		name    string
		fp      store.Fingerprint
		fn      func(context.Context) (store.Record, bool)
		want    store.Outcome
		body    string // of the record returned
		runsNow int64
	}{
		{"not kept: released", guardFP, op(500, false), store.Claimed, "run 1", 1},
		{"runs again after a release", guardFP, op(201, true), store.Claimed, "run 2", 2},
		{"replay", guardFP, op(201, true), store.Completed, "run 2", 2},
		{"mismatch", store.NewFingerprint("op", "/refund", [32]byte{1}), op(201, true), store.Mismatch, "", 2},
	}
	for _, s := range steps {
		got, rec, err := g.Run(ctx, "alice", "k", s.fp, s.fn)
		if err != nil || got != s.want || string(rec.Body) != s.body || runs.Load() != s.runsNow {
			t.Fatalf("%s: Run = %v, body %q, %v (runs %d); want %v, %q, nil (runs %d)", s.name, got, rec.Body, err, runs.Load(), s.want, s.body, s.runsNow)
		}
	}
}

func TestGuardRunInProgress(t *testing.T) {
	g := newGuard(t, nil)
	entered, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan store.Outcome)
	go func() {
		o, _, _ := g.Run(context.Background(), "alice", "k", guardFP, func(context.Context) (store.Record, bool) {
			close(entered)
			<-proceed
			return store.Record{Status: 200}, true
		})
		done <- o
	}()
	<-entered
	o, rec, err := g.Run(context.Background(), "alice", "k", guardFP, func(context.Context) (store.Record, bool) {
		t.Error("fn ran while the key was in progress")
		return store.Record{}, false
	})
	if o != store.InProgress || err != nil || rec.Status != 0 {
		t.Fatalf("second Run = %v, %+v, %v; want InProgress, zero record, nil", o, rec, err)
	}
	close(proceed)
	if o := <-done; o != store.Claimed {
		t.Fatalf("first Run = %v, want Claimed", o)
	}
}

// TestGuardRunPanic: a panicking fn releases the key, the panic goes on,
// and the observer hears of it.
func TestGuardRunPanic(t *testing.T) {
	var log eventLog
	g := newGuard(t, nil, idempotency.WithObserver(&log))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic \"boom\"", r)
			}
		}()
		_, _, _ = g.Run(context.Background(), "alice", "k", guardFP, func(context.Context) (store.Record, bool) { panic("boom") })
	}()
	if o, _, err := g.Run(context.Background(), "alice", "k", guardFP, func(context.Context) (store.Record, bool) {
		return store.Record{Status: 200}, true
	}); o != store.Claimed || err != nil {
		t.Fatalf("Run after a panic = %v, %v; want Claimed (the key was released)", o, err)
	}
	if evs := log.take(); len(evs) != 2 || evs[0].Outcome != "new" || evs[1].Outcome != "new" {
		t.Fatalf("events %+v, want two \"new\"", evs)
	}
}

// failingCompleteStore is a memory store whose Complete always fails.
type failingCompleteStore struct{ *idempotency.MemoryStore }

func (failingCompleteStore) Complete(context.Context, store.ID, store.Owner, store.Record, time.Duration) error {
	return errDown
}

// TestGuardRunStoreErrors: a store that cannot claim fails closed with an
// error wrapping ErrStoreUnavailable and the store's error, without
// running fn; one that cannot store fn's record leaves fn's answer
// standing and reports a store error.
func TestGuardRunStoreErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		var log eventLog
		down := &slowStore{MemoryStore: mem}
		down.down.Store(true)
		ran := false
		fn := func(context.Context) (store.Record, bool) {
			ran = true
			return store.Record{Status: 201}, true
		}
		o, _, err := newGuard(t, down, idempotency.WithObserver(&log)).Run(context.Background(), "alice", "k", guardFP, fn)
		if o != "" || ran || !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, errDown) {
			t.Fatalf("store down: Run = %v, %v (fn ran: %v); want 0 and an error wrapping ErrStoreUnavailable and the store's, fn not run", o, err, ran)
		}
		o, rec, err := newGuard(t, failingCompleteStore{mem}, idempotency.WithObserver(&log)).Run(context.Background(), "alice", "k", guardFP, fn)
		if o != store.Claimed || err != nil || rec.Status != 201 || !ran {
			t.Fatalf("Complete fails: Run = %v, %+v, %v; want Claimed, fn's record, nil", o, rec, err)
		}
		evs := log.take()
		if len(evs) != 2 || evs[0].Outcome != "store-error" || evs[1].Outcome != "store-error" || !errors.Is(evs[1].Err, errDown) {
			t.Fatalf("events %+v, want two store errors, the second wrapping the Complete error", evs)
		}
	})
}

// TestGuardRunLockLost: fn's context is canceled with ErrLockLost when the
// lock cannot be renewed; the record is not stored, and the observer gets
// a store error wrapping ErrLockLost.
func TestGuardRunLockLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		var log eventLog
		g := newGuard(t, lostLockStore{mem}, idempotency.WithObserver(&log), idempotency.WithLockTimeout(30*time.Second))
		o, err, cause := runUntilCanceled(g)
		if o != store.Claimed || err != nil || !errors.Is(cause, idempotency.ErrLockLost) {
			t.Fatalf("Run = %v, %v, fn's context ended with %v; want Claimed, nil, ErrLockLost", o, err, cause)
		}
		if evs := log.take(); len(evs) != 1 || evs[0].Outcome != "store-error" || !errors.Is(evs[0].Err, idempotency.ErrLockLost) {
			t.Fatalf("events %+v, want one store error wrapping ErrLockLost", evs)
		}
		time.Sleep(30 * time.Second) // the unrenewed lock expires
		if o, _, _ := g.Run(context.Background(), "alice", "k", guardFP, func(context.Context) (store.Record, bool) {
			return store.Record{Status: 201}, false
		}); o != store.Claimed {
			t.Fatalf("after a lost lock: Run = %v, want Claimed (nothing stored)", o)
		}
	})
}

// TestGuardRunCanceledBeforeRun: a request that ended while its key was
// claimed does not run; the key is released.
func TestGuardRunCanceledBeforeRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		g := newGuard(t, &slowStore{MemoryStore: mem})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(beginDelay/2, cancel)
		ran := false
		fn := func(context.Context) (store.Record, bool) {
			ran = true
			return store.Record{Status: 201}, true
		}
		o, _, err := g.Run(ctx, "alice", "k", guardFP, fn)
		if o != "" || ran || !errors.Is(err, context.Canceled) || errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Fatalf("Run = %v, %v (fn ran: %v); want 0, an error wrapping context.Canceled (not ErrStoreUnavailable), fn not run", o, err, ran)
		}
		if o, _, err := g.Run(context.Background(), "alice", "k", guardFP, fn); o != store.Claimed || err != nil || !ran {
			t.Fatalf("retry: Run = %v, %v; want Claimed (the key was released)", o, err)
		}
	})
}

// TestGuardRunRecordTooLarge: a record the store has no room for is kept
// without its body; a record whose body fn did not keep is stored so.
func TestGuardRunRecordTooLarge(t *testing.T) {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxBytes: 4 << 10})
	g := newGuard(t, mem)
	for i, rec := range []store.Record{
		{Status: 201, Body: make([]byte, 64<<10)},
		{Status: 201, BodyOmitted: true},
	} {
		k := fmt.Sprint(i)
		g.Run(context.Background(), "alice", k, guardFP, func(context.Context) (store.Record, bool) { return rec, true })
		o, got, err := g.Run(context.Background(), "alice", k, guardFP, func(context.Context) (store.Record, bool) {
			t.Error("fn ran again")
			return rec, true
		})
		if o != store.Completed || err != nil || got.Status != 201 || !got.BodyOmitted || len(got.Body) != 0 {
			t.Fatalf("record %d: replay %v, %+v, %v; want Completed, 201 with its body omitted", i, o, got, err)
		}
	}
}

func TestZeroGuard(t *testing.T) {
	for _, g := range []*idempotency.Guard{nil, new(idempotency.Guard)} {
		o, _, err := g.Run(context.Background(), "alice", "k", guardFP, func(context.Context) (store.Record, bool) {
			t.Fatal("a zero Guard ran fn")
			return store.Record{}, false
		})
		if o != "" || err == nil {
			t.Fatalf("zero Guard: Run = %v, %v; want 0 and an error", o, err)
		}
		g.ReportInvalid(context.Background()) // no observer: nothing, no panic
	}
	if o, _, err := newGuard(t, nil).Run(context.Background(), "alice", "k", guardFP, nil); o != "" || err == nil {
		t.Fatalf("Run(nil fn) = %v, %v; want 0 and an error", o, err)
	}
}

// TestReportInvalid: one "invalid" event with the guard's name.
func TestReportInvalid(t *testing.T) {
	var log eventLog
	newGuard(t, nil, idempotency.WithObserver(&log), idempotency.WithName("orders")).ReportInvalid(context.Background())
	want := observe.Event{Kind: observe.Idempotency, Name: "orders", Outcome: "invalid"}
	if evs := log.take(); len(evs) != 1 || evs[0] != want {
		t.Fatalf("events %+v, want [%+v]", evs, want)
	}
}

// extendDownStore fails every renewal with errDown.
type extendDownStore struct{ *idempotency.MemoryStore }

func (extendDownStore) Extend(context.Context, store.ID, store.Owner, time.Duration) error {
	return errDown
}

// TestGuardRunLockLostStoreDown: when no renewal is confirmed for a whole
// lock timeout because the store keeps failing, fn's context ends with a
// cause that wraps ErrLockLost and the store's error, and so does the
// observer's store error (ErrLockLost's documentation).
func TestGuardRunLockLostStoreDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		var log eventLog
		g := newGuard(t, extendDownStore{mem}, idempotency.WithObserver(&log), idempotency.WithLockTimeout(3*time.Second))
		_, _, cause := runUntilCanceled(g)
		if !errors.Is(cause, idempotency.ErrLockLost) || !errors.Is(cause, errDown) {
			t.Errorf("fn's context ended with %v; want it to wrap ErrLockLost and the store's error", cause)
		}
		if evs := log.take(); len(evs) != 1 || !errors.Is(evs[0].Err, errDown) {
			t.Errorf("events %+v; want one whose Err wraps the store's error", evs)
		}
	})
}

// runUntilCanceled runs a call through g whose fn waits for its context to
// end (a lost lock) and keeps a 201; it returns Run's outcome and error and
// the cause fn's context ended with.
func runUntilCanceled(g *idempotency.Guard) (store.Outcome, error, error) {
	var cause error
	o, _, err := g.Run(context.Background(), "alice", "k", guardFP, func(ctx context.Context) (store.Record, bool) {
		<-ctx.Done()
		cause = context.Cause(ctx)
		return store.Record{Status: 201}, true
	})
	return o, err, cause
}
