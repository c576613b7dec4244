package httpretry_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/wire"
)

// tailBase is a simulated provider: each request takes its latency
// (drawn from a seeded generator: 99% uniform in [8, 12] ms, 1% 100 ms;
// times slow during [slowFrom, slowTo) of the bubble's clock) unless
// canceled first. It records when each hedge was sent.
type tailBase struct {
	start            time.Time
	slowFrom, slowTo time.Duration
	slow             float64

	mu     sync.Mutex
	rng    *rand.Rand
	sent   int
	hedges []time.Duration // since start
}

func (b *tailBase) RoundTrip(r *http.Request) (*http.Response, error) {
	now := time.Since(b.start)
	b.mu.Lock()
	b.sent++
	if a := r.Header.Get(wire.AttemptHeader); a != "" {
		b.hedges = append(b.hedges, now)
	}
	d := time.Duration(8e6 + b.rng.Float64()*4e6)
	if b.rng.IntN(100) == 0 {
		d = 100 * time.Millisecond
	}
	b.mu.Unlock()
	if now >= b.slowFrom && now < b.slowTo {
		d = time.Duration(float64(d) * b.slow)
	}
	return okAfter(r, d)
}

// tailRun sends a GET every 5 ms for 60 s through a transport over base
// and returns the calls' latencies.
func tailRun(t *testing.T, base *tailBase, opts ...httpretry.Option) []time.Duration {
	tr, err := httpretry.NewTransport(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for range 12000 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://tail.test/", nil)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			resp.Body.Close()
			mu.Lock()
			lat = append(lat, time.Since(start))
			mu.Unlock()
		})
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(lat)
	return lat
}

func pct(lat []time.Duration, q float64) time.Duration {
	return lat[min(len(lat)-1, int(q*float64(len(lat))))]
}

// TestHedgeTailSimulation: a simulated provider where 1% of requests take
// 10x the median, 200 GETs/s for 60 s, without and with hedging (learned
// p95 delay, 1 hedge): hedging brings p99.9 within 1.25x of its floor (the
// p95 plus the median), at no more than 5% extra requests. With the
// provider 5x slower for 20 s in the middle, hedges stay at or below 1% of
// the requests of that period.
func TestHedgeTailSimulation(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	var plain, hedged []time.Duration
	var plainSent, hedgedSent int
	synctest.Test(t, func(t *testing.T) {
		base := &tailBase{start: time.Now(), rng: rand.New(rand.NewPCG(1, 1))}
		plain = tailRun(t, base)
		plainSent = base.sent
	})
	synctest.Test(t, func(t *testing.T) {
		base := &tailBase{start: time.Now(), rng: rand.New(rand.NewPCG(1, 1))}
		hedged = tailRun(t, base, httpretry.WithHedging(0, 0.95, 1))
		hedgedSent = base.sent
	})
	floor := pct(plain, 0.95) + pct(plain, 0.5)
	extra := float64(hedgedSent-len(hedged)) / float64(len(hedged))
	t.Logf("no hedging: p50 %v p99 %v p99.9 %v, %d requests for %d calls", pct(plain, 0.5), pct(plain, 0.99), pct(plain, 0.999), plainSent, len(plain))
	t.Logf("hedging:    p50 %v p99 %v p99.9 %v, %d requests for %d calls (%.1f%% extra); floor %v",
		pct(hedged, 0.5), pct(hedged, 0.99), pct(hedged, 0.999), hedgedSent, len(hedged), 100*extra, floor)
	if p := pct(hedged, 0.999); float64(p) > 1.25*float64(floor) {
		t.Errorf("hedged p99.9 %v above 1.25x its floor %v", p, floor)
	}
	if extra > 0.05 {
		t.Errorf("hedging sent %.1f%% extra requests, want at most 5%%", 100*extra)
	}

	// Overload: 5x slower for 20 s, from the middle of a window.
	synctest.Test(t, func(t *testing.T) {
		base := &tailBase{start: time.Now(), rng: rand.New(rand.NewPCG(1, 1)), slowFrom: 23300 * time.Millisecond, slowTo: 43300 * time.Millisecond, slow: 5}
		tailRun(t, base, httpretry.WithHedging(0, 0.95, 1))
		in := 0
		for _, h := range base.hedges {
			if h >= base.slowFrom && h < base.slowTo {
				in++
			}
		}
		calls := int((base.slowTo - base.slowFrom) / (5 * time.Millisecond))
		t.Logf("provider 5x slower for 20 s: %d hedges for %d calls in that period (%.2f%%); %d in the whole run of 12000",
			in, calls, 100*float64(in)/float64(calls), len(base.hedges))
		if float64(in) > 0.01*float64(calls) {
			t.Errorf("%d hedges during the slow period, above 1%% of its %d calls", in, calls)
		}
	})
}
