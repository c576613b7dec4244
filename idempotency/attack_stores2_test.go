// Black-box attack on the in-memory store, the Store contract and the keys
// (AREA=stores): each test names the documented sentence it checks.

package idempotency_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

func zzID(r *rand.Rand, scope byte) store.ID {
	var id store.ID
	for i := range id {
		id[i] = byte(r.Uint32())
	}
	for i := 0; i < 8; i++ {
		id[i] = scope
	}
	return id
}

// zzFill claims keys of scope until the store refuses one, and returns how
// many it took (at most limit).
func zzFill(t *testing.T, s *idempotency.MemoryStore, r *rand.Rand, scope byte, ttl time.Duration, limit int) int {
	t.Helper()
	for n := 0; n < limit; n++ {
		res, err := s.Begin(context.Background(), zzID(r, scope), store.Fingerprint{1}, ttl)
		if errors.Is(err, store.ErrStoreFull) {
			return n
		}
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Begin: %+v %v", res, err)
		}
	}
	return limit
}

// TestAttackStoresMemoryRoomComesBack: MemoryStore "never evicts a live
// lock or record ... when a shard is full it first drops its expired
// entries". After any mix of claims, completions of every size, releases,
// refusals and expiries, once everything has expired the store must take as
// many keys as when it was new: its accounting of keys and bytes per shard
// and per scope must not leak.
func TestAttackStores2MemoryRoomComesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := idempotency.MemoryConfig{MaxEntries: 256, MaxBytes: 64 << 10}
		s, err := idempotency.NewMemoryStore(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(1, 2))
		ctx := context.Background()
		fresh, _ := idempotency.NewMemoryStore(cfg)
		want := zzFill(t, fresh, rand.New(rand.NewPCG(9, 9)), 7, time.Hour, 10000)
		type held struct {
			id    store.ID
			owner store.Owner
		}
		var locks []held
		for round := 0; round < 2000; round++ {
			scope := byte(r.IntN(5))
			switch op := r.IntN(10); {
			case op < 4:
				id := zzID(r, scope)
				res, err := s.Begin(ctx, id, store.Fingerprint{scope}, time.Duration(1+r.IntN(50))*time.Millisecond)
				if err == nil && res.Outcome == store.Claimed {
					locks = append(locks, held{id, res.Owner})
				} else if err != nil && !errors.Is(err, store.ErrStoreFull) {
					t.Fatal(err)
				}
			case op < 7 && len(locks) > 0:
				i := r.IntN(len(locks))
				h := locks[i]
				locks = append(locks[:i], locks[i+1:]...)
				rec := store.Record{Status: 200, Body: make([]byte, r.IntN(3000)), Header: http.Header{"X": {strings.Repeat("v", r.IntN(100))}}}
				err := s.Complete(ctx, h.id, h.owner, rec, time.Duration(1+r.IntN(80))*time.Millisecond)
				if err != nil && !errors.Is(err, store.ErrStaleOwner) && !errors.Is(err, store.ErrStoreFull) {
					t.Fatal(err)
				}
				if errors.Is(err, store.ErrStoreFull) {
					// "A record of the status alone always fits in place of its lock"
					// (unless the lock expired meanwhile).
					if err := s.Complete(ctx, h.id, h.owner, store.Record{Status: 200}, time.Millisecond); err != nil && !errors.Is(err, store.ErrStaleOwner) {
						t.Errorf("status-only record after ErrStoreFull: %v", err)
					}
				}
			case op < 8 && len(locks) > 0:
				i := r.IntN(len(locks))
				_ = s.Release(ctx, locks[i].id, locks[i].owner)
				locks = append(locks[:i], locks[i+1:]...)
			case op < 9 && len(locks) > 0:
				i := r.IntN(len(locks))
				_ = s.Extend(ctx, locks[i].id, locks[i].owner, time.Duration(1+r.IntN(30))*time.Millisecond)
			default:
				time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond) // fake clock
			}
		}
		time.Sleep(time.Second) // everything has expired (fake clock)
		if got := zzFill(t, s, rand.New(rand.NewPCG(9, 9)), 7, time.Hour, 10000); got != want {
			t.Errorf("after churn and expiry the store takes %d keys of one scope, a new one %d", got, want)
		}
	})
}

// TestAttackStoresMemoryExpiryInstants: "An expired lock or record is
// treated as absent" (store.Store); a lock lasts lockTTL, a record
// retention; Extend, Complete and Release need an unexpired lock.
func TestAttackStores2MemoryExpiryInstants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		ctx := context.Background()
		r := rand.New(rand.NewPCG(3, 4))
		id := zzID(r, 1)
		fpA, fpB := store.Fingerprint{1}, store.Fingerprint{2}
		res, _ := s.Begin(ctx, id, fpA, time.Second)
		time.Sleep(time.Second - time.Nanosecond)
		if got, _ := s.Begin(ctx, id, fpB, time.Second); got.Outcome != store.Mismatch {
			t.Errorf("1ns before the lock's end, another fingerprint: %q, want mismatch", got.Outcome)
		}
		time.Sleep(time.Nanosecond)
		if err := s.Extend(ctx, id, res.Owner, time.Second); !errors.Is(err, store.ErrStaleOwner) {
			t.Errorf("Extend at the lock's end: %v", err)
		}
		if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 200}, time.Hour); !errors.Is(err, store.ErrStaleOwner) {
			t.Errorf("Complete at the lock's end: %v", err)
		}
		res2, _ := s.Begin(ctx, id, fpB, time.Second)
		if res2.Outcome != store.Claimed || res2.Owner == res.Owner {
			t.Fatalf("Begin at the lock's end: %+v", res2)
		}
		if err := s.Release(ctx, id, res.Owner); !errors.Is(err, store.ErrStaleOwner) {
			t.Errorf("old owner Release after reclaim: %v", err)
		}
		if err := s.Complete(ctx, id, res2.Owner, store.Record{Status: 201}, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		// A resent Complete with the same record succeeds while the record lives.
		if err := s.Complete(ctx, id, res2.Owner, store.Record{Status: 201}, 2*time.Second); err != nil {
			t.Errorf("resent Complete: %v", err)
		}
		if err := s.Complete(ctx, id, res2.Owner, store.Record{Status: 202}, 2*time.Second); !errors.Is(err, store.ErrStaleOwner) {
			t.Errorf("different Complete: %v", err)
		}
		time.Sleep(2 * time.Second)
		if err := s.Complete(ctx, id, res2.Owner, store.Record{Status: 201}, 2*time.Second); !errors.Is(err, store.ErrStaleOwner) {
			t.Errorf("resent Complete after the record expired: %v", err)
		}
		if got, _ := s.Begin(ctx, id, fpA, time.Second); got.Outcome != store.Claimed {
			t.Errorf("Begin after the record expired: %q", got.Outcome)
		}
	})
}

// TestAttackStoresMemoryConcurrentNoDoubleClaim: "Begin ... is atomic: of
// many concurrent Begins on a free key exactly one gets Claimed" and "It is
// safe for concurrent use", on a small store whose shards are full and
// swept, with locks expiring on the fake clock while goroutines race.
func TestAttackStores2MemoryConcurrentNoDoubleClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 64, MaxBytes: 64 * 160})
		ctx := context.Background()
		ids := make([]store.ID, 40)
		r := rand.New(rand.NewPCG(5, 6))
		for i := range ids {
			ids[i] = zzID(r, byte(i%4))
		}
		type claim struct {
			owner store.Owner
			end   time.Time
		}
		var mu sync.Mutex
		holder := map[store.ID]claim{} // a live claim: its owner and end
		var wg sync.WaitGroup
		for w := 0; w < 16; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rr := rand.New(rand.NewPCG(uint64(w), 7))
				for i := 0; i < 300; i++ {
					id := ids[rr.IntN(len(ids))]
					res, err := s.Begin(ctx, id, store.Fingerprint{}, 10*time.Millisecond)
					if err != nil {
						if !errors.Is(err, store.ErrStoreFull) {
							t.Error(err)
						}
						continue
					}
					if res.Outcome == store.Claimed {
						now := time.Now()
						mu.Lock()
						if c, ok := holder[id]; ok && now.Before(c.end) {
							t.Errorf("two live claims on one key")
						}
						holder[id] = claim{res.Owner, now.Add(10 * time.Millisecond)}
						mu.Unlock()
						if rr.IntN(2) == 0 {
							// Forgotten before the Release: once it returns,
							// another Begin may claim the key at once (and
							// found this claim still listed, a false report).
							mu.Lock()
							if holder[id].owner == res.Owner {
								delete(holder, id)
							}
							mu.Unlock()
							_ = s.Release(ctx, id, res.Owner)
						}
					}
					time.Sleep(time.Duration(rr.IntN(3)) * time.Millisecond)
				}
			}()
		}
		wg.Wait()
	})
}

// TestAttackStoresDecodeRecordMutations: store.DecodeRecord: "garbage gives
// an error saying the record is corrupt, never a panic"; a record it
// accepts round-trips through MarshalBinary.
func TestAttackStores2DecodeRecordMutations(t *testing.T) {
	base, err := (store.Record{Status: 201, Header: http.Header{"A": {"1", ""}, "B-C": nil, "Z": {"zz"}}, Body: []byte("body bytes")}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 20000; i++ {
		b := append([]byte{}, base...)
		switch r.IntN(4) {
		case 0:
			b = b[:r.IntN(len(b)+1)]
		case 1:
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		case 2:
			j := r.IntN(len(b) + 1)
			b = append(b[:j], append([]byte{byte(r.Uint32())}, b[j:]...)...)
		case 3:
			j := r.IntN(len(b))
			b = append(b[:j], b[j+1:]...)
		}
		rec, err := store.DecodeRecord(b)
		if err != nil {
			if !strings.Contains(err.Error(), "corrupt") {
				t.Fatalf("error %q does not say corrupt", err)
			}
			continue
		}
		again, err := rec.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded %q, but it does not encode: %v", b, err)
		}
		// (The decoder takes header names in any order, though it refuses
		// non-minimal varints: not every accepted input is canonical. The
		// encoding of what it returns must decode to the same record.)
		rec2, err := store.DecodeRecord(again)
		if err != nil || !reflect.DeepEqual(rec, rec2) {
			t.Fatalf("decoded %q re-encodes as %q, which decodes to %+v %v", b, again, rec2, err)
		}
	}
}

// TestAttackStoresParseKeyRandom: ParseKey "never panics"; a key it returns
// is 1 to 255 printable ASCII characters.
func TestAttackStores2ParseKeyRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	alphabet := []byte("ab\"\\, \t\x00\x7f\xff~")
	for i := 0; i < 50000; i++ {
		b := make([]byte, r.IntN(262))
		for j := range b {
			b[j] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(2) == 0 && len(b) > 1 {
			b[0], b[len(b)-1] = '"', '"'
		}
		k, err := idempotency.ParseKey(string(b))
		if err != nil {
			continue
		}
		if len(k) < 1 || len(k) > 255 {
			t.Fatalf("ParseKey(%q) = %q: %d characters", b, k, len(k))
		}
		for j := 0; j < len(k); j++ {
			if k[j] < 0x20 || k[j] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte 0x%02x", b, k, k[j])
			}
		}
	}
}
