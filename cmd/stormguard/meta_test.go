package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// metaArgs is a short matrix for the tests: a small provider, a 3 s
// trigger at 3 s of a 12 s run.
var metaArgs = []string{"sim", "meta", "--quiet", "--capacity", "200", "--workers", "10", "--clients", "4",
	"--trigger-start", "3s", "--trigger-for", "3s", "--horizon", "12s", "--deadline", "5s"}

// TestSimMetaText: the table fits 100 columns, has a block per trigger and
// a row per setup in each; --wide adds columns.
func TestSimMetaText(t *testing.T) {
	code, out, errs := runCLI(t, metaArgs...)
	if code != 0 {
		t.Fatalf("sim meta: exit %d: %s", code, errs)
	}
	for i, line := range strings.Split(out, "\n") {
		if n := len([]rune(line)); n > maxColumns {
			t.Errorf("sim meta: line %d is %d columns wide, at most %d: %q", i+1, n, maxColumns, line)
		}
	}
	for _, want := range []string{"\n503 for 3s\n", "\nhang for 3s", "\nservice time x5 for 3s\n", "\ncapacity cut by 80% for 3s\n",
		"policy ", "recovers", "\nfixed-1s ", "\n+limit "} {
		if !strings.Contains(out, want) {
			t.Errorf("sim meta output lacks %q:\n%s", want, out)
		}
	}
	if got := strings.Count(out, "\n+wait "); got != 4 {
		t.Errorf("sim meta: %d +wait rows, want one per trigger (4):\n%s", got, out)
	}
	_, wide, _ := runCLI(t, append(metaArgs, "--wide", "--triggers", "hang")...)
	if !strings.Contains(wide, "timedout") || strings.Contains(wide, "\n503 for") {
		t.Errorf("sim meta --wide --triggers hang: want the wide columns and the hang only:\n%s", wide)
	}
}

// TestSimMetaJSONAndChart: --json has a run per trigger asked for, each
// with a result per setup asked for; --chart draws a file.
func TestSimMetaJSONAndChart(t *testing.T) {
	file := filepath.Join(t.TempDir(), "meta.svg")
	code, out, errs := runCLI(t, append(metaArgs, "--json", "--triggers", "503,cut80", "--policies", "fixed-1s,+limit", "--chart", file)...)
	if code != 0 {
		t.Fatalf("sim meta --json: exit %d: %s", code, errs)
	}
	var r struct {
		Runs []struct {
			Trigger string `json:"trigger"`
			Results []struct {
				Phases map[string]any `json:"phases"`
			} `json:"results"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("sim meta --json: not JSON: %v", err)
	}
	if len(r.Runs) != 2 || r.Runs[0].Trigger != "503" || r.Runs[1].Trigger != "cut80" || len(r.Runs[1].Results) != 2 {
		t.Fatalf("sim meta --json: runs %+v, want 503 and cut80 with 2 results each", r.Runs)
	}
	if _, ok := r.Runs[0].Results[0].Phases["recovered"]; !ok {
		t.Errorf("sim meta --json: phases %v lack recovered", r.Runs[0].Results[0].Phases)
	}
	data, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(data), "<svg") {
		t.Errorf("sim meta --chart %s: not an SVG (%v)", file, err)
	}
}
