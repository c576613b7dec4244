package httpretry_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stormguard/stormguard/httpretry"
)

// canned is a RoundTripper that answers 200 from memory. It is used only
// to count the Transport's own allocations exactly (a network round trip
// allocates on both ends of the socket, in the same process); behaviour is
// tested against real servers.
type canned struct{ resp *http.Response }

func (c canned) RoundTrip(*http.Request) (*http.Response, error) { return c.resp, nil }

// maxOverheadAllocs is what the success path costs on top of the base
// transport, per request: the shallow copy of the request (http.Request
// has no way to change a header without one) and the header map with the
// attempt header (2 allocations: the map and its group of slots).
const maxOverheadAllocs = 3

func TestSuccessPathAllocs(t *testing.T) {
	tests := []struct {
		name string
		opts []httpretry.Option
		max  float64
	}{
		{"defaults (budget and breaker on)", nil, maxOverheadAllocs},
		{"no budget, no breaker", []httpretry.Option{httpretry.WithoutBudget(), httpretry.WithoutBreaker()}, maxOverheadAllocs},
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
			if _, err := tr.RoundTrip(req); err != nil { // warm the host table
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(1000, func() {
				if _, err := tr.RoundTrip(req); err != nil {
					t.Fatal(err)
				}
			})
			t.Logf("RoundTrip success path: %v allocs over the base", allocs)
			if allocs > tt.max {
				t.Errorf("RoundTrip success path = %v allocs, want at most %v", allocs, tt.max)
			}
		})
	}
}

// BenchmarkRoundTripOverhead measures the Transport's own cost per
// successful request over a base that answers from memory.
func BenchmarkRoundTripOverhead(b *testing.B) {
	setups := []struct {
		name string
		opts []httpretry.Option
	}{
		{"defaults", nil},
		{"no budget", []httpretry.Option{httpretry.WithoutBudget()}},
		{"no breaker", []httpretry.Option{httpretry.WithoutBreaker()}},
		{"no budget, no breaker", []httpretry.Option{httpretry.WithoutBudget(), httpretry.WithoutBreaker()}},
	}
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
			tr, err := httpretry.NewTransport(canned{resp}, s.opts...)
			if err != nil {
				b.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://example.test/x", nil)
			req.Header.Set("Accept", "text/plain")
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tr.RoundTrip(req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("request copy only", func(b *testing.B) {
		// The floor: what any wrapper that adds one header pays.
		req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://example.test/x", nil)
		req.Header.Set("Accept", "text/plain")
		b.ReportAllocs()
		for b.Loop() {
			r := req.WithContext(req.Context())
			h := make(http.Header, len(req.Header)+2)
			for k, v := range req.Header {
				h[k] = v
			}
			h[httpretry.AttemptHeader] = []string{"1"}
			r.Header = h
		}
	})
}
