package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSimLayers(t *testing.T) {
	code, out, errs := runCLI(t, "sim", "layers")
	if code != 0 {
		t.Fatalf("sim layers: exit %d: %s", code, errs)
	}
	for _, row := range []string{
		"     1          3          3", "     2          9          3",
		"     3         27          3", "     4         81          3",
	} {
		if !strings.Contains(out, row) {
			t.Errorf("sim layers output lacks row %q:\n%s", row, out)
		}
	}
}

func TestSimOutageAndContentionJSON(t *testing.T) {
	tests := []struct {
		args []string
		key  string
		n    int
	}{
		{[]string{"sim", "outage", "--json", "--policies", "fixed-1s,full+budget", "--horizon", "20s"}, "results", 2},
		{[]string{"sim", "outage", "--json", "--low-volume", "--clients", "500", "--policies", "full", "--horizon", "20s"}, "results", 1},
		{[]string{"sim", "contention", "--json", "--clients", "10,20", "--runs", "3", "--strategies", "full,equal"}, "results", 2},
		{[]string{"sim", "layers", "--json", "--layers", "3"}, "rows", 3},
	}
	for _, tt := range tests {
		code, out, errs := runCLI(t, tt.args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", tt.args, code, errs)
		}
		var v map[string]json.RawMessage
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%v: not JSON: %v", tt.args, err)
		}
		var items []json.RawMessage
		if err := json.Unmarshal(v[tt.key], &items); err != nil || len(items) != tt.n {
			t.Errorf("%v: %q has %d items (%v), want %d", tt.args, tt.key, len(items), err, tt.n)
		}
	}
	// --low-volume with --clients keeps the given clients and the low rate.
	_, out, _ := runCLI(t, "sim", "outage", "--json", "--low-volume", "--clients", "500", "--policies", "full", "--horizon", "20s")
	var r struct {
		Config struct {
			Clients int     `json:"clients"`
			Rate    float64 `json:"rate_per_client"`
		} `json:"config"`
	}
	json.Unmarshal([]byte(out), &r)
	if r.Config.Clients != 500 || r.Config.Rate != 0.1 {
		t.Errorf("--low-volume --clients 500: config %+v, want 500 clients at 0.1/s", r.Config)
	}
}

func TestSimContentionSameAsLibrary(t *testing.T) {
	// The CLI's range syntax expands to the same N values as a list.
	_, a, _ := runCLI(t, "sim", "contention", "--json", "--clients", "10-30/10", "--runs", "2")
	_, b, _ := runCLI(t, "sim", "contention", "--json", "--clients", "10,20,30", "--runs", "2")
	var x, y any
	json.Unmarshal([]byte(a), &x)
	json.Unmarshal([]byte(b), &y)
	if x == nil || !reflect.DeepEqual(x, y) {
		t.Error("--clients 10-30/10 and 10,20,30 gave different results")
	}
}

func TestStormCharts(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"sim", "layers"},
		{"sim", "outage", "--policies", "fixed-1s,full", "--horizon", "20s"},
		{"sim", "contention", "--clients", "10,20", "--runs", "2"},
	} {
		file := filepath.Join(dir, strings.ReplaceAll(args[1], " ", "_")+".svg")
		if code, _, errs := runCLI(t, append(args, "--chart", file)...); code != 0 {
			t.Fatalf("%v --chart: exit %d: %s", args, code, errs)
		}
		data, err := os.ReadFile(file)
		if err != nil || !strings.Contains(string(data), "<svg") {
			t.Errorf("%v --chart %s: not an SVG (%v)", args, file, err)
		}
	}
}
