package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// chromium returns the path of Debian's chromium. Without it the test is
// skipped, or fails when STORMGUARD_REQUIRE_SERVICES=1 (CI installs it).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "/usr/bin/chromium"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium to test the live page in (apt-get install chromium)"
	if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
		t.Fatal(msg + "; STORMGUARD_REQUIRE_SERVICES=1 makes that a failure")
	}
	t.Skip(msg)
	return ""
}

// browser starts a headless chromium for the test: a fresh profile, no
// sandbox (tests run as root), nothing that reaches the network by itself.
// errs returns the errors its page reported so far: console errors,
// uncaught exceptions, errors of the browser's log (a failed load).
func browser(t *testing.T) (ctx context.Context, errs func() []string) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	// The first action starts the browser, with no timeout (one would end
	// the browser with it).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	var (
		mu     sync.Mutex
		errors []string
	)
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return // the browser is closing
			}
			if m.Type == chromedp.ConsoleError || m.Type == "assert" || m.IsException() {
				mu.Lock()
				errors = append(errors, fmt.Sprintf("%s (%s:%d)", m, m.URL, m.Line))
				mu.Unlock()
			}
		}
	}()
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errors...)
	}
}

// lockedBuffer is a bytes.Buffer safe for concurrent use: the demo writes
// to it while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

var pageURLLine = regexp.MustCompile(`watch it at (http://\S+/)`)

// serveDemo runs `stormguard demo --serve 127.0.0.1:0 args...` until the
// test ends, and returns the page's URL and a function that waits for the
// demo's exit status once the test's context is done.
func serveDemo(t *testing.T, args ...string) (url string, stdout *lockedBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errs lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- runContext(ctx, append([]string{"demo", "--serve", "127.0.0.1:0"}, args...), &out, &errs)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			// After the runs, the end of the page is not an interruption.
			if code != 0 {
				t.Errorf("demo --serve ended with exit %d after the runs, want 0; stderr:\n%s", code, errs.String())
			}
		case <-time.After(time.Minute):
			t.Errorf("demo --serve did not end within a minute of its context")
		}
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := pageURLLine.FindStringSubmatch(errs.String()); m != nil {
			return m[1], &out
		}
		select {
		case code := <-done:
			t.Fatalf("demo --serve exited %d before serving: %s", code, errs.String())
		default:
		}
	}
	t.Fatalf("demo --serve printed no page URL: %q", errs.String())
	return "", nil
}

// pageRun is what the page shows of one run.
type pageRun struct {
	Name, Load, Served, State  string
	Offered, Succeeded, Failed string
	Series                     int
	SeriesLength               int
}

// readPage reads, from the page in the browser, what it shows of each run.
const readPage = `Array.from(document.querySelectorAll("figure.run")).map((fig) => {
  const i = fig.dataset.run;
  const row = document.querySelector('#headline tr[data-run="' + i + '"]');
  const paths = fig.querySelectorAll("path.attempts");
  return {
    Name: row.querySelector(".name").textContent,
    Load: row.querySelector(".load").textContent,
    Served: row.querySelector(".served").textContent,
    State: fig.dataset.state,
    Offered: fig.querySelector(".offered").textContent,
    Succeeded: fig.querySelector(".succeeded").textContent,
    Failed: fig.querySelector(".failed").textContent,
    Series: paths.length,
    SeriesLength: paths.length ? Math.round(paths[0].getTotalLength()) : 0,
  };
})`

// TestLivePage runs a short demo with its page open in a real headless
// Chromium: the page loads without an error, draws one series of attempts
// per run, and once the runs are over shows the figures of /data.json.
func TestLivePage(t *testing.T) {
	t.Parallel() // see TestMain
	ctx, pageErrors := browser(t)
	url, _ := serveDemo(t, "--quiet", "--clients", "20", "--every", "50ms", "--duration", "1s", "--fail-at", "300ms",
		"--fail-for", "300ms", "--deadline", "2s", "--window", "20ms", "--naive-every", "100ms", "--retry-after", "1s")
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := chromedp.Do(wait, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS(`body[data-done="true"]`)))
	var runs []pageRun
	if err == nil {
		runs, err = chromedp.Run(wait, chromedp.Evaluate[[]pageRun](readPage))
	}
	if err != nil {
		t.Fatalf("loading %s and waiting for the runs to end: %v; page errors: %q", url, err, pageErrors())
	}
	if errs := pageErrors(); len(errs) > 0 {
		t.Errorf("the page reported errors: %q", errs)
	}
	resp, err := http.Get(url + "data.json")
	if err != nil {
		t.Fatal(err)
	}
	var data boardJSON
	err = json.NewDecoder(resp.Body).Decode(&data)
	resp.Body.Close()
	if err != nil || !data.Done {
		t.Fatalf("GET data.json: %v, done %v; want the finished board", err, data.Done)
	}
	if len(runs) != len(data.Runs) || len(runs) == 0 {
		t.Fatalf("the page draws %d runs, data.json has %d", len(runs), len(data.Runs))
	}
	for i, got := range runs {
		want := data.Runs[i]
		if want.Summary == nil {
			t.Fatalf("data.json: run %d %q is done without a summary", i, want.Name)
		}
		if got.Name != want.Name || got.State != "done" {
			t.Errorf("page run %d: %q, %s; data.json: %q, done", i, got.Name, got.State, want.Name)
		}
		if got.Series != 1 || got.SeriesLength < 100 {
			t.Errorf("page run %d %q: %d series of attempts, the first %d units long; want one drawn line", i, got.Name, got.Series, got.SeriesLength)
		}
		checkFigure(t, fmt.Sprintf("run %d load", i), got.Load, "x", want.Summary.OutageAmplification, 0.005)
		checkFigure(t, fmt.Sprintf("run %d served", i), got.Served, "%", 100*want.Summary.Goodput, 0.05)
		for _, f := range []struct {
			what, got string
			want      int64
		}{{"offered", got.Offered, want.Offered}, {"succeeded", got.Succeeded, want.Succeeded}, {"failed", got.Failed, want.Failed}} {
			if f.got != strconv.FormatInt(f.want, 10) {
				t.Errorf("page run %d %s: %q, data.json %d", i, f.what, f.got, f.want)
			}
		}
		if got := len(want.Attempts); got == 0 || i > 0 && len(want.Breakers) == 0 {
			t.Errorf("data.json run %d: %d windows, %d breaker samples; want windows, and samples for stormguard's runs", i, got, len(want.Breakers))
		}
	}
}

// checkFigure checks that the page's text, a number followed by unit,
// shows want rounded to within tol, half the last digit shown (a little
// more: 0.675 is shown as 0.68, 0.005 away in decimal but a hair more in
// floating point).
func checkFigure(t *testing.T, what, text, unit string, want, tol float64) {
	t.Helper()
	v, err := strconv.ParseFloat(strings.TrimSuffix(text, unit), 64)
	if err != nil || !strings.HasSuffix(text, unit) || math.Abs(v-want) > tol+1e-9 {
		t.Errorf("page %s: %q, data.json %g", what, text, want)
	}
}

// TestDemoScreenshot writes a screenshot of the live page of a whole demo
// (the defaults) to the file STORMGUARD_DEMO_SCREENSHOT names, and the
// same run's chart (--chart) to demo.png beside it (make demo-screenshot);
// it logs the run's output. It is a measurement, not a test: about a
// minute, with live figures that vary from run to run.
func TestDemoScreenshot(t *testing.T) {
	file := os.Getenv("STORMGUARD_DEMO_SCREENSHOT")
	if file == "" {
		t.Skip("STORMGUARD_DEMO_SCREENSHOT names the file to write (make demo-screenshot)")
	}
	load, _ := os.ReadFile("/proc/loadavg")
	chart := filepath.Join(filepath.Dir(file), "demo.png")
	t.Logf("stormguard demo --serve 127.0.0.1:0 --chart %s; load average before: %s", chart, strings.TrimSpace(string(load)))
	ctx, pageErrors := browser(t)
	url, out := serveDemo(t, "--chart", chart)
	wait, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	err := chromedp.Do(wait, chromedp.EmulateViewport(1400, 1000), chromedp.Navigate(url),
		chromedp.WaitReady(chromedp.CSS(`body[data-done="true"]`)))
	var png []byte
	if err == nil {
		png, err = chromedp.Run(wait, chromedp.FullScreenshot(100))
	}
	if err != nil {
		t.Fatalf("screenshot of %s: %v; page errors: %q", url, err, pageErrors())
	}
	if errs := pageErrors(); len(errs) > 0 {
		t.Errorf("the page reported errors: %q", errs)
	}
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	load, _ = os.ReadFile("/proc/loadavg")
	t.Logf("wrote %s (%d bytes); load average after: %s\n%s", file, len(png), strings.TrimSpace(string(load)), out.String())
}
