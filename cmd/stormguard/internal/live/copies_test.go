package live_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCopiesMatch: the bench module's peer comparisons run on this package,
// but Go's internal rule keeps it to cmd/stormguard, so bench holds a copy
// (bench/internal/live) that must stay equal to this package, file for
// file, byte for byte (the package imports the standard library only).
func TestCopiesMatch(t *testing.T) {
	const (
		orig     = "cmd/stormguard/internal/live"
		copyDir  = "bench/internal/live"
		fromRoot = "../../../.." // this folder to the repository root
	)
	shipped := goFiles(t, ".")
	shipped = slices.DeleteFunc(shipped, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
	if len(shipped) == 0 {
		t.Fatal("no shipped .go file here")
	}
	copies := goFiles(t, filepath.Join(fromRoot, copyDir))
	for _, f := range shipped {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(fromRoot, copyDir, f))
		switch {
		case os.IsNotExist(err):
			t.Errorf("%s/%s is missing: the copy of %s/%s; bring it over (from the repository root): cp %s/%s %s/%s", copyDir, f, orig, f, orig, f, copyDir, f)
		case err != nil:
			t.Fatal(err)
		case !bytes.Equal(got, want):
			t.Errorf("%s/%s differs from %s/%s; bring it over (from the repository root): cp %s/%s %s/%s", copyDir, f, orig, f, orig, f, copyDir, f)
		}
	}
	for _, f := range copies {
		if !slices.Contains(shipped, f) {
			t.Errorf("%s/%s is not in %s (the copy holds the original's shipped files only): remove it (rm %s/%s)", copyDir, f, orig, copyDir, f)
		}
	}
}

// goFiles returns the names of the .go files in dir.
func goFiles(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			out = append(out, e.Name())
		}
	}
	return out
}
