package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// origin is a provider in memory for the stale cache's tests: up, it
// answers every request with its status, header and body; down, with a 503
// (or, with refuse set, with no response at all). It runs in the caller's
// goroutine, so it serves tests in a synctest bubble. Safe for concurrent
// use.
type origin struct {
	mu      sync.Mutex
	down    bool
	refuse  bool
	status  int
	header  http.Header
	body    string
	chunked bool // no Content-Length
	hits    int
}

var errRefused = errors.New("origin: connection refused")

func (o *origin) RoundTrip(r *http.Request) (*http.Response, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.hits++
	if r.Body != nil {
		_ = r.Body.Close()
	}
	if o.down && o.refuse {
		return nil, errRefused
	}
	resp := &http.Response{StatusCode: http.StatusServiceUnavailable, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header), Body: http.NoBody, Request: r}
	if !o.down {
		resp.StatusCode, resp.Header = o.status, o.header.Clone()
		resp.ContentLength = int64(len(o.body))
		if o.chunked {
			resp.ContentLength = -1
		}
		if o.body != "" && r.Method != http.MethodHead {
			resp.Body = io.NopCloser(strings.NewReader(o.body))
		}
	}
	resp.Status = strconv.Itoa(resp.StatusCode) + " " + http.StatusText(resp.StatusCode)
	return resp, nil
}

func (o *origin) set(f func(o *origin)) {
	o.mu.Lock()
	f(o)
	o.mu.Unlock()
}

// staleTransport is a transport over o with a stale cache, two attempts per
// request and a small backoff.
func staleTransport(t *testing.T, o http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	tr, _ := newTransport(t, o, append([]httpretry.Option{httpretry.WithRetry(retry.WithMaxAttempts(2))}, opts...)...)
	return tr
}

// get sends a request with the given method and header fields ("Name:
// value" strings) through tr. A field written "=name: value" is set under
// its key as written, by assigning to the header's map (net/http sends
// it so, and the server reads it as the canonical field).
func get(t *testing.T, tr http.RoundTripper, method, url string, fields ...string) (*http.Response, error) {
	t.Helper()
	req := newRequest(t, context.Background(), method, url, nil)
	for _, f := range fields {
		k, v, _ := strings.Cut(f, ":")
		if raw, ok := strings.CutPrefix(k, "="); ok {
			req.Header[raw] = append(req.Header[raw], strings.TrimSpace(v))
			continue
		}
		req.Header.Add(k, strings.TrimSpace(v))
	}
	return tr.RoundTrip(req)
}

func hdr(kv ...string) http.Header {
	h := make(http.Header)
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestStaleCacheRules: one case per rule of WithStaleCache. The origin
// answers a first request, goes down, time passes, and a second request
// either gets the kept response, marked stale, or the failure.
func TestStaleCacheRules(t *testing.T) {
	const url = "http://origin.test/item?id=1"
	type tc struct {
		name     string
		maxStale time.Duration
		creds    bool
		status   int
		header   http.Header
		body     string
		chunked  bool
		first    []string // the first request's header fields
		method   string   // both requests' ("" GET)
		read     string   // how the caller reads the first body: "all" (default), "none", "exact" (Content-Length bytes, no EOF)
		then     func(o *origin)
		refuse   bool
		wait     time.Duration
		second   []string
		served   bool
		mark     string // the Stormguard-Stale value, if served
		age      string
	}
	cc := func(v string) http.Header { return hdr("Cache-Control", v) }
	tests := []tc{
		{name: "fresh response, provider down", header: cc("max-age=60"), wait: 10 * time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=0", age: "10"},
		{name: "within stale-if-error", header: cc("max-age=10, stale-if-error=30"), wait: 35 * time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=25", age: "35"},
		{name: "at the edge of stale-if-error", header: cc("max-age=10, stale-if-error=30"), wait: 39*time.Second + 900*time.Millisecond,
			served: true, mark: "attempts-exhausted;attempts=2;stale=29", age: "39"},
		{name: "past stale-if-error", header: cc("max-age=10, stale-if-error=30"), wait: 41 * time.Second},
		{name: "stale-if-error above maxStale wins", maxStale: time.Second, header: cc("max-age=0, stale-if-error=600"), wait: 500 * time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=500", age: "500"},
		{name: "stale without a directive, maxStale 0", header: cc("max-age=10"), wait: 11 * time.Second},
		{name: "stale without a directive, within maxStale", maxStale: time.Minute, header: cc("max-age=10"), wait: 50 * time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=40", age: "50"},
		{name: "no freshness information, maxStale", maxStale: time.Minute, header: hdr(), wait: 30 * time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=30", age: "30"},
		{name: "Expires minus Date", header: hdr("Date", "Tue, 01 Dec 2026 00:00:00 GMT", "Expires", "Tue, 01 Dec 2026 00:01:00 GMT"),
			wait: 10 * time.Second, served: true},
		{name: "Age received counts", header: hdr("Cache-Control", "max-age=120, stale-if-error=60", "Age", "100"), wait: 30 * time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=10", age: "130"},
		{name: "a request's stale-if-error lowers the limit", header: cc("max-age=10, stale-if-error=60"), wait: 20 * time.Second,
			second: []string{"Cache-Control: stale-if-error=5"}},
		{name: "a request's stale-if-error within the limit", header: cc("max-age=10, stale-if-error=60"), wait: 20 * time.Second,
			second: []string{"Cache-Control: stale-if-error=15"}, served: true},
		{name: "no-store response", header: cc("no-store, max-age=60"), wait: time.Second},
		{name: "no-store request", header: cc("max-age=60"), first: []string{"Cache-Control: no-store"}, wait: time.Second},
		{name: "no-store on the second request", header: cc("max-age=60"), second: []string{"Cache-Control: no-store"}, wait: time.Second},
		{name: "no-cache response", header: cc("no-cache, stale-if-error=60"), wait: time.Second},
		{name: "must-revalidate response", header: cc("max-age=60, must-revalidate"), wait: time.Second},
		{name: "Set-Cookie response", header: hdr("Cache-Control", "max-age=60", "Set-Cookie", "s=1"), wait: time.Second},
		{name: "Vary: *", header: hdr("Cache-Control", "max-age=60", "Vary", "*"), wait: time.Second},
		{name: "Vary: the same value", header: hdr("Cache-Control", "max-age=60", "Vary", "Accept-Language"),
			first: []string{"Accept-Language: en"}, second: []string{"accept-language: en"}, wait: time.Second, served: true},
		{name: "Vary: another value", header: hdr("Cache-Control", "max-age=60", "Vary", "accept-language, Accept-Encoding"),
			first: []string{"Accept-Language: en"}, second: []string{"Accept-Language: fr"}, wait: time.Second},
		{name: "Vary: a field the second request lacks", header: hdr("Cache-Control", "max-age=60", "Vary", "X-Tenant"),
			first: []string{"X-Tenant: a"}, wait: time.Second},
		{name: "Authorization, not allowed", header: cc("max-age=60"), first: []string{"Authorization: Bearer alice"},
			second: []string{"Authorization: Bearer alice"}, wait: time.Second},
		{name: "Authorization, allowed, same user", creds: true, header: cc("max-age=60"), first: []string{"Authorization: Bearer alice"},
			second: []string{"Authorization: Bearer alice"}, wait: time.Second, served: true},
		{name: "Authorization, allowed, another user", creds: true, header: cc("max-age=60"), first: []string{"Authorization: Bearer alice"},
			second: []string{"Authorization: Bearer bob"}, wait: time.Second},
		{name: "Authorization, allowed, no credentials on the second", creds: true, header: cc("max-age=60"), first: []string{"Authorization: Bearer alice"},
			wait: time.Second},
		{name: "Cookie, not allowed", header: cc("max-age=60"), first: []string{"Cookie: s=alice"}, second: []string{"Cookie: s=alice"}, wait: time.Second},
		{name: "Cookie, allowed, another user", creds: true, header: cc("max-age=60"), first: []string{"Cookie: s=alice"},
			second: []string{"Cookie: s=bob"}, wait: time.Second},
		// Fields under a key that is not canonical ("authorization", set
		// by assigning to the map) are the same fields: net/http sends them
		// as written and the server reads them as the canonical ones.
		{name: "lowercase authorization, not allowed", header: cc("max-age=60"), first: []string{"=authorization: Bearer alice"},
			wait: time.Second},
		{name: "lowercase authorization, allowed, no credentials on the second", creds: true, header: cc("max-age=60"),
			first: []string{"=authorization: Bearer alice"}, wait: time.Second},
		{name: "lowercase authorization, allowed, another user", creds: true, header: cc("max-age=60"),
			first: []string{"=authorization: Bearer alice"}, second: []string{"=AUTHORIZATION: Bearer mallory"}, wait: time.Second},
		{name: "lowercase authorization, allowed, same user", creds: true, header: cc("max-age=60"),
			first: []string{"=authorization: Bearer alice"}, second: []string{"Authorization: Bearer alice"}, wait: time.Second, served: true},
		{name: "lowercase cookie, not allowed", header: cc("max-age=60"), first: []string{"=cookie: s=alice"}, wait: time.Second},
		{name: "lowercase proxy-authorization, not allowed", header: cc("max-age=60"), first: []string{"=proxy-authorization: Basic YTpi"},
			wait: time.Second},
		{name: "lowercase no-store request", header: cc("max-age=60"), first: []string{"=cache-control: no-store"}, wait: time.Second},
		{name: "lowercase range request", header: cc("max-age=60"), first: []string{"=range: bytes=0-3"}, wait: time.Second},
		{name: "Vary: a lowercase field", header: hdr("Cache-Control", "max-age=60", "Vary", "Accept-Language"),
			first: []string{"=accept-language: fr"}, wait: time.Second},
		{name: "Vary: a lowercase field, the same value", header: hdr("Cache-Control", "max-age=60", "Vary", "Accept-Language"),
			first: []string{"=accept-language: fr"}, second: []string{"Accept-Language: fr"}, wait: time.Second, served: true},
		{name: "lowercase no-store response", maxStale: time.Hour, header: http.Header{"cache-control": {"no-store, max-age=60"}}, wait: time.Second},
		{name: "lowercase set-cookie response", header: http.Header{"Cache-Control": {"max-age=60"}, "set-cookie": {"s=1"}}, wait: time.Second},
		// A Date centuries old makes the age the largest Duration: the
		// oldest there is, never one that wraps to a negative age.
		{name: "a Date centuries old, max-age=0", header: hdr("Cache-Control", "max-age=0", "Date", "Fri, 01 Jan 1700 00:00:00 GMT"),
			wait: time.Second},
		{name: "a Date centuries old, stale-if-error", header: hdr("Cache-Control", "max-age=0, stale-if-error=60", "Date", "Fri, 01 Jan 1700 00:00:00 GMT"),
			wait: time.Second},
		{name: "a Date centuries old, no Cache-Control", maxStale: time.Hour, header: hdr("Date", "Mon, 01 Jan 0001 00:00:00 GMT"),
			wait: 2 * time.Minute},
		{name: "private without credentials", creds: true, header: cc("private, max-age=60"), wait: time.Second},
		{name: "private, same user", creds: true, header: cc("private, max-age=60"), first: []string{"Cookie: s=alice"},
			second: []string{"Cookie: s=alice"}, wait: time.Second, served: true},
		{name: "private, another user", creds: true, header: cc("private, max-age=60"), first: []string{"Cookie: s=alice"},
			second: []string{"Cookie: s=bob"}, wait: time.Second},
		{name: "POST is never kept", method: http.MethodPost, header: cc("max-age=60"), wait: time.Second},
		{name: "HEAD", method: http.MethodHead, header: cc("max-age=60"), read: "none", wait: time.Second, served: true},
		{name: "a 404 is not kept", status: http.StatusNotFound, header: cc("max-age=60"), wait: time.Second},
		{name: "a later 404 drops the kept response", header: cc("max-age=60"), wait: time.Second,
			then: func(o *origin) { o.status = http.StatusNotFound }},
		{name: "a later no-store drops the kept response", header: cc("max-age=60"), wait: time.Second,
			then: func(o *origin) { o.header = cc("no-store") }},
		{name: "a later 200 replaces it", header: cc("max-age=60"), wait: time.Second, served: true,
			then: func(o *origin) { o.body = "second version" }},
		{name: "a body never read is not kept", header: cc("max-age=60"), read: "none", wait: time.Second},
		{name: "a body read to its Content-Length is kept", header: cc("max-age=60"), read: "exact", wait: time.Second, served: true},
		{name: "a chunked body read to EOF is kept", header: cc("max-age=60"), chunked: true, wait: time.Second, served: true},
		{name: "an empty 204 is kept at once", status: http.StatusNoContent, body: "-", header: cc("max-age=60"), read: "none", wait: time.Second, served: true},
		{name: "network errors", header: cc("max-age=60"), refuse: true, wait: time.Second,
			served: true, mark: "attempts-exhausted;attempts=2;stale=0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				if tt.status == 0 {
					tt.status = http.StatusOK
				}
				if tt.body == "" {
					tt.body = `{"id":1,"name":"first version"}`
				}
				if tt.body == "-" {
					tt.body = ""
				}
				if tt.method == "" {
					tt.method = http.MethodGet
				}
				o := &origin{status: tt.status, header: tt.header, body: tt.body, chunked: tt.chunked}
				tr := staleTransport(t, o, httpretry.WithStaleCache(1<<20, tt.maxStale, tt.creds))
				resp, err := get(t, tr, tt.method, url, tt.first...)
				if err != nil {
					t.Fatalf("first request: %v", err)
				}
				switch tt.read {
				case "none":
					_ = resp.Body.Close()
				case "exact":
					buf := make([]byte, len(tt.body))
					if _, err := io.ReadFull(resp.Body, buf); err != nil {
						t.Fatal(err)
					}
					_ = resp.Body.Close()
				default:
					if got := readClose(t, resp); got != tt.body {
						t.Fatalf("first body %q, want %q (the cache must not change it)", got, tt.body)
					}
				}
				want := tt.body
				if tt.then != nil {
					o.set(tt.then)
					r2, err := get(t, tr, tt.method, url, tt.first...)
					if err != nil {
						t.Fatal(err)
					}
					want = readClose(t, r2)
				}
				o.set(func(o *origin) { o.down, o.refuse = true, tt.refuse })
				time.Sleep(tt.wait)
				resp, err = get(t, tr, tt.method, url, tt.second...)
				if !tt.served {
					if err == nil {
						if v := resp.Header.Get("Stormguard-Stale"); v != "" || resp.StatusCode != http.StatusServiceUnavailable {
							t.Errorf("served %d with Stormguard-Stale %q, want the failure (503, not stale)", resp.StatusCode, v)
						}
						readClose(t, resp)
					} else if !errors.Is(err, errRefused) {
						t.Errorf("error %v, want the failure", err)
					}
					return
				}
				if err != nil {
					t.Fatalf("second request: %v, want the kept response", err)
				}
				mark := resp.Header.Get("Stormguard-Stale")
				if resp.StatusCode != tt.status || mark == "" {
					t.Fatalf("second request: %d, Stormguard-Stale %q; want %d marked stale", resp.StatusCode, mark, tt.status)
				}
				if tt.mark != "" && mark != tt.mark {
					t.Errorf("Stormguard-Stale %q, want %q", mark, tt.mark)
				}
				if tt.age != "" && resp.Header.Get("Age") != tt.age {
					t.Errorf("Age %q, want %q", resp.Header.Get("Age"), tt.age)
				}
				if tt.method == http.MethodHead || tt.status == http.StatusNoContent {
					want = ""
				}
				if got := readClose(t, resp); got != want {
					t.Errorf("stale body %q, want %q", got, want)
				}
				if resp.Request == nil || resp.Request.URL.String() != url {
					t.Errorf("stale response's Request %v, want the caller's", resp.Request)
				}
			})
		})
	}
}

// TestStaleCacheBreakerAndFallback: a request the open breaker refuses gets
// the kept response, marked circuit-open; one the cache cannot answer gets
// the fallback; a canceled one gets neither.
func TestStaleCacheBreakerAndFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{status: http.StatusOK, header: hdr("Cache-Control", "max-age=1, stale-if-error=3600"), body: "kept"}
		fallbacks := 0
		tr := staleTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Minute}),
			httpretry.WithFallback(func(req *http.Request, err *retry.Error) (*http.Response, error) {
				fallbacks++
				return nil, fmt.Errorf("fallback: %w", err)
			}))
		if _, err := getClose(t, tr, "http://origin.test/a"); err != nil {
			t.Fatal(err)
		}
		o.set(func(o *origin) { o.down = true })
		resp, err := get(t, tr, "GET", "http://origin.test/a") // two 503s: the breaker opens
		if err != nil || !strings.HasPrefix(resp.Header.Get("Stormguard-Stale"), "attempts-exhausted;attempts=2") {
			t.Fatalf("first request in the outage: %v, %v; want the kept response", resp, err)
		}
		readClose(t, resp)
		hits := o.hits
		resp, err = get(t, tr, "GET", "http://origin.test/a")
		if err != nil || !strings.HasPrefix(resp.Header.Get("Stormguard-Stale"), "circuit-open;attempts=0") {
			t.Fatalf("behind the open breaker: %v, %v; want the kept response marked circuit-open", resp, err)
		}
		if got := readClose(t, resp); got != "kept" || o.hits != hits {
			t.Errorf("body %q after %d more sends, want \"kept\" and none", got, o.hits-hits)
		}
		if fallbacks != 0 {
			t.Errorf("fallback called %d times, want 0 (the cache answered)", fallbacks)
		}
		if _, err := get(t, tr, "GET", "http://origin.test/never-seen"); err == nil || !strings.HasPrefix(err.Error(), "fallback:") || fallbacks != 1 {
			t.Errorf("a request the cache cannot answer: %v (%d fallbacks), want the fallback's", err, fallbacks)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		req := newRequest(t, ctx, "GET", "http://origin.test/a", nil)
		if resp, err := tr.RoundTrip(req); err == nil || !errors.Is(err, context.Canceled) {
			t.Errorf("canceled request: %v, %v; want the cancel", resp, err)
		}
	})
}

// TestStaleCacheLargeBody: a body larger than the cache passes through
// whole and is not kept; the cache still keeps smaller ones.
func TestStaleCacheLargeBody(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				big := strings.Repeat("x", 64<<10)
				o := &origin{status: http.StatusOK, header: hdr("Cache-Control", "max-age=60"), body: big, chunked: chunked}
				tr := staleTransport(t, o, httpretry.WithStaleCache(32<<10, 0, false))
				resp, err := get(t, tr, "GET", "http://origin.test/big")
				if err != nil {
					t.Fatal(err)
				}
				if got := readClose(t, resp); got != big {
					t.Fatalf("body of %d bytes, want all %d (never truncated)", len(got), len(big))
				}
				o.set(func(o *origin) { o.body = "small" })
				if _, err := getClose(t, tr, "http://origin.test/small"); err != nil {
					t.Fatal(err)
				}
				o.set(func(o *origin) { o.down = true })
				if resp, _ := get(t, tr, "GET", "http://origin.test/big"); resp == nil || resp.Header.Get("Stormguard-Stale") != "" {
					t.Errorf("the big body was kept: %v", resp)
				}
				resp, err = get(t, tr, "GET", "http://origin.test/small")
				if err != nil || readClose(t, resp) != "small" {
					t.Errorf("the small body was not kept: %v", err)
				}
			})
		})
	}
}

// TestStaleCacheOutage: a 10 s outage of a provider whose responses are
// fresh for 1 s and may be served stale for 60: every GET of a URL read
// before the outage is answered from the cache, with its staleness (through
// the attempts, then behind the open breaker), and the provider's recovery
// is seen at the breaker's next probe.
func TestStaleCacheOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{status: http.StatusOK, header: hdr("Cache-Control", "max-age=1, stale-if-error=60"), body: "v1"}
		tr := staleTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
		const urls = 50
		for i := range urls {
			if _, err := getClose(t, tr, fmt.Sprintf("http://origin.test/item/%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		o.set(func(o *origin) { o.down = true })
		served, maxStale := 0, 0
		for step := range 100 { // every 100 ms for 10 s
			time.Sleep(100 * time.Millisecond)
			resp, err := get(t, tr, "GET", fmt.Sprintf("http://origin.test/item/%d", step%urls))
			if err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			mark := resp.Header.Get("Stormguard-Stale")
			if body := readClose(t, resp); mark == "" || body != "v1" {
				t.Fatalf("step %d: %d %q, Stormguard-Stale %q; want the kept v1", step, resp.StatusCode, body, mark)
			}
			served++
			_, s, _ := strings.Cut(mark, ";stale=")
			n, _ := strconv.Atoi(s)
			maxStale = max(maxStale, n)
		}
		if served != 100 || maxStale != 9 {
			t.Errorf("served %d of 100 from the cache, at most %d s stale; want 100 and 9 (10 s outage, 1 s fresh)", served, maxStale)
		}
		o.set(func(o *origin) { o.down, o.body = false, "v2" })
		time.Sleep(2 * time.Second) // the breaker's open period (1 s, jittered by 20%)
		resp, err := get(t, tr, "GET", "http://origin.test/item/0")
		if err != nil || resp.Header.Get("Stormguard-Stale") != "" || readClose(t, resp) != "v2" {
			t.Errorf("after the outage: %v; want the provider's v2", err)
		}
	})
}

// TestStaleCacheConcurrent: many goroutines read, keep and are served from
// one cache while the provider flaps; run with -race.
func TestStaleCacheConcurrent(t *testing.T) {
	o := &origin{status: http.StatusOK, header: hdr("Cache-Control", "max-age=0, stale-if-error=60", "Vary", "X-Tenant"), body: "payload"}
	tr := staleTransport(t, o, httpretry.WithStaleCache(8<<10, 0, true), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 300 {
				if g == 0 && i%50 == 0 {
					o.set(func(o *origin) { o.down = !o.down })
				}
				url := fmt.Sprintf("http://origin.test/%d", (g*31+i)%40)
				resp, err := get(t, tr, "GET", url, "X-Tenant: "+strconv.Itoa(i%3), "Authorization: user"+strconv.Itoa(g%2))
				if err != nil {
					t.Error(err)
					return
				}
				body := readClose(t, resp)
				if resp.StatusCode == http.StatusOK && body != "payload" {
					t.Errorf("body %q", body)
				}
			}
		})
	}
	wg.Wait()
}

func TestWithStaleCacheInvalid(t *testing.T) {
	for _, opt := range []httpretry.Option{
		httpretry.WithStaleCache(0, 0, false),
		httpretry.WithStaleCache(-1, 0, false),
		httpretry.WithStaleCache(1, -time.Second, false),
	} {
		if _, err := httpretry.NewTransport(nil, opt); err == nil {
			t.Error("NewTransport with a bad WithStaleCache = nil error")
		}
	}
}

// TestStaleCacheDoesNotWaitBehindTheBreaker: a request the cache can answer
// gets the kept response at once when the host's breaker is open, where it
// would otherwise wait for the breaker's next probe round; one the cache
// cannot answer still waits.
func TestStaleCacheDoesNotWaitBehindTheBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &origin{status: http.StatusOK, header: hdr("Cache-Control", "max-age=1, stale-if-error=3600"), body: "kept"}
		tr := staleTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: 5 * time.Second, Rand: func() float64 { return 0.5 }}))
		if _, err := getClose(t, tr, "http://origin.test/a"); err != nil {
			t.Fatal(err)
		}
		o.set(func(o *origin) { o.down = true })
		resp, err := getClose(t, tr, "http://origin.test/a") // two 503s: the breaker opens
		if err != nil || resp.Header.Get("Stormguard-Stale") == "" {
			t.Fatalf("in the outage: %v, %v; want the kept response", resp, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		resp, err = tr.RoundTrip(newRequest(t, ctx, "GET", "http://origin.test/a", nil))
		if err != nil || !strings.HasPrefix(resp.Header.Get("Stormguard-Stale"), "circuit-open;attempts=0;retry-after=5") {
			t.Fatalf("behind the open breaker: %v, %v; want the kept response marked circuit-open", resp, err)
		}
		readClose(t, resp)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("the cached answer took %v, want 0 (no wait behind the breaker)", waited)
		}
		start = time.Now()
		resp, err = tr.RoundTrip(newRequest(t, ctx, "GET", "http://origin.test/never-seen", nil))
		if err == nil {
			readClose(t, resp)
		}
		if waited := time.Since(start); waited < 4*time.Second {
			t.Errorf("a request the cache cannot answer returned after %v, want it to wait for the probe round (5 s)", waited)
		}
	})
}

// authOrigin answers 401 to a request without Authorization and, up, a
// cacheable 200 to one with it; down, 503.
type authOrigin struct{ origin }

func (o *authOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	o.mu.Lock()
	down := o.down
	o.mu.Unlock()
	if !down && r.Header.Get("Authorization") == "" {
		return &http.Response{StatusCode: http.StatusUnauthorized, Status: "401 Unauthorized", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: make(http.Header), Body: http.NoBody, Request: r}, nil
	}
	return o.origin.RoundTrip(r)
}

// TestStaleCacheRefreshedCredentials: after WithRefreshOn401 the answer
// is kept by the request that was sent, with the credentials the refresh
// added: not kept at all without withCredentials, and with it served only
// to requests that carry those credentials.
func TestStaleCacheRefreshedCredentials(t *testing.T) {
	const url = "http://origin.test/me"
	refresh := httpretry.WithRefreshOn401(func(req *http.Request) (*http.Request, error) {
		r := req.Clone(req.Context())
		r.Header.Set("Authorization", "Bearer alice")
		return r, nil
	})
	for _, tt := range []struct {
		name   string
		creds  bool
		second []string
		served bool
	}{
		{name: "not allowed, anonymous second", second: nil},
		{name: "not allowed, alice second", second: []string{"Authorization: Bearer alice"}},
		{name: "allowed, anonymous second", creds: true},
		{name: "allowed, alice second", creds: true, second: []string{"Authorization: Bearer alice"}, served: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &authOrigin{origin{status: http.StatusOK, header: hdr("Cache-Control", "max-age=60"), body: "alice's"}}
				tr := staleTransport(t, o, httpretry.WithStaleCache(1<<20, 0, tt.creds), refresh)
				resp, err := get(t, tr, http.MethodGet, url)
				if err != nil {
					t.Fatal(err)
				}
				if got := readClose(t, resp); resp.StatusCode != http.StatusOK || got != "alice's" {
					t.Fatalf("first request: %d %q, want 200 after the refresh", resp.StatusCode, got)
				}
				o.set(func(o *origin) { o.down = true })
				time.Sleep(time.Second)
				resp, err = get(t, tr, http.MethodGet, url, tt.second...)
				if err != nil {
					t.Fatal(err)
				}
				mark := resp.Header.Get("Stormguard-Stale")
				readClose(t, resp)
				if served := mark != ""; served != tt.served {
					t.Errorf("second request: %d, Stormguard-Stale %q; want served %v", resp.StatusCode, mark, tt.served)
				}
			})
		})
	}
}

// TestStaleCacheCloseDuringRead: a body closed by another goroutine while
// a Read runs (net/http lets a Close abort a Read) is no data race with
// the cache on (run with -race).
func TestStaleCacheCloseDuringRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=60")
		for i := range 50 {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Microsecond)
		}
	}))
	defer srv.Close()
	tr, err := httpretry.NewTransport(srv.Client().Transport, httpretry.WithStaleCache(1<<20, 0, false))
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		resp, err := get(t, tr, http.MethodGet, srv.URL+"/stream")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = io.Copy(io.Discard, resp.Body)
		}()
		time.Sleep(time.Millisecond) // let the reader start: a race, not a timing, is what is checked
		_ = resp.Body.Close()
		<-done
	}
}
