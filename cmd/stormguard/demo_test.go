package main

import (
	"encoding/json"
	"strings"
	"testing"
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
	if len(r.Runs) != 3 {
		t.Fatalf("demo ran %d runs, want 3", len(r.Runs))
	}
	for _, run := range r.Runs {
		// 10 clients, every 50 ms for 300 ms: 60 requests.
		if run.Stats.Offered != 60 || run.Stats.Succeeded+run.Stats.Failed != 60 || run.Summary.Attempts < 1 {
			t.Errorf("run %q: stats %+v, attempts %d; want 60 offered, all accounted for", run.Name, run.Stats, run.Summary.Attempts)
		}
	}
	code, out, _ = runCLI(t, args...)
	if code != 0 || !strings.Contains(out, "stormguard, 503 + Retry-After 1s") || !strings.Contains(out, "peak per window") {
		t.Errorf("demo table: exit %d, output:\n%s", code, out)
	}
}
