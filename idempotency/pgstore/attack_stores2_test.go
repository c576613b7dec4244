// Black-box attack on the PostgreSQL store (AREA=stores): each test names
// the documented sentence it checks.

package pgstore_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency/store"
)

func zzID() store.ID {
	var id store.ID
	_, _ = rand.Read(id[:])
	return id
}

type zzRow struct {
	fp, owner, record []byte
	live              bool
}

func zzGet(t *testing.T, p *pgxpool.Pool, table string, id store.ID) zzRow {
	t.Helper()
	var r zzRow
	err := p.QueryRow(context.Background(), `SELECT fingerprint, owner, record, expires_at > statement_timestamp() FROM `+table+` WHERE key = $1`, id[:]).Scan(&r.fp, &r.owner, &r.record, &r.live)
	if err != nil {
		t.Fatalf("read row: %v", err)
	}
	return r
}

// TestAttackStoresCorruptRecordColumn: store.DecodeRecord: "garbage gives
// an error saying the record is corrupt, never a panic"; a corrupt stored
// row must give Begin a clear error and stay as it was (no lost data):
// Complete, Extend and Release by another owner change nothing.
func TestAttackStores2CorruptRecordColumn(t *testing.T) {
	p, _ := pool(t, 4)
	s, table := newTable(t, p)
	ctx := context.Background()
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	good, err := (store.Record{Status: 201, Header: map[string][]string{"A": {"b", "c"}}, Body: []byte("hello")}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string][]byte{
		"empty bytea":        {},
		"truncated":          good[:len(good)-1],
		"trailer":            append(append([]byte{}, good...), 0),
		"magic only":         []byte("SGR"),
		"huge header count":  []byte("SGR\x01\x00\xc8\xff\xff\xff\xff\x0f"),
		"huge body length":   []byte("SGR\x01\x00\xc8\x00\xff\xff\xff\xff\xff\xff\xff\xff\x7f"),
		"status 1000":        []byte("SGR\x01\x03\xe8\x00\x00"),
		"unknown flag":       []byte("SGR\x02\x00\xc8\x02\x00\x00"),
		"version 3":          []byte("SGR\x03\x00\xc8\x00\x00"),
		"repeated header":    []byte("SGR\x01\x00\xc8\x02\x01A\x00\x01A\x00\x00"),
		"non-minimal varint": []byte("SGR\x01\x00\xc8\x80\x00\x00"),
	}
	for name, rec := range cases {
		t.Run(name, func(t *testing.T) {
			id := zzID()
			owner := store.NewOwner()
			if _, err := p.Exec(ctx, `INSERT INTO `+table+` (key, fingerprint, owner, record, expires_at) VALUES ($1, $2, $3, $4, statement_timestamp() + interval '1 hour')`, id[:], fp[:], owner[:], rec); err != nil {
				t.Fatal(err)
			}
			res, err := s.Begin(ctx, id, fp, time.Minute)
			if err == nil {
				t.Errorf("Begin on a corrupt record = %+v, nil error", res)
			} else if !strings.Contains(err.Error(), "corrupt") {
				t.Errorf("Begin error %q does not say the record is corrupt", err)
			}
			o := store.NewOwner()
			_ = s.Complete(ctx, id, o, store.Record{Status: 200}, time.Hour)
			_ = s.Extend(ctx, id, o, time.Minute)
			_ = s.Release(ctx, id, o)
			if got := zzGet(t, p, table, id); !bytes.Equal(got.record, rec) || got.record == nil || !got.live {
				t.Errorf("row after calls by another owner: record %q live %v; want %q unchanged", got.record, got.live, rec)
			}
		})
	}
}

// TestAttackStoresCorruptRowColumns: the brief's "corrupt or truncated
// records in PG must give a clear error". store.Store: Mismatch is "a live
// lock or record with a different fingerprint" (answered 422: the client
// reused its key for another request). A row whose fingerprint or owner
// column was truncated (a bad manual fix, a restore gone wrong) is not a
// different request: the retry of the very request that made it must learn
// that the store is broken, not that it reused its key.
func TestAttackStores2CorruptRowColumns(t *testing.T) {
	p, _ := pool(t, 4)
	s, table := newTable(t, p)
	ctx := context.Background()
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	id := zzID()
	res, err := s.Begin(ctx, id, fp, time.Minute)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin: %+v %v", res, err)
	}
	if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 201, Body: []byte("charged")}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `UPDATE `+table+` SET fingerprint = substring(fingerprint from 1 for 31) WHERE key = $1`, id[:]); err != nil {
		t.Fatal(err)
	}
	got, err := s.Begin(ctx, id, fp, time.Minute)
	t.Logf("retry of the same request, its row's fingerprint truncated to 31 bytes: %+v, %v", got.Outcome, err)
	if err == nil {
		t.Errorf("Begin on a row with a 31-byte fingerprint = %q, nil error; want an error saying the row is corrupt (it answers the client 422 \"key reused for another request\")", got.Outcome)
	}
}

// TestAttackStoresConcurrentLifecycle: "Every method is safe for concurrent
// use ... of many concurrent Begins on a free key exactly one gets
// Claimed"; a Complete by a stale owner "changes nothing". Two stores
// (two servers) on one table race Begin, Complete by the claimer and
// impostors, Extend and Release.
func TestAttackStores2ConcurrentLifecycle(t *testing.T) {
	p, _ := pool(t, 8)
	s1, _ := newTable(t, p)
	ctx := context.Background()
	fp := store.NewFingerprint("POST", "/c", [32]byte{})
	const keys, workers = 6, 8
	ids := make([]store.ID, keys)
	for i := range ids {
		ids[i] = zzID()
	}
	var claims, completes [keys]atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, id := range ids {
				res, err := s1.Begin(ctx, id, fp, time.Minute)
				if err != nil {
					t.Errorf("Begin: %v", err)
					continue
				}
				if res.Outcome != store.Claimed {
					continue
				}
				claims[i].Add(1)
				if err := s1.Extend(ctx, id, res.Owner, time.Minute); err != nil {
					t.Errorf("Extend: %v", err)
				}
				if err := s1.Complete(ctx, id, store.NewOwner(), store.Record{Status: 500}, time.Hour); !errors.Is(err, store.ErrStaleOwner) {
					t.Errorf("impostor Complete: %v", err)
				}
				rec := store.Record{Status: 201, Body: []byte{byte(w)}}
				if err := s1.Complete(ctx, id, res.Owner, rec, time.Hour); err != nil {
					t.Errorf("Complete: %v", err)
					continue
				}
				completes[i].Add(1)
				// Resent identical: succeeds; a different one: stale.
				if err := s1.Complete(ctx, id, res.Owner, rec, time.Hour); err != nil {
					t.Errorf("resent Complete: %v", err)
				}
				if err := s1.Complete(ctx, id, res.Owner, store.Record{Status: 202}, time.Hour); !errors.Is(err, store.ErrStaleOwner) {
					t.Errorf("different second Complete: %v", err)
				}
				if err := s1.Release(ctx, id, res.Owner); !errors.Is(err, store.ErrStaleOwner) {
					t.Errorf("Release after Complete: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if claims[i].Load() != 1 || completes[i].Load() != 1 {
			t.Errorf("key %d: %d claims, %d completes", i, claims[i].Load(), completes[i].Load())
		}
		res, err := s1.Begin(ctx, id, fp, time.Minute)
		if err != nil || res.Outcome != store.Completed || res.Record.Status != 201 {
			t.Errorf("key %d: %+v %v", i, res, err)
		}
	}
}

// TestAttackStoresTTLEdges: "lockTTL must be at least 1 µs"; a lock's
// duration only rounded up.
func TestAttackStores2TTLEdges(t *testing.T) {
	p, _ := pool(t, 4)
	s, table := newTable(t, p)
	ctx := context.Background()
	for _, d := range []time.Duration{0, -1, 999} {
		if _, err := s.Begin(ctx, zzID(), store.Fingerprint{}, d); err == nil {
			t.Errorf("Begin(%v): nil error", d)
		}
		if err := s.Complete(ctx, zzID(), store.NewOwner(), store.Record{Status: 200}, d); err == nil {
			t.Errorf("Complete(%v): nil error", d)
		}
	}
	id := zzID()
	res, err := s.Begin(ctx, id, store.Fingerprint{}, time.Duration(1<<63-1))
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin(MaxInt64): %+v %v", res, err)
	}
	if err := s.Complete(ctx, id, res.Owner, store.Record{Status: 200}, time.Duration(1<<63-1)); err != nil {
		t.Errorf("Complete(MaxInt64): %v", err)
	}
	if r := zzGet(t, p, table, id); !r.live || r.record == nil {
		t.Errorf("row: %+v", r)
	}
}
