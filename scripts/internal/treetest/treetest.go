// Package treetest writes file trees for the tests of the tools in scripts.
package treetest

import (
	"os"
	"path/filepath"
	"testing"
)

// Write writes files (slash paths relative to dir, and their contents)
// under dir, making the folders they need. An error fails tb.
func Write(tb testing.TB, dir string, files map[string]string) {
	tb.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}
