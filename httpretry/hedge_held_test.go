package httpretry_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// pathBase answers each request after the time its path names: the first
// copy (no attempt header) after first[path], a hedge after hedge[path]
// (default 10 ms for both), unless canceled first. It counts the hedges
// per path.
type pathBase struct {
	first, hedge map[string]time.Duration

	mu     sync.Mutex
	hedges map[string]int
}

func (b *pathBase) RoundTrip(r *http.Request) (*http.Response, error) {
	d, ok := b.first[r.URL.Path]
	if r.Header.Get(wire.AttemptHeader) != "" {
		b.mu.Lock()
		b.hedges[r.URL.Path]++
		b.mu.Unlock()
		d, ok = b.hedge[r.URL.Path]
	}
	if !ok {
		d = 10 * time.Millisecond
	}
	return okAfter(r, d)
}

// TestHedgeHeldRaceLooksAgain: a slow request (1 s) that reaches its delay
// among a burst of queued ones (55 ms each) is held back by the due-share
// bound (more than 5 races in flight past their delay), but gets its hedge
// once the burst has cleared, a delay later, instead of taking its whole
// second. 300 GETs a second of 10 ms keep a window of races. The burst's
// held races end before they look again, so the hedges are the floor's 5
// and the slow request's one.
func TestHedgeHeldRaceLooksAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &pathBase{
			first:  map[string]time.Duration{"/burst": 55 * time.Millisecond, "/slow": time.Second},
			hedge:  map[string]time.Duration{"/burst": 55 * time.Millisecond},
			hedges: map[string]int{},
		}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(20*time.Millisecond, 0.95, 1), httpretry.WithLimit(nil),
			httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: granter{}}, nil }))
		if err != nil {
			t.Fatal(err)
		}
		get := func(path string) time.Duration {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://held.test"+path, nil)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("GET %s: %v", path, err)
				return 0
			}
			resp.Body.Close()
			return time.Since(start)
		}
		var wg sync.WaitGroup
		for range 600 { // 2 s of background traffic
			wg.Go(func() { get("/fast") })
			time.Sleep(time.Second / 300)
		}
		time.Sleep(time.Millisecond) // the burst at 2.000 s, after the last background GET
		for range 10 {
			wg.Go(func() { get("/burst") })
		}
		time.Sleep(time.Millisecond)
		var slow time.Duration
		wg.Go(func() { slow = get("/slow") })
		wg.Wait()

		// The slow request (1 ms after the burst) is due at 20 ms, with 10
		// burst races past their delay: held. It looks again every 10 ms
		// (half the delay): at 30, 40 and 50 ms the burst is still in
		// flight. At 60 ms it has ended (at 54 ms from the slow one's
		// start), but its answers all came late, the last at 54 ms: a
		// queue at the host, a hedge held for half a delay after the last
		// late answer (to 64 ms). At 70 ms the hedge goes, and answers 10
		// ms later.
		if want := 80 * time.Millisecond; slow != want {
			t.Errorf("slow GET took %v, want %v (held at its delay, hedged once the burst cleared)", slow, want)
		}
		base.mu.Lock()
		defer base.mu.Unlock()
		if base.hedges["/slow"] != 1 || base.hedges["/burst"] != 5 || base.hedges["/fast"] != 0 {
			t.Errorf("hedges %v, want /slow 1, /burst 5 (the floor), /fast 0", base.hedges)
		}
	})
}
