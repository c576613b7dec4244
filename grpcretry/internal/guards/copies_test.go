package guards_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCopiesMatch: grpcretry, a module of its own, may not import this
// internal package, so it holds a copy of it (grpcretry/internal/guards);
// the copy must stay equal to this package, file for file, byte for byte.
func TestCopiesMatch(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	copyDir := filepath.Join("..", "..", "grpcretry", "internal", "guards")
	shipped := 0
	for _, f := range files {
		if filepath.Ext(f) != ".go" || len(f) > 8 && f[len(f)-8:] == "_test.go" {
			continue
		}
		shipped++
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(copyDir, f))
		if err != nil {
			t.Errorf("copy of %s: %v", f, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from internal/guards/%s: copy it over (cp internal/guards/%s %s)", filepath.Join(copyDir, f), f, f, copyDir)
		}
	}
	copies, err := filepath.Glob(filepath.Join(copyDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	if shipped == 0 || len(copies) != shipped {
		t.Errorf("%d files here, %d in %s: the copy must hold the same files", shipped, len(copies), copyDir)
	}
}
