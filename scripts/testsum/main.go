// Command testsum reads the output of go test -json (from one or more go test
// runs, one after the other) on standard input and prints what plain go test
// prints, plus, at the end, which tests were skipped and why, and the totals.
//
// For each package it prints the package's closing line (ok, FAIL, or no
// test files), build errors, and the whole output of every failed test; the
// output of passing tests is left out, as go test does without -v. At the
// end it prints one line per skip reason, grouping the tests whose skip
// message names an environment variable (an upper-case name with an
// underscore, such as STORMGUARD_POSTGRES_URL) under that variable:
//
//	skipped: 14 tests need STORMGUARD_POSTGRES_URL (idempotency/pgstore)
//	skipped: 3 tests: would run long (cmd/stormguard/internal/sim)
//
// and a last line with the totals over every test, subtest and example
// (a package that fails with no failing test, such as one that does not
// build, counts as one failed):
//
//	tests: 812 passed, 0 failed, 15 skipped
//
// It exits with status 1 if a test or package failed or a package did not
// build, and with status 2 if its input has no test event at all.
//
// Usage:
//
//	go test -json ./... | go run ./scripts/testsum [-trim module/path]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
)

func main() {
	s := newSummary(os.Stdout)
	flag.StringVar(&s.trim, "trim", "", "module `path` trimmed from the package paths in the closing lines")
	flag.Parse()
	if err := s.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	os.Exit(s.finish())
}

// event is one line of go test -json output (cmd/test2json).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string // build-output and build-fail events
	FailedBuild string
}

// testKey names one test of one package.
type testKey struct{ pkg, test string }

// summary accumulates the events of one or more go test runs.
type summary struct {
	out            io.Writer
	trim           string                // module path trimmed from package paths in the closing lines
	output         map[testKey][]string  // output of each test still running, and of each package
	done           map[testKey]bool      // tests that ended
	passed, failed int                   // tests, subtests and examples; failed also counts each package that failed without a failing test
	skipped        int                   //
	skips          map[string]*skipGroup // by reason
	skipOrder      []string
	failedPkgs     []string
	testFailed     map[string]bool // packages with a failed test
	events         int
}

// skipGroup is the tests skipped for one reason.
type skipGroup struct {
	reason string
	count  int
	pkgs   []string
}

func newSummary(out io.Writer) *summary {
	return &summary{
		out:    out,
		output: map[testKey][]string{},
		done:   map[testKey]bool{},
		skips:  map[string]*skipGroup{},

		testFailed: map[string]bool{},
	}
}

// read consumes go test -json lines. A line that is not a JSON event (go test
// prints some errors as plain text) is copied to the output as it is.
func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil || e.Action == "" {
			fmt.Fprintf(s.out, "%s\n", line)
			continue
		}
		s.handle(e)
	}
	return sc.Err()
}

// handle records one event and prints what plain go test would print for it.
func (s *summary) handle(e event) {
	s.events++
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.out, e.Output)
		return
	case "build-fail":
		return
	}
	k := testKey{e.Package, e.Test}
	switch e.Action {
	case "output":
		s.output[k] = append(s.output[k], e.Output)
	case "pass", "fail", "skip":
		if e.Test == "" {
			s.endPackage(e)
			return
		}
		s.done[k] = true
		switch e.Action {
		case "pass":
			s.passed++
		case "fail":
			s.failed++
			s.testFailed[e.Package] = true
			for _, l := range s.output[k] {
				fmt.Fprint(s.out, l)
			}
		case "skip":
			s.skipped++
			s.addSkip(e.Package, skipMessage(s.output[k]))
		}
		delete(s.output, k)
	}
}

// endPackage prints the package's own output (its closing line, and anything
// printed outside a test) and, if it failed, the output of tests that never
// ended (a panic or a timeout ends the test binary in the middle of a test).
func (s *summary) endPackage(e event) {
	if e.Action == "fail" {
		s.failedPkgs = append(s.failedPkgs, e.Package)
		if !s.testFailed[e.Package] {
			// It failed with no failing test: it did not build, or its
			// test binary died outside a test. That counts as one failure.
			s.failed++
		}
		for k, lines := range s.output {
			if k.pkg == e.Package && k.test != "" && !s.done[k] {
				for _, l := range lines {
					fmt.Fprint(s.out, l)
				}
			}
		}
	}
	k := testKey{e.Package, ""}
	for _, l := range s.output[k] {
		if l == "PASS\n" || l == "testing: warning: no tests to run\n" {
			continue // go test without -v prints neither
		}
		fmt.Fprint(s.out, l)
	}
	for key := range s.output {
		if key.pkg == e.Package {
			delete(s.output, key)
		}
	}
	for key := range s.done {
		if key.pkg == e.Package {
			delete(s.done, key)
		}
	}
}

// skipMessage returns what a skipped test logged, without the === and ---
// lines and the file:line prefixes, on one line.
func skipMessage(lines []string) string {
	var msg []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- ") {
			continue
		}
		msg = append(msg, fileLine.ReplaceAllString(t, ""))
	}
	return strings.Join(msg, " ")
}

var (
	fileLine = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)
	// envVar matches an environment variable a skip message asks for, with
	// the value it must have if the message gives one (NAME=1).
	envVar = regexp.MustCompile(`\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b(?:=\S+)?`)
)

// addSkip counts a skipped test under its reason: the environment variables
// its message names, or else the message itself.
func (s *summary) addSkip(pkg, msg string) {
	var reason string
	if vars := envVar.FindAllString(msg, -1); len(vars) > 0 {
		for i, v := range vars {
			vars[i] = strings.TrimRight(v, ".,;:)")
		}
		slices.Sort(vars)
		reason = "need " + strings.Join(slices.Compact(vars), " and ")
	} else if msg != "" {
		reason = ": " + msg
	} else {
		reason = ": (no message)"
	}
	g := s.skips[reason]
	if g == nil {
		g = &skipGroup{reason: reason}
		s.skips[reason] = g
		s.skipOrder = append(s.skipOrder, reason)
	}
	g.count++
	if !slices.Contains(g.pkgs, pkg) {
		g.pkgs = append(g.pkgs, pkg)
	}
}

// finish prints the skip lines and the totals and returns the exit status.
func (s *summary) finish() int {
	if len(s.failedPkgs) > 0 {
		slices.Sort(s.failedPkgs)
		var pkgs []string
		for _, p := range s.failedPkgs {
			pkgs = append(pkgs, s.shortPkg(p))
		}
		fmt.Fprintf(s.out, "FAIL: %s\n", strings.Join(pkgs, " "))
	}
	for _, r := range s.skipOrder {
		g := s.skips[r]
		noun, reason := "tests", g.reason
		if g.count == 1 {
			noun, reason = "test", strings.Replace(reason, "need ", "needs ", 1)
		}
		if !strings.HasPrefix(reason, ":") {
			reason = " " + reason
		}
		var pkgs []string
		for _, p := range g.pkgs {
			pkgs = append(pkgs, s.shortPkg(p))
		}
		fmt.Fprintf(s.out, "skipped: %d %s%s (%s)\n", g.count, noun, reason, strings.Join(pkgs, ", "))
	}
	fmt.Fprintf(s.out, "tests: %d passed, %d failed, %d skipped\n", s.passed, s.failed, s.skipped)
	switch {
	case s.failed > 0 || len(s.failedPkgs) > 0:
		return 1
	case s.events == 0:
		fmt.Fprintln(s.out, "testsum: no test events on standard input")
		return 2
	}
	return 0
}

// shortPkg trims the module path set by -trim from a package path.
func (s *summary) shortPkg(p string) string {
	if s.trim != "" {
		if t := strings.TrimPrefix(p, s.trim); t != p && (t == "" || t[0] == '/') {
			t = strings.TrimPrefix(t, "/")
			if t == "" {
				return "."
			}
			return t
		}
	}
	return p
}
