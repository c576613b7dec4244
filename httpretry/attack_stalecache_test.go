// Black-box attack on the stale-if-error cache (WithStaleCache): each test
// names the documented promise it checks.
package httpretry_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// scaOrigin is an in-memory base: handle answers each request (in the
// calling goroutine, so it works in a synctest bubble).
type scaOrigin struct {
	mu     sync.Mutex
	down   atomic.Bool // answer 503 to everything
	sends  atomic.Int64
	handle func(r *http.Request) *http.Response
}

func (o *scaOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	o.sends.Add(1)
	if r.Body != nil {
		_ = r.Body.Close()
	}
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	if o.down.Load() {
		resp := scaResp(http.StatusServiceUnavailable, nil, "down")
		resp.Request = r
		return resp, nil
	}
	o.mu.Lock()
	h := o.handle
	o.mu.Unlock()
	resp := h(r)
	resp.Request = r
	return resp, nil
}

func scaResp(code int, hdr http.Header, body string) *http.Response {
	if hdr == nil {
		hdr = http.Header{}
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: hdr, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)),
	}
}

func scaTransport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	all := append([]httpretry.Option{httpretry.WithRetry(retry.WithBackoff(smallBackoff(t)), retry.WithMaxAttempts(2))}, opts...)
	tr, err := httpretry.NewTransport(base, all...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

func scaGet(t *testing.T, rt http.RoundTripper, method, url string, hdr http.Header) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "error: " + err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(b)
}

func scaStale(resp *http.Response) string {
	if resp == nil {
		return ""
	}
	return resp.Header.Get("Stormguard-Stale")
}

// DOC (WithStaleCache): "A served response is a copy: its body the kept
// bytes, its Request the caller's". After WithRefreshOn401 the served copy
// must still carry the caller's request, not the one the refresh made.
func TestAttackStaleCacheServedRequestIsCallersAfterRefresh(t *testing.T) {
	var outage atomic.Bool
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		if r.Header.Get("Authorization") != "Bearer new" {
			return scaResp(http.StatusUnauthorized, nil, "")
		}
		if outage.Load() {
			return scaResp(503, nil, "down")
		}
		return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=60"}}, "v1")
	}}
	tr := scaTransport(t, o,
		httpretry.WithStaleCache(1<<20, 0, true),
		httpretry.WithRefreshOn401(func(req *http.Request) (*http.Request, error) {
			req.Header.Set("Authorization", "Bearer new")
			return req, nil
		}))
	old := http.Header{"Authorization": {"Bearer old"}}
	if _, body := scaGet(t, tr, "GET", "http://api.test/x", old); body != "v1" {
		t.Fatalf("first GET: %q", body)
	}
	outage.Store(true)
	req, _ := http.NewRequest("GET", "http://api.test/x", nil)
	req.Header.Set("Authorization", "Bearer old")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("outage GET: %v", err)
	}
	defer resp.Body.Close()
	if scaStale(resp) == "" {
		t.Fatalf("outage GET not served from the cache: %d %v", resp.StatusCode, resp.Header)
	}
	if resp.Request != req {
		t.Errorf("served stale response's Request is not the caller's: Authorization %q (caller sent %q)",
			resp.Request.Header.Get("Authorization"), req.Header.Get("Authorization"))
	}
}

// DOC (WithStaleCache): "A later answer to the same request that is not
// kept (a 404, a no-store ...) drops the kept one." A 200 whose headers
// came before a 404 but whose body is read to the end after it must not
// come back as the kept response once the server has said 404.
func TestAttackStaleCacheLateBodyResurrectsAfter404(t *testing.T) {
	var n atomic.Int64
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		if n.Add(1) == 1 {
			return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "old-200")
		}
		return scaResp(404, nil, "gone")
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
	reqA, _ := http.NewRequest("GET", "http://api.test/item", nil)
	respA, err := tr.RoundTrip(reqA) // 200, body not read yet
	if err != nil {
		t.Fatal(err)
	}
	if resp, body := scaGet(t, tr, "GET", "http://api.test/item", nil); resp == nil || resp.StatusCode != 404 {
		t.Fatalf("second GET: %v %q", resp, body)
	}
	_, _ = io.ReadAll(respA.Body) // the older response's body, read after the 404
	_ = respA.Body.Close()
	o.down.Store(true)
	resp, body := scaGet(t, tr, "GET", "http://api.test/item", nil)
	if s := scaStale(resp); s != "" {
		t.Errorf("after a 404 (answered after the 200), the outage GET got the older 200 from the cache: %q, Stormguard-Stale %q", body, s)
	}
}

// DOC (WithStaleCache): "keeps the last good response". Two overlapping
// GETs: the later response (v2) is read first and kept; the earlier one
// (v1), read afterwards, must not replace it.
func TestAttackStaleCacheOlderResponseReplacesNewer(t *testing.T) {
	var n atomic.Int64
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		v := n.Add(1)
		return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "v"+strconv.FormatInt(v, 10))
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
	reqA, _ := http.NewRequest("GET", "http://api.test/item", nil)
	respA, err := tr.RoundTrip(reqA) // v1, body not read yet
	if err != nil {
		t.Fatal(err)
	}
	if _, body := scaGet(t, tr, "GET", "http://api.test/item", nil); body != "v2" {
		t.Fatalf("second GET: %q", body)
	}
	b, _ := io.ReadAll(respA.Body)
	_ = respA.Body.Close()
	if string(b) != "v1" {
		t.Fatalf("first body %q", b)
	}
	o.down.Store(true)
	resp, body := scaGet(t, tr, "GET", "http://api.test/item", nil)
	if scaStale(resp) == "" {
		t.Fatalf("outage GET not served: %q", body)
	}
	if body != "v2" {
		t.Errorf("served %q (Age %s), want the last good response v2", body, resp.Header.Get("Age"))
	}
}

// DOC (WithStaleCache): "A response counts its body, its header fields,
// its key and 256 bytes against maxBytes ... one larger than maxBytes is
// not kept." With a long URL, a response that by this count fits (even
// counting the key generously as method, host and URL, and 4 bytes more
// per header line) is not kept.
func TestAttackStaleCacheChargeCountsKeyOnce(t *testing.T) {
	path := "/" + strings.Repeat("k", 4000)
	url := "http://api.test" + path
	hdr := http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}
	body := "0123456789"
	headerBytes := 0
	for k, vs := range hdr {
		for _, v := range vs {
			headerBytes += len(k) + len(v) + 4
		}
	}
	keyBytes := len("GET ") + len("api.test ") + len(url)
	bound := int64(256 + keyBytes + headerBytes + len(body) + 64) // 64 bytes of slack
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		h := http.Header{}
		for k, v := range hdr {
			h[k] = append([]string(nil), v...)
		}
		return scaResp(200, h, body)
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(bound, 0, false))
	if _, b := scaGet(t, tr, "GET", url, nil); b != body {
		t.Fatalf("first GET %q", b)
	}
	o.down.Store(true)
	resp, b := scaGet(t, tr, "GET", url, nil)
	if scaStale(resp) == "" {
		t.Errorf("maxBytes %d >= body %d + header fields %d + key %d + 256 (+64 slack), yet the response was not kept (outage got %q)",
			bound, len(body), headerBytes, keyBytes, b)
	}
}

// DOC (WithStaleCache): freshness counted "from its age when received (Age,
// or now minus Date when later)", served "up to stale-if-error seconds past
// that", with "Age (its age in whole seconds)" and ";stale=<seconds past
// freshness>". Passes if the figures are right.
func TestAttackStaleCacheExpiryFromDate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &scaOrigin{handle: func(r *http.Request) *http.Response {
			return scaResp(200, http.Header{
				"Cache-Control": {"max-age=10, stale-if-error=30"},
				"Date":          {time.Now().Add(-30 * time.Second).UTC().Format(http.TimeFormat)},
				"Age":           {"5"},
			}, "data")
		}}
		tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, time.Hour, false), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
		if _, b := scaGet(t, tr, "GET", "http://api.test/d", nil); b != "data" {
			t.Fatalf("first %q", b)
		}
		o.down.Store(true)
		// received at age 30: stale 20 s; served until 10 s more pass.
		time.Sleep(9 * time.Second)
		resp, b := scaGet(t, tr, "GET", "http://api.test/d", nil)
		if s := scaStale(resp); !strings.HasSuffix(s, ";stale=29") || resp.Header.Get("Age") != "39" {
			t.Errorf("at +9s: body %q Age %q Stormguard-Stale %q, want Age 39 and stale=29", b, resp.Header.Get("Age"), s)
		}
		time.Sleep(2 * time.Second)
		resp, b = scaGet(t, tr, "GET", "http://api.test/d", nil)
		if s := scaStale(resp); s != "" {
			t.Errorf("at +11s (stale 31s > stale-if-error 30): served %q %q", b, s)
		}
	})
}

// DOC (WithStaleCache): served "never when the caller canceled". The
// caller cancels while the last attempt is in flight and the host then
// answers 503. Passes if no stale answer is given.
func TestAttackStaleCacheCanceledDuringLastAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cancel context.CancelFunc
		var phase atomic.Int64
		o := &scaOrigin{}
		o.handle = func(r *http.Request) *http.Response {
			if phase.Load() == 0 {
				return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "ok")
			}
			if phase.Add(1) == 3 { // second (last) attempt of the canceled call
				cancel()
			}
			return scaResp(503, nil, "down")
		}
		tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
		scaGet(t, tr, "GET", "http://api.test/c", nil)
		phase.Store(1)
		ctx, c := context.WithCancel(context.Background())
		cancel = c
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/c", nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			defer resp.Body.Close()
			if s := scaStale(resp); s != "" {
				t.Errorf("a caller that canceled got a stale answer: %q", s)
			}
		}
	})
}

// DOC (WithStaleCache): "the methods are kept apart"; a HEAD response is
// kept at once and served with no body. Passes if so.
func TestAttackStaleCacheHeadGetApart(t *testing.T) {
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		resp := scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "get-body")
		if r.Method == "HEAD" {
			resp.Body = http.NoBody
		}
		return resp
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
	scaGet(t, tr, "GET", "http://api.test/g", nil)
	scaGet(t, tr, "HEAD", "http://api.test/h", nil)
	o.down.Store(true)
	if resp, _ := scaGet(t, tr, "HEAD", "http://api.test/g", nil); scaStale(resp) != "" {
		t.Errorf("HEAD served from a GET's entry")
	}
	if resp, _ := scaGet(t, tr, "GET", "http://api.test/h", nil); scaStale(resp) != "" {
		t.Errorf("GET served from a HEAD's entry")
	}
	resp, b := scaGet(t, tr, "HEAD", "http://api.test/h", nil)
	if scaStale(resp) == "" || b != "" || resp.ContentLength != 8 {
		t.Errorf("HEAD not served as kept: stale %q body %q length %d", scaStale(resp), b, resp.ContentLength)
	}
}

// DOC (WithStaleCache): "A served response is a copy"; "safe for
// concurrent use". Many callers read (and mutate the headers of) served
// copies at once, under -race. Passes if each gets the whole body.
func TestAttackStaleCacheServedCopiesIndependent(t *testing.T) {
	want := strings.Repeat("abcdefgh", 4096)
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}, "X-V": {"1"}}, want)
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithBreaker(nil), httpretry.WithBudget(nil), httpretry.WithLimit(nil))
	scaGet(t, tr, "GET", "http://api.test/s", nil)
	o.down.Store(true)
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("GET", "http://api.test/s", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				errs <- err.Error()
				return
			}
			resp.Header.Set("X-V", "mutated")
			resp.Header["X-V"][0] = "m2"
			var buf bytes.Buffer
			p := make([]byte, 7)
			for {
				n, err := resp.Body.Read(p)
				buf.Write(p[:n])
				for j := range p[:n] {
					p[j] = 0
				}
				if err != nil {
					break
				}
			}
			_ = resp.Body.Close()
			if buf.String() != want || scaStale(resp) == "" {
				errs <- fmt.Sprintf("body %d bytes, stale %q", buf.Len(), scaStale(resp))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	resp, _ := scaGet(t, tr, "GET", "http://api.test/s", nil)
	if resp.Header.Get("X-V") != "1" {
		t.Errorf("kept header changed by a caller: %q", resp.Header.Get("X-V"))
	}
}

// DOC (WithStaleCache): "a larger body is passed through whole and not
// kept"; a later answer not kept drops the kept one. Chunked (unknown
// length) body bigger than maxBytes. Passes if the caller reads it whole
// and no stale answer is left.
func TestAttackStaleCacheLargerChunkedPassedWhole(t *testing.T) {
	var n atomic.Int64
	big := strings.Repeat("z", 10000)
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		b := "small"
		if n.Add(1) > 1 {
			b = big
		}
		resp := scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, b)
		resp.ContentLength = -1
		return resp
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(4096, 0, false))
	if _, b := scaGet(t, tr, "GET", "http://api.test/l", nil); b != "small" {
		t.Fatalf("first %q", b)
	}
	if _, b := scaGet(t, tr, "GET", "http://api.test/l", nil); b != big {
		t.Fatalf("large body cut: %d bytes", len(b))
	}
	o.down.Store(true)
	if resp, b := scaGet(t, tr, "GET", "http://api.test/l", nil); scaStale(resp) != "" {
		t.Errorf("after a larger (not kept) answer, the older one was still served: %q", b)
	}
}

// DOC (WithStaleCache): kept "by the values of the request header fields
// its Vary names". Probe: the URL's first answer has no Vary (v1), its
// next says Vary: Accept (v2, to Accept: a). A request with Accept: b in
// an outage: what does it get? Reported, not a finding by itself.
func TestAttackStaleCacheVaryChangeProbe(t *testing.T) {
	var n atomic.Int64
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		h := http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}
		v := n.Add(1)
		if v > 1 {
			h.Set("Vary", "Accept")
		}
		return scaResp(200, h, "v"+strconv.FormatInt(v, 10))
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
	scaGet(t, tr, "GET", "http://api.test/v", http.Header{"Accept": {"a"}})
	scaGet(t, tr, "GET", "http://api.test/v", http.Header{"Accept": {"a"}})
	o.down.Store(true)
	resp, b := scaGet(t, tr, "GET", "http://api.test/v", http.Header{"Accept": {"b"}})
	t.Logf("Accept: b in outage got %q stale %q", b, scaStale(resp))
}

// DOC (WithStaleCache): served when the transport gives up because "the
// retry budget, the breaker ... refused, or the deadline came"; the
// Stormguard-Stale value names the give-up. Passes if each is served.
func TestAttackStaleCacheGiveUpReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ok := func(r *http.Request) *http.Response {
			return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "kept")
		}
		// budget: no retries at all.
		o := &scaOrigin{handle: ok}
		tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithBreaker(nil),
			httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: -1}))
		scaGet(t, tr, "GET", "http://api.test/b", nil)
		o.down.Store(true)
		resp, b := scaGet(t, tr, "GET", "http://api.test/b", nil)
		if s := scaStale(resp); !strings.HasPrefix(s, "budget") || b != "kept" {
			t.Errorf("budget give-up: body %q stale %q", b, s)
		}
		// deadline: the host hangs past WithTimeout.
		var hang atomic.Bool
		o2 := &scaOrigin{handle: ok}
		slow := scaRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if hang.Load() {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return o2.RoundTrip(r)
		})
		tr2 := scaTransport(t, slow, httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithTimeout(time.Second))
		scaGet(t, tr2, "GET", "http://api.test/d", nil)
		hang.Store(true)
		resp, b = scaGet(t, tr2, "GET", "http://api.test/d", nil)
		if s := scaStale(resp); !strings.HasPrefix(s, "deadline") || b != "kept" {
			t.Errorf("deadline give-up: body %q stale %q", b, s)
		}
		// breaker: opened by the outage, then a request served at once.
		o3 := &scaOrigin{handle: ok}
		tr3 := scaTransport(t, o3, httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithBudget(nil))
		scaGet(t, tr3, "GET", "http://api.test/o", nil)
		o3.down.Store(true)
		for i := 0; i < 30; i++ {
			scaGet(t, tr3, "GET", "http://api.test/other", nil)
		}
		before := o3.sends.Load()
		resp, b = scaGet(t, tr3, "GET", "http://api.test/o", nil)
		if s := scaStale(resp); !strings.HasPrefix(s, "circuit-open;attempts=0") || b != "kept" || o3.sends.Load() != before {
			t.Errorf("open breaker: body %q stale %q sends %d", b, s, o3.sends.Load()-before)
		}
	})
}

type scaRoundTripFunc func(*http.Request) (*http.Response, error)

func (f scaRoundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// DOC (WithStaleCache): "up to maxBytes in all (LRU)". Many distinct URLs
// with bodies of several sizes, some read concurrently: in an outage, the
// bodies served (distinct URLs) must add up to no more than maxBytes, and
// the most recently stored one must be among them. Passes if so.
func TestAttackStaleCacheBoundManyURLs(t *testing.T) {
	const maxBytes = 64 << 10
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/u"))
		size := 1 + (n*7919)%(12<<10)
		resp := scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, strings.Repeat("x", size))
		if n%3 == 0 {
			resp.ContentLength = -1
		}
		return resp
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(maxBytes, 0, false), httpretry.WithBreaker(nil), httpretry.WithBudget(nil), httpretry.WithLimit(nil))
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < 200; i += 4 {
				scaGet(t, tr, "GET", fmt.Sprintf("http://api.test/u%d", i), nil)
			}
		}()
	}
	wg.Wait()
	scaGet(t, tr, "GET", "http://api.test/u1000", nil)
	o.down.Store(true)
	total, served := 0, 0
	for i := 0; i < 200; i++ {
		resp, b := scaGet(t, tr, "GET", fmt.Sprintf("http://api.test/u%d", i), nil)
		if scaStale(resp) != "" {
			total += len(b)
			served++
		}
	}
	resp, b := scaGet(t, tr, "GET", "http://api.test/u1000", nil)
	if scaStale(resp) == "" {
		t.Errorf("most recent response not served")
	}
	total += len(b)
	t.Logf("served %d URLs, %d body bytes", served+1, total)
	if total > maxBytes {
		t.Errorf("served bodies add up to %d bytes > maxBytes %d", total, maxBytes)
	}
}

// lockedBody is a body safe for concurrent Read (as net/http's is), one
// byte per Read.
type scaLockedBody struct {
	mu sync.Mutex
	r  *strings.Reader
}

func (b *scaLockedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(p) > 1 {
		p = p[:1]
	}
	return b.r.Read(p)
}
func (b *scaLockedBody) Close() error { return nil }

// DOC (WithStaleCache): "The body is kept as the caller reads it"; a
// served response's "body the kept bytes". Two goroutines read one
// response's body (a body safe for concurrent Read); the bytes kept must be
// the response's bytes, in order, or nothing. Probe: reports a reordering.
func TestAttackStaleCacheConcurrentReadKeepsOrder(t *testing.T) {
	var sb strings.Builder
	for i := 0; i < 2000; i++ {
		sb.WriteString(fmt.Sprintf("%04d", i))
	}
	want := sb.String()
	bad := 0
	for round := 0; round < 200; round++ {
		var down atomic.Bool
		base := scaRoundTripFunc(func(r *http.Request) (*http.Response, error) {
			if down.Load() {
				resp := scaResp(503, nil, "")
				resp.Request = r
				return resp, nil
			}
			resp := scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "")
			resp.Body = &scaLockedBody{r: strings.NewReader(want)}
			resp.ContentLength = int64(len(want))
			resp.Request = r
			return resp, nil
		})
		tr := scaTransport(t, base, httpretry.WithStaleCache(1<<20, 0, false))
		req, _ := http.NewRequest("GET", "http://api.test/cr", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := 0; g < 2; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := make([]byte, 1)
				for {
					if _, err := resp.Body.Read(p); err != nil {
						return
					}
				}
			}()
		}
		wg.Wait()
		_ = resp.Body.Close()
		down.Store(true)
		sr, b := scaGet(t, tr, "GET", "http://api.test/cr", nil)
		if scaStale(sr) != "" && b != want {
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%d of 200 rounds served a kept body that is not the response's bytes in order", bad)
	}
}

// DOC (WithStaleCache): "A request's own stale-if-error lowers the limit
// for that request"; a fresh response "always is" served; lifetime from
// "Expires minus Date". Passes if so.
func TestAttackStaleCacheLimits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &scaOrigin{handle: func(r *http.Request) *http.Response {
			now := time.Now().UTC()
			cc := "stale-if-error=100"
			if r.URL.Path == "/fresh" {
				cc = "max-age=60"
			}
			return scaResp(200, http.Header{
				"Cache-Control": {cc},
				"Date":          {now.Format(http.TimeFormat)},
				"Expires":       {now.Add(20 * time.Second).Format(http.TimeFormat)},
			}, "d")
		}}
		tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
		scaGet(t, tr, "GET", "http://api.test/e", nil)
		scaGet(t, tr, "GET", "http://api.test/fresh", nil)
		o.down.Store(true)
		time.Sleep(30 * time.Second) // 10 s past Expires
		resp, _ := scaGet(t, tr, "GET", "http://api.test/e", nil)
		if s := scaStale(resp); !strings.HasSuffix(s, ";stale=10") {
			t.Errorf("Expires-Date lifetime: stale %q, want stale=10", s)
		}
		resp, _ = scaGet(t, tr, "GET", "http://api.test/e", http.Header{"Cache-Control": {"stale-if-error=5"}})
		if s := scaStale(resp); s != "" {
			t.Errorf("request stale-if-error=5 did not lower the limit: %q", s)
		}
		resp, _ = scaGet(t, tr, "GET", "http://api.test/e", http.Header{"Cache-Control": {"stale-if-error=11"}})
		if s := scaStale(resp); s == "" {
			t.Errorf("request stale-if-error=11 at stale 10 (+backoff ms): not served")
		}
		resp, _ = scaGet(t, tr, "GET", "http://api.test/fresh", http.Header{"Cache-Control": {"stale-if-error=0"}})
		if s := scaStale(resp); !strings.HasSuffix(s, ";stale=0") {
			t.Errorf("fresh response (maxStale 0, no stale-if-error) not served: %q", s)
		}
	})
}

// DOC (WithStaleCache): "the response is stored once its body has been read
// to the end (or to its Content-Length)". The caller reads exactly
// Content-Length bytes (io.ReadFull) and has not closed the body yet.
func TestAttackStaleCacheReadToContentLength(t *testing.T) {
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "0123456789")
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
	req, _ := http.NewRequest("GET", "http://api.test/cl", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := make([]byte, resp.ContentLength)
	if _, err := io.ReadFull(resp.Body, p); err != nil {
		t.Fatal(err)
	}
	o.down.Store(true)
	sr, b := scaGet(t, tr, "GET", "http://api.test/cl", nil)
	if scaStale(sr) == "" {
		t.Errorf("body read to its Content-Length (10 bytes, not closed yet) not kept: outage got %q", b)
	}
}

// DOC (WithStaleCache): "up to 8 variants per URL"; "when it gives up on a
// 500, 502, 503 or 504 for any other reason". Passes if 8 of 9 Vary
// variants (the newest) are served and a 500/502/504 give-up is answered.
func TestAttackStaleCacheVariantsAndStatuses(t *testing.T) {
	var status atomic.Int64
	o := &scaOrigin{handle: func(r *http.Request) *http.Response {
		if s := status.Load(); s != 0 {
			return scaResp(int(s), nil, "err")
		}
		return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}, "Vary": {"Accept"}}, "for "+r.Header.Get("Accept"))
	}}
	tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
	for i := 0; i < 9; i++ {
		scaGet(t, tr, "GET", "http://api.test/var", http.Header{"Accept": {fmt.Sprint(i)}})
	}
	for _, code := range []int{500, 502, 504, 503} {
		status.Store(int64(code))
		for i := 0; i < 9; i++ {
			resp, b := scaGet(t, tr, "GET", "http://api.test/var", http.Header{"Accept": {fmt.Sprint(i)}})
			served := scaStale(resp) != ""
			if served != (i > 0) || (served && b != "for "+fmt.Sprint(i)) {
				t.Errorf("status %d variant %d: served %v body %q", code, i, served, b)
			}
		}
	}
}

// RFC 9111 4.1: a Vary-named field absent from a request matches only its
// absence. A response kept for a request with an empty Accept is not
// served stale to one without Accept, nor the other way round; to a
// request like its own it is.
func TestStaleCacheVaryAbsentIsNotEmpty(t *testing.T) {
	for _, tt := range []struct {
		name          string
		kept, later   http.Header
		wantStaleBody bool
	}{
		{"empty, then absent", http.Header{"Accept": {""}}, nil, false},
		{"absent, then empty", nil, http.Header{"Accept": {""}}, false},
		{"empty, then empty", http.Header{"Accept": {""}}, http.Header{"Accept": {""}}, true},
		{"absent, then absent", nil, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			o := &scaOrigin{handle: func(r *http.Request) *http.Response {
				return scaResp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}, "Vary": {"Accept"}}, "kept")
			}}
			tr := scaTransport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
			scaGet(t, tr, "GET", "http://api.test/v", tt.kept)
			o.down.Store(true)
			resp, b := scaGet(t, tr, "GET", "http://api.test/v", tt.later)
			if got := b == "kept" && scaStale(resp) != ""; got != tt.wantStaleBody {
				t.Errorf("kept for Accept %q, asked with %q: body %q, stale %q; want served stale: %v", tt.kept.Values("Accept"), tt.later.Values("Accept"), b, scaStale(resp), tt.wantStaleBody)
			}
		})
	}
}
