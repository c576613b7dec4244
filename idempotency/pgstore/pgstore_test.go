package pgstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
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
// unreachable server fails t.
func pool(t testing.TB, maxConns int32) (*pgxpool.Pool, *roundTrips) {
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
func newStore(t testing.TB, db pgstore.DB, now func() time.Time) *pgstore.Store {
	t.Helper()
	s, _ := newTable(t, db, now)
	return s
}

// newTable is newStore that also returns the table's name, for other
// stores on the same table.
func newTable(t testing.TB, db pgstore.DB, now func() time.Time) (*pgstore.Store, string) {
	t.Helper()
	table := "sg_idem_test_" + strings.ToLower(rand.Text())
	s, err := pgstore.New(db, pgstore.Config{Table: table, Now: now})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	t.Cleanup(func() {
		if err := s.DropTable(context.Background()); err != nil {
			t.Errorf("DropTable: %v", err)
		}
	})
	return s, table
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestConformance(t *testing.T) {
	p, _ := pool(t, 16)
	storetest.Run(t, func(t *testing.T) storetest.Fixture {
		clock := newFakeClock()
		return storetest.Fixture{Store: newStore(t, p, clock.Now), Advance: clock.Advance}
	})
}

func TestNewErrors(t *testing.T) {
	var db pgstore.DB = fakeDB{}
	for _, table := range []string{"a b", "1abc", "a.b.c", "x;drop table y", `"q"`, strings.Repeat("a", 64), "a."} {
		if _, err := pgstore.New(db, pgstore.Config{Table: table}); err == nil {
			t.Errorf("New(table %q) = nil error, want an error", table)
		}
	}
	if _, err := pgstore.New(nil, pgstore.Config{}); err == nil {
		t.Error("New(nil DB) = nil error")
	}
	if _, err := pgstore.New((*pgxpool.Pool)(nil), pgstore.Config{}); err == nil {
		t.Error("New((*pgxpool.Pool)(nil)) = nil error")
	}
	if _, err := pgstore.New(db, pgstore.Config{Table: "public.ok_name"}); err != nil {
		t.Errorf("New(table public.ok_name) error: %v", err)
	}
}

func TestMigrateTwice(t *testing.T) {
	p, _ := pool(t, 2)
	s := newStore(t, p, nil)
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
}

func TestDeleteExpired(t *testing.T) {
	ctx := context.Background()
	p, _ := pool(t, 2)
	clock := newFakeClock()
	s := newStore(t, p, clock.Now)
	fp := idempotency.NewFingerprint("POST", "/x", [32]byte{})
	// Three locks of 1 min, one of 1 h, one record kept 2 min.
	for i, ttl := range []time.Duration{time.Minute, time.Minute, time.Minute, time.Hour} {
		if _, err := s.Begin(ctx, idempotency.HashKey("s", string(rune('a'+i))), fp, ttl); err != nil {
			t.Fatal(err)
		}
	}
	k := idempotency.HashKey("s", "done")
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, idempotency.Record{Status: 200}, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if n, err := s.DeleteExpired(ctx); err != nil || n != 0 {
		t.Fatalf("DeleteExpired() before expiry = %d, %v; want 0", n, err)
	}
	clock.Advance(time.Minute)
	if n, err := s.DeleteExpired(ctx); err != nil || n != 3 {
		t.Fatalf("DeleteExpired() after 1 min = %d, %v; want 3", n, err)
	}
	clock.Advance(time.Minute)
	if n, err := s.DeleteExpired(ctx); err != nil || n != 1 {
		t.Fatalf("DeleteExpired() after 2 min = %d, %v; want 1", n, err)
	}
}

func TestCorruptRecord(t *testing.T) {
	ctx := context.Background()
	p, _ := pool(t, 2)
	table := "sg_idem_test_" + strings.ToLower(rand.Text())
	s, err := pgstore.New(p, pgstore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.DropTable(context.Background()) })
	fp := idempotency.NewFingerprint("POST", "/x", [32]byte{})
	k := idempotency.HashKey("s", "k")
	res, err := s.Begin(ctx, k, fp, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, k, res.Owner, idempotency.Record{Status: 200}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, `UPDATE `+table+` SET record = '\xdeadbeef'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Begin(ctx, k, fp, time.Minute); !errors.Is(err, idempotency.ErrCorruptRecord) {
		t.Fatalf("Begin on a corrupt row error = %v, want ErrCorruptRecord", err)
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
	k := idempotency.HashKey("s", "k")
	if _, err := s.Begin(context.Background(), k, idempotency.Fingerprint{}, time.Minute); err == nil {
		t.Fatal("Begin against a closed port: nil error")
	}
}

// TestRoundTrips checks the round trips per call once statements are
// prepared: Begin 1, Complete 1, replay 1, Release 1.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	p, rt := pool(t, 1)
	s := newStore(t, p, nil)
	fp := idempotency.NewFingerprint("POST", "/x", [32]byte{})
	rec := idempotency.Record{Status: 201, Body: []byte(`{"id":1}`)}
	cycle := func() {
		k := idempotency.HashKey("s", idempotency.NewKey())
		res, err := s.Begin(ctx, k, fp, time.Minute)
		if err != nil || res.Outcome != idempotency.Claimed {
			t.Fatalf("Begin = %v, %v", res.Outcome, err)
		}
		if err := s.Complete(ctx, k, res.Owner, rec, time.Hour); err != nil {
			t.Fatal(err)
		}
		if res, err := s.Begin(ctx, k, fp, time.Minute); err != nil || res.Outcome != idempotency.Completed {
			t.Fatalf("replay Begin = %v, %v", res.Outcome, err)
		}
		k2 := idempotency.HashKey("s", idempotency.NewKey())
		res, _ = s.Begin(ctx, k2, fp, time.Minute)
		if err := s.Release(ctx, k2, res.Owner); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // warm up: prepares each statement once per connection
	k := idempotency.HashKey("s", idempotency.NewKey())
	var owner idempotency.Owner
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
		if err != nil || res.Outcome != idempotency.Claimed {
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
		if res, err := s.Begin(ctx, k, fp, time.Minute); err != nil || res.Outcome != idempotency.Completed {
			t.Fatalf("replay Begin = %v, %v", res.Outcome, err)
		}
	})
}
