package httpretry_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
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
	short, cancelShort := context.WithTimeout(context.Background(), 30*time.Minute) // before the delay of an hour
	defer cancelShort()
	timeout := []httpretry.Option{httpretry.WithAttemptTimeout(2 * time.Hour)} // longer than the delay
	tests := []struct {
		name   string
		method string
		ctx    context.Context
		opts   []httpretry.Option
		race   bool    // the request runs a race (checked: a slow first copy gets a hedge)
		max    float64 // allocations hedging may add
	}{
		// Not eligible, or no hedge possible: the plain path.
		{"POST with a key", http.MethodPost, context.Background(), nil, false, 0},
		{"GET, hedging held back (no budget)", http.MethodGet, context.Background(), []httpretry.Option{httpretry.WithBudget(nil)}, false, 0},
		{"GET, learned delay still unknown", http.MethodGet, context.Background(), []httpretry.Option{httpretry.WithHedging(0, 0, 1)}, false, 0},
		// An attempt that ends before the delay: no hedge could go, no race.
		{"GET whose deadline comes before the delay", http.MethodGet, short, nil, false, 0},
		{"GET whose attempt timeout is shorter than the delay", http.MethodGet, context.Background(), []httpretry.Option{httpretry.WithAttemptTimeout(time.Minute)}, false, 0},
		// Eligible: a race that the first copy wins before the delay.
		{"GET, race won by the first copy", http.MethodGet, context.Background(), nil, true, maxRaceAllocs},
		{"GET on a cancelable context, race won by the first copy", http.MethodGet, cancelable, nil, true, maxRaceAllocsCancelable},
		// WithTimeout (no attempt timeout) puts its deadline on every
		// request's context: the race adds 5, whatever the caller's.
		{"GET under WithTimeout, race won by the first copy", http.MethodGet, context.Background(), []httpretry.Option{httpretry.WithTimeout(2 * time.Hour)}, true, 5},
		{"GET on a cancelable context under WithTimeout, race won by the first copy", http.MethodGet, cancelable, []httpretry.Option{httpretry.WithTimeout(2 * time.Hour)}, true, 5},
		// With an attempt timeout every attempt has a context of its own,
		// a request copy and a body that releases the context, hedging or
		// not: the race's first copy is that attempt, and adds nothing.
		{"GET with an attempt timeout, race won by the first copy", http.MethodGet, context.Background(), timeout, true, 0},
		{"GET on a cancelable context with an attempt timeout, race won by the first copy", http.MethodGet, cancelable, timeout, true, 0},
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
			hopts := append([]httpretry.Option{httpretry.WithHedging(time.Hour, 0, 1)}, tt.opts...)
			hedged := count(hopts...)
			if tt.race {
				checkRaces(t, hopts)
			}
			t.Logf("%s: %v allocs with hedging, %v without: %v added", tt.name, hedged, plain, hedged-plain)
			if hedged-plain > tt.max {
				t.Errorf("%s: hedging adds %v allocs, want at most %v", tt.name, hedged-plain, tt.max)
			}
		})
	}
}

// checkRaces checks that a GET through a transport with opts races: a
// first copy that answers after two hours gets a hedge.
func checkRaces(t *testing.T, opts []httpretry.Option) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(2*time.Hour, time.Millisecond)}
		tr, err := httpretry.NewTransport(base, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if body, _, err := hedgeGet(t, tr, context.Background()); err != nil || body != "leg1" {
			t.Errorf("GET with a slow first copy = %q, %v; want the hedge's \"leg1\" (the request does not race)", body, err)
		}
		base.settle(t)
	})
}

// What hedging adds, measured, to a request it races when the first
// copy answers before the delay, without an attempt timeout (with one it
// adds 0): the first copy's context and its cancel, and the copy of the
// request on it; on a cancelable context also the body wrapper that
// releases the first copy's context (else the parent would keep it among
// its children); on one that never ends the context holds nothing to
// release. The timer and the race's state come from a pool of the
// transport's; no goroutine; the parent's set of children is made once
// per parent, by its first child, and kept. Not 0: the first copy must be
// cancelable when a hedge wins, and the caller's request can be sent on
// another context only as a copy; the base may watch that context until
// the response body is closed, so it cannot be shared with later
// requests; nor handed to a later one once the body is closed: its Value
// must answer for each request's own context, and a context may be kept
// past its request (docs/hedging.md). Over a real http.Transport a race
// adds 6 (BenchmarkHedgeNotNeeded, loopback): the transport also asks the
// first copy's context for its Done channel and registers under it.
const (
	maxRaceAllocs           = 3 // on a context that never ends
	maxRaceAllocsCancelable = 4 // on a cancelable context
)

// BenchmarkHedgeNotNeeded: a GET that needs no hedge, without hedging and
// with a race its first copy wins before the delay, without and with an
// attempt timeout: over a base that answers from memory (one allocation of
// its own), and on loopback through a real http.Transport.
func BenchmarkHedgeNotNeeded(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []httpretry.Option
	}{
		{"no hedging", nil},
		{"race won by the first copy", []httpretry.Option{httpretry.WithHedging(time.Second, 0, 1)}},
		{"attempt timeout/no hedging", []httpretry.Option{httpretry.WithAttemptTimeout(time.Minute)}},
		{"attempt timeout/race won by the first copy", []httpretry.Option{httpretry.WithAttemptTimeout(time.Minute), httpretry.WithHedging(time.Second, 0, 1)}},
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
