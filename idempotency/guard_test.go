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
	"github.com/stormguard/stormguard/observe"
)

// guardFP is the fingerprint of the Guard tests' requests.
var guardFP = idempotency.NewFingerprint("op", "/charge", [32]byte{1})

func newGuard(t *testing.T, store idempotency.Store, opts ...idempotency.Option) *idempotency.Guard {
	t.Helper()
	g, err := idempotency.NewGuard(orMemory(t, store), opts...)
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	return g
}

func TestNewGuardErrors(t *testing.T) {
	store, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	tests := []struct {
		name  string
		store idempotency.Store
		opts  []idempotency.Option
		want  string // in the error
	}{
		{"nil store", nil, nil, "nil store"},
		{"nil *MemoryStore", (*idempotency.MemoryStore)(nil), nil, "nil store"},
		{"WithScope", store, []idempotency.Option{idempotency.WithScope(userScope)}, "WithScope applies to a Middleware only"},
		{"WithSharedScope", store, []idempotency.Option{idempotency.WithSharedScope()}, "WithSharedScope applies to a Middleware only"},
		{"WithRequired", store, []idempotency.Option{idempotency.WithRequired()}, "WithRequired"},
		{"WithMethods", store, []idempotency.Option{idempotency.WithMethods("PUT")}, "WithMethods"},
		{"WithRoute", store, []idempotency.Option{idempotency.WithRoute(nil)}, "WithRoute"},
		{"WithMaxRequestBody", store, []idempotency.Option{idempotency.WithMaxRequestBody(1)}, "WithMaxRequestBody"},
		{"WithMaxResponseBody", store, []idempotency.Option{idempotency.WithMaxResponseBody(1)}, "WithMaxResponseBody"},
		{"WithStoreStatus", store, []idempotency.Option{idempotency.WithStoreStatus(idempotency.DefaultStoreStatus)}, "WithStoreStatus"},
		{"WithReplayHeaders", store, []idempotency.Option{idempotency.WithReplayHeaders("Etag")}, "WithReplayHeaders"},
		{"WithLockTimeout(0)", store, []idempotency.Option{idempotency.WithLockTimeout(0)}, "WithLockTimeout(0s)"},
		{"WithRetention(-1s)", store, []idempotency.Option{idempotency.WithRetention(-time.Second)}, "WithRetention"},
		{"WithStoreTimeout(0)", store, []idempotency.Option{idempotency.WithStoreTimeout(0)}, "WithStoreTimeout"},
		{"WithLogger(nil)", store, []idempotency.Option{idempotency.WithLogger(nil)}, "WithLogger(nil)"},
	}
	for _, tc := range tests {
		_, err := idempotency.NewGuard(tc.store, tc.opts...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewGuard(%s) error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
	if _, err := idempotency.NewGuard(store, idempotency.Option{}, idempotency.WithName("x"), idempotency.WithObserver(nil),
		idempotency.WithLockTimeout(time.Second), idempotency.WithRetention(time.Hour), idempotency.WithStoreTimeout(time.Second)); err != nil {
		t.Errorf("NewGuard(core options) error: %v", err)
	}
}

// TestGuardRun: Run's outcomes, one call after another on one key.
func TestGuardRun(t *testing.T) {
	g := newGuard(t, nil)
	ctx := context.Background()
	k := idempotency.HashKey("alice", "k")
	var runs atomic.Int64
	op := func(status int, keep bool) func(context.Context) (idempotency.Record, bool) {
		return func(context.Context) (idempotency.Record, bool) {
			n := runs.Add(1)
			return idempotency.Record{Status: status, Body: fmt.Appendf(nil, "run %d", n)}, keep
		}
	}
	steps := []struct {
		name    string
		fp      idempotency.Fingerprint
		fn      func(context.Context) (idempotency.Record, bool)
		want    idempotency.Outcome
		body    string // of the record returned
		runsNow int64
	}{
		{"not kept: released", guardFP, op(500, false), idempotency.Claimed, "run 1", 1},
		{"runs again after a release", guardFP, op(201, true), idempotency.Claimed, "run 2", 2},
		{"replay", guardFP, op(201, true), idempotency.Completed, "run 2", 2},
		{"mismatch", idempotency.NewFingerprint("op", "/refund", [32]byte{1}), op(201, true), idempotency.Mismatch, "", 2},
	}
	for _, s := range steps {
		got, rec, err := g.Run(ctx, k, s.fp, s.fn)
		if err != nil || got != s.want || string(rec.Body) != s.body || runs.Load() != s.runsNow {
			t.Fatalf("%s: Run = %v, body %q, %v (runs %d); want %v, %q, nil (runs %d)", s.name, got, rec.Body, err, runs.Load(), s.want, s.body, s.runsNow)
		}
	}
}

func TestGuardRunInProgress(t *testing.T) {
	g := newGuard(t, nil)
	k := idempotency.HashKey("alice", "k")
	entered, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan idempotency.Outcome)
	go func() {
		o, _, _ := g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) {
			close(entered)
			<-proceed
			return idempotency.Record{Status: 200}, true
		})
		done <- o
	}()
	<-entered
	o, rec, err := g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) {
		t.Error("fn ran while the key was in progress")
		return idempotency.Record{}, false
	})
	if o != idempotency.InProgress || err != nil || rec.Status != 0 {
		t.Fatalf("second Run = %v, %+v, %v; want InProgress, zero record, nil", o, rec, err)
	}
	close(proceed)
	if o := <-done; o != idempotency.Claimed {
		t.Fatalf("first Run = %v, want Claimed", o)
	}
}

// TestGuardRunPanic: a panicking fn releases the key, the panic goes on,
// and the observer hears of it.
func TestGuardRunPanic(t *testing.T) {
	var log eventLog
	g := newGuard(t, nil, idempotency.WithObserver(&log))
	k := idempotency.HashKey("alice", "k")
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the panic \"boom\"", r)
			}
		}()
		_, _, _ = g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) { panic("boom") })
	}()
	if o, _, err := g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) {
		return idempotency.Record{Status: 200}, true
	}); o != idempotency.Claimed || err != nil {
		t.Fatalf("Run after a panic = %v, %v; want Claimed (the key was released)", o, err)
	}
	if evs := log.take(); len(evs) != 2 || evs[0].Outcome != "new" || evs[1].Outcome != "new" {
		t.Fatalf("events %+v, want two \"new\"", evs)
	}
}

// failingCompleteStore is a memory store whose Complete always fails.
type failingCompleteStore struct{ *idempotency.MemoryStore }

func (failingCompleteStore) Complete(context.Context, idempotency.Key, idempotency.Owner, idempotency.Record, time.Duration) error {
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
		fn := func(context.Context) (idempotency.Record, bool) {
			ran = true
			return idempotency.Record{Status: 201}, true
		}
		k := idempotency.HashKey("alice", "k")
		o, _, err := newGuard(t, down, idempotency.WithObserver(&log)).Run(context.Background(), k, guardFP, fn)
		if o != 0 || ran || !errors.Is(err, idempotency.ErrStoreUnavailable) || !errors.Is(err, errDown) {
			t.Fatalf("store down: Run = %v, %v (fn ran: %v); want 0 and an error wrapping ErrStoreUnavailable and the store's, fn not run", o, err, ran)
		}
		o, rec, err := newGuard(t, failingCompleteStore{mem}, idempotency.WithObserver(&log)).Run(context.Background(), k, guardFP, fn)
		if o != idempotency.Claimed || err != nil || rec.Status != 201 || !ran {
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
		k := idempotency.HashKey("alice", "k")
		var cause error
		o, _, err := g.Run(context.Background(), k, guardFP, func(ctx context.Context) (idempotency.Record, bool) {
			<-ctx.Done()
			cause = context.Cause(ctx)
			return idempotency.Record{Status: 201}, true
		})
		if o != idempotency.Claimed || err != nil || !errors.Is(cause, idempotency.ErrLockLost) {
			t.Fatalf("Run = %v, %v, fn's context ended with %v; want Claimed, nil, ErrLockLost", o, err, cause)
		}
		if evs := log.take(); len(evs) != 1 || evs[0].Outcome != "store-error" || !errors.Is(evs[0].Err, idempotency.ErrLockLost) {
			t.Fatalf("events %+v, want one store error wrapping ErrLockLost", evs)
		}
		time.Sleep(30 * time.Second) // the unrenewed lock expires
		if o, _, _ := g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) {
			return idempotency.Record{Status: 201}, false
		}); o != idempotency.Claimed {
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
		k := idempotency.HashKey("alice", "k")
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(beginDelay/2, cancel)
		ran := false
		fn := func(context.Context) (idempotency.Record, bool) {
			ran = true
			return idempotency.Record{Status: 201}, true
		}
		o, _, err := g.Run(ctx, k, guardFP, fn)
		if o != 0 || ran || !errors.Is(err, context.Canceled) || errors.Is(err, idempotency.ErrStoreUnavailable) {
			t.Fatalf("Run = %v, %v (fn ran: %v); want 0, an error wrapping context.Canceled (not ErrStoreUnavailable), fn not run", o, err, ran)
		}
		if o, _, err := g.Run(context.Background(), k, guardFP, fn); o != idempotency.Claimed || err != nil || !ran {
			t.Fatalf("retry: Run = %v, %v; want Claimed (the key was released)", o, err)
		}
	})
}

// TestGuardRunRecordTooLarge: a record the store has no room for is kept
// without its body; a record whose body fn did not keep is stored so.
func TestGuardRunRecordTooLarge(t *testing.T) {
	store, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{Shards: 1, MaxBytes: 4 << 10})
	g := newGuard(t, store)
	for i, rec := range []idempotency.Record{
		{Status: 201, Body: make([]byte, 64<<10)},
		{Status: 201, BodyOmitted: true},
	} {
		k := idempotency.HashKey("alice", fmt.Sprint(i))
		g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) { return rec, true })
		o, got, err := g.Run(context.Background(), k, guardFP, func(context.Context) (idempotency.Record, bool) {
			t.Error("fn ran again")
			return rec, true
		})
		if o != idempotency.Completed || err != nil || got.Status != 201 || !got.BodyOmitted || len(got.Body) != 0 {
			t.Fatalf("record %d: replay %v, %+v, %v; want Completed, 201 with its body omitted", i, o, got, err)
		}
	}
}

func TestZeroGuard(t *testing.T) {
	for _, g := range []*idempotency.Guard{nil, new(idempotency.Guard)} {
		o, _, err := g.Run(context.Background(), idempotency.Key{}, guardFP, func(context.Context) (idempotency.Record, bool) {
			t.Fatal("a zero Guard ran fn")
			return idempotency.Record{}, false
		})
		if o != 0 || err == nil {
			t.Fatalf("zero Guard: Run = %v, %v; want 0 and an error", o, err)
		}
		g.ReportInvalid(context.Background()) // no observer: nothing, no panic
	}
	if o, _, err := newGuard(t, nil).Run(context.Background(), idempotency.Key{}, guardFP, nil); o != 0 || err == nil {
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
