package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
)

// TestDemoSmall runs the live demo for a fraction of a second. It checks
// the accounting and the output's shape, not the figures, which depend on
// the machine.
func TestDemoSmall(t *testing.T) {
	t.Parallel() // see TestMain
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
	code, out, errs = runCLI(t, args...)
	if code != 0 {
		t.Fatalf("demo: exit %d: %s", code, errs)
	}
	checkWidth(t, "demo", out)
	lines := strings.Split(out, "\n")
	for i, run := range r.Runs {
		if !strings.HasPrefix(lines[i], fmt.Sprintf("%d %s", i+1, run.Name)) || !strings.Contains(lines[i], "the load in the outage") {
			t.Errorf("demo: line %d is %q, want the headline of run %q", i+1, lines[i], run.Name)
		}
	}
	if !strings.HasPrefix(errs, "stormguard demo: 4 runs") || !strings.Contains(errs, "about") {
		t.Errorf("demo: stderr %q, want what it runs and about how long first", errs)
	}
	code, out, _ = runCLI(t, append(args, "--wide", "--quiet")...)
	if code != 0 || !strings.Contains(out, "stormguard per client, 503 + Retry-After 1s") || !strings.Contains(out, "started in outage: ok") {
		t.Errorf("demo --wide: exit %d, want the table; output:\n%s", code, out)
	}
}

// checkWidth checks that every line of out fits in maxColumns.
func checkWidth(t *testing.T, what, out string) {
	t.Helper()
	for i, line := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(line); n > maxColumns {
			t.Errorf("%s: line %d is %d columns wide, at most %d: %q", what, i+1, n, maxColumns, line)
		}
	}
}

// TestDemoText checks the demo's text on results made up for it: one
// headline line per run first (names cut to fit), a sparkline per run on
// one scale, the outage marked, every line within 100 columns; --wide adds
// the table.
func TestDemoText(t *testing.T) {
	const window = 50 * time.Millisecond
	cfg := demoConfig{Clients: 200, Every: 200 * time.Millisecond, Duration: 7 * time.Second, FailAt: 2 * time.Second,
		FailFor: 2 * time.Second, Window: window, Deadline: 15 * time.Second}
	mk := func(name string, peak int64, amp, goodput float64) *live.Result {
		r := &live.Result{Name: name, Windows: make([]live.Window, 440)}
		for i := range r.Windows {
			r.Windows[i].Start = time.Duration(i) * window
			if i < 300 {
				r.Windows[i].Attempts = 50
			}
		}
		r.Windows[60].Attempts = peak // 3 s: in the outage
		r.Summary = live.Summary{OutageAmplification: amp, Goodput: goodput}
		return r
	}
	for _, tt := range []struct {
		name string
		runs []*live.Result
	}{
		{"the demo's runs", []*live.Result{
			mk("naive (every 1s), 503", 763, 4.912, 0.618),
			mk("stormguard per client, 503", 214, 1.29, 0.669),
			mk("stormguard per client, 503 + Retry-After 2s", 116, 1, 0.99996),
			mk("stormguard gateway (one transport, limit), 503", 105, 0.0123, 1),
		}},
		{"twelve runs with long names", func() []*live.Result {
			var rs []*live.Result
			for i := range 12 {
				rs = append(rs, mk(fmt.Sprintf("run %d %s", i, strings.Repeat("with a very long name ", 5)), int64(100*i), 123.456, 0.5))
			}
			return rs
		}()},
	} {
		r := &demoResult{Config: cfg, Runs: tt.runs}
		var b strings.Builder
		if err := r.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		checkWidth(t, tt.name, out)
		lines := strings.Split(out, "\n")
		num := len(fmt.Sprint(len(tt.runs)))
		for i, run := range tt.runs {
			h := lines[i]
			label := fmt.Sprintf("%*d ", num, i+1)
			name := strings.TrimSuffix(clip(run.Name, 40), "…")[:20]
			if !strings.HasPrefix(h, label+name) || !strings.Contains(h, times(run.Summary.OutageAmplification)+" the load in the outage") ||
				!strings.HasSuffix(h, percent(run.Summary.Goodput)+" served") {
				t.Errorf("%s: line %d is %q, want run %d's headline", tt.name, i+1, h, i+1)
			}
		}
		// After a blank line and the scale, a sparkline per run, then the
		// outage under them.
		sparks := lines[len(tt.runs)+2:]
		for i := range tt.runs {
			label := fmt.Sprintf("%*d ", num, i+1)
			if l := sparks[i]; !strings.HasPrefix(l, label) || strings.Trim(l[len(label):], " "+string(sparkLevels)) != "" ||
				!strings.ContainsRune(l, '█') && !strings.ContainsRune(l, '▂') {
				t.Errorf("%s: line %q, want run %d's sparkline", tt.name, l, i+1)
			}
		}
		if !strings.Contains(sparks[len(tt.runs)], "─━━━━━━━━━━─") || !strings.Contains(out, "━ the outage, 2s to 4s") {
			t.Errorf("%s: no outage marked under the sparklines:\n%s", tt.name, out)
		}
		r.wide = true
		b.Reset()
		if err := r.WriteText(&b); err != nil || !strings.Contains(b.String(), "started in outage: ok") {
			t.Errorf("%s: --wide: %v, want the table:\n%s", tt.name, err, b.String())
		}
	}
	if got := headline(live.Summary{OutageAmplification: 4.912, Goodput: 0.618}); got != "4.91x the load in the outage,  61.8% served" {
		t.Errorf("headline = %q", got)
	}
}

func TestPercent(t *testing.T) {
	for _, tt := range []struct {
		x    float64
		want string
	}{{1, "100%"}, {0.99996, "99.9%"}, {0.9994, "99.9%"}, {0.618, "61.8%"}, {0, "0.0%"}} {
		if got := percent(tt.x); got != tt.want {
			t.Errorf("percent(%v) = %q, want %q", tt.x, got, tt.want)
		}
	}
}
