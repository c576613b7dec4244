package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

func TestMemoryStoreConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func(time.Duration)) {
		clock := newFakeClock()
		s, err := newClocked(idempotency.MemoryConfig{}, clock.Now)
		if err != nil {
			t.Fatalf("NewMemoryStore: %v", err)
		}
		return s, clock.Advance
	})
}

func TestNewMemoryStoreErrors(t *testing.T) {
	for _, cfg := range []idempotency.MemoryConfig{
		{MaxEntries: -1},
		{MaxBytes: -1},
		{MaxEntries: 1},
		{MaxEntries: 3},
		{MaxBytes: 319},
		{MaxBytes: 639},
	} {
		if _, err := idempotency.NewMemoryStore(cfg); err == nil {
			t.Errorf("NewMemoryStore(%+v) = nil error, want an error", cfg)
		}
	}
}

// TestMemoryStoreShards: a store gets up to 16 shards, fewer when its
// bounds are small, so that each shard holds at least 64 keys.
func TestMemoryStoreShards(t *testing.T) {
	for _, tc := range []struct {
		cfg  idempotency.MemoryConfig
		want int
	}{
		{idempotency.MemoryConfig{}, 16},
		{idempotency.MemoryConfig{MaxEntries: 4}, 1},
		{idempotency.MemoryConfig{MaxEntries: 64 * 5}, 5},
		{idempotency.MemoryConfig{MaxBytes: 4 << 10}, 1},
		{idempotency.MemoryConfig{MaxEntries: 1 << 24, MaxBytes: 1 << 32}, 16},
	} {
		s, err := idempotency.NewMemoryStore(tc.cfg)
		if err != nil {
			t.Fatalf("NewMemoryStore(%+v): %v", tc.cfg, err)
		}
		if got := idempotency.MemoryShards(s); got != tc.want {
			t.Errorf("NewMemoryStore(%+v): %d shards, want %d", tc.cfg, got, tc.want)
		}
	}
	var zero idempotency.MemoryStore
	if got := idempotency.MemoryShards(&zero); got != 16 {
		t.Errorf("zero MemoryStore: %d shards, want 16", got)
	}
}

func fp(s string) store.Fingerprint {
	var sum [32]byte
	copy(sum[:], s)
	return store.NewFingerprint("POST", "/x", sum)
}

func TestMemoryStoreBoundedEntries(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	// One scope takes at most half: 3 keys.
	s, err := newClocked(idempotency.MemoryConfig{MaxEntries: 6}, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	var owners []store.Owner
	keys := []store.ID{idempotency.HashKey("s", "1"), idempotency.HashKey("s", "2"), idempotency.HashKey("s", "3")}
	// Key 1: a short lock; keys 2 and 3: long locks.
	for i, k := range keys {
		ttl := time.Hour
		if i == 0 {
			ttl = time.Minute
		}
		res, err := s.Begin(ctx, k, fp("a"), ttl)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Begin(key %d) = %v, %v; want claimed", i+1, res.Outcome, err)
		}
		owners = append(owners, res.Owner)
	}
	k4 := idempotency.HashKey("s", "4")
	// Full of live locks: refused, and no live lock is evicted.
	if _, err := s.Begin(ctx, k4, fp("a"), time.Hour); !errors.Is(err, store.ErrStoreFull) {
		t.Fatalf("Begin(key 4) on a full store error = %v, want ErrStoreFull", err)
	}
	for i, k := range keys {
		if res, err := s.Begin(ctx, k, fp("a"), time.Hour); err != nil || res.Outcome != store.InProgress {
			t.Fatalf("Begin(key %d) after refusal = %v, %v; want in-progress", i+1, res.Outcome, err)
		}
	}
	// Key 1's lock expires: it is evicted to make room.
	clock.Advance(time.Minute)
	if res, err := s.Begin(ctx, k4, fp("a"), time.Hour); err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin(key 4) after key 1 expired = %v, %v; want claimed", res.Outcome, err)
	}
	if got := idempotency.MemoryLen(s); got != 3 {
		t.Fatalf("Len() = %d, want 3", got)
	}
	if err := s.Complete(ctx, keys[0], owners[0], store.Record{Status: 200}, time.Hour); !errors.Is(err, store.ErrStaleOwner) {
		t.Fatalf("Complete(evicted key 1) error = %v, want ErrStaleOwner", err)
	}
}

func TestMemoryStoreBoundedBytes(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	// One scope takes at most half: 10,000 bytes.
	s, err := newClocked(idempotency.MemoryConfig{MaxBytes: 20_000}, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	big := store.Record{Status: 200, Body: make([]byte, 6000)}
	k1, k2 := idempotency.HashKey("s", "1"), idempotency.HashKey("s", "2")
	r1, _ := s.Begin(ctx, k1, fp("a"), time.Hour)
	r2, _ := s.Begin(ctx, k2, fp("a"), time.Hour)
	if err := s.Complete(ctx, k1, r1.Owner, big, time.Minute); err != nil {
		t.Fatalf("Complete(k1, 6000 bytes) error: %v", err)
	}
	if err := s.Complete(ctx, k2, r2.Owner, big, time.Hour); !errors.Is(err, store.ErrStoreFull) {
		t.Fatalf("Complete(k2, 6000 more bytes) error = %v, want ErrStoreFull", err)
	}
	// k1's record is still there, k2 still locked.
	if res, _ := s.Begin(ctx, k1, fp("a"), time.Hour); res.Outcome != store.Completed {
		t.Fatalf("Begin(k1) = %v, want completed", res.Outcome)
	}
	// Once k1's retention ends, its bytes are reclaimed for k2.
	clock.Advance(time.Minute)
	if err := s.Complete(ctx, k2, r2.Owner, big, time.Hour); err != nil {
		t.Fatalf("Complete(k2) after k1 expired error: %v", err)
	}
	if got := idempotency.MemoryLen(s); got != 1 {
		t.Fatalf("Len() = %d, want 1", got)
	}
}

func TestMemoryStoreSweep(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	s, _ := newClocked(idempotency.MemoryConfig{}, clock.Now)
	for i := range 100 {
		ttl := time.Hour
		if i%2 == 0 {
			ttl = time.Minute
		}
		s.Begin(ctx, idempotency.HashKey("s", string(rune('a'+i))), fp("a"), ttl)
	}
	if got := idempotency.MemorySweep(s); got != 0 {
		t.Fatalf("Sweep() before expiry = %d, want 0", got)
	}
	clock.Advance(time.Minute)
	if got := idempotency.MemorySweep(s); got != 50 {
		t.Fatalf("Sweep() = %d, want 50", got)
	}
	if got := idempotency.MemoryLen(s); got != 50 {
		t.Fatalf("Len() after Sweep = %d, want 50", got)
	}
}

func TestMemoryStoreBadArguments(t *testing.T) {
	ctx := context.Background()
	s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	k := idempotency.HashKey("s", "k")
	if _, err := s.Begin(ctx, k, fp("a"), 0); err == nil {
		t.Error("Begin(lockTTL 0) = nil error")
	}
	res, _ := s.Begin(ctx, k, fp("a"), time.Hour)
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 200}, 0); err == nil {
		t.Error("Complete(retention 0) = nil error")
	}
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 99}, time.Hour); err == nil {
		t.Error("Complete(status 99) = nil error")
	}
}

func TestMemoryStoreCopiesRecord(t *testing.T) {
	ctx := context.Background()
	s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	k := idempotency.HashKey("s", "k")
	res, _ := s.Begin(ctx, k, fp("a"), time.Hour)
	rec := store.Record{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("hello")}
	if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
		t.Fatal(err)
	}
	rec.Body[0] = 'J'
	rec.Header["Content-Type"][0] = "evil"
	got, _ := s.Begin(ctx, k, fp("a"), time.Hour)
	if string(got.Record.Body) != "hello" || got.Record.Header.Get("Content-Type") != "text/plain" {
		t.Fatalf("stored record changed with the caller's buffers: %q %v", got.Record.Body, got.Record.Header)
	}
}

// TestMemoryStoreFairShare: a scope's own keys and bytes count twice, so a
// scope that filled its share leaves room for the others, and a later
// scope gets half of what is left.
func TestMemoryStoreFairShare(t *testing.T) {
	ctx := context.Background()
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 100})
	if err != nil {
		t.Fatal(err)
	}
	claim := func(scope string) int {
		n := 0
		for i := range 100 {
			_, err := s.Begin(ctx, idempotency.HashKey(scope, fmt.Sprint(i)), fp("a"), time.Hour)
			if errors.Is(err, store.ErrStoreFull) {
				break
			}
			if err != nil {
				t.Fatalf("Begin(%s %d): %v", scope, i, err)
			}
			n++
		}
		return n
	}
	for _, tc := range []struct {
		scope string
		want  int
	}{
		{"mallory", 50}, // alone: half of 100
		{"bob", 25},     // half of the 50 left
		{"carol", 12},   // half of the 25 left, rounded down
	} {
		if got := claim(tc.scope); got != tc.want {
			t.Fatalf("%s claimed %d keys, want %d", tc.scope, got, tc.want)
		}
	}
}

// TestMemoryStoreStatusOnlyAlwaysFits: a record of size 0 takes no more
// room than its lock, so it is stored even when the scope's share is used
// up.
func TestMemoryStoreStatusOnlyAlwaysFits(t *testing.T) {
	ctx := context.Background()
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxBytes: 2000})
	if err != nil {
		t.Fatal(err)
	}
	var owners []store.Owner
	var keys []store.ID
	for i := 0; ; i++ {
		k := idempotency.HashKey("s", fmt.Sprint(i))
		res, err := s.Begin(ctx, k, fp("a"), time.Hour)
		if errors.Is(err, store.ErrStoreFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		keys, owners = append(keys, k), append(owners, res.Owner)
	}
	if len(keys) == 0 {
		t.Fatal("no key claimed")
	}
	if err := s.Complete(ctx, keys[0], owners[0], store.Record{Status: 201, Body: make([]byte, 100)}, time.Hour); !errors.Is(err, store.ErrStoreFull) {
		t.Fatalf("Complete with a body in a full store: %v, want ErrStoreFull", err)
	}
	for i, k := range keys {
		if err := s.Complete(ctx, k, owners[i], store.Record{Status: 201, BodyOmitted: true}, time.Hour); err != nil {
			t.Fatalf("Complete(key %d, status only) in a full store: %v", i, err)
		}
	}
}

func TestMemoryStoreRejectsBadRecord(t *testing.T) {
	ctx := context.Background()
	s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	k := idempotency.HashKey("s", "k")
	res, _ := s.Begin(ctx, k, fp("a"), time.Hour)
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 200, Body: []byte("x"), BodyOmitted: true}, time.Hour); err == nil {
		t.Fatal("Complete(a record with a body and BodyOmitted) = nil error")
	}
}
