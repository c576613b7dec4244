package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestSimJitterPrintsReferenceTable(t *testing.T) {
	want, err := os.ReadFile("testdata/jitter.golden")
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "sim", "jitter")
	if code != 0 || errs != "" {
		t.Fatalf("sim jitter: exit %d, stderr %q", code, errs)
	}
	if out != string(want) {
		t.Errorf("sim jitter output differs from testdata/jitter.golden (the reference table of docs/backoff.md):\n%s", out)
	}
}

func TestSimJitterJSON(t *testing.T) {
	code, out, _ := runCLI(t, "sim", "jitter", "--json", "--strategies", "full", "--clients", "10", "--rounds", "2")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	var v struct {
		Config struct {
			Clients int `json:"clients"`
		} `json:"config"`
		Results []struct {
			Strategy string `json:"strategy"`
			Rounds   []struct {
				Round    int `json:"round"`
				Occupied int `json:"occupied_windows"`
				Peak     int `json:"peak"`
			} `json:"rounds"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("--json output is not JSON: %v\n%s", err, out)
	}
	if v.Config.Clients != 10 || len(v.Results) != 1 || v.Results[0].Strategy != "full" || len(v.Results[0].Rounds) != 2 {
		t.Errorf("unexpected JSON: %+v", v)
	}
}

func TestSimJitterCharts(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ name, magic string }{
		{"j.png", "\x89PNG\r\n\x1a\n"},
		{"j.svg", "<?xml"},
	} {
		file := filepath.Join(dir, tt.name)
		if code, _, errs := runCLI(t, "sim", "jitter", "--chart", file); code != 0 {
			t.Fatalf("--chart %s: exit %d: %s", tt.name, code, errs)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(string(data), tt.magic) || len(data) < 5000 {
			t.Errorf("%s: %d bytes starting %q, want a real image", tt.name, len(data), data[:min(8, len(data))])
		}
	}
}
