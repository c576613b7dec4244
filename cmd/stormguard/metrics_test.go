package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

var metricsURLLine = regexp.MustCompile(`serving metrics at (http://\S+/metrics)`)

// TestDemoMetrics runs a short demo with --metrics and scrapes it: the
// demo's own series for every run from before the first run ends, then
// the runs' series labelled with their names (stormguard's metrics for
// the stormguard runs, http.client.request.duration for all four), the
// service name, and the endpoint still up after the runs, until the
// demo's context ends; and every query of the Grafana dashboard in docs/
// against that scrape.
//
// The provider fails from the start of each run to well past its end (20 s;
// a run ends by its calls' 2 s deadline), so that every attempt of every
// run fails however late a loaded machine sends it, and the series the
// dashboard reads exist after the runs whatever the scheduling: retries and
// give-ups of every stormguard run, and the gateway's breaker, which its
// calls' failed attempts trip (20 of them at least, its MinCalls) and
// behind which the later ones wait. A short outage inside the 300 ms of
// sending would be missed by requests sent late, and a breaker that never
// changes state exports no series (docs/metrics.md).
func TestDemoMetrics(t *testing.T) {
	t.Parallel() // see TestMain
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, []string{"demo", "--metrics", "127.0.0.1:0", "--clients", "10", "--every", "50ms",
			"--duration", "300ms", "--fail-at", "0s", "--fail-for", "20s", "--retry-after", "1s", "--deadline", "2s",
			"--window", "10ms", "--naive-every", "20ms", "--naive-tries", "3"}, &out, &errs)
	}()
	url := ""
	for deadline := time.Now().Add(30 * time.Second); url == "" && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if m := metricsURLLine.FindStringSubmatch(errs.String()); m != nil {
			url = m[1]
		}
	}
	if url == "" {
		t.Fatalf("demo --metrics printed no URL: %q", errs.String())
	}
	runs := []string{"naive (every 20ms), 503", "stormguard per client, 503", "stormguard per client, 503 + Retry-After 1s",
		"stormguard gateway (one transport, limit), 503"}

	// From the start: the demo's series of every run.
	first := scrape(t, url)
	for _, run := range runs {
		want := `stormguard_demo_calls_total{otel_scope_name="github.com/stormguard/stormguard/cmd/stormguard",otel_scope_schema_url="",otel_scope_version="",stormguard_outcome="offered",stormguard_run="` + run + `"}`
		if !strings.Contains(first, want) {
			t.Errorf("first scrape lacks %s:\n%s", want, first)
		}
	}

	for deadline := time.Now().Add(time.Minute); !strings.Contains(errs.String(), "the metrics stay up at "+url+" until Ctrl-C"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the demo did not say its metrics stay up: %q", errs.String())
		}
	}
	last := scrape(t, url) // after the runs: still served
	for _, run := range runs {
		label := `stormguard_run="` + run + `"`
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^stormguard_demo_calls_total\{.*stormguard_outcome="offered",` + regexp.QuoteMeta(label) + `\} 60$`),
			regexp.MustCompile(`(?m)^stormguard_demo_running\{.*` + regexp.QuoteMeta(label) + `\} 0$`),
			regexp.MustCompile(`(?m)^stormguard_demo_provider_attempts_total\{.*` + regexp.QuoteMeta(label) + `\} [1-9]`),
			regexp.MustCompile(`(?m)^http_client_request_duration_seconds_count\{.*http_request_method="GET".*` + regexp.QuoteMeta(label) + `\} [1-9]`),
			regexp.MustCompile(`(?m)^target_info\{.*service_name="stormguard-demo",` + regexp.QuoteMeta(label)),
		} {
			if !want.MatchString(last) {
				t.Errorf("the scrape after the runs has no line matching %s", want)
			}
		}
		attempts := regexp.MustCompile(`(?m)^stormguard_attempts_total\{.*` + regexp.QuoteMeta(label) + `.*\} [1-9]`)
		if stormguard := strings.HasPrefix(run, "stormguard"); attempts.MatchString(last) != stormguard {
			t.Errorf("run %q: stormguard_attempts_total present %v, want %v", run, !stormguard, stormguard)
		}
	}
	checkDashboard(t, last)
	if strings.Contains(last, "unknown_service") {
		t.Errorf("the scrape names an unknown service:\n%s", last)
	}
	if t.Failed() {
		t.Logf("the scrape after the runs:\n%s", last)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("demo --metrics ended with exit %d after the runs, want 0; stderr:\n%s", code, errs.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("demo --metrics did not end within a minute of its context")
	}
	if resp, err := http.Get(url); err == nil {
		resp.Body.Close()
		t.Errorf("the metrics are still served after the demo ended")
	}

	code, _, stderr := runCLI(t, "demo", "--metrics", "256.0.0.1:1")
	if code != 2 || !strings.Contains(stderr, "-metrics") {
		t.Errorf("demo --metrics on a bad address: exit %d, stderr %q; want 2 naming the flag", code, stderr)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d, %v", url, resp.StatusCode, err)
	}
	return string(body)
}

var (
	promMatchers   = regexp.MustCompile(`\{[^}]*\}`)
	promBy         = regexp.MustCompile(`\bby \(([^)]*)\)`)
	promLabel      = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)`)
	promIdentifier = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	legendLabel    = regexp.MustCompile(`\{\{\s*([a-z_]+)\s*\}\}`)
)

// checkDashboard checks every query of docs/grafana-dashboard.json against
// scraped, the demo's exposition: each metric it names is exported, and
// carries each label the query and its legend use.
func checkDashboard(t *testing.T, scraped string) {
	t.Helper()
	data, err := os.ReadFile("../../docs/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr, LegendFormat string }
		}
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	queries := 0
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			queries++
			var labels []string
			for _, m := range promMatchers.FindAllString(q.Expr, -1) {
				for _, l := range promLabel.FindAllStringSubmatch(m, -1) {
					labels = append(labels, l[1])
				}
			}
			for _, m := range promBy.FindAllStringSubmatch(q.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					if l = strings.TrimSpace(l); l != "le" {
						labels = append(labels, l)
					}
				}
			}
			for _, m := range legendLabel.FindAllStringSubmatch(q.LegendFormat, -1) {
				labels = append(labels, m[1])
			}
			rest := promBy.ReplaceAllString(promMatchers.ReplaceAllString(q.Expr, ""), "")
			metrics := 0
			for _, name := range promIdentifier.FindAllString(rest, -1) {
				if !strings.HasPrefix(name, "stormguard_") && !strings.HasPrefix(name, "http_") {
					continue // a function, an operator, a range
				}
				metrics++
				lines := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(name)+`\{.*$`).FindAllString(scraped, -1)
				if len(lines) == 0 {
					t.Errorf("dashboard panel %q: the demo exports no %s", p.Title, name)
					continue
				}
				for _, l := range labels {
					if !strings.Contains(strings.Join(lines, "\n"), l+`="`) {
						t.Errorf("dashboard panel %q: %s has no label %s", p.Title, name, l)
					}
				}
			}
			if metrics == 0 {
				t.Errorf("dashboard panel %q: query %q names no metric", p.Title, q.Expr)
			}
		}
	}
	if queries < 8 {
		t.Errorf("the dashboard has %d queries, want at least 8", queries)
	}
}
