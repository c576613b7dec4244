package copycheck_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/internal/copycheck"
)

const (
	origPrefix = "example.com/m/internal/"
	copyPrefix = "example.com/m/cmd/x/internal/"
	// orig is a shipped file that imports a sibling through origPrefix.
	orig = "package a\n\nimport \"example.com/m/internal/b\"\n\nvar _ = b.X\n"
	// copied is orig with its import rewritten.
	copied = "package a\n\nimport \"example.com/m/cmd/x/internal/b\"\n\nvar _ = b.X\n"
)

// tree writes files (path from the root: content) under a new folder and
// returns it.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestCompare(t *testing.T) {
	sedFix := `sed 's#"example.com/m/internal/#"example.com/m/cmd/x/internal/#g' internal/a/a.go > cmd/x/internal/a/a.go`
	tests := []struct {
		name     string
		files    map[string]string
		rewrite  bool
		want     []string // substrings, one per expected line, in order
		wantNone bool
	}{
		{
			name:     "rewritten import only",
			files:    map[string]string{"internal/a/a.go": orig, "internal/a/a_test.go": "package a\n", "cmd/x/internal/a/a.go": copied},
			rewrite:  true,
			wantNone: true,
		},
		{
			name:  "byte-identical copy of a file that imports through the prefix",
			files: map[string]string{"internal/a/a.go": orig, "cmd/x/internal/a/a.go": orig},
			// Without the rewrite the copy would import the original's
			// package, which its module may not.
			rewrite: true,
			want:    []string{"cmd/x/internal/a/a.go differs from internal/a/a.go; bring it over (from the repository root): " + sedFix},
		},
		{
			name:    "other change beside the rewrite",
			files:   map[string]string{"internal/a/a.go": orig, "cmd/x/internal/a/a.go": strings.Replace(copied, "b.X", "b.Y", 1)},
			rewrite: true,
			want:    []string{"cmd/x/internal/a/a.go differs from internal/a/a.go; bring it over (from the repository root): " + sedFix},
		},
		{
			name:    "prefix outside an import path is not rewritten",
			files:   map[string]string{"internal/a/a.go": "package a\n\n// see example.com/m/internal/b\n", "cmd/x/internal/a/a.go": "package a\n\n// see example.com/m/cmd/x/internal/b\n"},
			rewrite: true,
			want:    []string{"cmd/x/internal/a/a.go differs from internal/a/a.go; bring it over (from the repository root): cp internal/a/a.go cmd/x/internal/a/a.go"},
		},
		{
			name:  "missing file and extra file",
			files: map[string]string{"internal/a/a.go": orig, "internal/a/b.go": "package a\n", "cmd/x/internal/a/a.go": orig, "cmd/x/internal/a/c.go": "package a\n"},
			want: []string{
				"cmd/x/internal/a/b.go is missing: the copy of internal/a/b.go; bring it over (from the repository root): cp internal/a/b.go cmd/x/internal/a/b.go",
				"cmd/x/internal/a/c.go is not in internal/a",
			},
		},
		{
			name:     "byte-identical without a rewrite",
			files:    map[string]string{"internal/a/a.go": orig, "cmd/x/internal/a/a.go": orig},
			wantNone: true,
		},
		{
			name:  "rewritten copy when none is allowed",
			files: map[string]string{"internal/a/a.go": orig, "cmd/x/internal/a/a.go": copied},
			want:  []string{"cmd/x/internal/a/a.go differs from internal/a/a.go; bring it over (from the repository root): cp internal/a/a.go cmd/x/internal/a/a.go"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := copycheck.Pair{Root: tree(t, tt.files), Orig: "internal/a", Copy: "cmd/x/internal/a"}
			if tt.rewrite {
				p.OrigPrefix, p.CopyPrefix = origPrefix, copyPrefix
			}
			got, err := copycheck.Compare(p)
			if err != nil {
				t.Fatal(err)
			}
			if tt.wantNone {
				if len(got) != 0 {
					t.Fatalf("Compare = %q, want no difference", got)
				}
				return
			}
			if len(got) != len(tt.want) {
				t.Fatalf("Compare = %q, want %d lines", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("line %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

func TestCompareErrors(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
	}{
		{"no original", map[string]string{"cmd/x/internal/a/a.go": orig}},
		{"original with tests only", map[string]string{"internal/a/a_test.go": orig, "cmd/x/internal/a/a.go": orig}},
		{"no copy folder", map[string]string{"internal/a/a.go": orig}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := copycheck.Pair{Root: tree(t, tt.files), Orig: "internal/a", Copy: "cmd/x/internal/a"}
			if got, err := copycheck.Compare(p); err == nil {
				t.Fatalf("Compare = %q, nil error; want an error", got)
			}
		})
	}
}
