package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
)

var built struct {
	once sync.Once
	bin  string
	err  error
}

// buildStormguard builds the command once per test binary (with -race if
// the tests run with it, so that the build reuses their compiled packages)
// and returns its path.
func buildStormguard(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "stormguard-bin")
		if err != nil {
			built.err = err
			return
		}
		built.bin = filepath.Join(dir, "stormguard")
		args := []string{"build", "-o", built.bin}
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, s := range bi.Settings {
				if s.Key == "-race" && s.Value == "true" {
					args = append(args, "-race")
				}
			}
		}
		out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
		if err != nil {
			built.err = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

// TestMain removes the binary buildStormguard built.
//
// The tests that run the demo for real (TestDemoSmall, TestDemoMetrics,
// TestLivePage, TestInterruptExits130: 40 s together under -race, mostly
// waiting for the demo's runs and the browser, about half a core) call
// t.Parallel, so that they overlap instead of leaving the second core idle
// at the end of this module's tests. Each runs its own demo on its own
// ports and buffers, and checks counts and outputs, not timings.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.bin != "" {
		os.RemoveAll(filepath.Dir(built.bin))
	}
	os.Exit(code)
}

// interruptArgs is a demo that runs for a while (four runs of 5 s).
var interruptArgs = []string{"demo", "--clients", "20", "--every", "50ms", "--duration", "5s", "--fail-at", "1s",
	"--fail-for", "1s", "--deadline", "3s"}

// TestInterruptExits130 sends SIGINT to the built command while the demo
// runs, as Ctrl-C does: it stops with exit status 130, prints nothing on
// stdout and nothing on stderr but what it printed before (what it runs),
// which is what it prints when its context ends before the runs.
func TestInterruptExits130(t *testing.T) {
	t.Parallel() // see TestMain
	// In-process, with the context already over: no run, exit 130, no error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, announced bytes.Buffer
	if code := runContext(ctx, interruptArgs, &out, &announced); code != 130 || out.Len() != 0 ||
		!strings.HasPrefix(announced.String(), "stormguard demo: 4 runs") {
		t.Fatalf("demo with its context over: exit %d, stdout %q, stderr %q; want 130, nothing, what it runs", code, out.String(), announced.String())
	}

	bin := buildStormguard(t)
	cmd := exec.Command(bin, interruptArgs...)
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	// The announcement is written once the demo watches for Ctrl-C; then
	// let the first run get under way.
	for !strings.Contains(stderr.String(), "4 stormguard gateway") {
		select {
		case err := <-exited:
			t.Fatalf("demo exited (%v) before it said what it runs: %q", err, stderr.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("demo still running a minute after SIGINT")
	}
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Errorf("demo after SIGINT: exit %d, want 130", code)
	}
	if stdout.String() != "" || stderr.String() != announced.String() {
		t.Errorf("demo after SIGINT: stdout %q, stderr %q; want nothing but what it runs:\n%s", stdout.String(), stderr.String(), announced.String())
	}
}

// TestVersion checks that `stormguard version` prints the main module's
// version as the build recorded it (go version -m), in-process and built.
func TestVersion(t *testing.T) {
	code, out, errs := runCLI(t, "version")
	if code != 0 || errs != "" || out != versionLine()+"\n" || !strings.HasPrefix(out, "stormguard ") {
		t.Errorf("version: exit %d, stdout %q, stderr %q; want %q", code, out, errs, versionLine())
	}
	bin := buildStormguard(t)
	got, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	info, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	for _, line := range strings.Split(string(info), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/stormguard/stormguard/cmd/stormguard" {
			want = f[2]
		}
	}
	if want == "" || !strings.HasPrefix(string(got), "stormguard "+want+" go") {
		t.Errorf("stormguard version = %q; go version -m says the module is at %q", got, want)
	}
}
