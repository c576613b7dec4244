package pgstore_test

import (
	"context"
	"net/http"
	"net/url"
	"testing"

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
	// The proxy closes first, with every connection through it: closing
	// the pool then finds them broken and returns at once. The other way
	// round, pgxpool gives each connection up to 15 s to say goodbye,
	// which a black hole never lets it do (15 s per run of
	// TestBlackholedServerAnswers503).
	t.Cleanup(func() {
		p.Close()
		pool.Close()
	})
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
			_, table := newTable(t, direct)
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

// proxiedStore returns a store on a table of its own whose pool reaches
// PostgreSQL through a TCP proxy the test controls, and the proxy.
func proxiedStore(t *testing.T) (*pgstore.Store, *idemtest.TCPProxy) {
	t.Helper()
	direct, _ := pool(t, 2)
	p, proxy := proxiedPool(t)
	_, table := newTable(t, direct)
	s, err := pgstore.New(p, pgstore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return s, proxy
}

// TestCompletionBlip: PostgreSQL is unreachable (the proxy resets every
// connection) for 400 ms just as the handler's answer is stored: the answer
// is stored once it is back, and a retry after the lock timeout is a
// replay, not a second run.
func TestCompletionBlip(t *testing.T) {
	s, proxy := proxiedStore(t)
	idemtest.CompletionBlip(t, s, proxy.Refuse)
}

// TestSlowRenewal: with a short lock (1.5 s, renewed every 500 ms) and the
// default store timeout, PostgreSQL answers the first renewal 700 ms late
// (the proxy holds it, as a loaded server would): slower than the renewal
// period, before the lock's end. The lock is kept, the handler not
// canceled, and it runs once.
func TestSlowRenewal(t *testing.T) {
	s, proxy := proxiedStore(t)
	idemtest.SlowRenewal(t, s, proxy.Delay)
}
