package httpretry_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
)

// slowBase answers 200 from memory after 10 ms, counting the requests in
// flight at once.
type slowBase struct {
	in, peak atomic.Int64
}

func (b *slowBase) RoundTrip(r *http.Request) (*http.Response, error) {
	n := b.in.Add(1)
	for p := b.peak.Load(); n > p && !b.peak.CompareAndSwap(p, n); p = b.peak.Load() {
	}
	defer b.in.Add(-1)
	select {
	case <-time.After(10 * time.Millisecond):
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// TestDefaultLimiter: a transport built with no options has a per-host
// limiter, WithLimit(nil) has none. A burst of 50 requests without a
// deadline on a cold transport all succeed: the limiter (cold: 10 slots)
// makes the rest wait for slots instead of refusing them, and the host
// sees fewer than 50 at once; without the limiter it sees all 50. Run on
// synctest's clock.
func TestDefaultLimiter(t *testing.T) {
	for _, tt := range []struct {
		name    string
		opts    []httpretry.Option
		limiter bool
	}{
		{"default", nil, true},
		{"WithLimit(nil)", []httpretry.Option{httpretry.WithLimit(nil)}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowBase{}
				tr, err := httpretry.NewTransport(base, tt.opts...)
				if err != nil {
					t.Fatal(err)
				}
				var failed atomic.Int64
				var wg sync.WaitGroup
				for range 50 {
					wg.Go(func() {
						req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://dependency.test/", nil)
						resp, err := tr.RoundTrip(req)
						if err != nil || resp.StatusCode != 200 {
							failed.Add(1)
							t.Errorf("RoundTrip = %v, %v", resp, err)
							return
						}
						_ = resp.Body.Close()
					})
				}
				wg.Wait()
				g := tr.Hosts()["dependency.test"]
				peak := base.peak.Load()
				t.Logf("50 requests at once: %d failed, at most %d at the host at once, limiter %v", failed.Load(), peak, g.Limiter != nil)
				if (g.Limiter != nil) != tt.limiter {
					t.Errorf("host's limiter %v, want one: %v", g.Limiter, tt.limiter)
				}
				if tt.limiter && peak >= 50 {
					t.Errorf("the host saw %d at once, want fewer than 50 behind a cold limiter", peak)
				}
				if !tt.limiter && peak != 50 {
					t.Errorf("the host saw %d at once, want all 50 without a limiter", peak)
				}
			})
		})
	}
}

// TestDefaultLimiterKeepsPacedRelease: the default limiter leaves the
// breaker the transport builds with its release paced by the rate before
// the trip (ReleaseRate 0), so that transports of one caller each do not
// all release their backlogs at once; a limiter asked for with WithLimit
// makes that breaker release at once for the limiter to pace
// (ReleaseRate -1); a ReleaseRate of the caller's is kept either way.
func TestDefaultLimiterKeepsPacedRelease(t *testing.T) {
	tests := []struct {
		name string
		opts []httpretry.Option
		want float64
	}{
		{"default limiter", nil, 0},
		{"limiter asked for", []httpretry.Option{httpretry.WithLimit(&limit.Config{})}, -1},
		{"no limiter", []httpretry.Option{httpretry.WithLimit(nil)}, 0},
		{"limiter asked for, release rate set", []httpretry.Option{httpretry.WithLimit(&limit.Config{}), httpretry.WithBreaker(&breaker.Config{ReleaseRate: 50})}, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := httpretry.NewTransport(roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			}), tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := (&http.Client{Transport: tr}).Get("http://example.test/")
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			g, ok := tr.Hosts()["example.test"]
			if !ok || g.Breaker == nil {
				t.Fatalf("Hosts() = %v, want the host's guards with a breaker", tr.Hosts())
			}
			if got := g.Breaker.Config().ReleaseRate; got != tt.want {
				t.Errorf("breaker's ReleaseRate = %v, want %v", got, tt.want)
			}
		})
	}
}
