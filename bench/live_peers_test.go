package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	cenkalti "github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/stormguard/stormguard/bench/internal/live"
	"github.com/stormguard/stormguard/httpretry"
)

// The live peer comparison: one loopback outage (package live's Provider
// answers 503 from 2 s to 5 s, with or without Retry-After), hit by a fleet
// of 1000 clients each sending one GET a second, once per HTTP retry setup:
// a naive fixed-interval loop, go-retryablehttp, cenkalti/backoff v5,
// failsafe-go's HTTP retry policy and stormguard's transport, each as its
// defaults. Attempts are counted at the server, per 50 ms window.
//
// Every simulated client gets its own client object (its own retryablehttp
// client, failsafe round tripper or stormguard transport, with whatever
// per-client state the library keeps), as separate processes would; all of
// them send through one shared *http.Transport per run so that connection
// handling is the same for everyone.
//
// TestLivePeers takes real time (about 90 s) and runs only when
// STORMGUARD_LIVE_PEERS=1 is set. TestLivePeerSetups, always on, checks
// that each setup really retries a 503 against a live provider, so that the
// measurement cannot silently measure a pass-through.

// liveSetup is one HTTP retry setup under test.
type liveSetup struct {
	name string
	// how says how the library is set up, for the report.
	how string
	// newCall returns the call of one simulated client; it builds that
	// client's own client object over base.
	newCall func(base *http.Transport, url string) live.Call
}

// Live comparison settings.
const (
	liveNaiveEvery = time.Second
	liveNaiveTries = 5
)

// liveSetups lists the setups compared, the naive reference first.
func liveSetups() []liveSetup {
	return []liveSetup{
		{
			name: fmt.Sprintf("naive (fixed %v, %d tries)", liveNaiveEvery, liveNaiveTries),
			how:  "live.Naive: a hand-rolled loop, fixed 1 s sleep, 5 tries, ignores Retry-After",
			newCall: func(base *http.Transport, url string) live.Call {
				return live.Naive(&http.Client{Transport: base}, url, liveNaiveEvery, liveNaiveTries)
			},
		},
		{
			name: "go-retryablehttp v0.7.8",
			how: "retryablehttp.NewClient() per client, Logger = nil, HTTPClient.Transport = the shared base " +
				"(its default is a pooled transport per client); via StandardClient()",
			newCall: func(base *http.Transport, url string) live.Call {
				c := retryablehttp.NewClient()
				c.Logger = nil
				c.HTTPClient.Transport = base
				return live.Get(c.StandardClient(), url)
			},
		},
		{
			name: "cenkalti/backoff v5.0.3",
			how: "backoff.Retry(ctx, op) with no options (default ExponentialBackOff, no try limit, " +
				"15 min max elapsed); op fails on a non-2xx status and returns backoff.RetryAfter(n) when a " +
				"429 or 503 carries Retry-After: n (the library's own example does this for 429)",
			newCall: func(base *http.Transport, url string) live.Call {
				return cenkaltiCall(&http.Client{Transport: base}, url)
			},
		},
		{
			name: "failsafe-go v0.9.8",
			how: "failsafehttp.NewRoundTripper(base, failsafehttp.NewRetryPolicyBuilder().Build()) per client: " +
				"2 retries, no delay unless Retry-After (integer seconds), no jitter",
			newCall: func(base *http.Transport, url string) live.Call {
				rp := failsafehttp.NewRetryPolicyBuilder().Build()
				return live.Get(&http.Client{Transport: failsafehttp.NewRoundTripper(base, rp)}, url)
			},
		},
		{
			name: "stormguard",
			how: "httpretry.NewTransport(base) per client: 3 attempts, full jitter (100 ms base, 10 s cap), " +
				"Retry-After as a floor, per-host budget (10%, floor 1/s) and breaker (library defaults)",
			newCall: func(base *http.Transport, url string) live.Call {
				t, err := httpretry.NewTransport(base)
				if err != nil {
					panic(err) // no options: cannot fail
				}
				return live.Get(&http.Client{Transport: t}, url)
			},
		},
	}
}

// cenkaltiCall is the call of a client using cenkalti/backoff v5's Retry
// with its defaults.
func cenkaltiCall(client *http.Client, url string) live.Call {
	return func(ctx context.Context) error {
		_, err := cenkalti.Retry(ctx, func() (struct{}, error) {
			return struct{}{}, cenkaltiGet(ctx, client, url)
		})
		return err
	}
}

// cenkaltiGet is one attempt of cenkaltiCall: an error on a failure or a
// non-2xx status, a *backoff.RetryAfterError when a 429 or 503 carries a
// Retry-After in whole seconds (the shape of cenkalti's own example).
func cenkaltiGet(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return cenkalti.Permanent(err)
	}
	return cenkaltiOp(live.Do(client, req))
}

// newLiveBase is the transport every client of one run shares.
func newLiveBase() *http.Transport {
	return &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 30 * time.Second}
}

// TestLivePeerSetups checks, against a live provider that fails for the
// first second, that one call through each setup reaches the server more
// than once (it retries a 503) and that the first attempt got the 503.
func TestLivePeerSetups(t *testing.T) {
	for _, s := range liveSetups() {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			p, err := live.NewProvider(live.ProviderConfig{FailFor: time.Second, Window: time.Minute, Horizon: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			url, stop, err := p.Listen()
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			base := newLiveBase()
			defer base.CloseIdleConnections()
			call := s.newCall(base, url)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p.Start()
			err = call(ctx)
			w := p.Windows()[0]
			if w.Attempts < 2 || w.Failed < 1 {
				t.Errorf("%s: one call (err %v) made %d attempts at the server, %d failed; want at least 2 attempts after a 503",
					s.name, err, w.Attempts, w.Failed)
			}
		})
	}
	// The control: the check above tells a pass-through from a retrier.
	t.Run("control: no retries", func(t *testing.T) {
		t.Parallel()
		p, err := live.NewProvider(live.ProviderConfig{FailFor: time.Minute, Window: time.Minute, Horizon: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		url, stop, err := p.Listen()
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		base := newLiveBase()
		defer base.CloseIdleConnections()
		p.Start()
		err = live.Get(&http.Client{Transport: base}, url)(context.Background())
		if w := p.Windows()[0]; err == nil || w.Attempts != 1 {
			t.Errorf("live.Get over a bare transport = %v after %d attempts, want an error after 1", err, w.Attempts)
		}
	})
}

// TestCenkaltiGet checks the attempt function of the cenkalti setup: nil
// on a 200, a RetryAfterError carrying the hint on a 503 with Retry-After,
// a plain error on a 503 without it.
func TestCenkaltiGet(t *testing.T) {
	for _, tt := range []struct {
		code       int
		retryAfter string
		wantErr    bool
		wantAfter  time.Duration // 0: no RetryAfterError
	}{
		{200, "", false, 0},
		{503, "", true, 0},
		{503, "2", true, 2 * time.Second},
		{429, "1", true, time.Second},
		{503, "soon", true, 0},
		{500, "2", true, 0},
	} {
		p := &staticHandler{code: tt.code, retryAfter: tt.retryAfter}
		srv := newHTTPServer(t, p.ServeHTTP)
		err := cenkaltiGet(context.Background(), srv.Client(), srv.URL)
		var ra *cenkalti.RetryAfterError
		gotAfter := time.Duration(0)
		if errors.As(err, &ra) {
			gotAfter = ra.Duration
		}
		if (err != nil) != tt.wantErr || gotAfter != tt.wantAfter {
			t.Errorf("cenkaltiGet(%d, Retry-After %q) = %v (retry after %v), want error %v, retry after %v",
				tt.code, tt.retryAfter, err, gotAfter, tt.wantErr, tt.wantAfter)
		}
	}
}

// staticHandler answers every request with code and, if set, Retry-After.
type staticHandler struct {
	code       int
	retryAfter string
}

func (h *staticHandler) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if h.retryAfter != "" {
		w.Header().Set("Retry-After", h.retryAfter)
	}
	w.WriteHeader(h.code)
}

// liveScenario is the outage every setup faces in TestLivePeers.
type liveScenario struct {
	provider live.ProviderConfig
	fleet    live.FleetConfig
}

func defaultLiveScenario(retryAfter time.Duration) liveScenario {
	fleet := live.FleetConfig{Clients: 1000, Every: time.Second, Duration: 8 * time.Second, Deadline: 30 * time.Second}
	return liveScenario{
		provider: live.ProviderConfig{
			FailAt: 2 * time.Second, FailFor: 3 * time.Second, RetryAfter: retryAfter,
			Window: 50 * time.Millisecond, Horizon: fleet.Duration + fleet.Deadline,
		},
		fleet: fleet,
	}
}

// TestLivePeers runs the live comparison and reports it as tables (and as
// Markdown to the file named by STORMGUARD_LIVE_PEERS_MD, if set).
//
//	cd bench && STORMGUARD_LIVE_PEERS=1 go test -run='^TestLivePeers$' -v -timeout=10m .
func TestLivePeers(t *testing.T) {
	if os.Getenv("STORMGUARD_LIVE_PEERS") != "1" {
		t.Skip("live peer comparison: about 90 s of real time on loopback; set STORMGUARD_LIVE_PEERS=1 to run it")
	}
	loadBefore := loadavg()
	start := time.Now().UTC()
	var md strings.Builder
	fmt.Fprintf(&md, "Run %s on %s/%s, %d CPUs, %s; load average before: %s\n\n",
		start.Format(time.RFC3339), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), loadBefore)
	for _, ra := range []time.Duration{0, 2 * time.Second} {
		sc := defaultLiveScenario(ra)
		var results []*live.Result
		for _, s := range liveSetups() {
			base := newLiveBase()
			r, err := live.Run(context.Background(), s.name, sc.provider, sc.fleet, func(url string, _ int) live.Call {
				return s.newCall(base, url)
			})
			base.CloseIdleConnections()
			if err != nil {
				t.Fatalf("live.Run(%s): %v", s.name, err)
			}
			results = append(results, r)
		}
		table := liveTable(sc, results)
		t.Log("\n" + table)
		md.WriteString(table)
		md.WriteString("\n")
	}
	fmt.Fprintf(&md, "Took %v; load average after: %s\n\nSetups:\n\n", time.Since(start).Round(time.Second), loadavg())
	for _, s := range liveSetups() {
		fmt.Fprintf(&md, "- **%s**: %s\n", s.name, s.how)
	}
	if f := os.Getenv("STORMGUARD_LIVE_PEERS_MD"); f != "" {
		if err := os.WriteFile(f, []byte(md.String()), 0o644); err != nil {
			t.Errorf("writing %s: %v", f, err)
		}
	}
}

// liveTable formats one scenario's results as Markdown: the summary table
// and the attempts per second at the server. The p99 column is over the
// windows of the fleet's sending time plus one second.
func liveTable(sc liveScenario, rs []*live.Result) string {
	var b strings.Builder
	pc, fc := sc.provider, sc.fleet
	hint := "no Retry-After"
	if pc.RetryAfter > 0 {
		hint = fmt.Sprintf("Retry-After: %d", int64((pc.RetryAfter+time.Second-1)/time.Second))
	}
	outEnd := pc.FailAt + pc.FailFor
	fmt.Fprintf(&b, "#### 503 from %v to %v, %s; %d clients x 1 GET every %v (%.0f req/s offered) for %v, deadline %v per call\n\n",
		pc.FailAt, outEnd, hint, fc.Clients, fc.Every, float64(fc.Clients)/fc.Every.Seconds(), fc.Duration, fc.Deadline)
	b.WriteString("| client | attempts in outage | / offered in outage | peak per 50 ms (at) | p99 per 50 ms | attempts in the 1 s after | total attempts | / offered | goodput |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rs {
		s := r.Summary
		after := attemptsIn(r.Windows, outEnd, outEnd+time.Second)
		fmt.Fprintf(&b, "| %s | %d | %.2fx | %d (%.2f s) | %d | %d | %d | %.2fx | %.1f%% |\n",
			r.Name, s.OutageAttempts, s.OutageAmplification, s.Peak, s.PeakAt.Seconds(),
			percentile(r.Windows, fc.Duration+time.Second, 0.99), after, s.Attempts, s.Amplification, 100*s.Goodput)
	}
	b.WriteString("\nAttempts at the server per second:\n\n| client |")
	last := fc.Duration + 2*time.Second
	for _, r := range rs {
		for _, w := range r.Windows {
			if w.Attempts > 0 && w.Start+time.Second > last {
				last = w.Start.Truncate(time.Second) + time.Second
			}
		}
	}
	secs := int(last / time.Second)
	for i := range secs {
		fmt.Fprintf(&b, " %d-%d s |", i, i+1)
	}
	b.WriteString("\n|---|" + strings.Repeat("--:|", secs) + "\n")
	for _, r := range rs {
		fmt.Fprintf(&b, "| %s |", r.Name)
		for i := range secs {
			at := time.Duration(i) * time.Second
			fmt.Fprintf(&b, " %d |", attemptsIn(r.Windows, at, at+time.Second))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// attemptsIn sums the attempts of the windows starting in [from, to).
func attemptsIn(ws []live.Window, from, to time.Duration) int64 {
	var n int64
	for _, w := range ws {
		if w.Start >= from && w.Start < to {
			n += w.Attempts
		}
	}
	return n
}

// percentile returns the q-quantile (0 < q <= 1, nearest rank) of the
// attempts of the windows starting before end; 0 if there are none.
func percentile(ws []live.Window, end time.Duration, q float64) int64 {
	var xs []int64
	for _, w := range ws {
		if w.Start < end {
			xs = append(xs, w.Attempts)
		}
	}
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// loadavg returns the system's load averages, or "unknown".
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// TestPercentile checks the report's p99 helper on known windows.
func TestPercentile(t *testing.T) {
	ws := make([]live.Window, 100)
	for i := range ws {
		// Attempts 100, 99, ..., 1: sorting matters.
		ws[i] = live.Window{Start: time.Duration(i) * time.Second, Attempts: int64(100 - i)}
	}
	for _, tt := range []struct {
		end  time.Duration
		q    float64
		want int64
	}{
		{100 * time.Second, 0.99, 99},
		{100 * time.Second, 0.5, 50},
		{100 * time.Second, 1, 100},
		{10 * time.Second, 0.99, 100}, // windows 0-9 hold 100..91
		{0, 0.99, 0},
	} {
		if got := percentile(ws, tt.end, tt.q); got != tt.want {
			t.Errorf("percentile(end %v, %v) = %d, want %d", tt.end, tt.q, got, tt.want)
		}
	}
}
