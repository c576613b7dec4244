package main

// Black-box attacks on the stormguard command, against README.md, docs/*.md
// and its own help. The binary is built once (buildStormguard) and driven
// with os/exec under a context timeout, so a hang fails a test.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

type atkResult struct {
	stdout, stderr string
	code           int
	elapsed        time.Duration
}

// atkRun runs the binary with args, failing the test if it does not end
// within limit.
func atkRun(t *testing.T, limit time.Duration, dir string, args ...string) atkResult {
	t.Helper()
	bin := buildStormguard(t)
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	err := cmd.Run()
	r := atkResult{stdout: so.String(), stderr: se.String(), elapsed: time.Since(start)}
	if ctx.Err() != nil {
		t.Fatalf("stormguard %q: still running after %v (a hang)", args, limit)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("stormguard %q: %v", args, err)
	}
	if strings.Contains(r.stderr, "panic:") || strings.Contains(r.stderr, "goroutine ") {
		t.Fatalf("stormguard %q panicked:\n%s", args, r.stderr)
	}
	return r
}

// atkRepo is the worktree's root (the docs' commands run from there).
func atkRepo(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// atkDocRun is a "go run ./cmd/stormguard ..." line of a doc followed by
// its output block.
type atkDocRun struct {
	file string
	line int
	args []string
	want string
}

// atkDocRuns returns the commands of file that are followed by an output
// block (the next fenced block after the command's own).
func atkDocRuns(t *testing.T, file string) []atkDocRun {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(atkRepo(t), file))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var runs []atkDocRun
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(l, "go run ./cmd/stormguard sim ") {
			continue
		}
		j := i + 1
		for j < len(lines) && !strings.HasPrefix(lines[j], "```") {
			j++
		}
		k := j + 1
		for k < len(lines) && strings.TrimSpace(lines[k]) == "" {
			k++
		}
		if k >= len(lines) || lines[k] != "```" {
			continue // no output block
		}
		m := k + 1
		for m < len(lines) && !strings.HasPrefix(lines[m], "```") {
			m++
		}
		runs = append(runs, atkDocRun{file: file, line: i + 1,
			args: strings.Fields(strings.TrimPrefix(l, "go run ./cmd/stormguard ")),
			want: strings.Join(lines[k+1:m], "\n") + "\n"})
	}
	return runs
}

// The cheaper documented seeded runs print their output block byte for
// byte (the long meta matrix runs are left out but for one).
func TestAttackDocsDocOutputsByteForByte(t *testing.T) {
	var runs []atkDocRun
	for _, f := range []string{"docs/layers.md", "docs/backoff.md", "docs/outage.md", "docs/metastability.md"} {
		runs = append(runs, atkDocRuns(t, f)...)
	}
	checked := 0
	for _, r := range runs {
		cmd := strings.Join(r.args, " ")
		// cheap ones: layers, jitter, the default outage, one meta matrix.
		if !(strings.HasPrefix(cmd, "sim layers") || strings.HasPrefix(cmd, "sim jitter") ||
			cmd == "sim outage -quiet" || cmd == "sim outage -quiet -low-volume -capacity 2400" ||
			cmd == "sim meta -quiet --rho 0.8") {
			continue
		}
		checked++
		got := atkRun(t, 60*time.Second, atkRepo(t), r.args...)
		if got.code != 0 {
			t.Errorf("%s:%d %s: exit %d, stderr %q", r.file, r.line, cmd, got.code, got.stderr)
			continue
		}
		if got.stdout != r.want {
			t.Errorf("%s:%d %s: output differs from the doc's block\n--- doc\n%s--- got\n%s", r.file, r.line, cmd, r.want, got.stdout)
		}
	}
	if checked < 6 {
		t.Fatalf("only %d documented runs found to check", checked)
	}
}

// Bad input: exit 2, one line on stderr naming the problem, nothing on
// stdout, and at once (refused before any work).
func TestAttackDocsBadInputIsOneLineExit2(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cases := [][]string{
		{"foo"},
		{"sim", "foo"},
		{"simulate"},
		{"sim", "jitter", "--nope"},
		{"sim", "jitter", "-clients", "0"},
		{"sim", "jitter", "-clients", "-1"},
		{"sim", "jitter", "-clients", "99999999999999999999"},
		{"sim", "jitter", "-clients", "1e3"},
		{"sim", "jitter", "-window", "0"},
		{"sim", "jitter", "-window", "-1s"},
		{"sim", "jitter", "-window", "9999999999h"},
		{"sim", "jitter", "-window", "fast"},
		{"sim", "jitter", "-base", "2s", "-cap", "1s"},
		{"sim", "jitter", "-strategies", ""},
		{"sim", "jitter", "-strategies", "full,full"},
		{"sim", "jitter", "-strategies", "jumpy"},
		{"sim", "jitter", "-seed", "-1"},
		{"sim", "jitter", "-seed", "4294967296"},
		{"sim", "jitter", "-clients", "250000", "-rounds", "2"},
		{"sim", "jitter", "-clients", "1", "-clients", "2"},
		{"sim", "jitter", "extra"},
		{"sim", "jitter", "-json=maybe"},
		{"sim", "jitter", "-chart", filepath.Join(dir, "x.jpg")},
		{"sim", "jitter", "-chart", filepath.Join(dir, "nodir", "x.png")},
		{"sim", "jitter", "-chart", filepath.Join(file, "x.png")},
		{"sim", "jitter", "-chart", dir + "/.png/"},
		{"sim", "layers", "-rate", "0"},
		{"sim", "layers", "-rate", "NaN"},
		{"sim", "layers", "-rate", "+Inf"},
		{"sim", "layers", "-rate", "-5"},
		{"sim", "layers", "-budget-ratio", "1.5"},
		{"sim", "layers", "-layers", "11"},
		{"sim", "layers", "-attempts", "1000000", "-layers", "2"},
		{"sim", "layers", "-warmup", "20s"},
		{"sim", "layers", "-duration", "25h"},
		{"sim", "layers", "-rate", "1e6", "-duration", "24h"},
		{"sim", "layers", "-budget-ratio", "1", "-layers", "10"},
		{"sim", "outage", "-horizon", "0"},
		{"sim", "outage", "-window", "30ms"},
		{"sim", "outage", "-window", "2s"},
		{"sim", "outage", "-trigger-start", "16s"},
		{"sim", "outage", "-trigger-end", "90s"},
		{"sim", "outage", "-retry-after", "-1s"},
		{"sim", "outage", "-capacity", "0"},
		{"sim", "outage", "-queue", "0"},
		{"sim", "outage", "-clients", "100001"},
		{"sim", "outage", "-clients", "100000", "-rate", "1e6"},
		{"sim", "outage", "-window", "1ms", "-horizon", "24h"},
		{"sim", "outage", "-policies", "nope"},
		{"sim", "outage", "-policies", "full,,full"},
		{"sim", "outage", "-low-volume", "-rate", "1"},
		{"sim", "meta", "-rho", "0"},
		{"sim", "meta", "-rho", "2.5"},
		{"sim", "meta", "-capacity", "100000"},
		{"sim", "meta", "-workers", "4"},
		{"sim", "meta", "-workers", "0"},
		{"sim", "meta", "-queue-seconds", "0.001", "-capacity", "1"},
		{"sim", "meta", "-horizon", "0s"},
		{"sim", "meta", "-trigger-start", "59s"},
		{"sim", "meta", "-triggers", "503,503"},
		{"sim", "meta", "-triggers", "earthquake"},
		{"sim", "meta", "-policies", "+magic"},
		{"sim", "meta", "-rho", "2", "-capacity", "1666", "-deadline", "1h", "-timeout", "1ms"},
		{"sim", "contention", "-clients", "10-5"},
		{"sim", "contention", "-clients", "5-"},
		{"sim", "contention", "-clients", "1-1000/0"},
		{"sim", "contention", "-clients", "0"},
		{"sim", "contention", "-clients", "1001"},
		{"sim", "contention", "-clients", "10,,20"},
		{"sim", "contention", "-clients", "1-1000"},
		{"sim", "contention", "-runs", "0"},
		{"sim", "contention", "-runs", "10001"},
		{"sim", "contention", "-strategies", "none,none"},
		{"sim", "contention", "-base", "3s", "-cap", "2s"},
		{"sim", "contention", "-delay", "-1ms"},
		{"demo", "-clients", "0"},
		{"demo", "-clients", "5000", "-every", "1ms"},
		{"demo", "-clients", "2000", "-every", "1s", "-deadline", "20s"},
		{"demo", "-fail-at", "20s"},
		{"demo", "-duration", "0"},
		{"demo", "-deadline", "21s"},
		{"demo", "-every", "0"},
		{"demo", "-work", "-1ms"},
		{"demo", "-queue", "-1"},
		{"demo", "-naive-tries", "0"},
		{"demo", "-open-for", "0"},
		{"demo", "-serve", ":notaport"},
		{"demo", "-metrics", "localhost:99999"},
		{"demo", "-chart", filepath.Join(dir, "x.gif")},
		{"version", "-json"},
		{"version", "extra"},
		{"help", "foo"},
		{"help", "sim", "foo"},
	}
	for _, args := range cases {
		r := atkRun(t, 10*time.Second, dir, args...)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		switch {
		case r.code != 2:
			t.Errorf("stormguard %q: exit %d, want 2 (stderr %q)", args, r.code, r.stderr)
		case r.stdout != "":
			t.Errorf("stormguard %q: stdout %q, want nothing", args, r.stdout)
		case len(lines) != 1 || !strings.HasPrefix(lines[0], "stormguard"):
			t.Errorf("stormguard %q: stderr %q, want one line", args, r.stderr)
		case r.elapsed > 3*time.Second:
			t.Errorf("stormguard %q: refused after %v, want at once", args, r.elapsed)
		}
	}
}

// main.go:19 and the top-level help: "a bad one is refused before any
// work with one line on stderr and exit status 2". A --chart FILE that
// cannot be created (a dangling symbolic link, a path in /proc) passes the
// checks and fails only after the simulation, with exit status 1.
func TestAttackDocsUnwritableChartRefusedBeforeWork(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "dangling.png")
	if err := os.Symlink(filepath.Join(dir, "missing", "x.png"), link); err != nil {
		t.Fatal(err)
	}
	for _, chart := range []string{link, "/proc/stormguard-attack.png"} {
		if chart[0] == '/' && strings.HasPrefix(chart, "/proc/") {
			if _, err := os.Stat("/proc"); err != nil {
				continue
			}
		}
		r := atkRun(t, 60*time.Second, dir, "sim", "meta", "-quiet", "-chart", chart)
		if r.code != 2 {
			t.Errorf("sim meta -chart %s: exit %d after %v of work (stderr %q), want it refused before any work with exit 2",
				chart, r.code, r.elapsed.Round(10*time.Millisecond), strings.TrimSpace(r.stderr))
		}
	}
}

// --help exits 0 on stdout and lists what the docs show: every command of
// README.md's list, and the flags README.md and docs/*.md use.
func TestAttackDocsHelpListsTheDocumented(t *testing.T) {
	dir := t.TempDir()
	for _, h := range [][]string{{"help"}, {"-h"}, {"--help"}, {"-help"}} {
		r := atkRun(t, 10*time.Second, dir, h...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("stormguard %q: exit %d, stderr %q", h, r.code, r.stderr)
		}
		for _, c := range []string{"demo", "sim jitter", "sim layers", "sim outage", "sim meta", "sim contention", "version"} {
			if !strings.Contains(r.stdout, "  "+c+" ") {
				t.Errorf("stormguard %q does not list %q", h, c)
			}
		}
	}
	flags := map[string][]string{
		"demo":           {"wide", "json", "chart", "serve", "metrics", "quiet"},
		"sim jitter":     {"clients", "rounds", "base", "cap", "window", "seed", "strategies", "json", "chart"},
		"sim layers":     {"rate", "duration", "json", "chart", "quiet"},
		"sim outage":     {"quiet", "low-volume", "capacity", "chart", "json", "policies"},
		"sim meta":       {"quiet", "rho", "wide", "capacity", "workers", "trigger-start", "trigger-for", "horizon", "deadline", "seed", "triggers", "chart", "json"},
		"sim contention": {"chart", "json", "clients", "strategies"},
	}
	for cmd, fl := range flags {
		for _, form := range [][]string{append(strings.Fields(cmd), "--help"), append(strings.Fields(cmd), "-h"), append([]string{"help"}, strings.Fields(cmd)...)} {
			r := atkRun(t, 10*time.Second, dir, form...)
			if r.code != 0 || r.stderr != "" {
				t.Errorf("stormguard %q: exit %d, stderr %q", form, r.code, r.stderr)
				continue
			}
			for _, f := range fl {
				if !regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(f) + `( |$)`).MatchString(r.stdout) {
					t.Errorf("stormguard %q does not list -%s", form, f)
				}
			}
		}
	}
	r := atkRun(t, 10*time.Second, dir, "version")
	if r.code != 0 || !regexp.MustCompile(`^stormguard \S+ go\S+ \S+/\S+\n$`).MatchString(r.stdout) {
		t.Errorf("version: exit %d, %q", r.code, r.stdout)
	}
}

// atkRow returns the table row of policy in out (its first field).
func atkRow(out, policy string) string {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 1 && f[0] == policy {
			return strings.Join(f[1:], " ")
		}
	}
	return ""
}

// docs/metastability.md, "Where package limit wasted work with a shorter
// deadline": the prose gives the +limit row of that run as it is now,
// "`wasted 0%`, `recovers 0.8s`, `served 100%`, `timedout 0`, `limited
// 173`" (an attack found it still giving an older run's figures).
func TestAttackDocsMetaDeadlineRunProse(t *testing.T) {
	r := atkRun(t, 60*time.Second, t.TempDir(), "sim", "meta", "-quiet", "--capacity", "500", "--workers", "25",
		"--trigger-start", "5s", "--trigger-for", "5s", "--horizon", "30s", "--deadline", "10s", "--seed", "3", "--triggers", "503", "--wide")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// columns: before during 10s-after rest att/off wasted recovers served goodput p99 in-trig shed timedout limited
	f := strings.Fields(atkRow(r.stdout, "+limit"))
	if len(f) != 14 {
		t.Fatalf("+limit row %q: want 14 figures", f)
	}
	got := map[string]string{"wasted": f[5], "recovers": f[6], "served": f[7], "timedout": f[12], "limited": f[13]}
	want := map[string]string{"wasted": "0%", "recovers": "0.8s", "served": "100%", "timedout": "0", "limited": "173"}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("+limit %s: doc says %s, the command prints %s", k, w, got[k])
		}
	}
}
