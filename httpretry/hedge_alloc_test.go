package httpretry_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// TestHedgeSuccessPathAllocs counts what a request that needs no hedge
// allocates with hedging on, over a base that answers at once.
func TestHedgeSuccessPathAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector (sync.Pool drops items)")
	}
	tests := []struct {
		name   string
		method string
		opts   []httpretry.Option
		max    float64
	}{
		// Not eligible, or no hedge possible: the plain path.
		{"POST with a key", http.MethodPost, nil, maxOverheadAllocs},
		{"GET, hedging held back (no budget)", http.MethodGet, []httpretry.Option{httpretry.WithBudget(nil)}, maxOverheadAllocs},
		{"GET, learned delay still unknown", http.MethodGet, []httpretry.Option{httpretry.WithHedging(0, 0, 1)}, maxOverheadAllocs},
		// Eligible: the attempt runs as a race that the attempt wins.
		{"GET, race won by the attempt", http.MethodGet, nil, maxRaceAllocs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
			// The canned base shares one response: a delay no race reaches.
			opts := append([]httpretry.Option{httpretry.WithHedging(time.Hour, 0, 1)}, tt.opts...)
			tr, err := httpretry.NewTransport(canned{resp}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(context.Background(), tt.method, "http://example.test/x", nil)
			req.Header.Set("Idempotency-Key", "k-1")
			if _, err := tr.RoundTrip(req); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				r, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				r.Body.Close()
			})
			t.Logf("%s: %v allocs over the base", tt.name, allocs)
			if allocs > tt.max {
				t.Errorf("%s: %v allocs over the base, want at most %v", tt.name, allocs, tt.max)
			}
		})
	}
}

// maxRaceAllocs is what a request the transport races against hedges
// costs when its attempt answers before the delay (8, measured): the
// attempt's own context and its cancel, request copy and header, the
// goroutine it runs on and the body wrapper that releases the context (the
// results channel and the timer come from the transport's pool).
const maxRaceAllocs = 8

// BenchmarkHedgeNotNeeded: a GET over a base that answers at once,
// without hedging and with a race the attempt wins.
func BenchmarkHedgeNotNeeded(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []httpretry.Option
	}{
		{"no hedging", nil},
		{"race won by the attempt", []httpretry.Option{httpretry.WithHedging(time.Second, 0, 1)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
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
	}
}
