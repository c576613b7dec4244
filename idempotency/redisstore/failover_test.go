package redisstore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// TestClusterFailover runs payments through the middleware on a Redis
// Cluster of 3 masters with a replica each, with Replicas 1 (WAIT for the
// replica), while one master is failed over by hand (CLUSTER FAILOVER on
// its replica) and another is killed outright (its replica is promoted
// after the node timeout; the killed node is started again and rejoins as
// a replica). Each payment is sent until it succeeds. Every payment must
// be applied exactly once, and the only answers other than the handler's
// 201 (or its replay) must be the documented ones while a shard is
// failing over: 503 (store unavailable: the handler did not run) and 409
// (in progress: a claim made whose answer was lost with the killed master
// holds the key until the lock timeout, 5 s here).
func TestClusterFailover(t *testing.T) {
	t.Parallel() // see e2eStores
	c := startCluster(t, 3)
	prefix := "stormguard-cluster:" + rand.Text() + ":"
	s, err := redisstore.New(c.client(), redisstore.Config{Prefix: prefix, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	h := clusterHandler(t, s, &idemtest.Ledger{}, idempotency.WithLockTimeout(5*time.Second))
	ledger := h.ledger

	var (
		next, done          atomic.Int64
		unavailable, inProg atomic.Int64
		stop                = make(chan struct{})
		wg                  sync.WaitGroup
		mu                  sync.Mutex
		errs                []string
	)
	const workers = 8
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := int(next.Add(1)) - 1
				if why := h.pay(i, &unavailable, &inProg); why != "" {
					mu.Lock()
					errs = append(errs, why)
					mu.Unlock()
				}
				done.Add(1)
			}
		})
	}
	phase := func(name string, f func()) {
		t.Helper()
		start, before := time.Now(), done.Load()
		f()
		t.Logf("%s: %v, %d payments meanwhile (%d 503s, %d 409s so far)", name, time.Since(start).Round(time.Millisecond), done.Load()-before, unavailable.Load(), inProg.Load())
	}
	time.Sleep(300 * time.Millisecond)

	// A manual failover: the replica catches up, then takes over.
	probe := prefix + "probe-a"
	m := c.masterOf(probe)
	r := c.replicaOf(m)
	phase("CLUSTER FAILOVER", func() {
		rc := r.client()
		defer rc.Close()
		if err := rc.ClusterFailover(context.Background()).Err(); err != nil {
			t.Fatalf("CLUSTER FAILOVER on %s: %v", r.addr(), err)
		}
		if !eventually(15*time.Second, func() bool { return r.role() == "master" && m.role() == "slave" }) {
			t.Fatalf("manual failover: %s is %q, %s is %q after 15s", r.addr(), r.role(), m.addr(), m.role())
		}
	})
	time.Sleep(300 * time.Millisecond)

	// Another master killed outright: its replica is promoted after the
	// node timeout; the killed node comes back as a replica.
	var k *clusterNode
	for i := 0; k == nil || k == r; i++ {
		k = c.masterOf(fmt.Sprintf("%sprobe-%d", prefix, i))
	}
	kr := c.replicaOf(k)
	phase("master killed", func() {
		k.kill()
		if !eventually(20*time.Second, func() bool { return kr.role() == "master" }) {
			t.Fatalf("%s not promoted 20s after its master %s was killed", kr.addr(), k.addr())
		}
	})
	phase("killed node started again, in sync", func() {
		k.start()
		c.waitHealthy(3)
	})
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	n := int(done.Load())
	applied, dups, lost, unknown := ledger.Tally(n)
	t.Logf("%d payments: applied %d, duplicates %d, lost %d, unknown %d; 503 answers %d, 409 answers %d", n, applied, dups, lost, unknown, unavailable.Load(), inProg.Load())
	if dups != 0 || lost != 0 || unknown != 0 || applied != n {
		t.Errorf("%d payments: applied %d, %d duplicates, %d lost, %d unknown; want each applied once", n, applied, dups, lost, unknown)
	}
	if len(errs) > 0 {
		t.Errorf("%d payments failed, first: %s", len(errs), errs[0])
	}
	if n < 100 {
		t.Errorf("only %d payments during the run: it proves little", n)
	}
}

// TestClusterLostWrite: a claim and a completion that the master
// acknowledged but never replicated (its replica frozen), then the master
// killed and the replica promoted. Without Replicas the writes are lost and
// the retry runs the handler a second time, which is what Redis's
// asynchronous replication allows (the package documentation says so);
// with Replicas 1 the claim is refused (503) because no replica confirmed
// it, the handler does not run, and the retry on the new master runs it
// once.
func TestClusterLostWrite(t *testing.T) {
	t.Parallel() // see e2eStores
	c := startCluster(t, 3)
	cc := c.client()
	for _, tc := range []struct {
		replicas, wantRuns int
		wantFirst          int
	}{
		{0, 2, http.StatusCreated},
		{1, 1, http.StatusServiceUnavailable},
	} {
		func() { // the cluster's helpers fail t itself: no subtests
			t.Logf("Replicas %d:", tc.replicas)
			prefix := "stormguard-cluster:" + rand.Text() + ":"
			rs, err := redisstore.New(cc, redisstore.Config{Prefix: prefix, Replicas: tc.replicas})
			if err != nil {
				t.Fatal(err)
			}
			spy := &idSpy{Store: rs}
			var runs atomic.Int64
			mw, err := idempotency.NewMiddleware(spy, idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil }), idempotency.WithStoreTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write([]byte(idemtest.Charged))
			}))
			key := idempotency.NewKey()

			// Every replica frozen and cut off from its master (which
			// closes the replication link, so that not even the kernel's
			// socket buffer holds what follows): the masters acknowledge
			// writes that no replica has.
			var replicas, masters []*clusterNode
			replicaOf := map[*clusterNode]*clusterNode{}
			for _, n := range c.nodes {
				if n.cmd.ProcessState == nil && n.role() == "master" {
					masters = append(masters, n)
					replicaOf[n] = c.replicaOf(n)
					replicas = append(replicas, replicaOf[n])
				}
			}
			// The client learns the cluster's layout and Redis's commands
			// now, from nodes that answer: a first request, on another key.
			// A 503 (the store did not answer, or with Replicas no replica
			// confirmed the claim, within the store timeout: on a loaded
			// machine a replica may not be scheduled in time) is a
			// documented answer; the request is sent again, on a key of
			// its own each time (a claim whose answer came too late holds
			// its key until the lock timeout).
			unavailable := 0
			var warm *httptest.ResponseRecorder
			if !eventually(30*time.Second, func() bool {
				warm = postTo(h, idempotency.NewKey())
				if warm.Code == http.StatusServiceUnavailable {
					unavailable++
				}
				return warm.Code != http.StatusServiceUnavailable
			}) || warm.Code != http.StatusCreated {
				t.Fatalf("Replicas %d: a first request: %d %q (after %d 503s)", tc.replicas, warm.Code, warm.Body, unavailable)
			}
			if unavailable > 0 {
				t.Logf("Replicas %d: a first request: 201 after %d 503s", tc.replicas, unavailable)
			}
			runs.Store(0)
			for _, rep := range replicas {
				rep.pause()
				defer rep.resume() // on failure too: the next subtest needs them
			}
			for _, m := range masters {
				mc := m.client()
				err := mc.ClientKillByFilter(context.Background(), "TYPE", "replica").Err()
				mc.Close()
				if err != nil {
					t.Fatalf("CLIENT KILL TYPE replica on %s: %v", m.addr(), err)
				}
			}
			first := postTo(h, key)
			id := spy.last()
			rkey := prefix + hex.EncodeToString(id[:])
			m := c.masterOf(rkey)
			promoted := replicaOf[m]
			if first.Code != tc.wantFirst {
				t.Fatalf("Replicas %d: request with every replica frozen: %d %q, want %d", tc.replicas, first.Code, first.Body, tc.wantFirst)
			}
			m.kill()
			for _, rep := range replicas {
				rep.resume()
			}
			if !eventually(20*time.Second, func() bool { return promoted.role() == "master" }) {
				t.Fatalf("%s not promoted 20s after its master %s was killed", promoted.addr(), m.addr())
			}
			m.start() // back as a replica: WAIT can be satisfied again
			c.waitHealthy(3)
			var last *httptest.ResponseRecorder
			if !eventually(30*time.Second, func() bool {
				last = postTo(h, key)
				return last.Code == http.StatusCreated
			}) {
				t.Fatalf("retry after the failover: %d %q for 30s, want 201", last.Code, last.Body)
			}
			if n := runs.Load(); n != int64(tc.wantRuns) {
				t.Errorf("Replicas %d: handler ran %d times, want %d", tc.replicas, n, tc.wantRuns)
			}
			t.Logf("Replicas %d: first answer %d, retry %d (replayed %q), handler runs %d", tc.replicas, first.Code, last.Code, last.Header().Get(idempotency.ReplayHeader), runs.Load())
		}()
	}
}

// idSpy is a store that remembers the ID of the last Begin.
type idSpy struct {
	store.Store
	mu sync.Mutex
	id store.ID
}

func (s *idSpy) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	s.mu.Lock()
	s.id = id
	s.mu.Unlock()
	return s.Store.Begin(ctx, id, fp, ttl)
}

func (s *idSpy) last() store.ID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// postTo serves a POST with key to h and returns the answer.
func postTo(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
	req.Header.Set(idempotency.Header, key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// clusterPayments is the ledger's payments handler behind a middleware on
// a store.
type clusterPayments struct {
	h      http.Handler
	ledger *idemtest.Ledger
}

func clusterHandler(t *testing.T, s store.Store, ledger *idemtest.Ledger, opts ...idempotency.Option) *clusterPayments {
	t.Helper()
	mw, err := idempotency.NewMiddleware(s, append([]idempotency.Option{idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil }), idempotency.WithStoreTimeout(time.Second)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &clusterPayments{h: mw(ledger.Handler("server")), ledger: ledger}
}

// pay makes payment i with a key of its own, sending it again after a 503
// or 409 (after 10 ms) for up to 60 s, and returns why it failed ("" if it
// succeeded with the handler's answer for it).
func (p *clusterPayments) pay(i int, unavailable, inProgress *atomic.Int64) string {
	id := idemtest.PaymentID(i)
	body, _ := json.Marshal(idemtest.Payment{ID: id, AmountCents: 100})
	key := idempotency.NewKey()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(string(body)))
		req.Header.Set(idempotency.Header, key)
		rec := httptest.NewRecorder()
		p.h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusCreated:
			var got idemtest.Payment
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.ID != id {
				return fmt.Sprintf("%s: 201 with %q", id, rec.Body)
			}
			return ""
		case http.StatusServiceUnavailable:
			unavailable.Add(1)
		case http.StatusConflict:
			inProgress.Add(1)
		default:
			return fmt.Sprintf("%s: %d %q", id, rec.Code, rec.Body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return id + ": no success within 60s"
}
