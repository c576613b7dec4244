package fleet_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// fgRedis connects to the test Redis at 127.0.0.1:6379 (skipping without
// one), closed with t.
func fgRedis(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, PoolSize: 32})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
			t.Fatalf("no redis at 127.0.0.1:6379 and STORMGUARD_REQUIRE_SERVICES=1: %v", err)
		}
		t.Skipf("no redis at 127.0.0.1:6379: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// fgName returns a fleet name of its own, whose keys are deleted when t ends.
func fgName(t *testing.T, c *redis.Client) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "fgfg-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := c.Keys(ctx, "stormguard:fleet:{"+name+"}*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
	return name
}

// fgFleet builds a fleet, closed with t.
func fgFleet(t *testing.T, c *redis.Client, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// fgFastRetry is a schedule with 1 ms backoff (the tests count, never time).
func fgFastRetry(t *testing.T) httpretry.Option {
	b, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return httpretry.WithRetry(retry.WithBackoff(b))
}

// fgTransport builds a transport on f's guards, recording the host names
// it asks f for.
func fgTransport(t *testing.T, f *fleet.Fleet, names *sync.Map, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	g := f.Guards
	if names != nil {
		g = func(host string) (retry.Guards, error) {
			v, _ := names.LoadOrStore(host, new(atomic.Int64))
			v.(*atomic.Int64).Add(1)
			return f.Guards(host)
		}
	}
	rt, err := httpretry.NewTransport(nil, append([]httpretry.Option{httpretry.WithGuards(g), fgFastRetry(t)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// fgServer is an httptest server answering status, counting its hits.
func fgServer(t *testing.T, status *atomic.Int64) (*httptest.Server, *atomic.Int64) {
	hits := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(int(status.Load()))
	}))
	t.Cleanup(srv.Close)
	return srv, hits
}

// fgGet sends a GET through rt and returns the status (0 on an error).
func fgGet(rt http.RoundTripper, url string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestAttackFleetGuardsFleetRefusesNewHost: with MaxHosts 1, a transport's request to a
// second host fails with an error errors.Is finds fleet.ErrTooManyHosts in
// (WithGuards: "an error fails that request"), nothing reaches the
// second host, no panic, the first host keeps working, and a later
// request to the second host is refused again (not cached as a host).
func TestAttackFleetGuardsFleetRefusesNewHost(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), MaxHosts: 1, Timeout: 2 * time.Second})
	ok := new(atomic.Int64)
	ok.Store(200)
	a, aHits := fgServer(t, ok)
	b, bHits := fgServer(t, ok)
	rt := fgTransport(t, f, nil)
	if st, err := fgGet(rt, a.URL); err != nil || st != 200 {
		t.Fatalf("first host: %d, %v", st, err)
	}
	for i := range 3 {
		st, err := fgGet(rt, b.URL)
		if !errors.Is(err, fleet.ErrTooManyHosts) {
			t.Fatalf("second host, try %d: status %d, err %v; want fleet.ErrTooManyHosts", i, st, err)
		}
	}
	// Through an http.Client too (a *url.Error around it).
	_, err := (&http.Client{Transport: rt}).Get(b.URL)
	if !errors.Is(err, fleet.ErrTooManyHosts) {
		t.Fatalf("http.Client: %v; want fleet.ErrTooManyHosts", err)
	}
	if n := bHits.Load(); n != 0 {
		t.Errorf("%d requests reached the refused host", n)
	}
	if st, err := fgGet(rt, a.URL); err != nil || st != 200 {
		t.Fatalf("first host after the refusal: %d, %v", st, err)
	}
	if n := aHits.Load(); n != 2 {
		t.Errorf("first host hits = %d, want 2", n)
	}
	if hs := rt.Hosts(); len(hs) != 1 {
		t.Errorf("Transport.Hosts() holds %d hosts, want 1 (the refused one not stored)", len(hs))
	}
	// A POST with a body: the body is closed, the error is the fleet's.
	body := &fgBody{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPost, b.URL, body)
	req.GetBody = nil
	_, err = rt.RoundTrip(req)
	if !errors.Is(err, fleet.ErrTooManyHosts) || !body.closed.Load() {
		t.Errorf("POST to a refused host: err %v, body closed %v", err, body.closed.Load())
	}
}

type fgBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *fgBody) Close() error { b.closed.Store(true); return nil }

// TestAttackFleetGuardsHostNamesOneFleetHost: the same host through URLs that differ in
// case, path and query reaches the fleet as one host: f.Guards is asked
// once, with the lower-cased URL.Host (the port kept), and the two
// transports on one fleet share the very same breaker and budget.
func TestAttackFleetGuardsHostNamesOneFleetHost(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second})
	ok := new(atomic.Int64)
	ok.Store(200)
	srv, hits := fgServer(t, ok)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	var names sync.Map
	rt1 := fgTransport(t, f, &names)
	rt2 := fgTransport(t, f, &names)
	urls := []string{
		"http://localhost:" + port + "/",
		"http://LOCALHOST:" + port + "/a?b=c",
		"http://LocalHost:" + port + "/x",
	}
	for _, u := range urls {
		for _, rt := range []*httpretry.Transport{rt1, rt2} {
			if st, err := fgGet(rt, u); err != nil || st != 200 {
				t.Fatalf("%s: %d, %v", u, st, err)
			}
		}
	}
	if n := hits.Load(); n != 6 {
		t.Errorf("hits = %d, want 6", n)
	}
	var got []string
	names.Range(func(k, v any) bool {
		got = append(got, k.(string))
		return true
	})
	if len(got) != 1 || got[0] != "localhost:"+port {
		t.Errorf("fleet asked for hosts %q, want only %q", got, "localhost:"+port)
	}
	h1, h2 := rt1.Hosts()["localhost:"+port], rt2.Hosts()["localhost:"+port]
	if h1.Breaker == nil || h1.Breaker != h2.Breaker || h1.Budget != h2.Budget {
		t.Errorf("two transports on one fleet do not share the host's guards: %+v vs %+v", h1, h2)
	}
	// What the fleet itself does with another spelling of the same host:
	// fleet.Guards does not normalise (case is its caller's), so a caller
	// that does not lower-case gets a second budget and breaker.
	g1, _ := f.Guards("localhost:" + port)
	g2, err := f.Guards("LOCALHOST:" + port)
	if err != nil {
		t.Fatal(err)
	}
	if g1.Breaker == g2.Breaker {
		t.Logf("fleet.Guards folds case")
	} else {
		t.Logf("fleet.Guards is case-sensitive: %q and %q are two fleet hosts", "localhost:"+port, "LOCALHOST:"+port)
	}
}

// TestAttackFleetGuardsIPv6Host: an IPv6 literal host ("[::1]:port") goes through the
// fleet's guards and its breaker trips on a 503 storm like any other.
func TestAttackFleetGuardsIPv6Host(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, SyncEvery: 10 * time.Millisecond,
		MinCalls: 5, Breaker: breaker.Config{MinCalls: 5, OpenFor: time.Hour}})
	var hits atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	var names sync.Map
	rt := fgTransport(t, f, &names, httpretry.WithRetry(retry.WithMaxAttempts(1)))
	for range 10 {
		_, _ = fgGet(rt, srv.URL)
	}
	var got []string
	names.Range(func(k, v any) bool { got = append(got, k.(string)); return true })
	if len(got) != 1 || !strings.HasPrefix(got[0], "[::1]:") {
		t.Fatalf("fleet asked for %q, want one [::1]:port", got)
	}
	g, _ := f.Guards(got[0])
	if s := g.Breaker.State(); s != breaker.Open {
		t.Errorf("breaker of %s is %v after 10 failures, want open", got[0], s)
	}
	before := hits.Load()
	for range 5 {
		_, _ = fgGet(rt, srv.URL)
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("%d requests reached the IPv6 host through its open breaker", n)
	}
}

// TestAttackFleetGuardsBudgetBoundsTwoTransports: a 503 storm through two transports on
// one fleet, and two more on a second process of the fleet (another
// Fleet, same Name), with the breaker kept closed: the retries that reach
// the server stay within Ratio·requests + floor (Config.Budget: "retries
// of the whole fleet stay within Ratio times the fleet's requests plus
// MinPerSecond·Window.Seconds()").
func TestAttackFleetGuardsBudgetBoundsTwoTransports(t *testing.T) {
	c := fgRedis(t)
	name := fgName(t, c)
	cfg := fleet.Config{Name: name, Timeout: 2 * time.Second, SyncEvery: 10 * time.Millisecond,
		Budget:  budget.Config{Ratio: 0.1, MinPerSecond: 0.5, Window: 60 * time.Second},
		Breaker: breaker.Config{MinCalls: 1_000_000, FailureRatio: 1}, MinCalls: 1_000_000}
	f1 := fgFleet(t, c, cfg)
	f2 := fgFleet(t, c, cfg)
	storm := new(atomic.Int64)
	storm.Store(503)
	srv, hits := fgServer(t, storm)
	rts := []*httpretry.Transport{fgTransport(t, f1, nil), fgTransport(t, f1, nil), fgTransport(t, f2, nil), fgTransport(t, f2, nil)}
	const perTransport = 50
	var wg sync.WaitGroup
	var giveUps atomic.Int64
	for _, rt := range rts {
		for range 5 {
			wg.Go(func() {
				for range perTransport / 5 {
					st, err := fgGet(rt, srv.URL)
					if err != nil {
						t.Errorf("503 storm: %v", err)
						return
					}
					if st == 503 {
						giveUps.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	requests := int64(len(rts) * perTransport)
	retries := hits.Load() - requests
	bound := 0.1*float64(requests) + 0.5*60
	t.Logf("%d requests, %d retries reached the server (bound %.0f), %d gave up with 503; modes %v %v", requests, retries, bound, giveUps.Load(), f1.Mode(), f2.Mode())
	if f1.Mode() != fleet.ModeFleet || f2.Mode() != fleet.ModeFleet {
		t.Fatalf("a fleet went local: %v %v (%+v)", f1.Mode(), f2.Mode(), f1.Stats())
	}
	if float64(retries) > bound {
		t.Errorf("retries %d > bound %.0f (Ratio·requests + MinPerSecond·Window)", retries, bound)
	}
	if giveUps.Load() != requests {
		t.Errorf("%d of %d requests returned the 503", giveUps.Load(), requests)
	}
}

// TestAttackFleetGuardsBreakerPerHost: one fleet, two hosts: a 503 storm on one opens its
// breaker, in both processes of the fleet, and leaves the other host's
// closed and served.
func TestAttackFleetGuardsBreakerPerHost(t *testing.T) {
	c := fgRedis(t)
	name := fgName(t, c)
	cfg := fleet.Config{Name: name, Timeout: 2 * time.Second, SyncEvery: 10 * time.Millisecond, MinCalls: 10,
		Breaker: breaker.Config{MinCalls: 1000, OpenFor: time.Hour}}
	f1 := fgFleet(t, c, cfg)
	f2 := fgFleet(t, c, cfg)
	bad := new(atomic.Int64)
	bad.Store(503)
	good := new(atomic.Int64)
	good.Store(200)
	bSrv, bHits := fgServer(t, bad)
	gSrv, gHits := fgServer(t, good)
	rt1 := fgTransport(t, f1, nil, httpretry.WithRetry(retry.WithMaxAttempts(1)))
	rt2 := fgTransport(t, f2, nil, httpretry.WithRetry(retry.WithMaxAttempts(1)))
	for range 8 {
		for _, rt := range []*httpretry.Transport{rt1, rt2} {
			_, _ = fgGet(rt, bSrv.URL)
			if st, err := fgGet(rt, gSrv.URL); err != nil || st != 200 {
				t.Fatalf("good host: %d, %v", st, err)
			}
		}
	}
	bHost := bSrv.Listener.Addr().String()
	gHost := gSrv.Listener.Addr().String()
	deadline := time.Now().Add(3 * time.Second)
	for {
		g1, _ := f1.Guards(bHost)
		g2, _ := f2.Guards(bHost)
		if g1.Breaker.State() == breaker.Open && g2.Breaker.State() == breaker.Open {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the fleet did not open the failing host's breaker in both processes: %v %v", g1.Breaker.State(), g2.Breaker.State())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, f := range []*fleet.Fleet{f1, f2} {
		g, _ := f.Guards(gHost)
		if s := g.Breaker.State(); s != breaker.Closed {
			t.Errorf("the healthy host's breaker is %v", s)
		}
	}
	bBefore, gBefore := bHits.Load(), gHits.Load()
	for _, rt := range []*httpretry.Transport{rt1, rt2} {
		for range 5 {
			_, err := fgGet(rt, bSrv.URL)
			if !errors.Is(err, retry.CircuitOpen) {
				t.Errorf("failing host through its open breaker: %v, want retry.CircuitOpen", err)
			}
			if st, err := fgGet(rt, gSrv.URL); err != nil || st != 200 {
				t.Errorf("healthy host while the other's breaker is open: %d, %v", st, err)
			}
		}
	}
	if n := bHits.Load() - bBefore; n != 0 {
		t.Errorf("%d requests reached the failing host through its open breaker", n)
	}
	if n := gHits.Load() - gBefore; n != 10 {
		t.Errorf("healthy host got %d of 10 requests", n)
	}
}

// TestAttackFleetGuardsCloseWhileRequestsRun: a fleet closed while transports send:
// Close returns, the requests in flight and after it end with the
// server's answers (budgets and breakers keep working, in local mode), no
// panic, and requests to a host first seen after Close work too.
func TestAttackFleetGuardsCloseWhileRequestsRun(t *testing.T) {
	c := fgRedis(t)
	f, err := fleet.New(c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, SyncEvery: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	status := new(atomic.Int64)
	status.Store(200)
	srv, _ := fgServer(t, status)
	rt1 := fgTransport(t, f, nil)
	rt2 := fgTransport(t, f, nil)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var okN, errN atomic.Int64
	for _, rt := range []*httpretry.Transport{rt1, rt2} {
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					st, err := fgGet(rt, srv.URL)
					if err != nil || st != 200 {
						errN.Add(1)
						t.Errorf("request around Close: %d, %v", st, err)
						return
					}
					okN.Add(1)
				}
			})
		}
	}
	for okN.Load() < 50 {
		time.Sleep(time.Millisecond)
	}
	closeErr := f.Close()
	after := okN.Load()
	for okN.Load() < after+50 && errN.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if closeErr != nil {
		t.Errorf("Close: %v", closeErr)
	}
	if m := f.Mode(); m != fleet.ModeLocal {
		t.Errorf("mode after Close = %v, want local", m)
	}
	srv2, hits2 := fgServer(t, status)
	if st, err := fgGet(rt1, srv2.URL); err != nil || st != 200 || hits2.Load() != 1 {
		t.Errorf("new host after Close: %d, %v, %d hits", st, err, hits2.Load())
	}
	// After Close, a 503 storm is bounded by the local budget (default:
	// 10% + 1/s over 10 s), and the breaker still trips on its own calls.
	status.Store(503)
	before := hits2.Load()
	for range 100 {
		_, _ = fgGet(rt2, srv2.URL)
	}
	sent := hits2.Load() - before
	t.Logf("closed fleet, 100 requests into a 503: %d attempts", sent)
	if sent > 100+10+10 {
		t.Errorf("closed fleet: %d attempts for 100 requests, beyond the local budget", sent)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestAttackFleetGuardsUnstartedFleetLocal: a fleet on a Redis that does not answer
// starts local; its guards serve a transport at once, and its local
// budget bounds a 503 storm's retries.
func TestAttackFleetGuardsUnstartedFleetLocal(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens: connections are refused
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	f, err := fleet.New(c, fleet.Config{Name: "fgfg-local", Timeout: 100 * time.Millisecond,
		LocalBudget: budget.Config{Ratio: 0.1, MinPerSecond: -1, Window: time.Minute},
		Breaker:     breaker.Config{MinCalls: 1_000_000}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Mode() != fleet.ModeLocal {
		t.Fatalf("mode %v, want local", f.Mode())
	}
	storm := new(atomic.Int64)
	storm.Store(503)
	srv, hits := fgServer(t, storm)
	rt := fgTransport(t, f, nil)
	for range 100 {
		if st, err := fgGet(rt, srv.URL); err != nil || st != 503 {
			t.Fatalf("503 storm, local fleet: %d, %v", st, err)
		}
	}
	if r := hits.Load() - 100; r > 10 {
		t.Errorf("local mode: %d retries for 100 requests, LocalBudget allows 10", r)
	}
}

// TestAttackFleetGuardsFirstSeenConcurrently: 32 goroutines meet a new host at once
// through one transport: f is called once for it ("f is called once per
// host"), and every request is served.
func TestAttackFleetGuardsFirstSeenConcurrently(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second})
	ok := new(atomic.Int64)
	ok.Store(200)
	srv, hits := fgServer(t, ok)
	var names sync.Map
	rt := fgTransport(t, f, &names)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			<-start
			if st, err := fgGet(rt, srv.URL); err != nil || st != 200 {
				t.Errorf("%d, %v", st, err)
			}
		})
	}
	close(start)
	wg.Wait()
	calls := 0
	names.Range(func(k, v any) bool { calls += int(v.(*atomic.Int64).Load()); return true })
	if calls != 1 || hits.Load() != 32 {
		t.Errorf("guards asked %d times for one host, %d hits of 32", calls, hits.Load())
	}
}

// TestAttackFleetGuardsEvictedHostKeepsFleetGuards: a transport that holds one host
// (WithMaxHosts(1)) on a fleet of MaxHosts 2: alternating hosts A and B
// re-asks the fleet, which hands back the same breaker (the fleet's state
// survives the transport's eviction); a third host is refused with
// ErrTooManyHosts and leaves the transport's table as it was.
func TestAttackFleetGuardsEvictedHostKeepsFleetGuards(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, MaxHosts: 2})
	ok := new(atomic.Int64)
	ok.Store(200)
	a, _ := fgServer(t, ok)
	b, _ := fgServer(t, ok)
	cs, cHits := fgServer(t, ok)
	var names sync.Map
	rt := fgTransport(t, f, &names, httpretry.WithMaxHosts(1))
	aHost := a.Listener.Addr().String()
	var first *breaker.Breaker
	for i := range 3 {
		if st, err := fgGet(rt, a.URL); err != nil || st != 200 {
			t.Fatalf("A: %d, %v", st, err)
		}
		g := rt.Hosts()[aHost]
		if first == nil {
			first = g.Breaker
		} else if g.Breaker != first {
			t.Errorf("round %d: A's breaker after eviction is a new one, not the fleet's", i)
		}
		if st, err := fgGet(rt, b.URL); err != nil || st != 200 {
			t.Fatalf("B: %d, %v", st, err)
		}
	}
	if _, err := fgGet(rt, cs.URL); !errors.Is(err, fleet.ErrTooManyHosts) {
		t.Errorf("third host: %v, want ErrTooManyHosts", err)
	}
	if cHits.Load() != 0 {
		t.Errorf("third host got %d hits", cHits.Load())
	}
	hs := rt.Hosts()
	if _, okB := hs[b.Listener.Addr().String()]; len(hs) != 1 || !okB {
		t.Errorf("table after the refusal: %v, want B alone", hs)
	}
	v, _ := names.Load(aHost)
	if n := v.(*atomic.Int64).Load(); n != 3 {
		t.Errorf("fleet asked for A %d times, want 3 (once per eviction)", n)
	}
}

// TestAttackFleetGuardsHedgesWithinFleetBudget: hedges ("each hedge is one withdrawal:
// no budget, no hedge") through two transports on one fleet whose budget
// has no floor: the extra copies that reach a slow host stay within
// Ratio·requests.
func TestAttackFleetGuardsHedgesWithinFleetBudget(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, SyncEvery: 5 * time.Millisecond,
		Budget: budget.Config{Ratio: 0.1, MinPerSecond: -1, Window: 60 * time.Second}})
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%3 == 0 { // a third of the answers are slow: a tail to hedge
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Millisecond):
			}
		}
		w.WriteHeader(200)
	}))
	defer srv.Close()
	rts := []*httpretry.Transport{
		fgTransport(t, f, nil, httpretry.WithHedging(5*time.Millisecond, 0.5, 8)),
		fgTransport(t, f, nil, httpretry.WithHedging(5*time.Millisecond, 0.5, 8)),
	}
	const per = 60
	var wg sync.WaitGroup
	for _, rt := range rts {
		for range 4 {
			wg.Go(func() {
				for range per / 4 {
					if st, err := fgGet(rt, srv.URL); err != nil || st != 200 {
						t.Errorf("%d, %v", st, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	requests := int64(len(rts) * per)
	extra := hits.Load() - requests
	t.Logf("%d requests, %d hedges reached the host (bound %.0f), mode %v", requests, extra, 0.1*float64(requests), f.Mode())
	if f.Mode() != fleet.ModeFleet {
		t.Fatalf("fleet went local: %+v", f.Stats())
	}
	if float64(extra) > 0.1*float64(requests) {
		t.Errorf("hedges %d > Ratio·requests %.0f", extra, 0.1*float64(requests))
	}
}

// TestAttackFleetGuardsFleetLimiterHandedToTransport: with Config.Limit, the transport
// uses the fleet's limiter for the host (Transport.Hosts shows the one
// f.Guards returns), and a request through it is served.
func TestAttackFleetGuardsFleetLimiterHandedToTransport(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, SyncEvery: 10 * time.Millisecond,
		Limit: &fgLimitCfg})
	ok := new(atomic.Int64)
	ok.Store(200)
	srv, _ := fgServer(t, ok)
	rt := fgTransport(t, f, nil)
	for range 20 {
		if st, err := fgGet(rt, srv.URL); err != nil || st != 200 {
			t.Fatalf("%d, %v", st, err)
		}
	}
	host := srv.Listener.Addr().String()
	g, _ := f.Guards(host)
	if g.Limiter == nil || rt.Hosts()[host].Limiter != g.Limiter {
		t.Errorf("transport's limiter %p, fleet's %p", rt.Hosts()[host].Limiter, g.Limiter)
	}
}

// TestAttackFleetGuardsSameServerTwoSpellings records, without failing, how httpretry
// names one destination spelled "HOST:port" with the scheme's default
// port and without it: two fleet hosts, so two fleet budgets and
// breakers for one server (see the report's DOC-ONLY).
func TestAttackFleetGuardsSameServerTwoSpellings(t *testing.T) {
	c := fgRedis(t)
	f := fgFleet(t, c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second})
	var names sync.Map
	base := fgRT(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r, Header: http.Header{}}, nil
	})
	g := func(host string) (retry.Guards, error) {
		names.Store(host, true)
		return f.Guards(host)
	}
	rt, err := httpretry.NewTransport(base, httpretry.WithGuards(g))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"https://Example.COM:443/", "https://example.com/", "https://example.com./", "http://[::FFFF:7F00:1]:80/"} {
		if st, err := fgGet(rt, u); err != nil || st != 200 {
			t.Fatalf("%s: %d %v", u, st, err)
		}
	}
	var got []string
	names.Range(func(k, v any) bool { got = append(got, k.(string)); return true })
	t.Logf("fleet hosts for example.com over https (3 spellings) and one IPv6 literal: %q", got)
}

type fgRT func(*http.Request) (*http.Response, error)

func (f fgRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

var fgLimitCfg = limit.Config{}

// TestAttackFleetGuardsCloseDuringStorm: Close while a 503 storm's retries ask for
// leases: Close returns, every request ends with the 503 (a give-up, no
// error, no panic), and the retries stay within the fleet's budget plus
// the local budget's (the leases and the local mode after Close).
func TestAttackFleetGuardsCloseDuringStorm(t *testing.T) {
	c := fgRedis(t)
	f, err := fleet.New(c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, SyncEvery: 5 * time.Millisecond,
		Budget:      budget.Config{Ratio: 0.1, MinPerSecond: -1, Window: time.Minute},
		LocalBudget: budget.Config{Ratio: 0.1, MinPerSecond: -1, Window: time.Minute},
		Breaker:     breaker.Config{MinCalls: 1_000_000, FailureRatio: 1}, MinCalls: 1_000_000})
	if err != nil {
		t.Fatal(err)
	}
	storm := new(atomic.Int64)
	storm.Store(503)
	srv, hits := fgServer(t, storm)
	rts := []*httpretry.Transport{fgTransport(t, f, nil), fgTransport(t, f, nil)}
	var sent atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, rt := range rts {
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					sent.Add(1)
					st, err := fgGet(rt, srv.URL)
					if err != nil || st != 503 {
						t.Errorf("storm around Close: %d, %v", st, err)
						return
					}
				}
			})
		}
	}
	for sent.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	closed := make(chan error, 1)
	go func() { closed <- f.Close() }()
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s during a storm")
	}
	n := sent.Load()
	for sent.Load() < n+100 {
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if cerr != nil {
		t.Errorf("Close: %v", cerr)
	}
	requests := sent.Load()
	retries := hits.Load() - requests
	t.Logf("%d requests, %d retries", requests, retries)
	if float64(retries) > 0.2*float64(requests)+1 {
		t.Errorf("retries %d for %d requests: beyond the fleet's 10%% plus the local budget's 10%%", retries, requests)
	}
}

// TestAttackFleetGuardsClosedFleetOpenBreakerRecovers: calls with time to spare wait
// behind the fleet's open breaker; the fleet is then closed and the host
// recovers: the breaker (now local) probes on its own and every waiting
// call is served ("Budgets and breakers keep working afterwards, in
// local mode").
func TestAttackFleetGuardsClosedFleetOpenBreakerRecovers(t *testing.T) {
	c := fgRedis(t)
	f, err := fleet.New(c, fleet.Config{Name: fgName(t, c), Timeout: 2 * time.Second, SyncEvery: 5 * time.Millisecond,
		MinCalls: 5, Breaker: breaker.Config{MinCalls: 5, OpenFor: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	status := new(atomic.Int64)
	status.Store(503)
	srv, _ := fgServer(t, status)
	rt := fgTransport(t, f, nil, httpretry.WithTimeout(20*time.Second), httpretry.WithRetry(retry.WithMaxAttempts(1)))
	trip := fgTransport(t, f, nil, httpretry.WithRetry(retry.WithMaxAttempts(1)))
	host := srv.Listener.Addr().String()
	g, _ := f.Guards(host)
	for i := 0; g.Breaker.State() != breaker.Open; i++ {
		if i > 200 {
			t.Fatalf("breaker did not open: %v", g.Breaker.State())
		}
		_, _ = fgGet(trip, srv.URL)
	}
	var wg sync.WaitGroup
	var served atomic.Int64
	for range 8 {
		wg.Go(func() {
			st, err := fgGet(rt, srv.URL)
			if err != nil {
				t.Errorf("waiting call: %v", err)
				return
			}
			if st == 200 {
				served.Add(1)
			}
		})
	}
	if err := f.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	status.Store(200)
	wg.Wait()
	if served.Load() != 8 {
		t.Errorf("%d of 8 waiting calls served after Close and recovery", served.Load())
	}
	if s := g.Breaker.State(); s != breaker.Closed {
		t.Errorf("breaker after recovery: %v", s)
	}
}
