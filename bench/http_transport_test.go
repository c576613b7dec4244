package bench

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/stormguard/stormguard/httpretry"
)

// The HTTP benchmarks compare, on loopback against one httptest server
// answering 200 "ok": a bare *http.Transport, httpretry.Transport over an
// identical one (defaults: 3 attempts, per-host budget and breaker on), and
// go-retryablehttp v0.7.8's RoundTripper over an identical one (its client
// built once, logging off). Each iteration is one RoundTrip, the body read
// to the end and closed, so the connection is reused. The server runs in
// the same process, so B/op and allocs/op include its side; it is the same
// for every contender, and the differences are the wrappers' own cost.

type httpSetup struct {
	name string
	rt   func(base *http.Transport) http.RoundTripper
}

var httpSetups = []httpSetup{
	{"bare", func(base *http.Transport) http.RoundTripper { return base }},
	{"httpretry", func(base *http.Transport) http.RoundTripper {
		t, err := httpretry.NewTransport(base)
		if err != nil {
			panic(err)
		}
		return t
	}},
	{"retryablehttp", func(base *http.Transport) http.RoundTripper {
		c := retryablehttp.NewClient()
		c.HTTPClient.Transport = base
		// Its default logger writes every request at DEBUG; its default
		// wait (1 s) is off the success path, shortened for the test.
		c.Logger = nil
		c.RetryWaitMin, c.RetryWaitMax = time.Millisecond, 10*time.Millisecond
		return &retryablehttp.RoundTripper{Client: c}
	}},
}

func newHTTPServer(tb testing.TB, h http.HandlerFunc) *httptest.Server {
	tb.Helper()
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return srv
}

func okHandler(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }

func newBase() *http.Transport {
	return &http.Transport{MaxIdleConns: 100, MaxIdleConnsPerHost: 100}
}

func roundTrip(tb testing.TB, rt http.RoundTripper, req *http.Request) int {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		tb.Fatalf("RoundTrip: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestHTTPSetupsBehave checks every benchmarked setup: a 200 in one
// request, and a 503 followed by a 200 retried to the 200 (so the
// wrappers really are retrying round trippers, not pass-throughs).
func TestHTTPSetupsBehave(t *testing.T) {
	for _, s := range httpSetups {
		t.Run(s.name, func(t *testing.T) {
			var n atomic.Int32
			srv := newHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 2 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				okHandler(w, r)
			})
			base := newBase()
			defer base.CloseIdleConnections()
			rt := s.rt(base)
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			if code := roundTrip(t, rt, req); code != 200 || n.Load() != 1 {
				t.Errorf("%s: first RoundTrip = %d after %d requests, want 200 after 1", s.name, code, n.Load())
			}
			code := roundTrip(t, rt, req)
			want, wantN := 200, int32(3)
			if s.name == "bare" {
				want, wantN = 503, 2
			}
			if code != want || n.Load() != wantN {
				t.Errorf("%s: second RoundTrip = %d after %d requests in all, want %d after %d", s.name, code, n.Load(), want, wantN)
			}
		})
	}
}

// BenchmarkHTTPRoundTrip is one GET with a 200 response per iteration.
func BenchmarkHTTPRoundTrip(b *testing.B) {
	srv := newHTTPServer(b, okHandler)
	for _, s := range httpSetups {
		b.Run(s.name, func(b *testing.B) {
			base := newBase()
			defer base.CloseIdleConnections()
			rt := s.rt(base)
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			req.Header.Set("Accept", "text/plain")
			roundTrip(b, rt, req) // open the connection outside the timing
			b.ReportAllocs()
			for b.Loop() {
				roundTrip(b, rt, req)
			}
		})
	}
}

// BenchmarkHTTPRoundTripParallel is the same from every P at once: one
// Transport shared by all goroutines.
func BenchmarkHTTPRoundTripParallel(b *testing.B) {
	srv := newHTTPServer(b, okHandler)
	for _, s := range httpSetups {
		b.Run(s.name, func(b *testing.B) {
			base := newBase()
			defer base.CloseIdleConnections()
			rt := s.rt(base)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
				req.Header.Set("Accept", "text/plain")
				for pb.Next() {
					roundTrip(b, rt, req)
				}
			})
		})
	}
}

// BenchmarkHTTPRoundTripPaired is the fair comparison of httpretry with a
// bare transport on a shared machine: each iteration makes one GET through
// each, alternating which goes first, and times each, so that a change in
// the machine's load hits both equally. It reports each one's mean time per
// request and their throughput ratio (bare time / httpretry time: 1 means no
// cost).
func BenchmarkHTTPRoundTripPaired(b *testing.B) {
	srv := newHTTPServer(b, okHandler)
	bareBase, retryBase := newBase(), newBase()
	defer bareBase.CloseIdleConnections()
	defer retryBase.CloseIdleConnections()
	tr, err := httpretry.NewTransport(retryBase)
	if err != nil {
		b.Fatal(err)
	}
	rts := [2]http.RoundTripper{bareBase, tr}
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "text/plain")
	for _, rt := range rts {
		roundTrip(b, rt, req) // open the connections outside the timing
	}
	var spent [2]time.Duration
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		for k := range 2 {
			j := (i + k) % 2
			start := time.Now()
			roundTrip(b, rts[j], req)
			spent[j] += time.Since(start)
		}
		i++
	}
	n := float64(i)
	b.ReportMetric(float64(spent[0].Nanoseconds())/n, "bare-ns/req")
	b.ReportMetric(float64(spent[1].Nanoseconds())/n, "httpretry-ns/req")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "throughput-ratio")
}
