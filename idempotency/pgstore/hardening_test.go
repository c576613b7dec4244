package pgstore_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// proxiedPool returns a pool that reaches PostgreSQL through a TCP proxy
// the test controls, and the proxy. The pool has no connection yet.
func proxiedPool(t *testing.T) (*pgxpool.Pool, *idemtest.TCPProxy) {
	t.Helper()
	raw := storetest.ServiceAddress(t, urlEnv, "PostgreSQL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("%s: %v", urlEnv, err)
	}
	p, err := idemtest.NewTCPProxy(u.Host)
	if err != nil {
		t.Fatalf("NewTCPProxy: %v", err)
	}
	t.Cleanup(p.Close)
	u.Host = p.Addr()
	pool, err := pgxpool.New(context.Background(), u.String())
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// TestBlackholedServerAnswers503: PostgreSQL accepts connections and never
// answers (from the start, or after the pool connected): the middleware
// answers 503 within its store timeout instead of hanging.
func TestBlackholedServerAnswers503(t *testing.T) {
	for _, when := range []string{"from the start", "after connecting"} {
		t.Run(when, func(t *testing.T) {
			direct, _ := pool(t, 2)
			pool, p := proxiedPool(t)
			_, table := newTable(t, direct, nil)
			s, err := pgstore.New(pool, pgstore.Config{Table: table})
			if err != nil {
				t.Fatal(err)
			}
			url := idemtest.Serve(t, s)
			if when == "after connecting" {
				if code, _ := idemtest.Post(t, url, idempotency.NewKey()); code != http.StatusCreated {
					t.Fatalf("POST before the black hole: %d, want 201", code)
				}
			}
			p.Blackhole(true)
			if code, body := idemtest.Post(t, url, idempotency.NewKey()); code != http.StatusServiceUnavailable {
				t.Fatalf("POST with PostgreSQL blackholed: %d %q, want 503", code, body)
			}
		})
	}
}

// resendingDB sends every statement twice and returns the second answer,
// as a driver that resends a statement after losing its reply would.
type resendingDB struct{ pgstore.DB }

func (d resendingDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if _, err := d.DB.Exec(ctx, sql, args...); err != nil {
		return pgconn.CommandTag{}, err
	}
	return d.DB.Exec(ctx, sql, args...)
}

func (d resendingDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	var discard [3][]byte
	_ = d.DB.QueryRow(ctx, sql, args...).Scan(&discard[0], &discard[1], &discard[2])
	return d.DB.QueryRow(ctx, sql, args...)
}

// TestStatementsResent: a claim or completion executed twice (its first
// reply lost) is still the caller's own: Begin claims, Complete succeeds.
func TestStatementsResent(t *testing.T) {
	ctx := context.Background()
	p, _ := pool(t, 2)
	direct, table := newTable(t, p, nil)
	s, err := pgstore.New(resendingDB{p}, pgstore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	k := idempotency.HashKey("s", idempotency.NewKey())
	fp := idempotency.NewFingerprint("POST", "/x", [32]byte{})
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil || res.Outcome != idempotency.Claimed {
		t.Fatalf("Begin sent twice = %v, %v; want claimed", res.Outcome, err)
	}
	rec := idempotency.Record{Status: 201, Body: []byte("charged")}
	if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
		t.Fatalf("Complete sent twice: %v", err)
	}
	if got, err := direct.Begin(ctx, k, fp, time.Minute); err != nil || got.Outcome != idempotency.Completed || string(got.Record.Body) != "charged" {
		t.Fatalf("Begin after Complete = %v %q, %v; want the record", got.Outcome, got.Record.Body, err)
	}
}

// TestDurationsBelowMicroseconds: PostgreSQL keeps timestamps in whole
// microseconds, so a lock timeout or retention under 1 µs is refused when
// the middleware is built.
func TestDurationsBelowMicroseconds(t *testing.T) {
	s, err := pgstore.New(fakeDB{}, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, opt := range []idempotency.Option{idempotency.WithLockTimeout(500 * time.Nanosecond), idempotency.WithRetention(999 * time.Nanosecond)} {
		if _, err := idempotency.NewMiddleware(s, idempotency.WithSharedScope(), opt); err == nil {
			t.Errorf("New with a duration under 1 µs on PostgreSQL = nil error")
		}
	}
}

// fakeDB is a DB that is never called.
type fakeDB struct{}

func (fakeDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	panic("fakeDB.Exec called")
}
func (fakeDB) QueryRow(context.Context, string, ...any) pgx.Row { panic("fakeDB.QueryRow called") }
