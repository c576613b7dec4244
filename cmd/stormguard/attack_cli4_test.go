package main

// Black-box attack on the CLI (AREA=cli4), through run / runContext only.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// cl4SmallDemo are flags that make the four runs of the demo last about a
// second each.
var cl4SmallDemo = []string{"--quiet", "--clients", "5", "--every", "50ms", "--duration", "300ms",
	"--fail-at", "100ms", "--fail-for", "100ms", "--deadline", "400ms", "--window", "20ms"}

// cl4GoroutinesBackTo waits (up to 10 s) for the goroutine count to fall back
// to at most base, and fails with the stacks of the goroutines left.
func cl4GoroutinesBackTo(t *testing.T, base int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, stacks := cl4Goroutines()
		if n <= base {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d goroutines left, %d before the demo; stacks:\n%s", what, n, base, stacks)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cl4Goroutines counts the goroutines but the runtime's signal loop (started
// once per process by the first signal.Notify, not a leak) and returns
// their stacks.
func cl4Goroutines() (int, string) {
	buf := make([]byte, 4<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	var keep []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.TrimSpace(g) == "" || strings.Contains(g, "os/signal.signal_recv") {
			continue
		}
		n++
		keep = append(keep, g)
	}
	return n, strings.Join(keep, "\n\n")
}

var cl4MetricsLine = regexp.MustCompile(`serving metrics at (http://\S+/metrics)`)

// cl4Demo starts `demo --serve 127.0.0.1:0 --metrics 127.0.0.1:0 args...`
// and returns the page's and metrics' URLs, its stderr, its stdout, the
// cancel of its context and its exit status.
func cl4Demo(t *testing.T, args ...string) (page, metrics string, stdout, stderr *lockedBuffer, cancel func(), done <-chan int) {
	t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	stdout, stderr = new(lockedBuffer), new(lockedBuffer)
	ch := make(chan int, 1)
	go func() {
		ch <- runContext(ctx, append([]string{"demo", "--serve", "127.0.0.1:0", "--metrics", "127.0.0.1:0"}, args...), stdout, stderr)
	}()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s := stderr.String()
		pm, mm := pageURLLine.FindStringSubmatch(s), cl4MetricsLine.FindStringSubmatch(s)
		if pm != nil && mm != nil {
			return pm[1], mm[1], stdout, stderr, cancelCtx, ch
		}
	}
	cancelCtx()
	<-ch
	t.Fatalf("the demo printed no URLs: %q", stderr.String())
	return
}

// cl4Wait waits for the exit status of a demo.
func cl4Wait(t *testing.T, done <-chan int, stderr *lockedBuffer) int {
	t.Helper()
	select {
	case code := <-done:
		return code
	case <-time.After(time.Minute):
		t.Fatalf("the demo did not end within a minute of its context; stderr %q", stderr.String())
		return -1
	}
}

// cl4HostOf returns the host:port of an http URL.
func cl4HostOf(u string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(u, "metrics"), "http://"), "/")
}

// cl4Refused reports whether nothing listens at addr any more.
func cl4Refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// The page and the metrics "stay up after the runs until Ctrl-C"; then
// the demo returns 0 and leaves nothing behind: no listener, no goroutine.
// In between, the page answers GET and HEAD at /, its assets and
// /data.json, which parses and carries the fields the page documents
// (config, done, runs with name, state, attempts, offered, succeeded,
// failed, summary once done), and any other method gets 405, unknown
// paths 404, never the data.
func TestAttackCLI4DemoServeAfterRunsThenCtrlCLeavesNothing(t *testing.T) {
	base, _ := cl4Goroutines()
	page, metrics, _, stderr, cancel, done := cl4Demo(t, cl4SmallDemo...)
	defer cancel()
	for deadline := time.Now().Add(60 * time.Second); !strings.Contains(stderr.String(), "until Ctrl-C\n") || !strings.Contains(stderr.String(), "stays up"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the runs did not end: %q", stderr.String())
		}
	}
	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, url string) (int, []byte) {
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, body
	}
	for _, p := range []string{"", "app.js", "style.css", "data.json"} {
		if code, _ := do("GET", page+p); code != 200 {
			t.Errorf("GET /%s: %d, want 200", p, code)
		}
		if code, _ := do("HEAD", page+p); code != 200 {
			t.Errorf("HEAD /%s: %d, want 200", p, code)
		}
		for _, m := range []string{"POST", "PUT", "DELETE", "PATCH", "OPTIONS"} {
			if code, body := do(m, page+p); code != http.StatusMethodNotAllowed || bytes.Contains(body, []byte(`"runs"`)) {
				t.Errorf("%s /%s: %d %.80q, want 405 without the data", m, p, code, body)
			}
		}
	}
	for _, p := range []string{"data.json/", "DATA.JSON", "nope", "web/app.js", "data.json.gz"} {
		if code, body := do("GET", page+p); code != 404 {
			t.Errorf("GET /%s: %d %.80q, want 404", p, code, body)
		}
	}
	_, body := do("GET", page+"data.json")
	var board struct {
		Config map[string]any `json:"config"`
		Done   *bool          `json:"done"`
		Runs   []struct {
			Name      string          `json:"name"`
			State     string          `json:"state"`
			Attempts  []int64         `json:"attempts"`
			Offered   *int64          `json:"offered"`
			Succeeded *int64          `json:"succeeded"`
			Failed    *int64          `json:"failed"`
			Summary   json.RawMessage `json:"summary"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(body, &board); err != nil {
		t.Fatalf("/data.json does not parse: %v\n%s", err, body)
	}
	if board.Done == nil || !*board.Done || len(board.Runs) != 4 || board.Config["clients"] != float64(5) {
		t.Errorf("/data.json after the runs: done %v, %d runs, config %v; want done, 4 runs, clients 5", board.Done, len(board.Runs), board.Config)
	}
	for _, r := range board.Runs {
		if r.State != "done" || r.Offered == nil || r.Succeeded == nil || r.Failed == nil || len(r.Summary) == 0 || len(r.Attempts) == 0 {
			t.Errorf("/data.json run %q after the runs: state %q, offered %v, summary %s, %d windows", r.Name, r.State, r.Offered, r.Summary, len(r.Attempts))
		} else if *r.Offered != *r.Succeeded+*r.Failed {
			t.Errorf("/data.json run %q once done: offered %d != succeeded %d + failed %d", r.Name, *r.Offered, *r.Succeeded, *r.Failed)
		}
	}
	if code, _ := do("GET", metrics); code != 200 {
		t.Errorf("GET %s: %d", metrics, code)
	}
	tr.CloseIdleConnections()

	cancel()
	if code := cl4Wait(t, done, stderr); code != 0 {
		t.Errorf("Ctrl-C after the runs: exit %d, want 0; stderr %q", code, stderr.String())
	}
	for _, a := range []string{cl4HostOf(page), cl4HostOf(metrics)} {
		if !cl4Refused(a) {
			t.Errorf("after the demo returned, %s still accepts connections", a)
		}
	}
	cl4GoroutinesBackTo(t, base, "Ctrl-C after the runs")
}

// Ctrl-C during the runs: "stops them, prints nothing more and exits with
// status 130", and nothing is left running: no listener, no goroutine,
// while a reader polls /data.json throughout.
func TestAttackCLI4DemoServeCtrlCDuringRunsLeavesNothing(t *testing.T) {
	base, _ := cl4Goroutines()
	args := []string{"--quiet", "--clients", "50", "--every", "50ms", "--duration", "3s",
		"--fail-at", "500ms", "--fail-for", "1s", "--deadline", "2s", "--window", "20ms"}
	page, metrics, stdout, stderr, cancel, done := cl4Demo(t, args...)
	defer cancel()
	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	stopReaders := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stopReaders:
					return
				default:
				}
				resp, err := client.Get(page + "data.json")
				if err != nil {
					return // the server went away
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var v map[string]any
				if resp.StatusCode != 200 || json.Unmarshal(body, &v) != nil {
					mu.Lock()
					problems = append(problems, fmt.Sprintf("%d %.100q", resp.StatusCode, body))
					mu.Unlock()
				}
			}
		}()
	}
	// Into the second run.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := client.Get(page + "data.json")
		if err != nil {
			t.Fatal(err)
		}
		var b struct {
			Runs []struct {
				State string `json:"state"`
			} `json:"runs"`
		}
		err = json.NewDecoder(resp.Body).Decode(&b)
		resp.Body.Close()
		if err == nil && len(b.Runs) > 1 && b.Runs[1].State == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the second run did not start: %q", stderr.String())
		}
	}
	before := stderr.String()
	cancel()
	code := cl4Wait(t, done, stderr)
	close(stopReaders)
	wg.Wait()
	tr.CloseIdleConnections()
	if code != 130 {
		t.Errorf("Ctrl-C during the runs: exit %d, want 130", code)
	}
	if stdout.String() != "" || stderr.String() != before {
		t.Errorf("Ctrl-C during the runs printed more: stdout %q, stderr %q", stdout.String(), strings.TrimPrefix(stderr.String(), before))
	}
	for _, p := range problems {
		t.Errorf("/data.json during the runs: %s", p)
	}
	for _, a := range []string{cl4HostOf(page), cl4HostOf(metrics)} {
		if !cl4Refused(a) {
			t.Errorf("after the demo returned, %s still accepts connections", a)
		}
	}
	cl4GoroutinesBackTo(t, base, "Ctrl-C during the runs")
}

// --capacity 0 is documented as "unlimited", --work 0 and
// --attempt-timeout 0 ("no limit") are allowed; --wide ("every figure")
// must not print NaN or Inf, nor a provider that "serves 0 requests at
// once", nor clients that "timed out at 0s".
func TestAttackCLI4DemoWideWithUnlimitedCapacityAndNoTimeout(t *testing.T) {
	var out, errb lockedBuffer
	code := run(append([]string{"demo", "--wide", "--capacity", "0", "--work", "0s", "--attempt-timeout", "0s"}, cl4SmallDemo...), &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	s := out.String()
	for _, bad := range []string{"NaN", "Inf", "serves 0 requests at once", "timed out at 0s"} {
		if strings.Contains(s, bad) {
			line := s[strings.LastIndex(s[:strings.Index(s, bad)], "\n")+1:]
			line, _, _ = strings.Cut(line, "\n")
			t.Errorf("demo --wide --capacity 0 --work 0s --attempt-timeout 0s prints %q: %q", bad, line)
		}
	}
}

// The same figure with a finite capacity and --work 0: the capacity is
// requests at once, the work per request 0, and the wide table's req/s at
// most is not a number a reader can use.
func TestAttackCLI4DemoWideWithZeroWork(t *testing.T) {
	var out, errb lockedBuffer
	code := run(append([]string{"demo", "--wide", "--work", "0s"}, cl4SmallDemo...), &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	if strings.Contains(out.String(), "Inf") || strings.Contains(out.String(), "NaN") {
		t.Errorf("demo --wide --work 0s prints a non-number:\n%s", out.String())
	}
}

// cl4FlagRange is one flag of a command's --help with its range.
type cl4FlagRange struct {
	name, kind, lo, hi string
}

var cl4RangeLine = regexp.MustCompile(`^  -(\S+) (int|uint|number|duration)$`)
var cl4Span = regexp.MustCompile(`, (\S+) to (\S+)(?: \(default|$)`)

// cl4Ranges reads the ranged flags of a command from its --help.
func cl4Ranges(t *testing.T, cmd ...string) []cl4FlagRange {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(append(cmd, "--help"), &out, &errb); code != 0 {
		t.Fatalf("%v --help: exit %d", cmd, code)
	}
	var rs []cl4FlagRange
	sc := bufio.NewScanner(&out)
	var cur *cl4FlagRange
	for sc.Scan() {
		line := sc.Text()
		if m := cl4RangeLine.FindStringSubmatch(line); m != nil {
			cur = &cl4FlagRange{name: m[1], kind: m[2]}
			continue
		}
		if cur != nil {
			if m := cl4Span.FindStringSubmatch(line); m != nil {
				cur.lo, cur.hi = m[1], m[2]
				rs = append(rs, *cur)
			}
			cur = nil
		}
	}
	return rs
}

// cl4Outside returns values just outside [lo, hi] of kind, and junk.
func cl4Outside(t *testing.T, r cl4FlagRange) []string {
	var vs []string
	switch r.kind {
	case "int", "uint":
		lo, err1 := strconv.ParseInt(r.lo, 10, 64)
		if err1 == nil {
			vs = append(vs, strconv.FormatInt(lo-1, 10))
		}
		if hi, err := strconv.ParseUint(r.hi, 10, 64); err == nil && hi < 1<<63 {
			vs = append(vs, strconv.FormatUint(hi+1, 10))
		} else if err == nil {
			vs = append(vs, "18446744073709551616")
		}
		vs = append(vs, "1.5", "0x10", "")
	case "number":
		lo, _ := strconv.ParseFloat(r.lo, 64)
		hi, _ := strconv.ParseFloat(r.hi, 64)
		vs = append(vs, strconv.FormatFloat(lo-max(1e-9, lo*1e-6), 'g', -1, 64), strconv.FormatFloat(hi*(1+1e-9)+1e-9, 'g', -1, 64),
			"NaN", "Inf", "-Inf", "1e400", "")
	case "duration":
		lo, err := time.ParseDuration(r.lo)
		if err != nil {
			t.Fatalf("-%s: lower bound %q: %v", r.name, r.lo, err)
		}
		hi, err := time.ParseDuration(r.hi)
		if err != nil {
			t.Fatalf("-%s: upper bound %q: %v", r.name, r.hi, err)
		}
		if lo > 0 {
			vs = append(vs, (lo - 1).String())
		} else {
			vs = append(vs, "-1ns")
		}
		vs = append(vs, (hi + 1).String(), "10", "1x", "9999999999h", "")
	}
	return vs
}

// Every ranged flag of every command, given a value just outside the range
// its --help states (or one that does not parse): exit 2, nothing on
// stdout, exactly one line on stderr that names the flag; never a panic,
// never work.
func TestAttackCLI4EveryFlagJustOutsideItsRange(t *testing.T) {
	cmds := [][]string{{"demo"}, {"sim", "jitter"}, {"sim", "layers"}, {"sim", "outage"}, {"sim", "meta"}, {"sim", "contention"}}
	for _, cmd := range cmds {
		rs := cl4Ranges(t, cmd...)
		if len(rs) == 0 {
			t.Errorf("%v --help: no ranged flag read", cmd)
		}
		for _, r := range rs {
			for _, v := range cl4Outside(t, r) {
				for _, form := range [][]string{{"--" + r.name, v}, {"-" + r.name + "=" + v}} {
					args := append(append([]string{}, cmd...), form...)
					var out, errb bytes.Buffer
					code := func() (code int) {
						defer func() {
							if p := recover(); p != nil {
								t.Errorf("%q: panic %v", args, p)
								code = -1
							}
						}()
						return run(args, &out, &errb)
					}()
					e := errb.String()
					if code != 2 || out.Len() != 0 || strings.Count(e, "\n") != 1 || !strings.Contains(e, "-"+r.name) {
						t.Errorf("%q (range %s to %s): exit %d, stdout %d bytes, stderr %q; want exit 2, one line naming -%s",
							args, r.lo, r.hi, code, out.Len(), e, r.name)
					}
				}
			}
		}
	}
}

// Unknown flags, unknown subcommands, stray arguments, a flag twice:
// exit 2, one line on stderr (or the usage for a bare group), nothing on
// stdout.
func TestAttackCLI4UnknownFlagsAndCommands(t *testing.T) {
	cases := [][]string{
		{"dem"}, {"sim"}, {"sim", "jitterx"}, {"sim", "--json"}, {"sim", "jitter", "--bogus"},
		{"sim", "jitter", "extra"}, {"sim", "jitter", "--json", "--json"}, {"sim", "layers", "-json=maybe"},
		{"version", "--json"}, {"version", "x"}, {"demo", "--serve"}, {"demo", "--clients"},
		{"sim", "jitter", "--strategies", ""}, {"sim", "jitter", "--strategies", "full,full"},
		{"sim", "contention", "--clients", "10-"}, {"sim", "contention", "--clients", "-10"},
		{"sim", "contention", "--clients", "5-1"}, {"sim", "contention", "--clients", "1-10/0"},
		{"sim", "outage", "--policies", "nope"}, {"sim", "meta", "--triggers", "503,"},
		{"help", "nope"}, {"help", "sim", "nope"}, {"\n"}, {strings.Repeat("x", 10000)},
		{"demo", "--serve", "256.1.1.1:1"}, {"demo", "--metrics", "127.0.0.1:-1"},
		{"demo", "--chart", "/nonexistent-dir/x.png"}, {"demo", "--chart", "x.gif"},
	}
	for _, args := range cases {
		var out, errb bytes.Buffer
		code := run(args, &out, &errb)
		e := errb.String()
		lines := strings.Count(e, "\n")
		if code != 2 || out.Len() != 0 || (lines != 1 && !(len(args) == 1 && args[0] == "sim")) || (len(e) > 400 && lines == 1) {
			t.Errorf("%.80q: exit %d, stdout %q, stderr (%d lines) %.300q; want exit 2, one short line", args, code, out.String(), lines, e)
		}
	}
}

// "help sim jitter" is "sim jitter --help": the help on stdout, exit 0;
// and the same for every command.
func TestAttackCLI4HelpEveryCommand(t *testing.T) {
	for _, c := range [][]string{{"demo"}, {"sim", "jitter"}, {"sim", "layers"}, {"sim", "outage"}, {"sim", "meta"}, {"sim", "contention"}, {"version"}} {
		var a, b, ea, eb bytes.Buffer
		ca := run(append([]string{"help"}, c...), &a, &ea)
		cb := run(append(append([]string{}, c...), "-h"), &b, &eb)
		if ca != 0 || cb != 0 || a.String() != b.String() || ea.Len()+eb.Len() != 0 || !strings.HasPrefix(a.String(), "Usage: stormguard "+strings.Join(c, " ")) {
			t.Errorf("help %v: exit %d/%d, stdout equal %v, stderr %q %q", c, ca, cb, a.String() == b.String(), ea.String(), eb.String())
		}
	}
}

// cl4DocBlock returns the output block that follows the command line cmd in
// the markdown file.
func cl4DocBlock(t *testing.T, file, cmd string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, cmd+"\n```")
	if i < 0 {
		t.Fatalf("%s: no command %q", file, cmd)
	}
	s = s[i:]
	j := strings.Index(s, "\n```\n\n```\n")
	if j < 0 {
		t.Fatalf("%s: no output after %q", file, cmd)
	}
	s = s[j+len("\n```\n\n```\n"):]
	end := strings.Index(s, "```")
	return s[:end]
}

// docs/layers.md quotes the output of `sim layers` and of
// `sim layers --rate 0.2 --duration 1h`; the command prints exactly that.
func TestAttackCLI4LayersDocTablesAreWhatItPrints(t *testing.T) {
	for _, c := range []struct{ doc string }{
		{"go run ./cmd/stormguard sim layers"},
		{"go run ./cmd/stormguard sim layers --rate 0.2 --duration 1h"},
	} {
		want := cl4DocBlock(t, "../../docs/layers.md", c.doc)
		args := strings.Fields(strings.TrimPrefix(c.doc, "go run ./cmd/stormguard "))
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d %q", args, code, errb.String())
		}
		if out.String() != want {
			t.Errorf("%v prints\n%s\ndocs/layers.md quotes\n%s", args, out.String(), want)
		}
	}
}

// --json of every fast command parses, is one JSON value, and nothing
// else is on stdout.
func TestAttackCLI4JSONOfFastCommandsParses(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "jitter", "--json", "--clients", "50"},
		{"sim", "layers", "--json", "--duration", "12s"},
		{"sim", "outage", "--json", "--quiet", "--horizon", "10s", "--trigger-start", "2s", "--trigger-end", "4s", "--clients", "2", "--rate", "10"},
		{"sim", "meta", "--json", "--quiet", "--horizon", "10s", "--trigger-start", "2s", "--trigger-for", "2s", "--capacity", "50", "--workers", "5"},
		{"sim", "contention", "--json", "--quiet", "--clients", "5,10", "--runs", "2"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Errorf("%v: exit %d %q", args, code, errb.String())
			continue
		}
		dec := json.NewDecoder(&out)
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			t.Errorf("%v: --json does not parse: %v", args, err)
			continue
		}
		if _, ok := v["config"]; !ok {
			t.Errorf("%v: --json has no config: keys %v", args, v)
		}
		if dec.More() {
			t.Errorf("%v: more than one JSON value on stdout", args)
		}
	}
}

// --fail-for 0 is allowed (0 to 20s): no request starts in an outage of
// no length, so the --wide column "started in outage: ok" ("the same
// [requests that ended in success] for the requests started during the
// outage") has nothing to count; 0.0% claims every one of them failed.
func TestAttackCLI4DemoWideNoOutageStartedInOutage(t *testing.T) {
	var out, errb lockedBuffer
	args := []string{"demo", "--wide", "--quiet", "--clients", "5", "--every", "50ms", "--duration", "300ms",
		"--fail-at", "100ms", "--fail-for", "0s", "--deadline", "400ms", "--window", "20ms"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
	row := regexp.MustCompile(`(?m)^\s*(.+?, 503.*?)\s+\d+\s+\d+\s+\S+x\s+\d+\s+(\S+)%\s+(\S+?)%?\s+\d+\s*$`)
	ms := row.FindAllStringSubmatch(out.String(), -1)
	if len(ms) != 4 {
		t.Fatalf("read %d rows of the wide table, want 4:\n%s", len(ms), out.String())
	}
	for _, m := range ms {
		if m[3] != "-" {
			t.Errorf("run %q with --fail-for 0: started in outage: ok %s (goodput %s%%), want \"-\": no request started in the outage", m[1], m[3], m[2])
		}
	}
}
