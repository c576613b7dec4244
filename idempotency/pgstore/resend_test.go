package pgstore

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

// resendingDB sends every statement twice and returns the second answer,
// as a driver that resends a statement after losing its reply would.
type resendingDB struct{ db }

func (d resendingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if _, err := d.db.Exec(ctx, sql, args...); err != nil {
		return pgconn.CommandTag{}, err
	}
	return d.db.Exec(ctx, sql, args...)
}

func (d resendingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	var discard [3][]byte
	_ = d.db.QueryRow(ctx, sql, args...).Scan(&discard[0], &discard[1], &discard[2])
	return d.db.QueryRow(ctx, sql, args...)
}

// TestStatementsResent: a claim or completion executed twice (its first
// reply lost) is still the caller's own: Begin claims, Complete succeeds.
func TestStatementsResent(t *testing.T) {
	ctx := context.Background()
	url := storetest.ServiceAddress(t, "STORMGUARD_POSTGRES_URL", "PostgreSQL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	p, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	table := "sg_idem_test_" + strings.ToLower(rand.Text())
	direct, err := New(p, Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := direct.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	defer p.Exec(context.Background(), "DROP TABLE "+table)
	s, err := newStore(resendingDB{p}, Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	k := store.ID{1, 2, 3}
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil || res.Outcome != store.Claimed {
		t.Fatalf("Begin sent twice = %v, %v; want claimed", res.Outcome, err)
	}
	rec := store.Record{Status: 201, Body: []byte("charged")}
	if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
		t.Fatalf("Complete sent twice: %v", err)
	}
	if got, err := direct.Begin(ctx, k, fp, time.Minute); err != nil || got.Outcome != store.Completed || string(got.Record.Body) != "charged" {
		t.Fatalf("Begin after Complete = %v %q, %v; want the record", got.Outcome, got.Record.Body, err)
	}
}

// TestDurationsBelowMicroseconds: PostgreSQL keeps time in whole
// microseconds, so a lock TTL or retention under 1 µs is refused, before
// the database is called.
func TestDurationsBelowMicroseconds(t *testing.T) {
	s, err := newStore(resendingDB{}, Config{}) // never called
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.Begin(ctx, store.ID{}, store.Fingerprint{}, 999*time.Nanosecond); err == nil {
		t.Error("Begin(lock TTL 999ns) = nil error")
	}
	if err := s.Extend(ctx, store.ID{}, store.Owner{}, 0); err == nil {
		t.Error("Extend(lock TTL 0) = nil error")
	}
	if err := s.Complete(ctx, store.ID{}, store.Owner{}, store.Record{Status: 200}, 500*time.Nanosecond); err == nil {
		t.Error("Complete(retention 500ns) = nil error")
	}
}
