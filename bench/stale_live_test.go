package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/bench/internal/live"
	"github.com/stormguard/stormguard/httpretry"
)

// The live stale-cache scenario (issue 23): a loopback provider answers
// every GET with "Cache-Control: max-age=1, stale-if-error=60", then is down
// (503) for 10 s; 50 callers share one stormguard transport (a gateway) and
// each sends one GET every 100 ms, to one of 100 URLs. Once
// without a cache, once with WithStaleCache: per second, how many GETs got
// a fresh answer, a stale one from the cache (and how stale), or a failure,
// and how many attempts reached the provider.
//
// TestLiveStaleCache takes about 35 s of real time and runs only when
// STORMGUARD_LIVE_CACHE=1 is set; STORMGUARD_LIVE_CACHE_MD=file also writes
// its tables to file. It is a measurement, not a test: it fails only if
// the scenario cannot run.

const (
	cacheFailAt   = 3 * time.Second
	cacheFailFor  = 10 * time.Second
	cacheDuration = 16 * time.Second
	cacheClients  = 50
	cacheEvery    = 100 * time.Millisecond
	cacheURLs     = 100
	cacheDeadline = 2 * time.Second
)

// cacheSecond is what the callers got in one second of the run.
type cacheSecond struct {
	fresh, stale, failed int
	maxStale             int // seconds past freshness, of the stale answers
}

type cacheSetup struct {
	name string
	opts []httpretry.Option
}

func TestLiveStaleCache(t *testing.T) {
	if os.Getenv("STORMGUARD_LIVE_CACHE") != "1" {
		t.Skip("live stale-cache scenario: about 35 s of real time on loopback; set STORMGUARD_LIVE_CACHE=1 to run it")
	}
	setups := []cacheSetup{
		{"stormguard, no cache", nil},
		{"stormguard + WithStaleCache(32 MiB, 0, false)", []httpretry.Option{httpretry.WithStaleCache(32<<20, 0, false)}},
	}
	start := time.Now().UTC()
	var md strings.Builder
	fmt.Fprintf(&md, "Run %s on %s/%s, %d CPUs, %s; load average before: %s\n\n",
		start.Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), loadavg())
	fmt.Fprintf(&md, "503 from %v to %v; responses say `Cache-Control: max-age=1, stale-if-error=60`; %d callers x 1 GET every %v "+
		"(%.0f req/s) to %d URLs for %v through one transport (defaults otherwise), deadline %v per GET.\n\n",
		cacheFailAt, cacheFailAt+cacheFailFor, cacheClients, cacheEvery, float64(cacheClients)/cacheEvery.Seconds(), cacheURLs, cacheDuration, cacheDeadline)
	for _, s := range setups {
		secs, windows, err := runStaleCache(s)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		table := staleCacheTable(s.name, secs, windows)
		t.Log("\n" + table)
		md.WriteString(table)
		md.WriteString("\n")
	}
	fmt.Fprintf(&md, "Took %v; load average after: %s\n", time.Since(start).Round(time.Second), loadavg())
	if f := os.Getenv("STORMGUARD_LIVE_CACHE_MD"); f != "" {
		if err := os.WriteFile(f, []byte(md.String()), 0o644); err != nil {
			t.Errorf("writing %s: %v", f, err)
		}
	}
}

// runStaleCache runs the scenario once with setup s.
func runStaleCache(s cacheSetup) ([]cacheSecond, []live.Window, error) {
	p, err := live.NewProvider(live.ProviderConfig{FailAt: cacheFailAt, FailFor: cacheFailFor, Window: time.Second, Horizon: cacheDuration + time.Second})
	if err != nil {
		return nil, nil, err
	}
	p.Wrap(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Cache-Control", "max-age=1, stale-if-error=60")
			next.ServeHTTP(w, r)
		})
	})
	url, stop, err := p.Listen()
	if err != nil {
		return nil, nil, err
	}
	defer stop()
	base := newLiveBase()
	defer base.CloseIdleConnections()
	tr, err := httpretry.NewTransport(base, s.opts...)
	if err != nil {
		return nil, nil, err
	}
	client := &http.Client{Transport: tr}

	var mu sync.Mutex
	secs := make([]cacheSecond, int(cacheDuration/time.Second)+1)
	record := func(at time.Duration, f func(*cacheSecond)) {
		mu.Lock()
		f(&secs[min(int(at/time.Second), len(secs)-1)])
		mu.Unlock()
	}
	p.Start()
	t0 := time.Now()
	var wg sync.WaitGroup
	for c := range cacheClients {
		wg.Go(func() {
			time.Sleep(time.Duration(c) * cacheEvery / cacheClients) // spread the callers over the period
			for i := 0; ; i++ {
				at := time.Since(t0)
				if at >= cacheDuration {
					return
				}
				get1(client, fmt.Sprintf("%s/item/%d", url, (c*7+i)%cacheURLs), at, record)
				if d := time.Duration(i+1)*cacheEvery - time.Since(t0) + time.Duration(c)*cacheEvery/cacheClients; d > 0 {
					time.Sleep(d)
				}
			}
		})
	}
	wg.Wait()
	return secs, p.Windows(), nil
}

// get1 sends one GET and records what it got in the second it was sent.
func get1(client *http.Client, url string, at time.Duration, record func(time.Duration, func(*cacheSecond))) {
	ctx, cancel := context.WithTimeout(context.Background(), cacheDeadline)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := client.Do(req)
	if err != nil {
		record(at, func(s *cacheSecond) { s.failed++ })
		return
	}
	_, rerr := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mark := resp.Header.Get("Stormguard-Stale")
	switch {
	case rerr != nil || resp.StatusCode != http.StatusOK:
		record(at, func(s *cacheSecond) { s.failed++ })
	case mark != "":
		_, v, _ := strings.Cut(mark, ";stale=")
		n, _ := strconv.Atoi(v)
		record(at, func(s *cacheSecond) { s.stale++; s.maxStale = max(s.maxStale, n) })
	default:
		record(at, func(s *cacheSecond) { s.fresh++ })
	}
}

// staleCacheTable formats one run: a summary of the outage and a row per
// second.
func staleCacheTable(name string, secs []cacheSecond, ws []live.Window) string {
	var b strings.Builder
	var out cacheSecond
	var outAttempts int64
	for i, s := range secs {
		at := time.Duration(i) * time.Second
		if at >= cacheFailAt && at < cacheFailAt+cacheFailFor {
			out.fresh += s.fresh
			out.stale += s.stale
			out.failed += s.failed
			out.maxStale = max(out.maxStale, s.maxStale)
			if i < len(ws) {
				outAttempts += ws[i].Attempts
			}
		}
	}
	total := out.fresh + out.stale + out.failed
	fmt.Fprintf(&b, "#### %s\n\nIn the outage: %d GETs, %d answered from the cache (%.1f%%, at most %d s stale), %d failed; %d attempts reached the provider.\n\n",
		name, total, out.stale, 100*float64(out.stale)/float64(max(total, 1)), out.maxStale, out.failed, outAttempts)
	b.WriteString("| second | fresh | from cache | most stale (s) | failed | attempts at the provider |\n|--:|--:|--:|--:|--:|--:|\n")
	for i, s := range secs {
		var att int64
		if i < len(ws) {
			att = ws[i].Attempts
		}
		fmt.Fprintf(&b, "| %d | %d | %d | %d | %d | %d |\n", i, s.fresh, s.stale, s.maxStale, s.failed, att)
	}
	return b.String()
}
