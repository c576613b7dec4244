// Black-box attack (AREA hedgecache2) on WithHedging, WithStaleCache and
// WithFallback, against go doc, doc.go, docs/hedging.md and
// docs/stale-cache.md.
package httpretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// hc2Origin is an in-memory base: answer decides each response; down makes
// every request a 503 (with an optional delay).
type hc2Origin struct {
	mu     sync.Mutex
	down   atomic.Bool
	sends  atomic.Int64
	answer func(r *http.Request) (time.Duration, *http.Response)
	times  []time.Time
}

func (o *hc2Origin) RoundTrip(r *http.Request) (*http.Response, error) {
	o.sends.Add(1)
	o.mu.Lock()
	o.times = append(o.times, time.Now())
	a := o.answer
	o.mu.Unlock()
	if o.down.Load() {
		return hc2Resp(503, nil, "down", r), nil
	}
	d, resp := a(r)
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	resp.Request = r
	return resp, nil
}

func hc2Resp(code int, h http.Header, body string, r *http.Request) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h,
		ContentLength: int64(len(body)), Body: io.NopCloser(strings.NewReader(body)), Request: r,
	}
}

func hc2Transport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	tr, err := httpretry.NewTransport(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func hc2Get(t *testing.T, tr http.RoundTripper, url string, h http.Header) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, "ERR: " + err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	return resp, string(b)
}

// DOC (WithStaleCache): "answers decide in the order they arrived, not in
// the order their bodies are read to the end (an earlier one read last
// does not replace a later one)." Two answers to the same request (same
// URL, same Accept): the earlier one says Vary: Accept and its body is
// read last; the later one has no Vary. The later answer must be what an
// outage serves.
func TestAttackHC2StaleOrderAcrossVaryChange(t *testing.T) {
	for _, tc := range []struct {
		name         string
		varyA, varyB string
	}{
		{"earlier-varies", "Accept", ""},
		{"later-varies", "", "Accept"},
		{"vary-differs", "Accept", "Accept, Accept-Language"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var n atomic.Int64
				o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
					v := n.Add(1)
					h := http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}
					vary := tc.varyA
					if v > 1 {
						vary = tc.varyB
					}
					if vary != "" {
						h.Set("Vary", vary)
					}
					return 0, hc2Resp(200, h, fmt.Sprintf("v%d", v), r)
				}}
				tr := hc2Transport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
				hdr := http.Header{"Accept": {"text/plain"}, "Accept-Language": {"en"}}
				reqA, _ := http.NewRequest("GET", "http://hc2-api.test/item", nil)
				reqA.Header = hdr.Clone()
				respA, err := tr.RoundTrip(reqA) // v1: body read later
				if err != nil {
					t.Fatal(err)
				}
				if _, b := hc2Get(t, tr, "http://hc2-api.test/item", hdr); b != "v2" { // v2: read at once
					t.Fatalf("second GET %q", b)
				}
				b, _ := io.ReadAll(respA.Body)
				_ = respA.Body.Close()
				if string(b) != "v1" {
					t.Fatalf("first body %q", b)
				}
				o.down.Store(true)
				resp, body := hc2Get(t, tr, "http://hc2-api.test/item", hdr)
				if resp == nil || resp.Header.Get("Stormguard-Stale") == "" {
					t.Fatalf("outage GET not served from cache: %q", body)
				}
				if body != "v2" {
					t.Errorf("outage served %q (the earlier answer, read last), want v2 (the later answer)", body)
				}
			})
		})
	}
}

// DOC (WithStaleCache): "A later answer to the same request that is not
// kept (a 404, a no-store, ...) drops the kept one". The kept response said
// Vary: Accept; a later 404 to the same request (no Vary) must drop it.
func TestAttackHC2StaleDropAcrossVary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			if n.Add(1) == 1 {
				h := http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}, "Vary": {"Accept"}}
				return 0, hc2Resp(200, h, "v1", r)
			}
			return 0, hc2Resp(404, nil, "gone", r)
		}}
		tr := hc2Transport(t, o, httpretry.WithStaleCache(1<<20, 0, false))
		hdr := http.Header{"Accept": {"text/plain"}}
		hc2Get(t, tr, "http://hc2-api.test/x", hdr)
		if resp, _ := hc2Get(t, tr, "http://hc2-api.test/x", hdr); resp.StatusCode != 404 {
			t.Fatalf("second: %d", resp.StatusCode)
		}
		o.down.Store(true)
		resp, body := hc2Get(t, tr, "http://hc2-api.test/x", hdr)
		if resp != nil && resp.Header.Get("Stormguard-Stale") != "" {
			t.Errorf("served %q after a 404 to the same request", body)
		}
	})
}

// DOC (WithHedging): "delay = 0 learns the delay per host: the quantile q
// of the time to a good answer of the host's recent requests". With answers
// 3/4 at 10 ms and 1/4 at 40 ms (by path), q = 0.5 must hedge near 10 ms, q = 0.9 near
// 40 ms.
func TestAttackHC2HedgeLearnedQuantile(t *testing.T) {
	for _, tc := range []struct {
		q        float64
		min, max time.Duration
	}{
		{0.5, 9 * time.Millisecond, 12 * time.Millisecond},
		{0.9, 39 * time.Millisecond, 45 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(tc.q), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var slow atomic.Bool
				o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
					d := 10 * time.Millisecond
					if r.URL.Path == "/mid" {
						d = 40 * time.Millisecond
					}
					if slow.Load() && r.Header.Get("Stormguard-Attempt") == "" {
						d = time.Second
					}
					return d, hc2Resp(200, nil, "ok", r)
				}}
				tr := hc2Transport(t, o, httpretry.WithHedging(0, tc.q, 1))
				for k := 0; k < 40; k++ {
					// 40 answers, one every 200 ms: few enough a second
					// that the due-share bound holds nothing.
					path := "/fast"
					if k%4 == 3 {
						path = "/mid"
					}
					hc2Get(t, tr, "http://hc2-q.test"+path, nil)
					time.Sleep(200 * time.Millisecond)
				}
				slow.Store(true)
				o.mu.Lock()
				o.times = nil
				o.mu.Unlock()
				start := time.Now()
				hc2Get(t, tr, "http://hc2-q.test/", nil)
				o.mu.Lock()
				times := append([]time.Time(nil), o.times...)
				o.mu.Unlock()
				if len(times) < 2 {
					t.Fatalf("q=%v: no hedge (%d sends)", tc.q, len(times))
				}
				d := times[1].Sub(start)
				t.Logf("q=%v: hedge after %v", tc.q, d)
				if d < tc.min || d > tc.max {
					t.Errorf("q=%v: hedge after %v, want in [%v, %v]", tc.q, d, tc.min, tc.max)
				}
			})
		})
	}
}

// DOC (WithHedging): "sends up to max hedges": with max = 3 and every copy
// hanging, exactly 3 hedges go, delay apart.
func TestAttackHC2HedgeAtMostMax(t *testing.T) {
	for _, max := range []int{2, 3, 8} {
		t.Run(fmt.Sprint(max), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
					return time.Second, hc2Resp(200, nil, "ok", r)
				}}
				tr2 := hc2Transport(t, o, httpretry.WithHedging(10*time.Millisecond, 0, max))
				start := time.Now()
				hc2Get(t, tr2, "http://hc2-max.test/", nil)
				o.mu.Lock()
				times := append([]time.Time(nil), o.times...)
				o.mu.Unlock()
				if len(times) != max+1 {
					t.Errorf("max=%d: %d sends, want %d", max, len(times), max+1)
				}
				for k, tm := range times {
					t.Logf("send %d at %v", k, tm.Sub(start))
				}
			})
		})
	}
}

// DOC (WithFallback): "fallback's response or error is returned instead
// ... A request that was not retryable (a 404, a POST without a key) or
// whose context was canceled gets no fallback. With WithStaleCache, a
// request the cache can answer gets the cached response and the fallback
// is not called."
func TestAttackHC2FallbackAndStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		fb := httpretry.WithFallback(func(req *http.Request, err *retry.Error) (*http.Response, error) {
			calls.Add(1)
			return hc2Resp(200, http.Header{"X-Fallback": {"1"}}, "fallback", req), nil
		})
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			return 0, hc2Resp(200, http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}, "good", r)
		}}
		tr := hc2Transport(t, o, httpretry.WithStaleCache(1<<20, 0, false), fb)
		hc2Get(t, tr, "http://hc2-fb.test/a", nil)
		o.down.Store(true)
		resp, body := hc2Get(t, tr, "http://hc2-fb.test/a", nil)
		if body != "good" || resp.Header.Get("Stormguard-Stale") == "" || calls.Load() != 0 {
			t.Errorf("cached URL: %q stale=%q fallback calls %d", body, resp.Header.Get("Stormguard-Stale"), calls.Load())
		}
		_, body = hc2Get(t, tr, "http://hc2-fb.test/b", nil)
		if body != "fallback" || calls.Load() != 1 {
			t.Errorf("uncached URL: %q, fallback calls %d", body, calls.Load())
		}
	})
}

var _ = context.Background

// DOC (package): "a Retry-After on 429, 503 and an in-progress 409 ... is a
// floor" on the next sleep; docs/hedging.md: "if every copy fails, the
// retry loop gets the last failure and retries as usual". A race whose
// first copy gets 503 Retry-After: 2 while its hedge is in flight, the
// hedge then failing with a 502 without one: the host said "not before 2
// s"; does the next attempt respect it?
func TestAttackHC2HedgeRetryAfterLostToLaterFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var i atomic.Int64
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			switch i.Add(1) {
			case 1: // first copy: 503 with Retry-After at 30 ms
				return 30 * time.Millisecond, hc2Resp(503, http.Header{"Retry-After": {"2"}}, "busy", r)
			case 2: // hedge (sent at 10 ms): 502 at 40 ms
				return 30 * time.Millisecond, hc2Resp(502, nil, "bad gateway", r)
			default:
				return 0, hc2Resp(200, nil, "ok", r)
			}
		}}
		tr := hc2Transport(t, o, httpretry.WithHedging(10*time.Millisecond, 0, 1))
		start := time.Now()
		resp, body := hc2Get(t, tr, "http://hc2-ra.test/", nil)
		o.mu.Lock()
		times := append([]time.Time(nil), o.times...)
		o.mu.Unlock()
		for k, tm := range times {
			t.Logf("send %d at %v", k, tm.Sub(start))
		}
		t.Logf("got %v %q", resp != nil && resp.StatusCode == 200, body)
		if len(times) >= 3 {
			if d := times[2].Sub(times[0].Add(30 * time.Millisecond)); d < 2*time.Second {
				t.Errorf("retry sent %v after the 503 that said Retry-After: 2", d)
			}
		}
	})
}

// DOC (WithStaleCache): keeps "the last good response of cacheable GET"; a
// hedge that wins is the call's answer (docs/hedging.md), so it is kept and
// served in the outage.
func TestAttackHC2StaleKeepsHedgeWinner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var i atomic.Int64
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			h := http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}}
			if i.Add(1) == 1 {
				return time.Second, hc2Resp(200, h, "first-copy", r)
			}
			return 5 * time.Millisecond, hc2Resp(200, h, "hedge", r)
		}}
		tr := hc2Transport(t, o, httpretry.WithHedging(10*time.Millisecond, 0, 1), httpretry.WithStaleCache(1<<20, 0, false))
		if _, b := hc2Get(t, tr, "http://hc2-hw.test/", nil); b != "hedge" {
			t.Fatalf("race: %q", b)
		}
		time.Sleep(2 * time.Second)
		o.down.Store(true)
		resp, b := hc2Get(t, tr, "http://hc2-hw.test/", nil)
		if resp == nil || b != "hedge" || resp.Header.Get("Stormguard-Stale") == "" {
			t.Errorf("outage: %q", b)
		}
	})
}

// DOC (WithStaleCache): "The cache is safe for concurrent use". Many
// goroutines read, close early, and get served while the origin flaps
// (run with -race).
func TestAttackHC2StaleConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			v := n.Add(1)
			h := http.Header{"Cache-Control": {"max-age=0, stale-if-error=600"}, "Vary": {"Accept"}}
			return time.Millisecond, hc2Resp(200, h, strings.Repeat("x", int(v%50)+1), r)
		}}
		tr := hc2Transport(t, o, httpretry.WithStaleCache(2000, 0, false), httpretry.WithHedging(0, 0, 1), httpretry.WithBreaker(nil))
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 60; k++ {
					if g == 0 && k%20 == 10 {
						o.down.Store(!o.down.Load())
					}
					req, _ := http.NewRequest("GET", fmt.Sprintf("http://hc2-cc.test/%d", k%7), nil)
					req.Header.Set("Accept", fmt.Sprint(g%3))
					resp, err := tr.RoundTrip(req)
					if err != nil {
						continue
					}
					switch k % 3 {
					case 0:
						_, _ = io.ReadAll(resp.Body)
					case 1:
						_, _ = io.ReadFull(resp.Body, make([]byte, 3))
					}
					_ = resp.Body.Close()
				}
			}()
		}
		wg.Wait()
	})
}

// DOC (wire.GiveUpHeader): "after how many attempts and, when known, in how
// many whole seconds the server may be tried again". One attempt, hedged:
// the first copy's 503 says Retry-After: 2, the hedge then fails with a
// 502; the give-up handed back should say retry-after=2 (it is known).
func TestAttackHC2HedgeGiveUpDropsRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var i atomic.Int64
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			if i.Add(1) == 1 {
				return 30 * time.Millisecond, hc2Resp(503, http.Header{"Retry-After": {"2"}}, "busy", r)
			}
			return 30 * time.Millisecond, hc2Resp(502, nil, "bad gateway", r)
		}}
		tr := hc2Transport(t, o, httpretry.WithHedging(10*time.Millisecond, 0, 1), httpretry.WithRetry(retry.WithMaxAttempts(1)))
		resp, body := hc2Get(t, tr, "http://hc2-gu.test/", nil)
		if resp == nil {
			t.Fatalf("no response: %s", body)
		}
		gu := resp.Header.Get("Stormguard-Gave-Up")
		t.Logf("sends %d, status %d, Gave-Up %q, Retry-After %q", o.sends.Load(), resp.StatusCode, gu, resp.Header.Get("Retry-After"))
		if !strings.Contains(gu, "retry-after=2") {
			t.Errorf("give-up %q (status %d) does not carry the 503's Retry-After: 2", gu, resp.StatusCode)
		}
	})
}

// DOC (WithStaleCache): with withCredentials, "its response is kept under a
// SHA-256 of its credentials and served only to requests with the same
// credentials, and a response marked private is kept only for such a
// request"; "up to 8 variants per URL".
func TestAttackHC2StaleCredentialsAndVariants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &hc2Origin{answer: func(r *http.Request) (time.Duration, *http.Response) {
			h := http.Header{"Cache-Control": {"private, max-age=0, stale-if-error=600"}}
			return 0, hc2Resp(200, h, "for:"+r.Header.Get("Cookie")+r.Header.Get("Authorization"), r)
		}}
		tr := hc2Transport(t, o, httpretry.WithStaleCache(1<<20, 0, true))
		for k := 0; k < 9; k++ {
			hc2Get(t, tr, "http://hc2-cr.test/", http.Header{"Cookie": {fmt.Sprintf("s=%d", k)}})
		}
		hc2Get(t, tr, "http://hc2-cr.test/", nil) // private without credentials: not kept
		o.down.Store(true)
		for k := 0; k < 9; k++ {
			resp, b := hc2Get(t, tr, "http://hc2-cr.test/", http.Header{"Cookie": {fmt.Sprintf("s=%d", k)}})
			served := resp != nil && resp.Header.Get("Stormguard-Stale") != ""
			if k == 0 && served {
				t.Errorf("variant 0 of 9 still served: %q", b)
			}
			if k > 0 && (!served || b != fmt.Sprintf("for:s=%d", k)) {
				t.Errorf("cookie s=%d: served=%v %q", k, served, b)
			}
		}
		for _, h := range []http.Header{nil, {"Authorization": {"s=1"}}, {"Cookie": {"s=1"}, "Authorization": {"x"}}} {
			if resp, b := hc2Get(t, tr, "http://hc2-cr.test/", h); resp != nil && resp.Header.Get("Stormguard-Stale") != "" {
				t.Errorf("%v: served %q", h, b)
			}
		}
	})
}
