// Black-box attack on the stale-if-error cache (WithStaleCache) and on
// hedging (WithHedging): each test names the documented promise it checks.
package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// ---- helpers ----

// zchBody is a response body that counts its Close.
type zchBody struct {
	r      io.Reader
	once   sync.Once
	closed *atomic.Int64
}

func (b *zchBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *zchBody) Close() error {
	b.once.Do(func() {
		if b.closed != nil {
			b.closed.Add(1)
		}
	})
	return nil
}

// zchOrigin is an in-memory base transport: handle answers each request on
// the calling goroutine (so it works inside a synctest bubble). It counts
// the bodies it hands out and those closed.
type zchOrigin struct {
	mu     sync.Mutex
	handle func(r *http.Request) (*http.Response, error)
	reqs   []*http.Request
	opened atomic.Int64
	closed atomic.Int64
}

func (o *zchOrigin) set(h func(r *http.Request) (*http.Response, error)) {
	o.mu.Lock()
	o.handle = h
	o.mu.Unlock()
}

func (o *zchOrigin) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
	o.mu.Lock()
	o.reqs = append(o.reqs, r)
	h := o.handle
	o.mu.Unlock()
	resp, err := h(r)
	if err != nil {
		return nil, err
	}
	resp.Request = r
	if resp.Body == nil {
		resp.Body = http.NoBody
	} else if resp.Body != http.NoBody {
		o.opened.Add(1)
		resp.Body = &zchBody{r: resp.Body, closed: &o.closed}
	}
	return resp, nil
}

func (o *zchOrigin) sent() []*http.Request {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*http.Request(nil), o.reqs...)
}

func (o *zchOrigin) reset() {
	o.mu.Lock()
	o.reqs = nil
	o.mu.Unlock()
}

func zch503(*http.Request) (*http.Response, error) {
	return scaResp(http.StatusServiceUnavailable, nil, "down"), nil
}

func zchBackoff(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// zchStaleTransport: a stale cache, 2 attempts, no breaker and no budget
// (so that every give-up is attempts-exhausted), unless opts say otherwise.
func zchStaleTransport(t *testing.T, base http.RoundTripper, maxBytes int64, maxStale time.Duration, creds bool, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	all := append([]httpretry.Option{
		httpretry.WithRetry(retry.WithBackoff(zchBackoff(t)), retry.WithMaxAttempts(2)),
		httpretry.WithBreaker(nil), httpretry.WithBudget(nil),
		httpretry.WithStaleCache(maxBytes, maxStale, creds),
	}, opts...)
	tr, err := httpretry.NewTransport(base, all...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

// zchDo sends a request with hdr set directly on the header map (keys as
// written) and reads the whole body.
func zchDo(t *testing.T, rt http.RoundTripper, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = append(req.Header[k], v)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "ERR: " + err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(b)
}

func zchDate(t time.Time) string { return t.UTC().Format(http.TimeFormat) }

func zchOK(cc string, extra map[string][]string, body string) func(*http.Request) (*http.Response, error) {
	return func(*http.Request) (*http.Response, error) {
		h := http.Header{}
		if cc != "" {
			h["Cache-Control"] = []string{cc}
		}
		h["Date"] = []string{zchDate(time.Now())}
		for k, v := range extra {
			h[k] = v // as written: a base may use any spelling
		}
		return scaResp(http.StatusOK, h, body), nil
	}
}

// ---- stale cache: RFC 5861 expiry ----

// WithStaleCache: "It is served up to stale-if-error seconds past that when
// it carried Cache-Control stale-if-error, else up to maxStale past it" and
// "Age (its age in whole seconds)", ";stale=" "how many whole seconds past
// its freshness".
func TestAttackCacheHedge5SIEExpiry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		age      string
		okAt     time.Duration // served, with this stale and age
		stale    int
		ageOut   int
		failAt   time.Duration // one second later: not served
		maxStale time.Duration
	}{
		{name: "sie-overrides-longer-maxStale", okAt: 30 * time.Second, stale: 20, ageOut: 30, maxStale: time.Hour},
		{name: "sie-overrides-shorter-maxStale", okAt: 30 * time.Second, stale: 20, ageOut: 30, maxStale: time.Second},
		{name: "initial-Age-counts", age: "5", okAt: 25 * time.Second, stale: 20, ageOut: 30, maxStale: time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &zchOrigin{}
				extra := map[string][]string{}
				if tc.age != "" {
					extra["Age"] = []string{tc.age}
				}
				o.set(zchOK("max-age=10, stale-if-error=20", extra, "v1"))
				tr := zchStaleTransport(t, o, 1<<20, tc.maxStale, false)
				const url = "http://origin.test/a"
				if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || b != "v1" {
					t.Fatalf("warm: %v %q", resp, b)
				}
				o.set(zch503)
				time.Sleep(tc.okAt)
				resp, b := zchDo(t, tr, "GET", url, nil)
				if resp == nil || resp.StatusCode != 200 || b != "v1" {
					t.Fatalf("at %v: want the kept response, got %v %q", tc.okAt, resp, b)
				}
				if got := resp.Header.Get("Age"); got != strconv.Itoa(tc.ageOut) {
					t.Errorf("Age = %q, want %d", got, tc.ageOut)
				}
				if got := resp.Header.Get("Stormguard-Stale"); !strings.HasSuffix(got, ";stale="+strconv.Itoa(tc.stale)) || !strings.HasPrefix(got, "attempts-exhausted;attempts=2") {
					t.Errorf("Stormguard-Stale = %q, want attempts-exhausted;attempts=2...;stale=%d", got, tc.stale)
				}
				time.Sleep(time.Second)
				resp, b = zchDo(t, tr, "GET", url, nil)
				if resp == nil || resp.StatusCode != 503 || resp.Header.Get("Stormguard-Stale") != "" {
					t.Fatalf("1 s past stale-if-error: want the 503, got %v %q", resp, b)
				}
			})
		})
	}
}

// WithStaleCache: "a response is fresh for its max-age (or Expires minus
// Date)"; "(0: only responses with stale-if-error are served stale; a
// fresh one always is)"; "A request's own stale-if-error lowers the limit
// for that request."
func TestAttackCacheHedge5ExpiresAndRequestSIE(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(func(*http.Request) (*http.Response, error) {
			now := time.Now()
			h := http.Header{"Date": {zchDate(now)}, "Expires": {zchDate(now.Add(10 * time.Second))}}
			return scaResp(200, h, "e"), nil
		})
		tr := zchStaleTransport(t, o, 1<<20, 0, false)
		const url = "http://origin.test/exp"
		zchDo(t, tr, "GET", url, nil)
		o.set(zch503)
		time.Sleep(10 * time.Second) // exactly at the end of freshness
		if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 200 || b != "e" {
			t.Fatalf("fresh (Expires-Date = 10 s) at 10 s: want served, got %v %q", resp, b)
		}
		time.Sleep(time.Second)
		if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 503 {
			t.Fatalf("maxStale 0 and no stale-if-error, 1 s stale: want 503, got %v %q", resp, b)
		}

		// Request stale-if-error lowers maxStale.
		o2 := &zchOrigin{}
		o2.set(zchOK("max-age=0", nil, "r"))
		tr2 := zchStaleTransport(t, o2, 1<<20, time.Hour, false)
		zchDo(t, tr2, "GET", url, nil)
		o2.set(zch503)
		time.Sleep(5 * time.Second)
		if resp, b := zchDo(t, tr2, "GET", url, map[string]string{"cache-control": "stale-if-error=5"}); resp == nil || resp.StatusCode != 200 {
			t.Fatalf("request stale-if-error=5 at 5 s: want served, got %v %q", resp, b)
		}
		time.Sleep(time.Second)
		if resp, b := zchDo(t, tr2, "GET", url, map[string]string{"cache-control": "stale-if-error=5"}); resp == nil || resp.StatusCode != 503 {
			t.Fatalf("request stale-if-error=5 at 6 s: want 503, got %v %q", resp, b)
		}
		if resp, b := zchDo(t, tr2, "GET", url, nil); resp == nil || resp.StatusCode != 200 || b != "r" {
			t.Fatalf("no request directive, maxStale 1h at 6 s: want served, got %v %q", resp, b)
		}
	})
}

// ---- stale cache: what is never kept ----

// WithStaleCache: "Never kept: ... a request or response with
// Cache-Control no-store, a response with no-cache, must-revalidate or
// proxy-revalidate ..., a Vary of "*", a Set-Cookie", "a private response
// to a request without credentials is never kept", and "A later answer to
// the same request that is not kept ... drops the kept one". Fields set by
// the base under any spelling and on any line.
func TestAttackCacheHedge5NeverKept(t *testing.T) {
	for _, tc := range []struct {
		name string
		hdr  map[string][]string
	}{
		{"no-store-second-line", map[string][]string{"Cache-Control": {"max-age=60", "no-store"}}},
		{"no-store-lowercase-key", map[string][]string{"cache-control": {"max-age=60, NO-STORE"}}},
		{"no-store-after-quoted-comma", map[string][]string{"Cache-Control": {`max-age=60, ext="a, b", no-store`}}},
		{"private", map[string][]string{"Cache-Control": {"max-age=60, Private"}}},
		{"private-field-list", map[string][]string{"Cache-Control": {`private="x-user", max-age=60`}}},
		{"no-cache-field-list", map[string][]string{"Cache-Control": {`no-cache="set-cookie", max-age=60`}}},
		{"must-revalidate", map[string][]string{"Cache-Control": {"max-age=60, must-revalidate"}}},
		{"proxy-revalidate", map[string][]string{"Cache-Control": {"max-age=60, proxy-revalidate"}}},
		{"vary-star-second-line", map[string][]string{"Vary": {"Accept", "*"}}},
		{"vary-star-in-list", map[string][]string{"vary": {"accept, *"}}},
		{"set-cookie-lowercase", map[string][]string{"set-cookie": {"a=b"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &zchOrigin{}
				o.set(zchOK("max-age=60", nil, "good"))
				tr := zchStaleTransport(t, o, 1<<20, time.Hour, false)
				const url = "http://origin.test/n"
				zchDo(t, tr, "GET", url, nil)
				o.set(zch503)
				if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 200 || b != "good" {
					t.Fatalf("control: want served, got %v %q", resp, b)
				}
				o.set(func(*http.Request) (*http.Response, error) {
					h := http.Header{}
					for k, v := range tc.hdr {
						h[k] = v
					}
					return scaResp(200, h, "bad"), nil
				})
				if _, b := zchDo(t, tr, "GET", url, nil); b != "bad" {
					t.Fatalf("got %q", b)
				}
				o.set(zch503)
				resp, b := zchDo(t, tr, "GET", url, nil)
				if resp == nil || resp.StatusCode != 503 {
					t.Fatalf("after an answer that may not be kept: want the 503, got %v %q (stale %q)", resp, b, resp.Header.Get("Stormguard-Stale"))
				}
			})
		})
	}
}

// WithStaleCache: "Never kept: a request with a Range, a request ... with
// Cache-Control no-store"; a request's fields "under any spelling".
func TestAttackCacheHedge5RequestNoStoreRange(t *testing.T) {
	for _, hdr := range []map[string]string{
		{"cache-control": "no-store"},
		{"Cache-Control": "max-age=0, no-store"},
		{"range": "bytes=0-"},
	} {
		synctest.Test(t, func(t *testing.T) {
			o := &zchOrigin{}
			o.set(zchOK("max-age=60", nil, "x"))
			tr := zchStaleTransport(t, o, 1<<20, time.Hour, false)
			const url = "http://origin.test/r"
			zchDo(t, tr, "GET", url, hdr)
			o.set(zch503)
			if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 503 {
				t.Fatalf("%v: response to it was kept: %v %q", hdr, resp, b)
			}
		})
	}
}

// ---- stale cache: credentials ----

// WithStaleCache: "A request carrying credentials (Authorization,
// Proxy-Authorization or Cookie) is neither kept nor served unless
// withCredentials is true; then ... served only to requests with the same
// credentials, and a response marked private is kept only for such a
// request".
func TestAttackCacheHedge5Credentials(t *testing.T) {
	const url = "http://origin.test/me"
	t.Run("off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &zchOrigin{}
			o.set(func(r *http.Request) (*http.Response, error) {
				who := r.Header.Get("Authorization") + r.Header.Get("Cookie") + r.Header.Get("Proxy-Authorization")
				return scaResp(200, http.Header{"Cache-Control": {"max-age=60"}}, "for:"+who), nil
			})
			tr := zchStaleTransport(t, o, 1<<20, time.Hour, false)
			zchDo(t, tr, "GET", url, nil) // anonymous kept
			for _, hdr := range []map[string]string{
				{"authorization": "Bearer alice"},
				{"Cookie": "s=alice"},
				{"proxy-authorization": "Basic x"},
			} {
				zchDo(t, tr, "GET", url, hdr)
				o.set(zch503)
				if resp, b := zchDo(t, tr, "GET", url, hdr); resp == nil || resp.StatusCode != 503 {
					t.Errorf("%v without withCredentials: served %v %q", hdr, resp, b)
				}
				if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 200 || b != "for:" {
					t.Errorf("anonymous after %v: want the anonymous one, got %v %q", hdr, resp, b)
				}
				o.set(func(r *http.Request) (*http.Response, error) {
					who := r.Header.Get("Authorization") + r.Header.Get("Cookie") + r.Header.Get("Proxy-Authorization")
					return scaResp(200, http.Header{"Cache-Control": {"max-age=60"}}, "for:"+who), nil
				})
			}
		})
	})
	t.Run("on", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			o := &zchOrigin{}
			o.set(func(r *http.Request) (*http.Response, error) {
				who := r.Header.Get("Authorization")
				return scaResp(200, http.Header{"Cache-Control": {"private, max-age=60"}}, "for:"+who), nil
			})
			tr := zchStaleTransport(t, o, 1<<20, time.Hour, true)
			zchDo(t, tr, "GET", url, map[string]string{"Authorization": "Bearer alice"})
			zchDo(t, tr, "GET", url, nil) // private to anonymous: never kept
			o.set(zch503)
			if resp, b := zchDo(t, tr, "GET", url, map[string]string{"authorization": "Bearer alice"}); resp == nil || resp.StatusCode != 200 || b != "for:Bearer alice" {
				t.Errorf("alice (lower-case key): want alice's, got %v %q", resp, b)
			}
			for _, hdr := range []map[string]string{
				nil,
				{"Authorization": "Bearer bob"},
				{"Authorization": "Bearer alice", "Cookie": "x=1"},
				{"Proxy-Authorization": "Bearer alice"},
			} {
				if resp, b := zchDo(t, tr, "GET", url, hdr); resp == nil || resp.StatusCode != 503 {
					t.Errorf("%v: another's private response served: %v %q", hdr, resp, b)
				}
			}
		})
	})
}

// ---- stale cache: Vary ----

// WithStaleCache: kept "by the values of the request header fields its
// Vary names (a field the request lacks matches only its absence ...; up
// to 8 variants per URL)"; Vary on several lines and in any case.
func TestAttackCacheHedge5Vary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(func(r *http.Request) (*http.Response, error) {
			h := http.Header{"Cache-Control": {"max-age=60"}, "vary": {"accept"}, "Vary": {"ACCEPT-LANGUAGE , x-tenant"}}
			return scaResp(200, h, "a="+r.Header.Get("Accept")+",l="+r.Header.Get("Accept-Language")+",t="+r.Header.Get("X-Tenant")), nil
		})
		tr := zchStaleTransport(t, o, 1<<20, time.Hour, false)
		const url = "http://origin.test/v"
		zchDo(t, tr, "GET", url, map[string]string{"Accept": "json", "Accept-Language": "en", "X-Tenant": "1"})
		zchDo(t, tr, "GET", url, map[string]string{"Accept": "json", "Accept-Language": "fr", "X-Tenant": "1"})
		o.set(zch503)
		for _, tc := range []struct {
			hdr  map[string]string
			want string // "" for not served
		}{
			{map[string]string{"accept": "json", "accept-language": "en", "x-tenant": "1"}, "a=json,l=en,t=1"},
			{map[string]string{"Accept": "json", "Accept-Language": "fr", "X-Tenant": "1"}, "a=json,l=fr,t=1"},
			{map[string]string{"Accept": "json", "Accept-Language": "de", "X-Tenant": "1"}, ""},
			{map[string]string{"Accept": "json", "Accept-Language": "en"}, ""},
			{map[string]string{"Accept": "json", "Accept-Language": "en", "X-Tenant": "2"}, ""},
			{map[string]string{"Accept": "json", "Accept-Language": "en", "X-Tenant": ""}, ""},
			{nil, ""},
		} {
			resp, b := zchDo(t, tr, "GET", url, tc.hdr)
			switch {
			case resp == nil:
				t.Errorf("%v: %s", tc.hdr, b)
			case tc.want == "" && resp.StatusCode != 503:
				t.Errorf("%v: want not served, got %d %q", tc.hdr, resp.StatusCode, b)
			case tc.want != "" && (resp.StatusCode != 200 || b != tc.want):
				t.Errorf("%v: want %q, got %d %q", tc.hdr, tc.want, resp.StatusCode, b)
			}
		}
	})
}

// ---- stale cache: the byte bound ----

// WithStaleCache: "up to maxBytes in all"; "the least recently used
// responses go first when a new one needs room"; a served response is a
// use.
func TestAttackCacheHedge5LRUManyURLs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bodyLen = 10 << 10
		const maxBytes = 5*bodyLen + 5*1024 // room for 5 with their headers, never 6
		o := &zchOrigin{}
		o.set(func(r *http.Request) (*http.Response, error) {
			return scaResp(200, http.Header{"Cache-Control": {"max-age=60"}}, strings.Repeat(r.URL.Path[1:2], bodyLen)), nil
		})
		tr := zchStaleTransport(t, o, maxBytes, time.Hour, false)
		names := "abcdefghijklmnopqrst"
		for _, c := range names {
			zchDo(t, tr, "GET", "http://origin.test/"+string(c), nil)
		}
		serve := func(c byte) bool {
			o.set(zch503)
			resp, b := zchDo(t, tr, "GET", "http://origin.test/"+string(c), nil)
			if resp != nil && resp.StatusCode == 200 {
				if b != strings.Repeat(string(c), bodyLen) {
					t.Fatalf("%c: wrong body served (%d bytes)", c, len(b))
				}
				return true
			}
			return false
		}
		var got []byte
		for i := range len(names) {
			if serve(names[i]) {
				got = append(got, names[i])
			}
		}
		if string(got) != "pqrst" {
			t.Fatalf("served after 20 URLs into room for 5: %q, want %q", got, "pqrst")
		}
		// p is the least recently used now? No: serving touched them in
		// order p..t; p is the oldest use. Use p again, add a new URL: q
		// must go, not p.
		serve('p')
		o.set(func(r *http.Request) (*http.Response, error) {
			return scaResp(200, http.Header{"Cache-Control": {"max-age=60"}}, strings.Repeat(r.URL.Path[1:2], bodyLen)), nil
		})
		zchDo(t, tr, "GET", "http://origin.test/u", nil)
		got = got[:0]
		for _, c := range []byte("pqrstu") {
			if serve(c) {
				got = append(got, c)
			}
		}
		if string(got) != "prstu" {
			t.Fatalf("after using p and adding u: served %q, want %q", got, "prstu")
		}
	})
}

// WithStaleCache: "A later answer to the same request that is not kept
// (... a body larger than the bound ...) drops the kept one"; "a larger
// body is passed through whole and not kept".
func TestAttackCacheHedge5LargerBodyDrops(t *testing.T) {
	for _, chunked := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			o := &zchOrigin{}
			o.set(zchOK("max-age=60", nil, "small"))
			tr := zchStaleTransport(t, o, 4096, time.Hour, false)
			const url = "http://origin.test/big"
			zchDo(t, tr, "GET", url, nil)
			big := strings.Repeat("B", 10000)
			o.set(func(*http.Request) (*http.Response, error) {
				r := scaResp(200, http.Header{"Cache-Control": {"max-age=60"}}, big)
				if chunked {
					r.ContentLength = -1
				}
				return r, nil
			})
			if _, b := zchDo(t, tr, "GET", url, nil); b != big {
				t.Fatalf("chunked=%v: larger body not passed whole: %d bytes", chunked, len(b))
			}
			o.set(zch503)
			if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 503 {
				t.Fatalf("chunked=%v: after a larger answer the old one was served: %v %q", chunked, resp, b)
			}
		})
	}
}

// WithStaleCache: "(the methods are kept apart)"; "A HEAD response ... is
// kept at once"; served HEAD has no body.
func TestAttackCacheHedge5HeadVsGet(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(func(r *http.Request) (*http.Response, error) {
			resp := scaResp(200, http.Header{"Cache-Control": {"max-age=60"}, "X-M": {r.Method}}, "body-"+r.Method)
			if r.Method == "HEAD" {
				resp.Body = http.NoBody
				resp.ContentLength = 8
			}
			return resp, nil
		})
		tr := zchStaleTransport(t, o, 1<<20, time.Hour, false)
		const url = "http://origin.test/h"
		req, _ := http.NewRequest("HEAD", url, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		o.set(zch503)
		if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 503 {
			t.Fatalf("GET served from a HEAD: %v %q", resp, b)
		}
		resp, b := zchDo(t, tr, "HEAD", url, nil)
		if resp == nil || resp.StatusCode != 200 || b != "" || resp.Header.Get("X-M") != "HEAD" || resp.ContentLength != 8 {
			t.Fatalf("HEAD: want the kept HEAD, got %v %q", resp, b)
		}
		o.set(func(r *http.Request) (*http.Response, error) {
			return scaResp(200, http.Header{"Cache-Control": {"max-age=60"}, "X-M": {r.Method}}, "body-"+r.Method), nil
		})
		zchDo(t, tr, "GET", url, nil)
		o.set(func(*http.Request) (*http.Response, error) { return scaResp(404, nil, "gone"), nil })
		zchDo(t, tr, "HEAD", url, nil) // a 404 to HEAD drops the HEAD only
		o.set(zch503)
		if resp, b := zchDo(t, tr, "GET", url, nil); resp == nil || resp.StatusCode != 200 || b != "body-GET" {
			t.Fatalf("GET after HEAD's 404: want kept GET, got %v %q", resp, b)
		}
		if resp, b := zchDo(t, tr, "HEAD", url, nil); resp == nil || resp.StatusCode != 503 {
			t.Fatalf("HEAD after its 404: want 503, got %v %q", resp, b)
		}
	})
}

// ---- stale cache: concurrent use, loopback, -race ----

// WithStaleCache: "The cache is safe for concurrent use"; a served
// response is the kept one for that URL (never another's), bound held.
func TestAttackCacheHedge5ConcurrentLoopback(t *testing.T) {
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() && rand.Intn(4) != 0 {
			w.WriteHeader(503)
			return
		}
		w.Header().Set("Cache-Control", "max-age=1, stale-if-error=600")
		w.Header().Set("Vary", "X-V")
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		_, _ = io.WriteString(w, strings.Repeat(r.URL.RawQuery+"|"+r.Header.Get("X-V")+";", 1+n%50))
	}))
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 16}
	defer base.CloseIdleConnections()
	tr := zchStaleTransport(t, base, 64<<10, 0, false)
	var wg sync.WaitGroup
	var served, bad atomic.Int64
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewSource(int64(g)))
			for i := range 150 {
				if g == 0 && i == 50 {
					down.Store(true)
				}
				n := rnd.Intn(40)
				v := strconv.Itoa(rnd.Intn(3))
				method := "GET"
				if rnd.Intn(5) == 0 {
					method = "HEAD"
				}
				req, _ := http.NewRequest(method, srv.URL+"/x?n="+strconv.Itoa(n), nil)
				req.Header.Set("X-V", v)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != 200 {
					continue
				}
				if resp.Header.Get("Stormguard-Stale") != "" {
					served.Add(1)
				}
				if method == "GET" {
					want := strings.Repeat("n="+strconv.Itoa(n)+"|"+v+";", 1+n%50)
					if string(b) != want {
						bad.Add(1)
					}
				} else if len(b) != 0 {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if bad.Load() != 0 {
		t.Fatalf("%d answers with another request's body", bad.Load())
	}
	t.Logf("served stale: %d", served.Load())
}

// ---- hedging ----

// zchHedgeTransport: hedging with a fixed delay, no stale cache.
func zchHedgeTransport(t *testing.T, base http.RoundTripper, delay time.Duration, max int, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	all := append([]httpretry.Option{
		httpretry.WithRetry(retry.WithBackoff(zchBackoff(t)), retry.WithMaxAttempts(3)),
		httpretry.WithHedging(delay, 0.95, max),
	}, opts...)
	tr, err := httpretry.NewTransport(base, all...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr
}

// zchSlow answers each request after lat(r), or fails with its context's
// error if canceled first (as http.Transport does).
func zchSlow(lat func(r *http.Request) time.Duration, code int, body func(r *http.Request) string) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		select {
		case <-time.After(lat(r)):
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
		return scaResp(code, http.Header{}, body(r)), nil
	}
}

func zchAttempt(r *http.Request) string { return r.Header.Get(wire.AttemptHeader) }

// WithHedging: "the first good answer ... winning and the others canceled,
// their bodies closed", those that answer after the winner included
// (docs/hedging.md); "each hedge is one withdrawal".
func TestAttackCacheHedge5LosersCanceledClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		var firstErr atomic.Value
		o.set(func(r *http.Request) (*http.Response, error) {
			if zchAttempt(r) == "" { // the first copy: slow, honours its context
				select {
				case <-time.After(time.Second):
					return scaResp(200, nil, "first"), nil
				case <-r.Context().Done():
					firstErr.Store(r.Context().Err())
					return nil, r.Context().Err()
				}
			}
			time.Sleep(10 * time.Millisecond)
			return scaResp(200, nil, "hedge"+zchAttempt(r)), nil
		})
		tr := zchHedgeTransport(t, o, 50*time.Millisecond, 1)
		start := time.Now()
		resp, body := zchDo(t, tr, "GET", "http://h.test/x", nil)
		if resp == nil || body != "hedge2" {
			t.Fatalf("want the hedge's answer, got %v %q", resp, body)
		}
		if el := time.Since(start); el != 60*time.Millisecond {
			t.Errorf("answered after %v, want 60ms", el)
		}
		synctest.Wait()
		if e, _ := firstErr.Load().(error); !errors.Is(e, context.Canceled) {
			t.Errorf("first copy's context: %v, want canceled", e)
		}
		st := tr.Hosts()["h.test"].Budget.(*budget.Budget).Stats()
		if st.Retries != 1 {
			t.Errorf("budget withdrawals = %d, want 1 (the hedge)", st.Retries)
		}

		// Losers that ignore their context and answer good after the
		// winner: their bodies are closed.
		o.set(func(r *http.Request) (*http.Response, error) {
			lat := 100 * time.Millisecond
			if zchAttempt(r) != "" {
				lat = 70 * time.Millisecond // hedge at 50 ms answers at 120 ms: loses
			}
			time.Sleep(lat)
			return scaResp(200, nil, "leg"+zchAttempt(r)), nil
		})
		o.opened.Store(0)
		o.closed.Store(0)
		tr2 := zchHedgeTransport(t, o, 50*time.Millisecond, 3)
		resp, body = zchDo(t, tr2, "GET", "http://h2.test/x", nil)
		if resp == nil || body != "leg" {
			t.Fatalf("want the first copy's answer, got %v %q", resp, body)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if op, cl := o.opened.Load(), o.closed.Load(); op != cl || op < 2 {
			t.Errorf("bodies opened %d, closed %d", op, cl)
		}
	})
}

// WithHedging: "A write is never hedged" ("keyed or not"); "a GET, HEAD or
// OPTIONS request without a body".
func TestAttackCacheHedge5OnlySafeMethods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(zchSlow(func(*http.Request) time.Duration { return 200 * time.Millisecond }, 200, func(*http.Request) string { return "ok" }))
		tr := zchHedgeTransport(t, o, 20*time.Millisecond, 2)
		for _, tc := range []struct {
			method string
			hdr    map[string]string
			body   string
			want   int
		}{
			{"PUT", nil, "", 1},
			{"DELETE", nil, "", 1},
			{"POST", map[string]string{"Idempotency-Key": "k1"}, "x", 1},
			{"PATCH", map[string]string{"Idempotency-Key": "k2"}, "", 1},
			{"TRACE", nil, "", 1},
			{"GET", nil, "with-body", 1},
			{"GET", nil, "", 3},
			{"HEAD", nil, "", 3},
			{"OPTIONS", nil, "", 3},
		} {
			o.reset()
			var rb io.Reader
			if tc.body != "" {
				rb = strings.NewReader(tc.body)
			}
			req, _ := http.NewRequest(tc.method, "http://safe.test/"+tc.method, rb)
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", tc.method, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			synctest.Wait()
			if n := len(o.sent()); n != tc.want {
				t.Errorf("%s (body %q): %d sends, want %d", tc.method, tc.body, n, tc.want)
			}
		}
	})
}

// WithHedging: "Each hedge is an attempt on the wire: it carries the next
// wire.AttemptHeader number"; "The retry loop counts the race as one
// attempt with the winner's answer; a retry after it carries the wire
// number after the hedges'."
func TestAttackCacheHedge5Numbers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		var calls atomic.Int64
		o.set(func(r *http.Request) (*http.Response, error) {
			calls.Add(1)
			a := zchAttempt(r)
			switch a {
			case "", "2": // attempt 1's race: both fail (502, no push-back)
				time.Sleep(100 * time.Millisecond)
				return scaResp(502, nil, "bad"), nil
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return scaResp(200, nil, "ok"+a), nil
		})
		tr := zchHedgeTransport(t, o, 50*time.Millisecond, 1, httpretry.WithBreaker(nil))
		resp, body := zchDo(t, tr, "GET", "http://num.test/x", nil)
		time.Sleep(time.Second)
		synctest.Wait()
		var got []string
		for _, r := range o.sent() {
			got = append(got, zchAttempt(r))
		}
		if resp == nil || body != "ok3" {
			t.Errorf("want the retry's first copy (attempt 3) to win, got %v %q; attempts %q", resp, body, got)
		}
		if strings.Join(got, ",") != ",2,3,4" {
			t.Errorf("wire attempts %q, want [\"\" 2 3 4]", got)
		}
	})
}

// WithHedging: no hedge while "the host has not pushed back in the last 5
// s (a 429 or a 503, or any failed answer, a 408, 500, 502 or 504, with a
// positive Retry-After or a don't-retry mark; a longer Retry-After holds
// for as long)"; "Every request gets the state, hedged or not: its host's
// push-back holds the hedges of the others (a 503 to a POST too)".
func TestAttackCacheHedge5Pushback(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		code   int
		hdr    http.Header
		hold   time.Duration // 0: no hold
	}{
		{"503-post", "POST", 503, nil, 5 * time.Second},
		{"429-get", "GET", 429, nil, 5 * time.Second},
		{"502-retry-after-1", "GET", 502, http.Header{"Retry-After": {"1"}}, 5 * time.Second},
		{"504-dont-retry", "GET", 504, http.Header{"Stormguard-Retry": {"no"}}, 5 * time.Second},
		{"500-retry-after-30", "GET", 500, http.Header{"Retry-After": {"30"}}, 30 * time.Second},
		{"429-retry-after-date", "GET", 429, nil, 20 * time.Second},
		{"502-plain", "GET", 502, nil, 0},
		{"408-retry-after-0", "GET", 408, http.Header{"Retry-After": {"0"}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &zchOrigin{}
				tr := zchHedgeTransport(t, o, 20*time.Millisecond, 1,
					httpretry.WithRetry(retry.WithMaxAttempts(1)), httpretry.WithBreaker(nil))
				o.set(func(*http.Request) (*http.Response, error) {
					h := tc.hdr.Clone()
					if h == nil {
						h = http.Header{}
					}
					if tc.name == "429-retry-after-date" {
						h["Retry-After"] = []string{zchDate(time.Now().Add(20 * time.Second))}
					}
					return scaResp(tc.code, h, "push"), nil
				})
				zchDo(t, tr, tc.method, "http://pb.test/x", nil)
				o.set(zchSlow(func(*http.Request) time.Duration { return 100 * time.Millisecond }, 200, func(*http.Request) string { return "ok" }))
				probe := func() int {
					o.reset()
					zchDo(t, tr, "GET", "http://pb.test/y", nil)
					synctest.Wait()
					return len(o.sent())
				}
				if tc.hold == 0 {
					if n := probe(); n != 2 {
						t.Fatalf("no push-back: %d sends, want a hedge", n)
					}
					return
				}
				time.Sleep(tc.hold - 500*time.Millisecond)
				if n := probe(); n != 1 {
					t.Errorf("%v after the push-back: %d sends, want no hedge", tc.hold-500*time.Millisecond, n)
				}
				time.Sleep(time.Second)
				if n := probe(); n != 2 {
					t.Errorf("%v after the push-back: %d sends, want a hedge", tc.hold+500*time.Millisecond, n)
				}
			})
		})
	}
}

// WithHedging: a hedge only when "its breaker is closed".
func TestAttackCacheHedge5BreakerNotClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		tr := zchHedgeTransport(t, o, 20*time.Millisecond, 1,
			httpretry.WithRetry(retry.WithMaxAttempts(1)),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second, Probes: 1}),
			httpretry.WithTimeout(30*time.Second))
		o.set(func(*http.Request) (*http.Response, error) { return nil, errors.New("reset") })
		zchDo(t, tr, "POST", "http://br.test/x", nil) // trips the breaker, no push-back
		if s := tr.Hosts()["br.test"].Breaker.Snapshot().State; s != breaker.Open {
			t.Fatalf("breaker %v, want open", s)
		}
		o.set(zchSlow(func(*http.Request) time.Duration { return 100 * time.Millisecond }, 200, func(*http.Request) string { return "ok" }))
		o.reset()
		resp, b := zchDo(t, tr, "GET", "http://br.test/y", nil) // waits for the probe round
		synctest.Wait()
		if resp == nil || b != "ok" {
			t.Fatalf("got %v %q", resp, b)
		}
		if n := len(o.sent()); n != 1 {
			t.Errorf("the breaker's probe was hedged: %d sends", n)
		}
	})
}

// WithHedging: "A hedge is only sent when the host's retry budget grants
// it (each hedge is one withdrawal: no budget, no hedge)".
func TestAttackCacheHedge5NoBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(zchSlow(func(*http.Request) time.Duration { return 100 * time.Millisecond }, 200, func(*http.Request) string { return "ok" }))
		for _, opt := range []httpretry.Option{
			httpretry.WithBudget(nil),
			httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: -1}),
		} {
			tr := zchHedgeTransport(t, o, 20*time.Millisecond, 2, opt)
			o.reset()
			zchDo(t, tr, "GET", "http://nb.test/x", nil)
			synctest.Wait()
			if n := len(o.sent()); n != 1 {
				t.Errorf("no budget: %d sends", n)
			}
		}
		// A budget of exactly 3 (floor of 0.3/s over 10 s): 3 hedges, then none.
		tr := zchHedgeTransport(t, o, 20*time.Millisecond, 1, httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: 0.3}))
		total := 0
		for range 6 {
			o.reset()
			zchDo(t, tr, "GET", "http://nb2.test/x", nil)
			synctest.Wait()
			total += len(o.sent())
		}
		if total != 6+3 {
			t.Errorf("6 requests with a budget of 3 hedges: %d sends, want 9", total)
		}
	})
}

// Hedging with the stale cache: a hedge's winning answer is kept (it is
// the answer handed back), and a race that fails everywhere gives up to
// the kept response, its Stormguard-Stale counting the race as one
// attempt.
func TestAttackCacheHedge5WithStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(func(r *http.Request) (*http.Response, error) {
			lat := 200 * time.Millisecond
			if zchAttempt(r) != "" {
				lat = 10 * time.Millisecond
			}
			select {
			case <-time.After(lat):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return scaResp(200, http.Header{"Cache-Control": {"max-age=60"}}, "v"+zchAttempt(r)), nil
		})
		tr := zchHedgeTransport(t, o, 50*time.Millisecond, 1,
			httpretry.WithStaleCache(1<<20, time.Hour, false), httpretry.WithRetry(retry.WithMaxAttempts(2)), httpretry.WithBreaker(nil))
		if _, b := zchDo(t, tr, "GET", "http://hs.test/x", nil); b != "v2" {
			t.Fatalf("want the hedge's answer, got %q", b)
		}
		o.set(func(*http.Request) (*http.Response, error) {
			time.Sleep(100 * time.Millisecond)
			return scaResp(502, nil, "bad"), nil
		})
		synctest.Wait()
		resp, b := zchDo(t, tr, "GET", "http://hs.test/x", nil)
		if resp == nil || resp.StatusCode != 200 || b != "v2" {
			t.Fatalf("want the hedge's kept answer, got %v %q", resp, b)
		}
		if s := resp.Header.Get("Stormguard-Stale"); !strings.HasPrefix(s, "attempts-exhausted;attempts=2") {
			t.Errorf("Stormguard-Stale = %q", s)
		}
	})
}

// zchObs records the events of hedges and attempts.
type zchObs struct {
	mu sync.Mutex
	ev []observe.Event
}

func (o *zchObs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.ev = append(o.ev, e)
	o.mu.Unlock()
}

func (o *zchObs) ends(hedge bool) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []string
	for _, e := range o.ev {
		if e.Kind == observe.AttemptEnd && e.Hedge == hedge {
			out = append(out, fmt.Sprintf("%d:%s", e.Attempt, e.Outcome))
		}
	}
	return out
}

// WithHedging: "an observer hears its own AttemptStart and AttemptEnd
// (Event.Hedge set; a canceled loser ends with Outcome "canceled")";
// observe.Event.Hedge: "A hedge that lost the race ends with Outcome
// "canceled"". A hedge whose good answer wins the race after the first
// copy failed did not lose: its end is a success.
func TestAttackCacheHedge5WinnerAfterFirstFailsObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &zchOrigin{}
		o.set(func(r *http.Request) (*http.Response, error) {
			if zchAttempt(r) == "" { // the first copy fails at 100 ms (a 502, no push-back)
				time.Sleep(100 * time.Millisecond)
				return scaResp(502, nil, "bad"), nil
			}
			time.Sleep(100 * time.Millisecond) // the hedge, sent at 50 ms, answers at 150 ms
			return scaResp(200, nil, "hedge"), nil
		})
		obs := &zchObs{}
		tr := zchHedgeTransport(t, o, 50*time.Millisecond, 1, httpretry.WithObserver(obs), httpretry.WithBreaker(nil))
		resp, b := zchDo(t, tr, "GET", "http://obs.test/x", nil)
		synctest.Wait()
		if resp == nil || b != "hedge" {
			t.Fatalf("want the hedge's answer, got %v %q", resp, b)
		}
		if n := len(o.sent()); n != 2 {
			t.Fatalf("%d sends, want 2", n)
		}
		if got := obs.ends(false); strings.Join(got, ",") != "1:success" {
			t.Errorf("the loop's attempt ends: %q, want [1:success]", got)
		}
		if got := obs.ends(true); strings.Join(got, ",") != "2:success" {
			t.Errorf("the winning hedge's end: %q, want [2:success] (it won the race: the caller got its answer)", got)
		}
	})
}

// WithHedging: no hedge while "the host has not pushed back in the last 5
// s (a 429 or a 503 ...)", whichever copy of a race got it: the first copy
// that failed before a hedge won, and a first copy whose 503 came back
// after the hedge had won (it answered before it saw its cancel).
func TestAttackCacheHedge5RacePushback(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("first-after-win=%v", late), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &zchOrigin{}
				o.set(func(r *http.Request) (*http.Response, error) {
					if zchAttempt(r) == "" {
						d := 100 * time.Millisecond
						if late {
							d = 300 * time.Millisecond // ignores its cancel
						}
						time.Sleep(d)
						return scaResp(503, nil, "busy"), nil
					}
					time.Sleep(100 * time.Millisecond)
					return scaResp(200, nil, "hedge"), nil
				})
				tr := zchHedgeTransport(t, o, 50*time.Millisecond, 1, httpretry.WithBreaker(nil))
				if _, b := zchDo(t, tr, "GET", "http://rp.test/x", nil); b != "hedge" {
					t.Fatalf("got %q", b)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				o.set(zchSlow(func(*http.Request) time.Duration { return 100 * time.Millisecond }, 200, func(*http.Request) string { return "ok" }))
				o.reset()
				zchDo(t, tr, "GET", "http://rp.test/y", nil)
				synctest.Wait()
				if n := len(o.sent()); n != 1 {
					t.Errorf("a 503 from the race's first copy 1 s ago: %d sends, want no hedge", n)
				}
			})
		})
	}
}
