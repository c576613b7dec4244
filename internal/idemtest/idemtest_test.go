package idemtest_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// upstream starts a server answering 201 "ok" and counting its requests.
func upstream(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Upstream", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "ok "+r.URL.RequestURI())
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

// post sends one POST without an idempotency key (which net/http never
// resends on its own) and returns the status and body, or the error.
func post(t *testing.T, c *http.Client, url string) (int, string, error) {
	t.Helper()
	resp, err := c.Post(url, "text/plain", strings.NewReader("hello"))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestProxyFaults(t *testing.T) {
	tests := []struct {
		name             string
		reset, drop, cut float64
		wantErr          bool
		wantHits         int64
		wantStats        idemtest.ProxyStats
		wantStatus       int
		wantBody, wantHd string
	}{
		{name: "relay", wantHits: 1, wantStatus: 201, wantBody: "ok /pay?x=1", wantHd: "yes",
			wantStats: idemtest.ProxyStats{Requests: 1, Forwarded: 1, Relayed: 1, PerUpstream: []int64{1}}},
		{name: "reset before", reset: 1, wantErr: true, wantHits: 0,
			wantStats: idemtest.ProxyStats{Requests: 1, Resets: 1, PerUpstream: []int64{0}}},
		{name: "drop after", drop: 1, wantErr: true, wantHits: 1,
			wantStats: idemtest.ProxyStats{Requests: 1, Forwarded: 1, Drops: 1, DroppedOriginals: 1, PerUpstream: []int64{1}}},
		{name: "cut midway", cut: 1, wantErr: true, wantHits: 1,
			wantStats: idemtest.ProxyStats{Requests: 1, Forwarded: 1, Cuts: 1, CutOriginals: 1, PerUpstream: []int64{1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, hits := upstream(t)
			p, err := idemtest.NewProxy(idemtest.ProxyConfig{Upstreams: []string{srv.URL}, ResetRate: tt.reset, DropRate: tt.drop, CutRate: tt.cut})
			if err != nil {
				t.Fatalf("NewProxy: %v", err)
			}
			defer p.Close()
			c := &http.Client{Transport: &http.Transport{}}
			code, body, err := post(t, c, p.URL()+"/pay?x=1")
			if (err != nil) != tt.wantErr {
				t.Fatalf("POST through the proxy: error %v, want error: %v", err, tt.wantErr)
			}
			if !tt.wantErr && (code != tt.wantStatus || body != tt.wantBody) {
				t.Errorf("POST through the proxy = %d %q, want %d %q", code, body, tt.wantStatus, tt.wantBody)
			}
			if n := hits.Load(); n != tt.wantHits {
				t.Errorf("upstream got %d requests, want %d", n, tt.wantHits)
			}
			if got := p.Stats(); fmt.Sprint(got) != fmt.Sprint(tt.wantStats) {
				t.Errorf("Stats() = %+v, want %+v", got, tt.wantStats)
			}
		})
	}
}

func TestProxyRoundRobin(t *testing.T) {
	a, hitsA := upstream(t)
	b, hitsB := upstream(t)
	p, err := idemtest.NewProxy(idemtest.ProxyConfig{Upstreams: []string{a.URL, b.URL}})
	if err != nil {
		t.Fatalf("NewProxy: %v", err)
	}
	defer p.Close()
	c := &http.Client{Transport: &http.Transport{}}
	for range 10 {
		if _, _, err := post(t, c, p.URL()); err != nil {
			t.Fatalf("POST: %v", err)
		}
	}
	if hitsA.Load() != 5 || hitsB.Load() != 5 {
		t.Errorf("10 requests over 2 upstreams: %d and %d, want 5 and 5", hitsA.Load(), hitsB.Load())
	}
}

// faultPattern sends n sequential requests through a fresh proxy and
// returns which failed.
func faultPattern(t *testing.T, seed uint64, n int) []bool {
	t.Helper()
	srv, _ := upstream(t)
	p, err := idemtest.NewProxy(idemtest.ProxyConfig{Upstreams: []string{srv.URL}, ResetRate: 0.1, DropRate: 0.2, Seed: seed})
	if err != nil {
		t.Fatalf("NewProxy: %v", err)
	}
	defer p.Close()
	c := &http.Client{Transport: &http.Transport{}}
	failed := make([]bool, n)
	for i := range failed {
		_, _, err := post(t, c, p.URL())
		failed[i] = err != nil
	}
	return failed
}

func TestProxySeed(t *testing.T) {
	const n = 100
	a, b, c := faultPattern(t, 7, n), faultPattern(t, 7, n), faultPattern(t, 8, n)
	if !slices.Equal(a, b) {
		t.Errorf("seed 7 twice: fault patterns differ:\n%v\n%v", a, b)
	}
	if slices.Equal(a, c) {
		t.Errorf("seeds 7 and 8: same fault pattern %v", a)
	}
	if !slices.Contains(a, true) || !slices.Contains(a, false) {
		t.Errorf("seed 7: pattern %v, want some faults and some successes", a)
	}
}

func TestNewProxyErrors(t *testing.T) {
	tests := []struct {
		name string
		cfg  idemtest.ProxyConfig
	}{
		{"no upstream", idemtest.ProxyConfig{}},
		{"relative upstream", idemtest.ProxyConfig{Upstreams: []string{"/x"}}},
		{"https upstream", idemtest.ProxyConfig{Upstreams: []string{"https://127.0.0.1:1"}}},
		{"upstream with a path", idemtest.ProxyConfig{Upstreams: []string{"http://127.0.0.1:1/x"}}},
		{"bad URL", idemtest.ProxyConfig{Upstreams: []string{"http://[::1"}}},
		{"negative reset rate", idemtest.ProxyConfig{Upstreams: []string{"http://127.0.0.1:1"}, ResetRate: -0.1}},
		{"NaN drop rate", idemtest.ProxyConfig{Upstreams: []string{"http://127.0.0.1:1"}, DropRate: nan()}},
		{"rates over 1", idemtest.ProxyConfig{Upstreams: []string{"http://127.0.0.1:1"}, ResetRate: 0.6, DropRate: 0.5}},
		{"rates with cuts over 1", idemtest.ProxyConfig{Upstreams: []string{"http://127.0.0.1:1"}, ResetRate: 0.4, DropRate: 0.4, CutRate: 0.3}},
		{"negative cut rate", idemtest.ProxyConfig{Upstreams: []string{"http://127.0.0.1:1"}, CutRate: -0.1}},
	}
	for _, tt := range tests {
		p, err := idemtest.NewProxy(tt.cfg)
		if err == nil {
			p.Close()
			t.Errorf("NewProxy(%s) = nil error, want one", tt.name)
		}
	}
}

func nan() float64 {
	zero := 0.0
	return zero / zero
}

func TestLedgerHandler(t *testing.T) {
	var l idemtest.Ledger
	h := l.Handler("s1")
	tests := []struct {
		body       string
		wantStatus int
		wantBody   string
	}{
		{`{"payment":"p1","amount_cents":5}`, 201, `{"payment":"p1","amount_cents":5,"applied":1,"server":"s1"}`},
		{`{"payment":"p1","amount_cents":5}`, 201, `{"payment":"p1","amount_cents":5,"applied":2,"server":"s1"}`},
		{`{"payment":"p2"}`, 201, `{"payment":"p2","amount_cents":0,"applied":1,"server":"s1"}`},
		{`{"amount_cents":5}`, 400, ""},
		{`not json`, 400, ""},
	}
	for _, tt := range tests {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(tt.body)))
		if rec.Code != tt.wantStatus || (tt.wantBody != "" && rec.Body.String() != tt.wantBody) {
			t.Errorf("POST %s = %d %q, want %d %q", tt.body, rec.Code, rec.Body, tt.wantStatus, tt.wantBody)
		}
	}
	if n := l.Times("p1"); n != 2 {
		t.Errorf("Times(p1) = %d, want 2", n)
	}
	applied, byServer := l.Snapshot()
	if fmt.Sprint(applied) != "map[p1:2 p2:1]" || fmt.Sprint(byServer) != "map[s1:3]" {
		t.Errorf("Snapshot() = %v, %v; want map[p1:2 p2:1], map[s1:3]", applied, byServer)
	}
}

func TestLedgerConcurrent(t *testing.T) {
	var l idemtest.Ledger
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				l.Apply("p", fmt.Sprint("s", i%2))
			}
		})
	}
	wg.Wait()
	if n := l.Times("p"); n != 800 {
		t.Errorf("8x100 concurrent Apply: Times = %d, want 800", n)
	}
}

// forgetfulStore is a broken store: every Begin claims, so nothing is
// ever deduplicated.
type forgetfulStore struct{}

func (forgetfulStore) Begin(context.Context, store.ID, store.Fingerprint, time.Duration) (store.Result, error) {
	return store.Result{Outcome: store.Claimed, Owner: store.NewOwner()}, nil
}
func (forgetfulStore) Complete(context.Context, store.ID, store.Owner, store.Record, time.Duration) error {
	return nil
}
func (forgetfulStore) Extend(context.Context, store.ID, store.Owner, time.Duration) error {
	return nil
}
func (forgetfulStore) Release(context.Context, store.ID, store.Owner) error {
	return nil
}

// TestRunDetectsDuplicates: the harness must fail a store that does not
// deduplicate; otherwise its passing verdicts prove nothing.
func TestRunDetectsDuplicates(t *testing.T) {
	res, err := idemtest.Run(t.Context(), idemtest.Config{Stores: []store.Store{forgetfulStore{}}, Payments: 300})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	err = res.Err()
	if res.Duplicates == 0 || err == nil || !strings.Contains(err.Error(), "duplicate applications") {
		t.Fatalf("Run with a store that never deduplicates: %d duplicates, verdict %v; want duplicates and a failing verdict\n%v", res.Duplicates, err, res)
	}
	t.Logf("verdict, as expected:\n%v", err)
}

// busyOnceStore answers InProgress (409) to the first Begin of every key,
// as if another request with that key still ran.
type busyOnceStore struct {
	store.Store
	mu   sync.Mutex
	seen map[store.ID]bool
}

func (s *busyOnceStore) Begin(ctx context.Context, k store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	s.mu.Lock()
	first := !s.seen[k]
	s.seen[k] = true
	s.mu.Unlock()
	if first {
		return store.Result{Outcome: store.InProgress}, nil
	}
	return s.Store.Begin(ctx, k, fp, ttl)
}

// TestRunRedrivesConflicts: a 409 leaves the payment unknown; the driver
// sends it again with the same key, and it is applied once.
func TestRunRedrivesConflicts(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	busy := &busyOnceStore{Store: mem, seen: make(map[store.ID]bool)}
	const n = 200
	res := idemtest.RunTest(t, idemtest.Config{Stores: []store.Store{busy}, Payments: n, ResetRate: -1, DropRate: -1})
	if res.Conflicts != n || res.Redrives != n || res.Calls != 2*n {
		t.Errorf("%d payments, each first answered 409: %d conflicts, %d re-drives, %d calls; want %d, %d, %d",
			n, res.Conflicts, res.Redrives, res.Calls, n, n, 2*n)
	}
}

// busyStore answers InProgress (409) to every Begin of a key until hold
// has passed since its first Begin (forever if hold is 0), as if another
// request held the key that long.
type busyStore struct {
	store.Store
	hold  time.Duration
	mu    sync.Mutex
	first map[store.ID]time.Time
}

func (s *busyStore) Begin(ctx context.Context, k store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	s.mu.Lock()
	t, ok := s.first[k]
	if !ok {
		t = time.Now()
		s.first[k] = t
	}
	s.mu.Unlock()
	if s.hold == 0 || time.Since(t) < s.hold {
		return store.Result{Outcome: store.InProgress}, nil
	}
	return s.Store.Begin(ctx, k, fp, ttl)
}

// TestRunInProgressWait: a key held longer than MaxRedrives quick
// re-drives last (1 s; the pauses of 20 re-drives add up to 420 ms) is
// waited out, every payment applied once; a key held for good fails the
// run once InProgressWait has passed, each payment named.
func TestRunInProgressWait(t *testing.T) {
	const n = 20
	for _, tc := range []struct {
		name       string
		hold, wait time.Duration
		failed     int
	}{
		{name: "held 1 s", hold: time.Second},
		{name: "held for good", wait: 200 * time.Millisecond, failed: n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
			if err != nil {
				t.Fatalf("NewMemoryStore: %v", err)
			}
			busy := &busyStore{Store: mem, hold: tc.hold, first: make(map[store.ID]time.Time)}
			cfg := idemtest.Config{Stores: []store.Store{busy}, Payments: n, ResetRate: -1, DropRate: -1, InProgressWait: tc.wait}
			res, err := idemtest.Run(t.Context(), cfg)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Failed != tc.failed {
				t.Fatalf("%d payments failed, want %d\n%v", res.Failed, tc.failed, res)
			}
			if tc.failed == 0 {
				if err := res.Err(); err != nil {
					t.Fatalf("verdict: %v", err)
				}
				if res.LongestBusy < tc.hold*9/10 {
					t.Errorf("longest run of 409s got past: %v, want about %v", res.LongestBusy, tc.hold)
				}
				return
			}
			if err := res.Err(); err == nil || !strings.Contains(err.Error(), "still in progress after") {
				t.Fatalf("verdict %v, want payments still in progress", err)
			}
		})
	}
}

// TestRunRedrivesGiveUps: with one attempt per call the transport gives up
// on most faults; re-driving with the same key still applies every
// payment once, and a dropped original answer comes back as a replay.
func TestRunRedrivesGiveUps(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	res := idemtest.RunTest(t, idemtest.Config{Stores: []store.Store{mem, mem}, Payments: 1000, MaxAttempts: 1})
	if res.GaveUp == 0 || res.Redrives == 0 || res.Replays == 0 {
		t.Errorf("one attempt per call: %d give-ups, %d re-drives, %d replays; want each > 0", res.GaveUp, res.Redrives, res.Replays)
	}
}

// TestRunNetHTTPResend: the ordinary stack, where net/http resends an
// attempt that failed on a reused connection before the retrying
// transport sees it, applies every payment once too.
func TestRunNetHTTPResend(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	res := idemtest.RunTest(t, idemtest.Config{Stores: []store.Store{mem, mem}, Payments: 1000, NetHTTPResend: true})
	if res.Proxy.Requests <= res.Attempts {
		t.Errorf("NetHTTPResend: proxy got %d requests for %d attempts, want more (net/http resends)", res.Proxy.Requests, res.Attempts)
	}
}

func TestRunErrors(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatalf("NewMemoryStore: %v", err)
	}
	tests := []struct {
		name string
		cfg  idemtest.Config
	}{
		{"no store", idemtest.Config{}},
		{"bad middleware option", idemtest.Config{Stores: []store.Store{mem}, Middleware: []idempotency.Option{idempotency.WithLockTimeout(-1)}}},
		{"negative payments", idemtest.Config{Stores: []store.Store{mem}, Payments: -1}},
		{"rates over 1", idemtest.Config{Stores: []store.Store{mem}, ResetRate: 0.5, DropRate: 0.6}},
		{"negative attempts", idemtest.Config{Stores: []store.Store{mem}, MaxAttempts: -1}},
	}
	for _, tt := range tests {
		if _, err := idemtest.Run(t.Context(), tt.cfg); err == nil {
			t.Errorf("Run(%s) = nil error, want one", tt.name)
		}
	}
}

func TestResultErr(t *testing.T) {
	good := func() *idemtest.Result {
		return &idemtest.Result{
			Payments: 1000, Servers: 2, Applied: 1000, Calls: 1000, Replays: 200,
			ResetRate: 0.1, DropRate: 0.2,
			Proxy: idemtest.ProxyStats{Requests: 1450, Resets: 145, Drops: 290, DroppedOriginals: 200, PerUpstream: []int64{650, 655}},
		}
	}
	tests := []struct {
		name   string
		change func(*idemtest.Result)
		want   string // "" means pass
	}{
		{"good", func(*idemtest.Result) {}, ""},
		{"no fault configured", func(r *idemtest.Result) {
			r.ResetRate, r.DropRate, r.Proxy.Resets, r.Proxy.Drops = 0, 0, 0, 0
		}, ""},
		{"nothing", func(r *idemtest.Result) { *r = idemtest.Result{} }, "no payment made"},
		{"duplicate", func(r *idemtest.Result) { r.Duplicates = 1 }, "1 duplicate applications"},
		{"lost", func(r *idemtest.Result) { r.Lost, r.Applied = 1, 999 }, "1 payments lost"},
		{"unknown", func(r *idemtest.Result) { r.Unknown = 2 }, "2 ledger entries"},
		{"failed", func(r *idemtest.Result) { r.Failed, r.Errors = 1, []string{"pay-1: 400"} }, "pay-1: 400"},
		{"key error", func(r *idemtest.Result) { r.KeyErrors = 3 }, "3 calls whose attempts"},
		{"key collision", func(r *idemtest.Result) { r.KeyCollisions = 1 }, "shared a key"},
		{"upstream error", func(r *idemtest.Result) { r.Proxy.UpstreamErrors = 1 }, "1 proxy upstream errors"},
		{"no reset", func(r *idemtest.Result) { r.Proxy.Resets = 0 }, "no resets injected"},
		{"no drop", func(r *idemtest.Result) { r.Proxy.Drops = 0 }, "no drops injected"},
		{"reset rate off", func(r *idemtest.Result) { r.Proxy.Resets = 50 }, "resets rate 0.0345"},
		{"drop rate off", func(r *idemtest.Result) { r.Proxy.Drops = 500 }, "drops rate 0.3448"},
		{"replays differ", func(r *idemtest.Result) { r.Replays = 199 }, "199 payments ended with a replay"},
		{"idle server", func(r *idemtest.Result) { r.Proxy.PerUpstream = []int64{1305, 0} }, "server 1 got no request"},
		{"bad replay", func(r *idemtest.Result) { r.BadReplays = 1 }, "1 replays and 0 original answers differ"},
		{"bad answer", func(r *idemtest.Result) { r.BadAnswers = 2 }, "0 replays and 2 original answers differ"},
		{"cuts", func(r *idemtest.Result) {
			r.CutRate, r.Proxy.Cuts, r.Proxy.CutOriginals, r.Replays = 0.05, 72, 50, 250
		}, ""},
		{"no cut", func(r *idemtest.Result) { r.CutRate = 0.05 }, "no cuts injected"},
		{"cut original not replayed", func(r *idemtest.Result) {
			r.CutRate, r.Proxy.Cuts, r.Proxy.CutOriginals = 0.05, 72, 50
		}, "dropped or cut 250 original answers"},
		{"timeouts", func(r *idemtest.Result) {
			r.Timeout, r.SlowRate, r.Aborted, r.Overran, r.TimedOut, r.Replays = time.Millisecond, 0.1, 5, 7, 9, 209
		}, ""},
		{"replays past the timeouts", func(r *idemtest.Result) {
			r.Timeout, r.SlowRate, r.Aborted, r.Overran, r.TimedOut, r.Replays = time.Millisecond, 0.1, 5, 7, 9, 210
		}, "want 200 to 209"},
		{"no abort", func(r *idemtest.Result) {
			r.Timeout, r.SlowRate, r.Overran, r.TimedOut = time.Millisecond, 0.1, 7, 9
		}, "0 aborted"},
	}
	for _, tt := range tests {
		r := good()
		tt.change(r)
		err := r.Err()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: Err() = %v, want nil", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: Err() = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

func TestPayments(t *testing.T) {
	tests := []struct {
		env  string
		want int
	}{
		{"", idemtest.DefaultPaymentsHere},
		{"250", 250},
	}
	for _, tt := range tests {
		t.Setenv(idemtest.PaymentsEnv, tt.env)
		if got := idemtest.Payments(t); got != tt.want {
			t.Errorf("Payments() with %s=%q = %d, want %d", idemtest.PaymentsEnv, tt.env, got, tt.want)
		}
	}
}

// TestHandlerWith: the shaped handler pads its answer, writes it in
// chunks, records what it produced, and a slow run that waits before
// applying gives up without a word when its request is canceled.
func TestHandlerWith(t *testing.T) {
	var l idemtest.Ledger
	cfg := idemtest.HandlerConfig{AnswerBytes: 4000, Chunks: 4}
	rec := httptest.NewRecorder()
	writes := &countingWriter{ResponseRecorder: rec}
	l.HandlerWith("s", cfg).ServeHTTP(writes, httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"payment":"p1"}`)))
	if rec.Code != 201 || rec.Body.Len() < 4000 || rec.Body.Len() > 4010 || writes.n != 4 {
		t.Fatalf("answer: %d, %d bytes in %d writes; want 201, about 4000 bytes in 4", rec.Code, rec.Body.Len(), writes.n)
	}
	if h, ok := l.Produced("p1"); !ok || h != sha256.Sum256(rec.Body.Bytes()) {
		t.Fatal("Produced(p1) is not the hash of the answer written")
	}
	if _, ok := l.Produced("p2"); ok {
		t.Fatal("Produced(p2) for a payment never made")
	}
	// Every run slow: half wait before applying. Find one that gives up.
	slow := idemtest.HandlerConfig{Chunks: 2, SlowRate: 1, Pause: time.Hour}
	synctest.Test(t, func(t *testing.T) {
		var l idemtest.Ledger
		for i := range 20 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			rec := httptest.NewRecorder()
			l.HandlerWith("s", slow).ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodPost, "/payments", strings.NewReader(fmt.Sprintf(`{"payment":"p%d"}`, i))))
			cancel()
		}
		aborted, overran := l.Slow()
		applied, _ := l.Snapshot()
		if aborted == 0 || overran == 0 || aborted+len(applied) != 20 {
			t.Fatalf("20 slow runs with a 1 s deadline: %d aborted, %d overran, %d applied; want some aborted, some overran, aborted+applied = 20", aborted, overran, len(applied))
		}
	})
}

type countingWriter struct {
	*httptest.ResponseRecorder
	n int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n++
	return w.ResponseRecorder.Write(p)
}

// TestRunDetectsTruncatedReplays: the harness must fail a middleware that
// replays a cut answer; here a store that keeps only the first 100 bytes
// of every body.
func TestRunDetectsTruncatedReplays(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := idemtest.Run(t.Context(), idemtest.Config{
		Stores:   []store.Store{truncatingStore{mem}},
		Payments: 300,
		Handler:  idemtest.HandlerConfig{AnswerBytes: 1000},
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := res.Err(); res.BadReplays == 0 || err == nil || !strings.Contains(err.Error(), "differ from what the handler produced") {
		t.Fatalf("Run with a store that truncates bodies: %d bad replays, verdict %v; want bad replays and a failing verdict\n%v", res.BadReplays, err, res)
	}
}

// truncatingStore keeps only the first 100 bytes of every body.
type truncatingStore struct{ *idempotency.MemoryStore }

func (s truncatingStore) Complete(ctx context.Context, k store.ID, o store.Owner, rec store.Record, d time.Duration) error {
	rec.Body = rec.Body[:min(len(rec.Body), 100)]
	return s.MemoryStore.Complete(ctx, k, o, rec, d)
}

// TestRunStoreBlips: with store blips on, blips happen and are counted,
// and every payment is still applied once.
func TestRunStoreBlips(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	res := idemtest.RunTest(t, idemtest.Config{Stores: []store.Store{mem, mem}, Payments: 1500, StoreBlipRate: 0.2})
	if res != nil && res.StoreBlips == 0 {
		t.Errorf("StoreBlipRate 0.2: %d blips, want some", res.StoreBlips)
	}
}
