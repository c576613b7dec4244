// Black-box attack on the Redis store (AREA=stores): each test names the
// documented sentence it checks.

package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
)

func zzPrefix() string { return "stormguard-zzattack:" + rand.Text() + ":" }

func zzKey(prefix string, id store.ID) string { return prefix + hex.EncodeToString(id[:]) }

func zzID() store.ID {
	var id store.ID
	_, _ = rand.Read(id[:])
	return id
}

// zzStore returns a store under a fresh prefix on a direct client, and the
// client (its keys are deleted at cleanup).
func zzStore(t *testing.T) (*redisstore.Store, *redis.Client, string) {
	t.Helper()
	c, _ := client(t, 8)
	prefix := zzPrefix()
	s, err := redisstore.New(c, redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { deletePrefix(t, c, prefix) })
	return s, c, prefix
}

// TestAttackStoresCorruptEntries: decodeEntry "parses a Redis value written
// by the store. It never panics"; store.DecodeRecord: "garbage gives an
// error saying the record is corrupt, never a panic". A corrupt value must
// give Begin a clear error, and leave the value as it was (no lost data):
// Complete, Extend and Release of any owner change nothing.
func TestAttackStores2CorruptEntries(t *testing.T) {
	s, c, prefix := zzStore(t)
	ctx := context.Background()
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	good, err := (store.Record{Status: 201, Header: map[string][]string{"A": {"b"}}, Body: []byte("hello")}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var owner store.Owner
	owner[0] = 7
	hdr := func(v, st byte) []byte {
		b := []byte{v, st}
		b = append(b, owner[:]...)
		return append(b, fp[:]...)
	}
	cases := map[string][]byte{
		"empty":              {},
		"one byte":           {1},
		"short header":       hdr(1, 'p')[:40],
		"version 2":          hdr(2, 'p'),
		"version 0":          hdr(0, 'c'),
		"state x":            hdr(1, 'x'),
		"lock with trailer":  append(hdr(1, 'p'), 0),
		"completed, no rec":  hdr(1, 'c'),
		"truncated record":   append(hdr(1, 'c'), good[:len(good)-1]...),
		"record + trailer":   append(append(hdr(1, 'c'), good...), 'z'),
		"garbage record":     append(hdr(1, 'c'), []byte("SGR\x01\x00\xc8\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01")...),
		"huge header count":  append(hdr(1, 'c'), []byte("SGR\x01\x00\xc8\xff\xff\xff\xff\x0f")...),
		"status 199":         append(hdr(1, 'c'), []byte("SGR\x01\x00\xc7\x00\x00")...),
		"v2 no flags":        append(hdr(1, 'c'), []byte("SGR\x02\x00\xc8\x00\x00\x00")...),
		"omitted with body":  append(hdr(1, 'c'), []byte("SGR\x02\x00\xc8\x01\x00\x01x")...),
		"non-minimal varint": append(hdr(1, 'c'), []byte("SGR\x01\x00\xc8\x80\x00\x00")...),
	}
	for name, v := range cases {
		t.Run(name, func(t *testing.T) {
			id := zzID()
			k := zzKey(prefix, id)
			if err := c.Set(ctx, k, v, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			res, err := s.Begin(ctx, id, fp, time.Minute)
			if err == nil {
				t.Errorf("Begin on a corrupt value = %+v, nil error; want an error", res)
			} else if !strings.Contains(err.Error(), "corrupt") {
				t.Errorf("Begin error %q does not say the entry is corrupt", err)
			}
			rec := store.Record{Status: 200}
			o := store.NewOwner() // any owner but the entry's own token
			_ = s.Complete(ctx, id, o, rec, time.Hour)
			_ = s.Extend(ctx, id, o, time.Minute)
			_ = s.Release(ctx, id, o)
			got, err := c.Get(ctx, k).Bytes()
			if err != nil || string(got) != string(v) {
				t.Errorf("value after Complete/Extend/Release by another owner: %q %v; want it unchanged %q", got, err, v)
			}
			// The entry's own token: no panic, whatever it does.
			_ = s.Complete(ctx, id, owner, rec, time.Hour)
			_ = s.Extend(ctx, id, owner, time.Minute)
			_ = s.Release(ctx, id, owner)
			if _, err := s.Begin(ctx, id, fp, time.Minute); err != nil && !strings.Contains(err.Error(), "corrupt") {
				t.Errorf("Begin after the owner's calls: %v", err)
			}
		})
	}
}

// TestAttackStoresWrongTypeKey: a key under the prefix holding another Redis
// type (a prefix shared by mistake) must be an error, not a claim or a panic.
func TestAttackStores2WrongTypeKey(t *testing.T) {
	s, c, prefix := zzStore(t)
	ctx := context.Background()
	id := zzID()
	if err := c.HSet(ctx, zzKey(prefix, id), "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.Begin(ctx, id, store.Fingerprint{1}, time.Minute)
	if err == nil {
		t.Errorf("Begin on a hash = %+v, nil error", res)
	}
	if err := s.Complete(ctx, id, store.NewOwner(), store.Record{Status: 200}, time.Hour); err == nil {
		t.Errorf("Complete on a hash: nil error")
	}
	if typ, _ := c.Type(ctx, zzKey(prefix, id)).Result(); typ != "hash" {
		t.Errorf("the hash became a %q", typ)
	}
}

// TestAttackStoresConcurrentLifecycle: "Every method is safe for
// concurrent use ... of many concurrent Begins on a free key exactly one
// gets Claimed"; a Complete from a stale owner "changes nothing". Many
// goroutines race Begin, Complete (by the claimer and by impostors),
// Extend and Release on a few keys; each key ends with exactly one record,
// the claimer's.
func TestAttackStores2ConcurrentLifecycle(t *testing.T) {
	s, _, _ := zzStore(t)
	ctx := context.Background()
	fp := store.NewFingerprint("POST", "/c", [32]byte{})
	const keys, workers = 8, 12
	ids := make([]store.ID, keys)
	for i := range ids {
		ids[i] = zzID()
	}
	var claims [keys]atomic.Int64
	var completes [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, id := range ids {
				res, err := s.Begin(ctx, id, fp, time.Minute)
				if err != nil {
					t.Errorf("Begin: %v", err)
					continue
				}
				if res.Outcome == store.Claimed {
					claims[i].Add(1)
					_ = s.Extend(ctx, id, res.Owner, time.Minute)
					if err := s.Complete(ctx, id, store.NewOwner(), store.Record{Status: 500 + w}, time.Hour); !errors.Is(err, store.ErrStaleOwner) {
						t.Errorf("impostor Complete: %v, want ErrStaleOwner", err)
					}
					if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 201, Body: []byte{byte(w)}}, time.Hour); err != nil {
						t.Errorf("Complete: %v", err)
					} else {
						completes[i].Add(1)
					}
					if err := s.Release(ctx, id, res.Owner); !errors.Is(err, store.ErrStaleOwner) {
						t.Errorf("Release after Complete: %v, want ErrStaleOwner", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if claims[i].Load() != 1 || completes[i].Load() != 1 {
			t.Errorf("key %d: %d claims, %d completes; want 1, 1", i, claims[i].Load(), completes[i].Load())
		}
		res, err := s.Begin(ctx, id, fp, time.Minute)
		if err != nil || res.Outcome != store.Completed || res.Record.Status != 201 || len(res.Record.Body) != 1 {
			t.Errorf("key %d after the race: %+v %v", i, res, err)
		}
	}
}

// TestAttackStoresTTLEdges: "a lock's duration is rounded up and a
// retention down, and one under 1 ms is an error".
func TestAttackStores2TTLEdges(t *testing.T) {
	s, c, prefix := zzStore(t)
	ctx := context.Background()
	fp := store.Fingerprint{9}
	for _, d := range []time.Duration{0, -time.Second, time.Millisecond - 1} {
		if _, err := s.Begin(ctx, zzID(), fp, d); err == nil {
			t.Errorf("Begin(lockTTL %v): nil error", d)
		}
	}
	id := zzID()
	res, err := s.Begin(ctx, id, fp, 1500*time.Microsecond+time.Hour)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin: %+v %v", res, err)
	}
	pttl, _ := c.PTTL(ctx, zzKey(prefix, id)).Result()
	if pttl < time.Hour {
		t.Errorf("lock of 1h0.0015s has PTTL %v: rounded down", pttl)
	}
	if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 200}, time.Millisecond-1); err == nil {
		t.Errorf("Complete(retention 999.999µs): nil error")
	}
	// The lock is still live after a refused completion.
	if err := s.Extend(ctx, id, res.Owner, time.Hour); err != nil {
		t.Errorf("Extend after a refused completion: %v", err)
	}
	if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 200}, time.Duration(1<<63-1)); err != nil {
		t.Errorf("Complete(retention MaxInt64): %v", err)
	}
	if r, err := s.Begin(ctx, id, fp, time.Minute); err != nil || r.Outcome != store.Completed {
		t.Errorf("Begin after a MaxInt64 retention: %+v %v", r, err)
	}
}
