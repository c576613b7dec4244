package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fixture is a module whose tests pass, fail, skip for a missing variable,
// skip for another reason, and one of whose packages does not build.
var fixture = map[string]string{
	"go.mod": "module example.com/fx\n\ngo 1.25.0\n",
	"a/a_test.go": `package a

import (
	"os"
	"testing"
)

func TestPass(t *testing.T) {}

func TestFail(t *testing.T) { t.Log("the detail"); t.Fatal("boom") }

func TestService(t *testing.T) {
	if os.Getenv("FX_DB_URL") == "" {
		t.Skip("db tests skipped: set FX_DB_URL (e.g. postgres://localhost)")
	}
}

func TestService2(t *testing.T) {
	if os.Getenv("FX_DB_URL") == "" {
		t.Skipf("db tests skipped: set FX_DB_URL (e.g. %s)", "postgres://localhost")
	}
}

func TestSubtests(t *testing.T) {
	t.Run("one", func(t *testing.T) {})
	t.Run("two", func(t *testing.T) { t.Skip("would run long") })
}
`,
	"b/b.go":      "package b\n\nfunc F() int { return \"not an int\" }\n",
	"b/b_test.go": "package b\n\nimport \"testing\"\n\nfunc TestF(t *testing.T) { F() }\n",
	"c/c.go":      "package c\n",
	"d/d_test.go": "package d\n\nimport \"testing\"\n\nfunc TestOK(t *testing.T) {}\n",
}

// goTestJSON runs go test -json on the fixture and returns its output.
func goTestJSON(t *testing.T) []byte {
	t.Helper()
	dir := t.TempDir()
	for name, body := range fixture {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "FX_DB_URL=")
	out, err := cmd.Output()
	if _, ok := err.(*exec.ExitError); !ok && err != nil {
		t.Fatalf("go test: %v", err)
	}
	return out
}

func TestSummary(t *testing.T) {
	in := goTestJSON(t)
	var out bytes.Buffer
	s := newSummary(&out)
	s.trim = "example.com/fx"
	if err := s.read(bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	code := s.finish()
	got := out.String()
	if code != 1 {
		t.Errorf("finish() = %d, want 1 (a test failed, a package did not build)", code)
	}
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	tail := strings.Join(lines[len(lines)-3:], "\n")
	wantTail := "skipped: 2 tests need FX_DB_URL (a)\n" +
		"skipped: 1 test: would run long (a)\n" +
		"tests: 4 passed, 2 failed, 3 skipped"
	if tail != wantTail {
		t.Errorf("last lines:\n%s\nwant:\n%s\nwhole output:\n%s", tail, wantTail, got)
	}
	for _, want := range []string{
		"the detail", // log of the failed test
		"boom",       // its failure
		"--- FAIL: TestFail",
		"FAIL\texample.com/fx/a",
		"not an int", // the build error
		"FAIL\texample.com/fx/b [build failed]",
		"?   \texample.com/fx/c\t[no test files]",
		"ok  \texample.com/fx/d",
		"FAIL: a b\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, notWant := range []string{"=== RUN   TestPass", "--- PASS", "\"Action\""} {
		if strings.Contains(got, notWant) {
			t.Errorf("output has %q (passing tests print nothing):\n%s", notWant, got)
		}
	}
}

func TestSummaryAllPass(t *testing.T) {
	in := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}
{"Action":"output","Package":"p","Test":"TestA","Output":"--- PASS: TestA (0.00s)\n"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"output","Package":"p","Output":"PASS\n"}
{"Action":"output","Package":"p","Output":"ok  \tp\t0.01s\n"}
{"Action":"pass","Package":"p"}
`
	var out bytes.Buffer
	s := newSummary(&out)
	if err := s.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	if code := s.finish(); code != 0 {
		t.Errorf("finish() = %d, want 0", code)
	}
	if want := "ok  \tp\t0.01s\ntests: 1 passed, 0 failed, 0 skipped\n"; out.String() != want {
		t.Errorf("output %q, want %q", out.String(), want)
	}
}

func TestSummaryNoEvents(t *testing.T) {
	var out bytes.Buffer
	s := newSummary(&out)
	if err := s.read(strings.NewReader("go: some error printed as text\n")); err != nil {
		t.Fatal(err)
	}
	if code := s.finish(); code != 2 {
		t.Errorf("finish() = %d, want 2 for input with no test event", code)
	}
	if !strings.HasPrefix(out.String(), "go: some error printed as text\n") {
		t.Errorf("plain text input not copied: %q", out.String())
	}
}

func TestSkipReason(t *testing.T) {
	tests := []struct {
		msgs []string
		want string
	}{
		{[]string{"Postgres store tests skipped: set STORMGUARD_POSTGRES_URL (e.g. postgres://x)"}, "need STORMGUARD_POSTGRES_URL"},
		{[]string{"live peer comparison: set STORMGUARD_LIVE_PEERS=1 to run it"}, "need STORMGUARD_LIVE_PEERS=1"},
		{[]string{"set A_B and C_D."}, "need A_B and C_D"},
		{[]string{"no loopback: dial tcp: refused"}, ": no loopback: dial tcp: refused"},
		{[]string{""}, ": (no message)"},
	}
	for _, tt := range tests {
		s := newSummary(&bytes.Buffer{})
		s.addSkip("p", skipMessage(append([]string{"=== RUN   TestX\n"}, append(tt.msgs, "--- SKIP: TestX (0.00s)\n")...)))
		if len(s.skipOrder) != 1 || s.skipOrder[0] != tt.want {
			t.Errorf("skip reason of %q = %q, want %q", tt.msgs, s.skipOrder, tt.want)
		}
	}
}
