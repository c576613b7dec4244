// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package httpretry_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// atkhBase answers each request with what fn says, after its delay, or with
// the request context's error when canceled first. It records the requests.
type atkhBase struct {
	fn   func(i int, r *http.Request) (time.Duration, int, http.Header, string)
	mu   sync.Mutex
	reqs []*http.Request
	open atomic.Int64
}

type atkhBody struct {
	io.Reader
	open   *atomic.Int64
	closed atomic.Bool
}

func (b *atkhBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.open.Add(-1)
	}
	return nil
}

func (b *atkhBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := len(b.reqs)
	b.reqs = append(b.reqs, r)
	b.mu.Unlock()
	d, code, h, s := b.fn(i, r)
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	if h == nil {
		h = http.Header{}
	}
	b.open.Add(1)
	return &http.Response{StatusCode: code, Header: h, Request: r, ContentLength: int64(len(s)),
		Body: &atkhBody{Reader: strings.NewReader(s), open: &b.open}}, nil
}

func (b *atkhBase) sent() []*http.Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*http.Request(nil), b.reqs...)
}

func atkhDo(t *testing.T, tr http.RoundTripper, method, url string, h http.Header) (*http.Response, string, error) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), nil
}

// A Retry-After too large for a Duration (ParseRetryAfter saturates it)
// must hold hedges back at least pushbackHold, "a longer Retry-After holds
// for as long".
func TestAttackHedgePushbackHugeRetryAfter(t *testing.T) {
	for _, ra := range []string{"2", "99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"} {
		t.Run(ra, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
					switch i {
					case 0:
						return 0, 200, nil, "ok" // the host is first seen
					case 1:
						return 0, 503, http.Header{"Retry-After": {ra}}, "busy"
					}
					return 50 * time.Millisecond, 200, nil, "ok"
				}}
				tr, err := httpretry.NewTransport(base, httpretry.WithHedging(10*time.Millisecond, 0, 1),
					httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				if _, _, err := atkhDo(t, tr, "GET", "http://h.example/a", nil); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Second)
				resp, _, err := atkhDo(t, tr, "GET", "http://h.example/a", nil)
				if err != nil || resp.StatusCode != 503 {
					t.Fatalf("first: %v %v", resp, err)
				}
				time.Sleep(time.Second) // well within the 5 s hold
				if _, _, err := atkhDo(t, tr, "GET", "http://h.example/a", nil); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if n := len(base.sent()); n != 3 {
					t.Errorf("Retry-After %s: %d requests reached the base, want 3 (no hedge within 5 s of a 503)", ra, n)
				}
			})
		})
	}
}

// The first copy of a race must not carry the caller's own attempt number
// or probe mark (the package doc: such a request goes as a copy without them).
func TestAttackHedgeFirstCopyCallerMarks(t *testing.T) {
	for _, hedge := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "hedging"}[hedge], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
					return time.Millisecond, 200, nil, "ok"
				}}
				var opts []httpretry.Option
				if hedge {
					opts = append(opts, httpretry.WithHedging(10*time.Millisecond, 0, 1))
				}
				tr, err := httpretry.NewTransport(base, opts...)
				if err != nil {
					t.Fatal(err)
				}
				h := http.Header{wire.AttemptHeader: {"3"}, wire.ProbeHeader: {"1"}}
				if _, _, err := atkhDo(t, tr, "GET", "http://h.example/a", h); err != nil {
					t.Fatal(err)
				}
				rs := base.sent()
				if len(rs) != 1 {
					t.Fatalf("%d requests", len(rs))
				}
				if v := rs[0].Header.Values(wire.AttemptHeader); len(v) > 0 {
					t.Errorf("first attempt carried %s: %q, want none", wire.AttemptHeader, v)
				}
				if v := rs[0].Header.Values(wire.ProbeHeader); len(v) > 0 {
					t.Errorf("first attempt carried %s: %q, want none", wire.ProbeHeader, v)
				}
			})
		})
	}
}

// A 503 the host answers to a POST is the host pushing back: no hedge of a
// GET to it for 5 s.
func TestAttackHedgePushbackFromWrite(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
					if i == 0 {
						return 0, 503, nil, "busy"
					}
					return 50 * time.Millisecond, 200, nil, "ok"
				}}
				tr, err := httpretry.NewTransport(base, httpretry.WithHedging(10*time.Millisecond, 0, 1),
					httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				resp, _, err := atkhDo(t, tr, method, "http://h.example/a", nil)
				if err != nil || resp.StatusCode != 503 {
					t.Fatalf("first: %v %v", resp, err)
				}
				time.Sleep(time.Second)
				if _, _, err := atkhDo(t, tr, "GET", "http://h.example/b", nil); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if n := len(base.sent()); n != 2 {
					t.Errorf("after a 503 to a %s: %d requests reached the base, want 2 (no hedge within 5 s of a 503)", method, n)
				}
			})
		})
	}
}

// WithStaleCache: "one whose retry meets the breaker open (its own failure
// tripped it) waits for the round within its deadline like any request,
// and gets the kept response if it then gives up". A black-box attack
// found it waiting, where the doc said "at once" for every request that
// meets the breaker open; the doc now tells the two cases apart.
func TestAttackStaleBreakerOpensMidCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			if down.Load() {
				return 0, 503, nil, "busy"
			}
			return 0, 200, http.Header{"Cache-Control": {"max-age=1, stale-if-error=600"}}, "kept"
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithStaleCache(1<<20, 0, false),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: 30 * time.Second}),
			httpretry.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if _, b, err := atkhDo(t, tr, "GET", "http://h.example/a", nil); err != nil || b != "kept" {
			t.Fatalf("prime: %q %v", b, err)
		}
		down.Store(true)
		start := time.Now()
		resp, b, err := atkhDo(t, tr, "GET", "http://h.example/a", nil)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("status %d body %q stale %q after %v", resp.StatusCode, b, resp.Header.Get("Stormguard-Stale"), took)
		if b != "kept" || !strings.HasPrefix(resp.Header.Get("Stormguard-Stale"), "circuit-open;") || took > time.Minute {
			t.Errorf("served %q (Stormguard-Stale %q) after %v; want the kept response, for the open breaker, within the call's minute", b, resp.Header.Get("Stormguard-Stale"), took)
		}
	})
}

var _ = context.Background

// An in-progress 409 (a keyed request, with Retry-After) is no good answer:
// it must not win a race against a first copy still in flight.
func TestAttackHedgeInProgress409DoesNotWin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			if r.Header.Get(wire.AttemptHeader) == "2" { // the hedge meets the key in progress
				return time.Millisecond, http.StatusConflict, http.Header{"Retry-After": {"1"}}, "in progress"
			}
			return 50 * time.Millisecond, 200, nil, "first"
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(10*time.Millisecond, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, b, err := atkhDo(t, tr, "GET", "http://h.example/a", http.Header{"Idempotency-Key": {"k1"}})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		var atts []string
		for _, r := range base.sent() {
			atts = append(atts, r.Header.Get(wire.AttemptHeader))
		}
		t.Logf("status %d body %q after %v; attempts on the wire %q", resp.StatusCode, b, took, atts)
		if b != "first" || took != 50*time.Millisecond || len(atts) != 2 {
			t.Errorf("got %q after %v with %d requests; want the first copy's 200 at 50ms, 2 requests (the hedge's in-progress 409 is not a good answer)", b, took, len(atts))
		}
	})
}

// After a 401 refresh the request sent (with the refreshed credentials)
// decides: its kept response is served when the refreshed request's
// retries give up.
func TestAttackStaleRefreshedCredentialsServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			if r.Header.Get("Authorization") != "Bearer new" {
				return 0, 401, nil, "who?"
			}
			if down.Load() {
				return 0, 503, nil, "busy"
			}
			return 0, 200, http.Header{"Cache-Control": {"max-age=1, stale-if-error=600"}}, "kept"
		}}
		refresh := func(r *http.Request) (*http.Request, error) {
			r.Header.Set("Authorization", "Bearer new")
			return r, nil
		}
		tr, err := httpretry.NewTransport(base, httpretry.WithStaleCache(1<<20, 0, true),
			httpretry.WithRefreshOn401(refresh), httpretry.WithBreaker(nil))
		if err != nil {
			t.Fatal(err)
		}
		old := http.Header{"Authorization": {"Bearer old"}}
		if _, b, err := atkhDo(t, tr, "GET", "http://h.example/a", old); err != nil || b != "kept" {
			t.Fatalf("prime: %q %v", b, err)
		}
		// The same request sent with the refreshed credentials is served.
		down.Store(true)
		resp, b, err := atkhDo(t, tr, "GET", "http://h.example/a", http.Header{"Authorization": {"Bearer new"}})
		if err != nil || b != "kept" {
			t.Fatalf("control, sent with the new credentials: %v %q %v", resp, b, err)
		}
		resp, b, err = atkhDo(t, tr, "GET", "http://h.example/a", old)
		if err != nil {
			t.Fatal(err)
		}
		var auth []string
		for _, r := range base.sent() {
			auth = append(auth, r.Header.Get("Authorization")+"→")
		}
		t.Logf("requests: %q", auth)
		if b != "kept" {
			t.Errorf("refreshed request gave up: got %d %q (Stormguard-Stale %q), want the response kept for the credentials it was sent with",
				resp.StatusCode, b, resp.Header.Get("Stormguard-Stale"))
		}
	})
}

// Stress over loopback: hedged GETs with a stale cache, a small bound, a
// provider that is slow now and then and fails now and then. Under -race:
// no race, no panic, every served body is a whole kept body, and no
// connection left open once the client's idle ones are closed.
func TestAttackHedgeStaleLoopbackStress(t *testing.T) {
	var active atomic.Int64
	var n atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1)
		switch {
		case i%7 == 0:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(503)
			return
		case i%5 == 0:
			select {
			case <-time.After(30 * time.Millisecond):
			case <-r.Context().Done():
				return
			}
		}
		body := strings.Repeat(r.URL.Path, 50)
		w.Header().Set("Cache-Control", "max-age=0, stale-if-error=60")
		w.Header().Set("Vary", "Accept-Language")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = io.WriteString(w, body)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			active.Add(1)
		case http.StateClosed, http.StateHijacked:
			active.Add(-1)
		}
	}
	srv.Start()
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 4}
	tr, err := httpretry.NewTransport(base, httpretry.WithHedging(5*time.Millisecond, 0.5, 2),
		httpretry.WithStaleCache(8<<10, time.Minute, false), httpretry.WithBudget(&budget.Config{Ratio: 1, MinPerSecond: 1000}),
		httpretry.WithRetry(retry.WithMaxAttempts(2)), httpretry.WithBreaker(nil))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 60 {
				path := "/p" + strconv.Itoa((g+j)%13)
				req, _ := http.NewRequest("GET", srv.URL+path, nil)
				req.Header.Set("Accept-Language", []string{"en", "fr"}[j%2])
				resp, err := tr.RoundTrip(req)
				if err != nil {
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 && string(b) != strings.Repeat(path, 50) {
					t.Errorf("%s: body %q (stale %q)", path, b, resp.Header.Get("Stormguard-Stale"))
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond)
	base.CloseIdleConnections()
	deadline := time.Now().Add(3 * time.Second)
	for active.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if a := active.Load(); a != 0 {
		t.Errorf("%d connections still open", a)
	}
	t.Logf("%d requests reached the server", n.Load())
}

// The same request, with a field under two spellings ("Cookie" and
// "cookie", both sent), must be served its kept response every time.
func TestAttackStaleMixedSpellingsDeterministic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		creds bool
		field string
		vary  string
	}{{"cookie", true, "Cookie", ""}, {"vary", false, "Accept-Language", "Accept-Language"}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var down atomic.Bool
				base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
					if down.Load() {
						return 0, 503, nil, "busy"
					}
					h := http.Header{"Cache-Control": {"max-age=1, stale-if-error=600"}}
					if tc.vary != "" {
						h.Set("Vary", tc.vary)
					}
					return 0, 200, h, "kept"
				}}
				tr, err := httpretry.NewTransport(base, httpretry.WithStaleCache(1<<20, 0, tc.creds),
					httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				h := http.Header{tc.field: {"a=1"}, strings.ToLower(tc.field): {"b=2"}}
				if _, b, err := atkhDo(t, tr, "GET", "http://h.example/a", h); err != nil || b != "kept" {
					t.Fatalf("prime: %q %v", b, err)
				}
				down.Store(true)
				missed := 0
				for range 40 {
					_, b, err := atkhDo(t, tr, "GET", "http://h.example/a", h)
					if err != nil || b != "kept" {
						missed++
					}
				}
				if missed > 0 {
					t.Errorf("the same request was not served its kept response %d times of 40", missed)
				}
			})
		})
	}
}

// LRU: of A and B kept, A served last: C's room is made by evicting B.
func TestAttackStaleLRU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		body := strings.Repeat("x", 1000)
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			if down.Load() {
				return 0, 503, nil, "busy"
			}
			return 0, 200, http.Header{"Cache-Control": {"max-age=1, stale-if-error=600"}}, body
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithStaleCache(2*1400, 0, false),
			httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		get := func(p string) string {
			_, b, err := atkhDo(t, tr, "GET", "http://h.example/"+p, nil)
			if err != nil {
				return "error"
			}
			return b
		}
		get("a")
		get("b")
		down.Store(true)
		if get("a") != body {
			t.Fatal("a not served")
		}
		down.Store(false)
		get("c")
		down.Store(true)
		a, b, c := get("a") == body, get("b") == body, get("c") == body
		if !a || b || !c {
			t.Errorf("served a=%v b=%v c=%v; want a and c (b least recently used)", a, b, c)
		}
	})
}

// Age and staleness figures: received 100 s old (Date), fresh for 60 s
// (max-age, or Expires - Date), stale-if-error=100; 30 s later: age 130,
// stale 70; a request's stale-if-error=60 refuses it.
func TestAttackStaleAgeFigures(t *testing.T) {
	for _, mode := range []string{"max-age", "expires"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var down atomic.Bool
				base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
					if down.Load() {
						return 0, 503, nil, "busy"
					}
					now := time.Now()
					h := http.Header{"Date": {now.Add(-100 * time.Second).UTC().Format(http.TimeFormat)}, "Age": {"10"}}
					if mode == "max-age" {
						h.Set("Cache-Control", "max-age=60, stale-if-error=100")
					} else {
						h.Set("Cache-Control", "stale-if-error=100")
						h.Set("Expires", now.Add(-40*time.Second).UTC().Format(http.TimeFormat))
					}
					return 0, 200, h, "kept"
				}}
				tr, err := httpretry.NewTransport(base, httpretry.WithStaleCache(1<<20, 0, false),
					httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				atkhDo(t, tr, "GET", "http://h.example/a", nil)
				down.Store(true)
				time.Sleep(30 * time.Second)
				resp, b, err := atkhDo(t, tr, "GET", "http://h.example/a", nil)
				if err != nil || b != "kept" {
					t.Fatalf("not served: %v %q %v", resp, b, err)
				}
				if a, s := resp.Header.Get("Age"), resp.Header.Get("Stormguard-Stale"); a != "130" || !strings.HasSuffix(s, ";stale=70") {
					t.Errorf("Age %q, Stormguard-Stale %q; want 130 and stale=70", a, s)
				}
				_, b, _ = atkhDo(t, tr, "GET", "http://h.example/a", http.Header{"Cache-Control": {"stale-if-error=60"}})
				if b == "kept" {
					t.Errorf("served 70 s stale to a request with stale-if-error=60")
				}
				time.Sleep(31 * time.Second) // 101 s stale
				if _, b, _ = atkhDo(t, tr, "GET", "http://h.example/a", nil); b == "kept" {
					t.Errorf("served 101 s stale past stale-if-error=100")
				}
			})
		})
	}
}

// atkhOneToken lets one attempt through, then makes every later one wait
// for its context: a client-side rate limit of one attempt.
type atkhOneToken struct{ n atomic.Int64 }

func (l *atkhOneToken) Wait(ctx context.Context) error {
	if l.n.Add(1) == 1 {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// WithRetry: retry.WithRateLimit paces "the attempts to every host; a
// hedge does not wait for it". A black-box attack found the hedge going
// past a limiter with one token, where the doc did not say so; it does
// now: the first copy takes the token, the hedge goes at its delay.
func TestAttackHedgeRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			return 50 * time.Millisecond, 200, nil, "ok"
		}}
		l := &atkhOneToken{}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(10*time.Millisecond, 0, 1),
			httpretry.WithRetry(retry.WithRateLimit(l)))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := atkhDo(t, tr, "GET", "http://h.example/a", nil); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if n := len(base.sent()); n != 2 || l.n.Load() != 1 {
			t.Errorf("%d requests on the wire, limiter asked %d times; want 2 (the copy and its hedge), asked once", n, l.n.Load())
		}
	})
}

// No hedge while the host's recent median (of the latest 32 answers) is
// more than 3 times its baseline.
func TestAttackHedgeInflated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var lat atomic.Int64
		lat.Store(int64(10 * time.Millisecond))
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			return time.Duration(lat.Load()), 200, nil, "ok"
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(60*time.Millisecond, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		for range 300 {
			atkhDo(t, tr, "GET", "http://h.example/a", nil)
			time.Sleep(90 * time.Millisecond)
		}
		lat.Store(int64(50 * time.Millisecond))
		for range 40 {
			atkhDo(t, tr, "GET", "http://h.example/a", nil)
		}
		time.Sleep(100 * time.Millisecond)
		lat.Store(int64(time.Second))
		before := len(base.sent())
		atkhDo(t, tr, "GET", "http://h.example/a", nil)
		synctest.Wait()
		if n := len(base.sent()) - before; n != 1 {
			t.Errorf("%d requests for a GET while the median is 5x its baseline; want 1 (no hedge)", n)
		}
	})
}

type atkhCutBody struct{ n int }

func (b *atkhCutBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		b.n++
		return copy(p, "part"), nil
	}
	return 0, io.ErrUnexpectedEOF // the connection broke mid-body
}
func (b *atkhCutBody) Close() error { return nil }

type atkhCutBase struct {
	atkhBase
	cut atomic.Bool
}

func (b *atkhCutBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.cut.Load() {
		return &http.Response{StatusCode: 200, Header: http.Header{"Cache-Control": {"max-age=1, stale-if-error=600"}},
			ContentLength: -1, Body: &atkhCutBody{}, Request: r}, nil
	}
	return b.atkhBase.RoundTrip(r)
}

// A 200 whose body breaks mid-way (the host failing) or that the caller
// stops reading is not an answer that replaces the kept response: the kept
// one is still served at the next give-up. (Control: closing early keeps it.)
func TestAttackStaleCutBodyKeepsOld(t *testing.T) {
	for _, mode := range []string{"close-early", "read-error"} {
		t.Run(mode, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var down atomic.Bool
				base := &atkhCutBase{atkhBase: atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
					if down.Load() {
						return 0, 503, nil, "busy"
					}
					return 0, 200, http.Header{"Cache-Control": {"max-age=1, stale-if-error=600"}}, "kept"
				}}}
				tr, err := httpretry.NewTransport(base, httpretry.WithStaleCache(1<<20, 0, false),
					httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				if _, b, err := atkhDo(t, tr, "GET", "http://h.example/a", nil); err != nil || b != "kept" {
					t.Fatalf("prime: %q %v", b, err)
				}
				base.cut.Store(true)
				req, _ := http.NewRequest("GET", "http://h.example/a", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if mode == "close-early" {
					buf := make([]byte, 2)
					resp.Body.Read(buf)
				} else {
					_, rerr := io.ReadAll(resp.Body)
					t.Logf("read: %v", rerr)
				}
				resp.Body.Close()
				base.cut.Store(false)
				down.Store(true)
				resp, b, err := atkhDo(t, tr, "GET", "http://h.example/a", nil)
				if err != nil || b != "kept" {
					t.Errorf("after a %s 200: got %v %q, want the kept response", mode, resp.StatusCode, b)
				}
			})
		})
	}
}

// A hedge never spends the call's attempts; a retry after a race carries
// the number after the hedges'.
func TestAttackHedgeAttemptsAndNumbers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkhBase{fn: func(i int, r *http.Request) (time.Duration, int, http.Header, string) {
			switch i {
			case 0:
				return 100 * time.Millisecond, 502, nil, "bad"
			case 1: // the first hedge fails: no second one in this race
				return 5 * time.Millisecond, 502, nil, "bad"
			}
			return time.Millisecond, 200, nil, "ok"
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(10*time.Millisecond, 0, 2),
			httpretry.WithRetry(retry.WithMaxAttempts(2)))
		if err != nil {
			t.Fatal(err)
		}
		resp, b, err := atkhDo(t, tr, "GET", "http://h.example/a", nil)
		if err != nil {
			t.Fatal(err)
		}
		var atts []string
		for _, r := range base.sent() {
			atts = append(atts, r.Header.Get(wire.AttemptHeader))
		}
		t.Logf("%d %q, attempts %q", resp.StatusCode, b, atts)
		if b != "ok" || strings.Join(atts, ",") != ",2,3" {
			t.Errorf("attempts on the wire %q, body %q", atts, b)
		}
	})
}
