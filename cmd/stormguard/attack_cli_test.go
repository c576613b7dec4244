// Black-box attacks on the stormguard CLI (area: cli): only what a user
// can do, run the command with arguments and make HTTP requests to what it
// serves. Each test names the documented sentence it checks.

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
)

// atkFailWriter fails every write, as stdout does on a full disk or a closed
// pipe (stormguard sim jitter > /dev/full).
type atkFailWriter struct{}

func (atkFailWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// main.go, run: "the exit status: 0 on success or help, 1 when the work
// failed". A command whose output cannot be written has failed: it must
// not report success.
func TestAttackCLIFailingStdoutIsNotSuccess(t *testing.T) {
	for _, args := range [][]string{
		{"version"},
		{"sim", "jitter", "--clients", "10", "--rounds", "2"},
		{"sim", "jitter", "--clients", "10", "--rounds", "2", "--json"},
		{"sim", "layers", "--layers", "2", "--rate", "10", "--duration", "2s", "--warmup", "1s"},
		{"sim", "contention", "--clients", "5", "--runs", "2", "--json"},
	} {
		var errb strings.Builder
		code := run(args, atkFailWriter{}, &errb)
		if code != 1 {
			t.Errorf("run(%q) with a stdout that fails every write: exit %d, stderr %q; want 1 (the work failed)", args, code, errb.String())
		}
	}
}

// Every sim command takes -seed; the simulations are deterministic
// ("a deterministic discrete-event simulation", README; sim jitter "With
// the defaults this prints the reference table"): the same command line
// twice prints the same figures.
func TestAttackCLISameSeedSameFigures(t *testing.T) {
	for _, args := range [][]string{
		{"sim", "jitter", "--clients", "200", "--rounds", "3", "--seed", "7", "--json"},
		{"sim", "layers", "--layers", "3", "--rate", "50", "--duration", "20s", "--warmup", "5s", "--seed", "7", "--json"},
		{"sim", "outage", "--clients", "4", "--rate", "20", "--horizon", "10s", "--trigger-start", "2s", "--trigger-end", "5s", "--seed", "7", "--json", "--quiet"},
		{"sim", "meta", "--rho", "0.9", "--capacity", "100", "--workers", "10", "--horizon", "10s", "--trigger-start", "2s", "--trigger-for", "3s", "--deadline", "3s", "--seed", "7", "--json", "--quiet"},
		{"sim", "contention", "--clients", "5,10", "--runs", "3", "--seed", "7", "--json", "--quiet"},
	} {
		code1, out1, err1 := runCLI(t, args...)
		code2, out2, err2 := runCLI(t, args...)
		if code1 != 0 || code2 != 0 {
			t.Errorf("%q: exit %d, %d: %q %q", args, code1, code2, err1, err2)
			continue
		}
		if out1 != out2 {
			a, b := strings.Split(out1, "\n"), strings.Split(out2, "\n")
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Errorf("%q twice with the same seed: outputs differ first at line %d: %q vs %q", args, i+1, a[i], b[i])
					break
				}
			}
		}
	}
}

// `stormguard help`: "a value out of range is refused before any work,
// with exit status 2"; --chart FILE is "(.png or .svg, in an existing
// directory)". A FILE that is itself a directory cannot be written: it
// must be refused before the simulation (exit 2), not after it.
func TestAttackCLIChartThatIsADirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out.png")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	code, out, errs := runCLI(t, "sim", "outage", "--quiet", "--chart", dir)
	if code != 2 || out != "" {
		t.Errorf("sim outage --chart %s (a directory): exit %d after %v, stdout %d bytes, stderr %q; want exit 2 before any work",
			dir, code, time.Since(start).Round(time.Millisecond), len(out), errs)
	}
}

// Main help: "Every command but version takes --json ... --chart ... and
// --help": version takes none of them, so they are refused (exit 2).
func TestAttackCLIVersionRefusesOtherFlags(t *testing.T) {
	for _, args := range [][]string{{"version", "--json"}, {"version", "--chart", "v.png"}, {"version", "extra"}, {"version", "--quiet"}} {
		code, out, errs := runCLI(t, args...)
		if code != 2 || out != "" || strings.Count(errs, "\n") != 1 {
			t.Errorf("run(%q) = exit %d, stdout %q, stderr %q; want exit 2 and one line on stderr", args, code, out, errs)
		}
	}
}

// startDemo runs `stormguard demo --serve 127.0.0.1:0 --metrics
// 127.0.0.1:0 args...` and returns the page's and the metrics' URLs, its
// stderr, a cancel (Ctrl-C) and its exit status once it ends.
func atkStartDemo(t *testing.T, args ...string) (page, metrics string, errs *lockedBuffer, cancel func(), done <-chan int) {
	t.Helper()
	ctx, cancelCtx := context.WithCancel(context.Background())
	var out lockedBuffer
	errs = new(lockedBuffer)
	ch := make(chan int, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		ch <- runContext(ctx, append([]string{"demo", "--serve", "127.0.0.1:0", "--metrics", "127.0.0.1:0"}, args...), &out, errs)
	}()
	t.Cleanup(func() {
		cancelCtx()
		select {
		case <-ended:
		case <-time.After(time.Minute):
			t.Errorf("the demo did not end within a minute of its context")
		}
	})
	metricsLine := regexp.MustCompile(`serving metrics at (http://\S+/metrics)`)
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		s := errs.String()
		pm, mm := pageURLLine.FindStringSubmatch(s), metricsLine.FindStringSubmatch(s)
		if pm != nil && mm != nil {
			return pm[1], mm[1], errs, cancelCtx, ch
		}
	}
	t.Fatalf("the demo printed no URLs: %q", errs.String())
	return
}

// The live page and /data.json (README: "draws the runs as they happen on
// a page ..., the same data at /data.json") read by many clients at once
// while the runs update it (run with -race); the documented figures only
// grow while a run runs: offered, succeeded, failed ("the fleet's calls so
// far") and the attempts per window; wrong methods and unknown paths get
// an HTTP error, not the data.
func TestAttackCLILivePageConcurrentReaders(t *testing.T) {
	page, metrics, errs, cancel, done := atkStartDemo(t, "--quiet", "--clients", "20", "--every", "20ms", "--duration", "500ms",
		"--fail-at", "100ms", "--fail-for", "200ms", "--deadline", "1s", "--window", "10ms", "--naive-every", "30ms",
		"--retry-after", "100ms", "--capacity", "5", "--queue", "10", "--work", "5ms")

	type seen struct{ offered, succeeded, failed, attempts int64 }
	var (
		mu       sync.Mutex
		problems []string
	)
	report := func(format string, args ...any) {
		mu.Lock()
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := map[string]seen{}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Get(page + "data.json")
				if err != nil {
					report("GET data.json: %v", err)
					return
				}
				var b boardJSON
				err = json.NewDecoder(resp.Body).Decode(&b)
				ct := resp.Header.Get("Content-Type")
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || ct != "application/json" {
					report("GET data.json: status %d, type %q, %v", resp.StatusCode, ct, err)
					continue
				}
				for _, run := range b.Runs {
					var a int64
					for _, n := range run.Attempts {
						a += n
					}
					s := seen{run.Offered, run.Succeeded, run.Failed, a}
					p := last[run.Name]
					if s.offered < p.offered || s.succeeded < p.succeeded || s.failed < p.failed || s.attempts < p.attempts {
						report("run %q (%s): figures went down: %+v then %+v", run.Name, run.State, p, s)
					}
					if run.Succeeded+run.Failed > run.Offered {
						report("run %q (%s): succeeded %d + failed %d > offered %d (under way negative)", run.Name, run.State, run.Succeeded, run.Failed, run.Offered)
					}
					last[run.Name] = s
				}
				if b.Done {
					return
				}
			}
		}()
	}
	// Metrics readers at the same time.
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := http.Get(metrics)
				if err != nil {
					report("GET metrics: %v", err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	deadline := time.After(90 * time.Second)
	for !strings.Contains(errs.String(), "the page stays up") {
		select {
		case <-deadline:
			close(stop)
			wg.Wait()
			t.Fatalf("the runs did not end: %q", errs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	close(stop)
	wg.Wait()
	for _, p := range problems {
		t.Error(p)
	}

	for _, tt := range []struct {
		method, url string
		want        int
	}{
		{"POST", page + "data.json", http.StatusMethodNotAllowed},
		{"DELETE", page, http.StatusMethodNotAllowed},
		{"PUT", page + "index.html", http.StatusMethodNotAllowed},
		{"GET", page + "nope", http.StatusNotFound},
		{"GET", page + "data.json/", http.StatusNotFound},
		{"GET", page + "../../../../etc/passwd", http.StatusNotFound},
		{"GET", strings.TrimSuffix(metrics, "metrics") + "nope", http.StatusNotFound},
	} {
		req, _ := http.NewRequest(tt.method, tt.url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", tt.method, tt.url, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s %s: status %d (%d bytes), want %d", tt.method, tt.url, resp.StatusCode, len(body), tt.want)
		}
	}
	resp, err := http.Get(metrics)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("GET /metrics: Content-Type %q, want the Prometheus text format", ct)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("demo ended with exit %d after the runs, want 0", code)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("the demo did not end within 30 s of Ctrl-C")
	}
}

// demo --help: "--serve ADDR ... stays up after the runs until Ctrl-C".
// Clients that never read their answer, or never finish their request,
// must not keep Ctrl-C from ending the demo.
func TestAttackCLISlowClientsDoNotHoldCtrlC(t *testing.T) {
	page, metrics, errs, cancel, done := atkStartDemo(t, "--quiet", "--clients", "5", "--every", "50ms", "--duration", "200ms",
		"--fail-at", "50ms", "--fail-for", "50ms", "--deadline", "300ms", "--window", "10ms")
	for deadline := time.Now().Add(90 * time.Second); !strings.Contains(errs.String(), "the page stays up"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the runs did not end: %q", errs.String())
		}
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for _, u := range []string{page, metrics} {
		host := strings.TrimPrefix(u, "http://")
		host = host[:strings.Index(host, "/")]
		for i := 0; i < 20; i++ {
			c, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			w := bufio.NewWriter(c)
			if i%2 == 0 {
				// Never reads: many pipelined requests for the data.
				path := "/data.json"
				if u == metrics {
					path = "/metrics"
				}
				for k := 0; k < 200; k++ {
					fmt.Fprintf(w, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
				}
			} else {
				fmt.Fprintf(w, "GET / HTTP/1.1\r\nHost: x\r\n") // never finishes its headers
			}
			w.Flush()
		}
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Errorf("demo --serve --metrics with clients that never read: not ended %v after Ctrl-C", time.Since(start).Round(time.Millisecond))
	}
}

// main.go, run: "1 when the work failed"; the sim commands exit 1 when
// their table cannot be written (TestAttackCLIFailingStdoutIsNotSuccess
// passes), the demo reports success: its headlines, sparklines and note
// all lost, exit 0.
func TestAttackCLIDemoFailingStdoutIsNotSuccess(t *testing.T) {
	var errb lockedBuffer
	code := run([]string{"demo", "--clients", "5", "--every", "100ms", "--duration", "300ms", "--deadline", "300ms",
		"--fail-at", "100ms", "--fail-for", "100ms", "--quiet"}, atkFailWriter{}, &errb)
	if code != 1 {
		t.Errorf("demo with a stdout that fails every write: exit %d, stderr %q; want 1 (the work failed)", code, errb.String())
	}
}

// The demo's announcement "about X in all, at most Y": Y counts, for each
// run, its duration, the deadline of its last requests and the provider's
// stop, which waits up to live.StopGrace for work still queued for callers
// who left (a run took 2 s past the "at most" it announced).
func TestAttackCLIDemoAtMostCountsTheStop(t *testing.T) {
	c := demoConfig{Clients: 10, Every: 100 * time.Millisecond, Duration: time.Second, Deadline: time.Second,
		FailFor: 100 * time.Millisecond, Timeout: time.Second, Work: time.Second}
	var b strings.Builder
	names := []string{"a", "b", "c", "d"}
	announce(&b, c, names)
	m := regexp.MustCompile(`at most (\S+)\.`).FindStringSubmatch(strings.ReplaceAll(b.String(), "\n", " "))
	if m == nil {
		t.Fatalf("no 'at most' in %q", b.String())
	}
	most, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if want := 4 * (c.Duration + c.Deadline + live.StopGrace); most != want {
		t.Errorf("announced at most %v, want %v (4 runs of duration + deadline + the provider's stop)", most, want)
	}
}

// `stormguard help`: "Every input is bounded so that a run fits in memory
// and takes seconds". sim meta at its request bound (200,000) with a 1 ms
// attempt timeout and a 1 h deadline (30 attempts a request in the naive
// rows) ran two minutes; it is refused before any work now, with exit 2.
func TestAttackCLIMetaBoundsAttempts(t *testing.T) {
	code, _, stderr := runCLI(t, "sim", "meta", "--quiet", "--rho", "2", "--capacity", "100", "--horizon", "1000s",
		"--trigger-start", "1s", "--trigger-for", "1s", "--timeout", "1ms", "--deadline", "1h", "--workers", "1000", "--queue-seconds", "600")
	if code != 2 || !strings.Contains(stderr, "attempts, at most 4000000") {
		t.Errorf("exit %d, stderr %q; want 2 and the attempts' bound named", code, stderr)
	}
}
