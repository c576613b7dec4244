package idempotency_test

import (
	"context"
	"math"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

const extYear = 365 * 24 * time.Hour

func extStore(t *testing.T, c idempotency.MemoryConfig) *idempotency.MemoryStore {
	t.Helper()
	s, err := idempotency.NewMemoryStore(c)
	if err != nil {
		t.Fatalf("NewMemoryStore(%+v): %v", c, err)
	}
	return s
}

// Option edges: WithLockTimeout and WithRetention "at least 1 ms",
// WithStoreTimeout "> 0"; NewMemoryStore "fails on negative fields of cfg,
// or bounds under 4 keys (MaxEntries under 4, MaxBytes under 640)".
func TestAttackExtremesOptionEdges(t *testing.T) {
	s := extStore(t, idempotency.MemoryConfig{})
	bad := map[string]idempotency.GuardOption{
		"lock 999us":       idempotency.WithLockTimeout(time.Millisecond - 1),
		"lock 0":           idempotency.WithLockTimeout(0),
		"lock MinInt64":    idempotency.WithLockTimeout(math.MinInt64),
		"retention 999us":  idempotency.WithRetention(time.Millisecond - 1),
		"retention -1":     idempotency.WithRetention(-1),
		"store timeout 0":  idempotency.WithStoreTimeout(0),
		"store timeout -1": idempotency.WithStoreTimeout(math.MinInt64),
		"logger nil":       idempotency.WithLogger(nil),
	}
	for name, o := range bad {
		if g, err := idempotency.NewGuard(s, o); err == nil || g != nil {
			t.Errorf("%s: NewGuard = %v, %v; want an error", name, g, err)
		}
	}
	good := map[string]idempotency.GuardOption{
		"lock 1ms":               idempotency.WithLockTimeout(time.Millisecond),
		"lock MaxInt64":          idempotency.WithLockTimeout(math.MaxInt64),
		"retention 1ms":          idempotency.WithRetention(time.Millisecond),
		"retention MaxInt64":     idempotency.WithRetention(math.MaxInt64),
		"store timeout 1ns":      idempotency.WithStoreTimeout(1),
		"store timeout MaxInt64": idempotency.WithStoreTimeout(math.MaxInt64),
	}
	for name, o := range good {
		if _, err := idempotency.NewGuard(s, o); err != nil {
			t.Errorf("%s: NewGuard: %v; want success", name, err)
		}
	}
	if _, err := idempotency.NewMiddleware(s, extScope, idempotency.WithMaxRequestBody(0)); err == nil {
		t.Error("WithMaxRequestBody(0) accepted")
	}
	if _, err := idempotency.NewMiddleware(s, extScope, idempotency.WithMaxResponseBody(math.MinInt)); err == nil {
		t.Error("WithMaxResponseBody(MinInt) accepted")
	}
	if _, err := idempotency.NewMiddleware(s, extScope, idempotency.WithMaxRequestBody(math.MaxInt64), idempotency.WithMaxResponseBody(math.MaxInt)); err != nil {
		t.Errorf("max bodies: %v", err)
	}
	for _, c := range []idempotency.MemoryConfig{{MaxEntries: -1}, {MaxBytes: -1}, {MaxEntries: 3}, {MaxBytes: 639}, {MaxEntries: math.MinInt}} {
		if _, err := idempotency.NewMemoryStore(c); err == nil {
			t.Errorf("NewMemoryStore(%+v) accepted", c)
		}
	}
	for _, c := range []idempotency.MemoryConfig{{MaxEntries: 4}, {MaxBytes: 640}, {MaxEntries: math.MaxInt, MaxBytes: math.MaxInt64}} {
		if _, err := idempotency.NewMemoryStore(c); err != nil {
			t.Errorf("NewMemoryStore(%+v): %v", c, err)
		}
	}
}

var extScope = idempotency.WithScope(func(*http.Request) (string, error) { return "s", nil })

var extFP = store.NewFingerprint(http.MethodPost, "/ext", [32]byte{1})

// Retention of the largest Duration: a finished record is replayed a
// century later (its expiry saturates, never wraps into the past). Lock
// timeout of the largest Duration: a second request while the first runs is
// told "in progress", and fn runs once.
func TestAttackExtremesRetentionAndLockMaxDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := extStore(t, idempotency.MemoryConfig{})
		g, err := idempotency.NewGuard(s, idempotency.WithRetention(math.MaxInt64), idempotency.WithLockTimeout(math.MaxInt64))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		runs := 0
		fn := func(ctx context.Context) (store.Record, bool) {
			runs++
			// While it runs, another request with the key is in progress.
			out, _, err := g.Run(ctx, "scope", "key-1", extFP, func(context.Context) (store.Record, bool) {
				runs += 100
				return store.Record{Status: 200}, true
			})
			if err != nil || out != store.InProgress {
				t.Errorf("concurrent Run: %v, %v; want in-progress", out, err)
			}
			time.Sleep(10 * extYear) // a long handler: the lock is renewed or lasts
			if ctx.Err() != nil {
				t.Errorf("handler context ended after 10 years: %v", context.Cause(ctx))
			}
			return store.Record{Status: 201}, true
		}
		out, rec, err := g.Run(ctx, "scope", "key-1", extFP, fn)
		if err != nil || out != store.Claimed || rec.Status != 201 {
			t.Fatalf("first Run: %v, %+v, %v", out, rec, err)
		}
		time.Sleep(100 * extYear)
		out, rec, err = g.Run(ctx, "scope", "key-1", extFP, fn)
		if err != nil || out != store.Completed || rec.Status != 201 || runs != 1 {
			t.Errorf("Run a century later: %v, %+v, %v (runs %d); want a replay of 201, fn run once", out, rec, err, runs)
		}
	})
}

// MemoryStore directly: lock TTL and retention of the largest Duration
// keep the key; 1 ns ones expire; non-positive ones are errors.
func TestAttackExtremesMemoryStoreTTLs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := extStore(t, idempotency.MemoryConfig{})
		ctx := context.Background()
		id := store.ID{1, 2, 3}
		res, err := s.Begin(ctx, id, extFP, math.MaxInt64)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Begin: %+v, %v", res, err)
		}
		time.Sleep(200 * extYear)
		if r2, err := s.Begin(ctx, id, extFP, time.Second); err != nil || r2.Outcome != store.InProgress {
			t.Errorf("Begin 200 years into a MaxInt64 lock: %+v, %v; want in-progress", r2, err)
		}
		if err := s.Extend(ctx, id, res.Owner, math.MaxInt64); err != nil {
			t.Errorf("Extend(MaxInt64): %v", err)
		}
		if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 200}, math.MaxInt64); err != nil {
			t.Errorf("Complete(MaxInt64): %v", err)
		}
		time.Sleep(50 * extYear)
		if r3, err := s.Begin(ctx, id, extFP, time.Second); err != nil || r3.Outcome != store.Completed {
			t.Errorf("Begin 50 years after a MaxInt64 retention: %+v, %v; want completed", r3, err)
		}
		id2 := store.ID{4, 5, 6}
		for _, ttl := range []time.Duration{0, -1, math.MinInt64} {
			if _, err := s.Begin(ctx, id2, extFP, ttl); err == nil {
				t.Errorf("Begin(ttl %v) accepted", ttl)
			}
		}
		r4, err := s.Begin(ctx, id2, extFP, 1)
		if err != nil || r4.Outcome != store.Claimed {
			t.Fatalf("Begin 1ns: %+v, %v", r4, err)
		}
		time.Sleep(time.Nanosecond) // the 1 ns lock's whole life
		if r5, err := s.Begin(ctx, id2, extFP, time.Second); err != nil || r5.Outcome != store.Claimed {
			t.Errorf("Begin after a 1ns lock expired: %+v, %v; want claimed", r5, err)
		}
	})
}
