// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package httpretry_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

func ratkNoWait(t *testing.T) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Base: time.Nanosecond, Cap: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// "Giving up: on a retryable status the caller gets the last response with
// a nil error" -- a request with one allowed attempt (or a hint above the
// maximum) needs no rewind, yet GetBody is called and its failure replaces
// the response with an error.
func TestReattackRewindOnLastAttempt(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	for _, attempts := range []int{1, 3} {
		tr, err := httpretry.NewTransport(http.DefaultTransport,
			httpretry.WithRetry(retry.WithMaxAttempts(attempts), retry.WithBackoff(ratkNoWait(t))),
			httpretry.WithBreaker(nil), httpretry.WithLimit(nil), httpretry.WithBudget(nil))
		if err != nil {
			t.Fatal(err)
		}
		var gets atomic.Int32
		req, _ := http.NewRequest(http.MethodPut, srv.URL, bytes.NewReader([]byte("payload")))
		req.GetBody = func() (io.ReadCloser, error) {
			// The body can be rewound as often as a retry needs, not more.
			if gets.Add(1) >= int32(attempts) {
				return nil, errors.New("no more rewinds")
			}
			return io.NopCloser(strings.NewReader("payload")), nil
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Errorf("attempts=%d: err %v, want the last 503 with a nil error (GetBody calls %d)", attempts, err, gets.Load())
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get(wire.GiveUpHeader) == "" {
			t.Errorf("attempts=%d: %d %q", attempts, resp.StatusCode, resp.Header.Get(wire.GiveUpHeader))
		}
	}
}

// A 503 whose Retry-After exceeds the maximum: "the transport gives up at
// once and returns that response".
func TestReattackRewindHintOverMax(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(http.DefaultTransport, httpretry.WithBreaker(nil), httpretry.WithLimit(nil), httpretry.WithBudget(nil))
	req, _ := http.NewRequest(http.MethodPut, srv.URL, bytes.NewReader([]byte("payload")))
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("cannot rewind") }
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("err %v, want the 503 returned", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

// Idempotency-Key under other spellings makes a POST safe to repeat.
func TestReattackKeySpellings(t *testing.T) {
	for _, name := range []string{"idempotency-key", "IDEMPOTENCY-KEY", "x-idempotency-key", "X-IDEMPOTENCY-KEY", "iDempotency-Key"} {
		var hits atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if hits.Add(1) == 1 {
				w.WriteHeader(503)
				return
			}
			w.WriteHeader(200)
		}))
		tr, _ := httpretry.NewTransport(http.DefaultTransport, httpretry.WithRetry(retry.WithBackoff(ratkNoWait(t))))
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header[name] = []string{"k1"}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else {
			resp.Body.Close()
			if resp.StatusCode != 200 || hits.Load() != 2 {
				t.Errorf("%s: status %d hits %d", name, resp.StatusCode, hits.Load())
			}
			if k := httpretry.IdempotencyKey(resp, nil); k != "k1" {
				t.Errorf("%s: IdempotencyKey %q", name, k)
			}
		}
		srv.Close()
	}
}

// Two spellings of the key with different values: IdempotencyKey must name
// the key the server reads (net/http writes the fields in sorted key order,
// the server's Header.Get reads the first).
func TestReattackKeyTwoSpellings(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(200)
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(http.DefaultTransport)
	bad := 0
	for i := 0; i < 40; i++ {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header["IDEMPOTENCY-KEY"] = []string{"a"}
		req.Header["idempotency-key"] = []string{"b"}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		got := seen[len(seen)-1]
		mu.Unlock()
		if k := httpretry.IdempotencyKey(resp, nil); k != got {
			bad++
			if bad == 1 {
				t.Errorf("IdempotencyKey %q, server read %q", k, got)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d/40 mismatches", bad)
	}
}

// Caller's attempt/probe marks under any spelling: the first attempt goes
// without them, the retry carries the transport's only.
func TestReattackMarksSpellings(t *testing.T) {
	for _, hedge := range []bool{false, true} {
		var mu sync.Mutex
		var got []http.Header
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, r.Header.Clone())
			n := len(got)
			mu.Unlock()
			if n == 1 {
				w.WriteHeader(503)
				return
			}
			w.WriteHeader(200)
		}))
		opts := []httpretry.Option{httpretry.WithRetry(retry.WithBackoff(ratkNoWait(t)))}
		if hedge {
			opts = append(opts, httpretry.WithHedging(time.Hour, 0.99, 1))
		}
		tr, err := httpretry.NewTransport(http.DefaultTransport, opts...)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		req.Header["stormguard-attempt"] = []string{"7"}
		req.Header["STORMGUARD-PROBE"] = []string{"1"}
		req.Header["Stormguard-attempt"] = []string{"9"}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		if len(got) != 2 {
			t.Fatalf("hedge=%v: %d requests", hedge, len(got))
		}
		if v := got[0].Values(wire.AttemptHeader); len(v) != 0 {
			t.Errorf("hedge=%v: first attempt carried %v", hedge, v)
		}
		if v := got[0].Values(wire.ProbeHeader); len(v) != 0 {
			t.Errorf("hedge=%v: first attempt probe %v", hedge, v)
		}
		if v := got[1].Values(wire.AttemptHeader); len(v) != 1 || v[0] != "2" {
			t.Errorf("hedge=%v: retry carried %v", hedge, v)
		}
		if v := got[1].Values(wire.ProbeHeader); len(v) != 0 {
			t.Errorf("hedge=%v: retry probe %v", hedge, v)
		}
		mu.Unlock()
		srv.Close()
	}
}

// DNS errors: retried but "no such host".
func TestReattackDNS(t *testing.T) {
	wrap := func(d *net.DNSError) error {
		return &url.Error{Op: "Get", URL: "http://x.example", Err: &net.OpError{Op: "dial", Net: "tcp", Err: d}}
	}
	cases := []struct {
		d    *net.DNSError
		want bool
	}{
		{&net.DNSError{Err: "server misbehaving", Name: "x.example", IsTemporary: false}, true},
		{&net.DNSError{Err: "no answer from DNS server", Name: "x.example"}, true},
		{&net.DNSError{Err: "no such host", Name: "x.example", IsNotFound: true}, false},
		{&net.DNSError{Err: "i/o timeout", Name: "x.example", IsTimeout: true}, true},
		{&net.DNSError{Err: "no such host", Name: "x.example", IsNotFound: true, UnwrapErr: errors.New("x")}, false},
	}
	for _, c := range cases {
		if got := httpretry.IsRetryable(wrap(c.d)); got != c.want {
			t.Errorf("%+v: %v want %v", c.d, got, c.want)
		}
	}
}

// An empty key under one spelling, a key under another: whether the POST
// is retried must not depend on map iteration order.
func TestReattackKeyEmptyAndSet(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1)%2 == 1 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(200)
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(http.DefaultTransport, httpretry.WithRetry(retry.WithBackoff(ratkNoWait(t))), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
	statuses := map[int]int{}
	for i := 0; i < 40; i++ {
		hits.Store(0)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
		req.Header["IDEMPOTENCY-KEY"] = []string{""}
		req.Header["idempotency-key"] = []string{"b"}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses[resp.StatusCode]++
	}
	if len(statuses) > 1 {
		t.Errorf("the same request was retried or not at random: %v", statuses)
	}
}

// The stale cache reads the request's fields under any spelling.
func TestReattackStaleSpellings(t *testing.T) {
	type tc struct {
		name      string
		first     http.Header
		second    http.Header
		vary      string
		wantStale bool
	}
	cases := []tc{
		{"authorization lower", http.Header{"authorization": {"s"}}, http.Header{"authorization": {"s"}}, "", false},
		{"AUTHORIZATION upper", http.Header{"AUTHORIZATION": {"s"}}, http.Header{"AUTHORIZATION": {"s"}}, "", false},
		{"cookie lower", http.Header{"cookie": {"a=b"}}, http.Header{"cookie": {"a=b"}}, "", false},
		{"range lower", http.Header{"range": {"bytes=0-1"}}, http.Header{}, "", false},
		{"no-store lower", http.Header{"cache-control": {"no-store"}}, http.Header{}, "", false},
		{"vary lower then canonical", http.Header{"accept-language": {"fr"}}, http.Header{"Accept-Language": {"de"}}, "Accept-Language", false},
		{"vary canonical then lower same", http.Header{"Accept-Language": {"fr"}}, http.Header{"accept-language": {"fr"}}, "Accept-Language", true},
		{"plain", http.Header{}, http.Header{}, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if hits.Add(1) == 1 {
					w.Header().Set("Cache-Control", "max-age=0")
					if c.vary != "" {
						w.Header().Set("Vary", c.vary)
					}
					w.WriteHeader(200)
					io.WriteString(w, "kept")
					return
				}
				w.WriteHeader(503)
			}))
			defer srv.Close()
			tr, err := httpretry.NewTransport(http.DefaultTransport, httpretry.WithStaleCache(1<<20, time.Hour, false),
				httpretry.WithRetry(retry.WithMaxAttempts(1)), httpretry.WithBreaker(nil))
			if err != nil {
				t.Fatal(err)
			}
			for i, h := range []http.Header{c.first, c.second} {
				req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
				for k, v := range h {
					req.Header[k] = v
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if i == 1 {
					stale := resp.Header.Get("Stormguard-Stale") != ""
					if stale != c.wantStale {
						t.Errorf("second request: status %d body %q stale %v, want stale %v", resp.StatusCode, b, stale, c.wantStale)
					}
				}
			}
		})
	}
}

// A hint above the maximum: the give-up header says deadline and the
// hint as retry-after ("when known").
func TestReattackHintOverGiveUpHeader(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3600")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(http.DefaultTransport, httpretry.WithBreaker(nil))
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	g, ok := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
	if !ok || g.Reason != "deadline" || g.Attempts != 1 || g.RetryAfter != time.Hour {
		t.Errorf("give-up %q: %+v", resp.Header.Get(wire.GiveUpHeader), g)
	}
}
