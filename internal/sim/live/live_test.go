package live_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/sim/live"
)

func TestProviderSchedule(t *testing.T) {
	p, err := live.NewProvider(live.ProviderConfig{FailAt: time.Hour, FailFor: time.Hour, RetryAfter: 1500 * time.Millisecond, Window: time.Second, Horizon: 3 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		at   time.Duration
		want bool
	}{{0, false}, {time.Hour - 1, false}, {time.Hour, true}, {2*time.Hour - 1, true}, {2 * time.Hour, false}} {
		if got := p.Failing(tt.at); got != tt.want {
			t.Errorf("Failing(%v) = %v, want %v", tt.at, got, tt.want)
		}
	}
	// Before Start, and an hour before the outage: healthy.
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusOK {
		t.Errorf("healthy provider answered %d", rec.Code)
	}
	// An outage from t=0: 503 with Retry-After rounded up to whole seconds.
	q, _ := live.NewProvider(live.ProviderConfig{FailFor: time.Hour, RetryAfter: 1500 * time.Millisecond, Window: time.Second, Horizon: time.Minute})
	q.Start()
	rec = httptest.NewRecorder()
	q.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "2" {
		t.Errorf("failing provider answered %d with Retry-After %q, want 503 and 2", rec.Code, rec.Header().Get("Retry-After"))
	}
	w := q.Windows()
	if len(w) != 60 || w[0].Attempts != 1 || w[0].Failed != 1 {
		t.Errorf("Windows() = %d windows, first %+v; want 60 and one failed attempt", len(w), w[0])
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []live.ProviderConfig{
		{Window: 0, Horizon: time.Second},
		{Window: time.Second, Horizon: 0},
		{Window: time.Nanosecond, Horizon: time.Hour},
		{Window: time.Second, Horizon: time.Second, FailFor: -1},
	} {
		if _, err := live.NewProvider(c); !errors.Is(err, live.ErrInvalidConfig) {
			t.Errorf("NewProvider(%+v) = %v, want ErrInvalidConfig", c, err)
		}
	}
	if _, err := live.RunFleet(context.Background(), live.FleetConfig{Clients: 0, Every: time.Second, Duration: time.Second}, nil); !errors.Is(err, live.ErrInvalidConfig) {
		t.Errorf("RunFleet with no clients = %v, want ErrInvalidConfig", err)
	}
}

// TestRunAccounting runs a tiny real fleet on loopback and checks that what
// the provider counted equals what the clients sent. Nothing here depends
// on timing: the outage may catch more or fewer requests on a slow machine.
func TestRunAccounting(t *testing.T) {
	var attempts atomic.Int64
	pc := live.ProviderConfig{FailAt: 40 * time.Millisecond, FailFor: 60 * time.Millisecond, RetryAfter: time.Second, Window: 10 * time.Millisecond, Horizon: 2 * time.Second}
	fc := live.FleetConfig{Clients: 8, Every: 20 * time.Millisecond, Duration: 200 * time.Millisecond, Deadline: 2 * time.Second}
	client := &http.Client{Transport: countingTransport{&attempts, http.DefaultTransport}}
	r, err := live.Run(context.Background(), "naive", pc, fc, func(url string, _ int) live.Call {
		return live.Naive(client, url, 10*time.Millisecond, 3)
	})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Stats
	// 8 clients, one request per 20 ms each, for 200 ms: exactly 80.
	if st.Offered != 80 || st.Offered != st.Succeeded+st.Failed {
		t.Errorf("stats %+v: offered must be 80 and equal succeeded+failed", st)
	}
	var sum int64
	for _, w := range r.Windows {
		if w.Attempts != w.OK+w.Failed+w.Shed {
			t.Errorf("window %+v does not add up", w)
		}
		sum += w.Attempts
	}
	if sum != attempts.Load() || r.Summary.Attempts != sum {
		t.Errorf("provider counted %d (summary %d), clients sent %d", sum, r.Summary.Attempts, attempts.Load())
	}
	if r.Summary.Peak <= 0 || r.Summary.Amplification < 1 {
		t.Errorf("summary %+v: want a positive peak and amplification >= 1", r.Summary)
	}
}

type countingTransport struct {
	n    *atomic.Int64
	base http.RoundTripper
}

func (c countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.base.RoundTrip(r)
}
