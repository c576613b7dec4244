package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// canned is a RoundTripper that answers 200 from memory. It is used only
// to count the Transport's own allocations exactly (a network round trip
// allocates on both ends of the socket, in the same process); behaviour is
// tested against real servers.
type canned struct{ resp *http.Response }

func (c canned) RoundTrip(*http.Request) (*http.Response, error) { return c.resp, nil }

// maxOverheadAllocs is what the success path may cost on top of the base
// transport, per request: none, as the package doc promises.
const maxOverheadAllocs = 0

// TestSuccessPathAllocs counts what RoundTrip allocates on the success
// path over a base that allocates nothing: the Transport's own cost,
// exactly.
func TestSuccessPathAllocs(t *testing.T) {
	tests := []struct {
		name string
		opts []httpretry.Option
	}{
		{"defaults (budget, breaker and limiter on)", nil},
		{"no limiter", []httpretry.Option{httpretry.WithLimit(nil)}},
		{"no budget, no breaker", []httpretry.Option{httpretry.WithBudget(nil), httpretry.WithBreaker(nil)}},
		{"caller's idempotency key on a POST", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
			tr, err := httpretry.NewTransport(canned{resp}, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://example.test/x", nil)
			req.Header.Set("Accept", "text/plain")
			req.Header.Set("User-Agent", "test")
			if tt.name == "caller's idempotency key on a POST" {
				req.Method = "POST"
				req.Header.Set("Idempotency-Key", "k-1")
			}
			if _, err := tr.RoundTrip(req); err != nil { // warm the host table
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				if _, err := tr.RoundTrip(req); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("RoundTrip success path: %v allocs over the base", allocs)
			if allocs > maxOverheadAllocs {
				t.Errorf("RoundTrip success path = %v allocs over the base, want at most %v", allocs, maxOverheadAllocs)
			}
		})
	}
}

// loopback is a server answering "ok" and a plain http.Transport to it,
// closed at the end of the test.
func loopback(tb testing.TB) (*httptest.Server, *http.Transport) {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	tb.Cleanup(srv.Close)
	base := &http.Transport{MaxIdleConnsPerHost: 64}
	tb.Cleanup(base.CloseIdleConnections)
	return srv, base
}

// getOK sends req through rt and reads the whole answer.
func getOK(tb testing.TB, rt http.RoundTripper, req *http.Request) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != 200 {
		tb.Fatalf("status %d", resp.StatusCode)
	}
}

// TestLoopbackAllocs compares a GET on loopback through a bare
// http.Transport with the same GET through a default Transport over it:
// the whole process's allocations (client and server) per request.
func TestLoopbackAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	srv, base := loopback(t)
	tr, err := httpretry.NewTransport(base)
	if err != nil {
		t.Fatal(err)
	}
	req := newRequest(t, context.Background(), "GET", srv.URL, nil)
	getOK(t, base, req) // open the connection
	getOK(t, tr, req)   // and the host's state
	bare := testing.AllocsPerRun(1000, func() { getOK(t, base, req) })
	through := testing.AllocsPerRun(1000, func() { getOK(t, tr, req) })
	t.Logf("loopback GET: bare http.Transport %v allocs, through httpretry %v allocs", bare, through)
	if through-bare > maxOverheadAllocs {
		t.Errorf("loopback GET through httpretry = %v allocs, bare %v: %v more, want at most %v",
			through, bare, through-bare, maxOverheadAllocs)
	}
}

// BenchmarkLoopbackGET is the transport's cost on a real round trip: a GET
// on loopback through a bare http.Transport, and through a Transport with
// the defaults (budget and breaker on) over an identical one; serial and
// parallel.
func BenchmarkLoopbackGET(b *testing.B) {
	clients := []struct {
		name string
		wrap func(b *testing.B, base *http.Transport) http.RoundTripper
	}{
		{"bare", func(b *testing.B, base *http.Transport) http.RoundTripper { return base }},
		{"httpretry", func(b *testing.B, base *http.Transport) http.RoundTripper {
			tr, err := httpretry.NewTransport(base)
			if err != nil {
				b.Fatal(err)
			}
			return tr
		}},
	}
	for _, c := range clients {
		b.Run(c.name, func(b *testing.B) {
			srv, base := loopback(b)
			rt := c.wrap(b, base)
			req, _ := http.NewRequestWithContext(context.Background(), "GET", srv.URL, nil)
			b.ReportAllocs()
			for b.Loop() {
				getOK(b, rt, req)
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			srv, base := loopback(b)
			rt := c.wrap(b, base)
			req, _ := http.NewRequestWithContext(context.Background(), "GET", srv.URL, nil)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					getOK(b, rt, req)
				}
			})
		})
	}
}

// fresh is a RoundTripper that answers 200 from memory with a new
// response each time (a Transport may wrap the body of the response it
// returns, so a shared one would grow).
type fresh struct{}

func (fresh) RoundTrip(*http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
}

// BenchmarkRoundTripOverhead measures the Transport's own cost per
// successful request over a base that answers from memory ("base alone"
// is that base's own cost, one allocation). "defaults" has the budget,
// the breaker and the limiter; "no limiter" is the defaults with
// WithLimit(nil), the default before the limiter was.
func BenchmarkRoundTripOverhead(b *testing.B) {
	setups := []struct {
		name string
		opts []httpretry.Option
	}{
		{"base alone", nil},
		{"defaults", nil},
		{"no limiter", []httpretry.Option{httpretry.WithLimit(nil)}},
		{"no budget", []httpretry.Option{httpretry.WithBudget(nil)}},
		{"no breaker", []httpretry.Option{httpretry.WithBreaker(nil)}},
		{"no budget, no breaker", []httpretry.Option{httpretry.WithBudget(nil), httpretry.WithBreaker(nil)}},
		{"auto key (a POST)", []httpretry.Option{httpretry.WithAutoIdempotencyKey()}},
		{"with a timeout", []httpretry.Option{httpretry.WithTimeout(time.Minute)}},
	}
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			var rt http.RoundTripper = fresh{}
			if s.name != "base alone" {
				tr, err := httpretry.NewTransport(fresh{}, s.opts...)
				if err != nil {
					b.Fatal(err)
				}
				rt = tr
			}
			method := "GET"
			if s.name == "auto key (a POST)" {
				method = "POST"
			}
			req, _ := http.NewRequestWithContext(context.Background(), method, "http://example.test/x", nil)
			req.Header.Set("Accept", "text/plain")
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_ = resp.Body.Close()
			}
		})
	}
}
