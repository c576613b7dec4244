package pgstore_test

// Black-box fault attack (AREA idemfault): a TCP proxy the test controls sits
// between the store client and the server; it cuts, delays or blackholes the
// link at chosen moments while requests with the same key run concurrently
// (the scenarios: internal/idemtest's RunFaults).

import (
	"context"
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/internal/idemtest"
)

const fltDefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

func fltURL(t *testing.T) string {
	return storetest.ServiceAddress(t, "STORMGUARD_POSTGRES_URL", "PostgreSQL", fltDefaultURL)
}

var fltSeq atomic.Int64

// fltStores returns a store reaching PostgreSQL through a fresh proxy, a
// second store on the same table directly, and the proxy.
func fltStores(t *testing.T) (proxied, direct store.Store, p *idemtest.FaultProxy) {
	raw := fltURL(t)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	p = idemtest.NewFaultProxy(t, u.Host)
	dpool, err := pgxpool.New(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dpool.Close)
	u.Host = p.Addr()
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	ppool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); ppool.Close() })
	table := fmt.Sprintf("flt_idemfault_%d_%d", time.Now().UnixNano()%1e9, fltSeq.Add(1))
	ds, err := pgstore.New(dpool, pgstore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dpool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	ps, err := pgstore.New(ppool, pgstore.Config{Table: table})
	if err != nil {
		t.Fatal(err)
	}
	return ps, ds, p
}

// TestAttackFault runs the fault scenarios (internal/idemtest.RunFaults)
// on this store through a TCP proxy.
func TestAttackFault(t *testing.T) {
	idemtest.RunFaults(t, fltStores)
}
