package pgstore_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
)

const (
	urlEnv = "STORMGUARD_POSTGRES_URL"
)

// roundTrips counts what the client sends to PostgreSQL: writes on the
// socket (each is one request the client then waits on) and, as a cross
// check, queries and prepares seen by a pgx tracer.
type roundTrips struct {
	writes, queries, prepares atomic.Int64
}

func (c *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.queries.Add(1)
	return ctx
}
func (c *roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	c.prepares.Add(1)
	return ctx
}
func (c *roundTrips) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (c *roundTrips) reset() {
	c.writes.Store(0)
	c.queries.Store(0)
	c.prepares.Store(0)
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.n.Add(1)
	return c.Conn.Write(p)
}

// pool connects to the server named by STORMGUARD_POSTGRES_URL. Without the
// variable it skips t, unless STORMGUARD_REQUIRE_SERVICES=1; with it, an
// unreachable server fails t. Each of configure, if any, changes the
// pool's configuration last.
func pool(t testing.TB, maxConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, *roundTrips) {
	t.Helper()
	url := storetest.ServiceAddress(t, urlEnv, "PostgreSQL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("%s: %v", urlEnv, err)
	}
	rt := &roundTrips{}
	cfg.MaxConns = maxConns
	// pgxpool pings a connection idle for over a second when it is
	// acquired; that would add a round trip the store does not make (and
	// that a loaded test machine can trigger at random).
	cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	cfg.ConnConfig.Tracer = rt
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &rt.writes}, nil
	}
	for _, f := range configure {
		f(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = p.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("PostgreSQL at %s=%s unreachable: %v", urlEnv, url, err)
	}
	t.Cleanup(p.Close)
	return p, rt
}

// newStore creates a store on a table of its own, dropped at cleanup.
func newStore(t testing.TB, p *pgxpool.Pool) *pgstore.Store {
	t.Helper()
	s, _ := newTable(t, p)
	return s
}

// newTable is newStore that also returns the table's name, for other
// stores on the same table.
func newTable(t testing.TB, p *pgxpool.Pool) (*pgstore.Store, string) {
	t.Helper()
	table := "sg_idem_test_" + strings.ToLower(rand.Text())
	s, err := pgstore.New(p, pgstore.Config{Table: table})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() {
		if _, err := p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
			t.Errorf("drop table %s: %v", table, err)
		}
	})
	return s, table
}

// testID returns a store ID made of parts.
func testID(parts ...string) store.ID {
	return store.ID(sha256.Sum256([]byte(strings.Join(parts, "\x00"))))
}

func TestConformance(t *testing.T) {
	p, _ := pool(t, 16)
	storetest.Run(t, func(t *testing.T) (store.Store, func(time.Duration)) {
		// The database's clock: nothing to advance, the suite uses short
		// TTLs and polls.
		return newStore(t, p), nil
	})
}

func TestNewErrors(t *testing.T) {
	// A pool that never connects: New does not touch the database.
	p, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, table := range []string{"a b", "1abc", "a.b.c", "x;drop table y", `"q"`, strings.Repeat("a", 64), "a."} {
		if _, err := pgstore.New(p, pgstore.Config{Table: table}); err == nil {
			t.Errorf("New(table %q) = nil error, want an error", table)
		}
	}
	if _, err := pgstore.New(nil, pgstore.Config{}); err == nil {
		t.Error("New(nil pool) = nil error")
	}
	if _, err := pgstore.New(p, pgstore.Config{Table: "public.ok_name"}); err != nil {
		t.Errorf("New(table public.ok_name) error: %v", err)
	}
}

func TestMigrateTwice(t *testing.T) {
	p, _ := pool(t, 2)
	s := newStore(t, p)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
}

// TestDeleteExpired: expired locks and records are deleted, live ones
// kept, by the database's clock (short TTLs, real time).
func TestDeleteExpired(t *testing.T) {
	ctx := context.Background()
	p, _ := pool(t, 2)
	s := newStore(t, p)
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	const short = 200 * time.Millisecond
	// Three short locks, one of 1 h, one record kept 1 h.
	for i, ttl := range []time.Duration{short, short, short, time.Hour} {
		if _, err := s.Begin(ctx, testID("s", string(rune('a'+i))), fp, ttl); err != nil {
			t.Fatal(err)
		}
	}
	k := testID("s", "done")
	res, err := s.Begin(ctx, k, fp, short)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteExpired(ctx); err != nil || n != 0 {
		t.Fatalf("DeleteExpired() before expiry = %d, %v; want 0", n, err)
	}
	// The database's clock cannot be faked: poll until the short locks
	// expire (bounded), then check that the others are still there.
	deleted, deadline := int64(0), time.Now().Add(10*time.Second)
	for deleted < 3 && time.Now().Before(deadline) {
		time.Sleep(short / 4)
		n, err := s.DeleteExpired(ctx)
		if err != nil {
			t.Fatalf("DeleteExpired(): %v", err)
		}
		deleted += n
	}
	if deleted != 3 {
		t.Fatalf("DeleteExpired() deleted %d rows in all, want the 3 short locks", deleted)
	}
	if res, err := s.Begin(ctx, testID("s", "d"), fp, time.Minute); err != nil || res.Outcome != store.InProgress {
		t.Fatalf("Begin(the 1 h lock) after DeleteExpired = %v, %v; want in-progress", res.Outcome, err)
	}
	if res, err := s.Begin(ctx, k, fp, time.Minute); err != nil || res.Outcome != store.Completed {
		t.Fatalf("Begin(the record) after DeleteExpired = %v, %v; want completed", res.Outcome, err)
	}
}

func TestCorruptRecord(t *testing.T) {
	ctx := context.Background()
	p, _ := pool(t, 2)
	s, table := newTable(t, p)
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	k := testID("s", "k")
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, store.Record{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `UPDATE `+table+` SET record = '\xdeadbeef'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, k, fp, time.Minute); err == nil || !strings.Contains(err.Error(), "corrupt record") {
		t.Fatalf("Begin on a corrupt row error = %v, want a corrupt record", err)
	}
}

func TestUnavailable(t *testing.T) {
	// A server that refuses connections: every call fails with an error.
	p, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	s, err := pgstore.New(p, pgstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(context.Background(), testID("k"), store.Fingerprint{}, time.Minute); err == nil {
		t.Fatal("Begin against a closed port: nil error")
	}
}

// TestRoundTrips checks the round trips per call once statements are
// prepared: Begin 1, Complete 1, replay 1, Release 1.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	p, rt := pool(t, 1)
	s := newStore(t, p)
	fp := store.NewFingerprint("POST", "/x", [32]byte{})
	rec := store.Record{Status: 201, Body: []byte(`{"id":1}`)}
	cycle := func() {
		k := testID("s", idempotency.NewKey())
		res, err := s.Begin(ctx, k, fp, time.Minute)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
		if res, err := s.Begin(ctx, k, fp, time.Minute); err != nil || res.Outcome != store.Completed {
			t.Fatalf("replay Begin = %v, %v", res.Outcome, err)
		}
		k2 := testID("s", idempotency.NewKey())
		res, _ = s.Begin(ctx, k2, fp, time.Minute)
		if err := s.Release(ctx, k2, res.Owner); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // warm up: prepares each statement once per connection
	k := testID("s", idempotency.NewKey())
	var owner store.Owner
	check := func(name string, f func()) {
		t.Helper()
		rt.reset()
		f()
		if w, q, pr := rt.writes.Load(), rt.queries.Load(), rt.prepares.Load(); w != 1 || q != 1 || pr != 0 {
			t.Errorf("%s: %d round trips (%d queries, %d prepares), want 1 (1, 0)", name, w, q, pr)
		}
	}
	check("Begin (new key)", func() {
		res, err := s.Begin(ctx, k, fp, time.Minute)
		if err != nil || res.Outcome != store.Claimed {
			t.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		owner = res.Owner
	})
	check("Complete", func() {
		if err := s.Complete(ctx, k, owner, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
	})
	check("Begin (replay)", func() {
		if res, err := s.Begin(ctx, k, fp, time.Minute); err != nil || res.Outcome != store.Completed {
			t.Fatalf("replay Begin = %v, %v", res.Outcome, err)
		}
	})
}
