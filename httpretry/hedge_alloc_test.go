package httpretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// TestHedgeSuccessPathAllocs counts what hedging adds to a request that
// needs no hedge: the same request, over a base that answers at once,
// through a transport with hedging and one without.
func TestHedgeSuccessPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector (sync.Pool drops items)")
	}
	cancelable, cancel := context.WithCancel(context.Background())
	defer cancel()
	tests := []struct {
		name   string
		method string
		ctx    context.Context
		opts   []httpretry.Option
		max    float64
	}{
		// Not eligible, or no hedge possible: the plain path.
		{"POST with a key", http.MethodPost, context.Background(), nil, 0},
		{"GET, hedging held back (no budget)", http.MethodGet, context.Background(), []httpretry.Option{httpretry.WithBudget(nil)}, 0},
		{"GET, learned delay still unknown", http.MethodGet, context.Background(), []httpretry.Option{httpretry.WithHedging(0, 0, 1)}, 0},
		// Eligible: a race that the first copy wins before the delay.
		{"GET, race won by the first copy", http.MethodGet, context.Background(), nil, maxRaceAllocs},
		{"GET on a cancelable context, race won by the first copy", http.MethodGet, cancelable, nil, maxRaceAllocs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			count := func(opts ...httpretry.Option) float64 {
				tr, err := httpretry.NewTransport(fresh{}, opts...)
				if err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequestWithContext(tt.ctx, tt.method, "http://example.test/x", nil)
				req.Header.Set("Idempotency-Key", "k-1")
				return testing.AllocsPerRun(1000, func() {
					r, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					r.Body.Close()
				})
			}
			plain := count(tt.opts...)
			// A delay no race reaches.
			hedged := count(append([]httpretry.Option{httpretry.WithHedging(time.Hour, 0, 1)}, tt.opts...)...)
			t.Logf("%s: %v allocs with hedging, %v without: %v added", tt.name, hedged, plain, hedged-plain)
			if hedged-plain > tt.max {
				t.Errorf("%s: hedging adds %v allocs, want at most %v", tt.name, hedged-plain, tt.max)
			}
		})
	}
}

// maxRaceAllocs is what hedging adds to a request it races when the first
// copy answers before the delay (4, measured): the first copy's context
// and its cancel, the copy of the request on it, and the body wrapper
// that releases the context (the timer and the race's state come from a
// pool of the transport's; no goroutine), on a cancelable context as on
// one that is not (the parent's set of children is made once per parent,
// by its first child, and kept). Not 0: the
// first copy must be cancelable when a hedge wins, and the caller's
// request can be sent on another context only as a copy; the base may
// watch that context until the response body is closed, so it cannot be
// shared with later requests.
const maxRaceAllocs = 4

// BenchmarkHedgeNotNeeded: a GET that needs no hedge, without hedging and
// with a race its first copy wins before the delay: over a base that
// answers from memory (one allocation of its own), and on loopback through
// a real http.Transport.
func BenchmarkHedgeNotNeeded(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []httpretry.Option
	}{
		{"no hedging", nil},
		{"race won by the first copy", []httpretry.Option{httpretry.WithHedging(time.Second, 0, 1)}},
	} {
		b.Run("memory/"+bc.name, func(b *testing.B) {
			tr, err := httpretry.NewTransport(fresh{}, bc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://example.test/x", nil)
			b.ReportAllocs()
			for b.Loop() {
				r, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				r.Body.Close()
			}
		})
		b.Run("loopback/"+bc.name, func(b *testing.B) {
			srv, base := loopback(b)
			tr, err := httpretry.NewTransport(base, bc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
			b.ReportAllocs()
			for b.Loop() {
				getOK(b, tr, req)
			}
		})
	}
}
