package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/httpretry"
)

// TestDemoSmall runs the live demo for a fraction of a second. It checks
// the accounting and the output's shape, not the figures, which depend on
// the machine.
func TestDemoSmall(t *testing.T) {
	args := []string{"demo", "--clients", "10", "--every", "50ms", "--duration", "300ms", "--fail-at", "100ms",
		"--fail-for", "100ms", "--retry-after", "1s", "--deadline", "2s", "--window", "10ms", "--naive-every", "20ms", "--naive-tries", "3"}
	code, out, errs := runCLI(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("demo --json: exit %d: %s", code, errs)
	}
	var r struct {
		Runs []struct {
			Name  string `json:"name"`
			Stats struct {
				Offered, Succeeded, Failed int64
			} `json:"stats"`
			Summary struct {
				Attempts int64 `json:"attempts"`
			} `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("demo --json is not JSON: %v", err)
	}
	if len(r.Runs) != 4 {
		t.Fatalf("demo ran %d runs, want 4", len(r.Runs))
	}
	for _, run := range r.Runs {
		// 10 clients, every 50 ms for 300 ms: 60 requests.
		if run.Stats.Offered != 60 || run.Stats.Succeeded+run.Stats.Failed != 60 || run.Summary.Attempts < 1 {
			t.Errorf("run %q: stats %+v, attempts %d; want 60 offered, all accounted for", run.Name, run.Stats, run.Summary.Attempts)
		}
	}
	code, out, _ = runCLI(t, args...)
	if code != 0 || !strings.Contains(out, "stormguard per client, 503 + Retry-After 1s") || !strings.Contains(out, "stormguard gateway") ||
		!strings.Contains(out, "started in outage: ok") {
		t.Errorf("demo table: exit %d, output:\n%s", code, out)
	}
}

// TestDemoMetrics serves the transports' metrics while the demo runs: a
// scrape after the run finds the retry metrics with the provider's host.
func TestDemoMetrics(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	opt, stop, err := serveMetrics(mustListen(t, addr))
	if err != nil || opt == nil {
		t.Fatalf("serveMetrics = %v", err)
	}
	defer stop()
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer provider.Close()
	tr, err := httpretry.NewTransport(nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := (&http.Client{Transport: tr}).Get(provider.URL); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "stormguard_attempts") {
		t.Errorf("GET /metrics = %d, want 200 with the attempts of the request made:\n%s", resp.StatusCode, body)
	}
	code, _, errs := runCLI(t, "demo", "--metrics", "256.0.0.1:1")
	if code != 2 || !strings.Contains(errs, "-metrics") {
		t.Errorf("demo --metrics on a bad address: exit %d, stderr %q; want 2 naming the flag", code, errs)
	}
}

func mustListen(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return ln
}
