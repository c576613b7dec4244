// Package copycheck compares a package with its copy in another module of
// the repository. A published module may not import another module's
// internal package, so the few it needs (cmd/stormguard's simulator steps
// the breaker's own wait order and pacer) are copied into an internal folder
// of its own, and TestRepositoryCopies (this package's test, one row per
// copy, with why it exists) calls [Compare] so that no copy can drift.
//
// The copy holds the original's shipped (non-test) .go files, file for file.
// Each must equal the original byte for byte, except that an import path
// beginning with the original's prefix (such as
// "github.com/stormguard/stormguard/internal/") begins with the copy's
// prefix (such as "github.com/stormguard/stormguard/cmd/stormguard/internal/"):
// that rewrite of quoted paths, and nothing else, is allowed.
package copycheck

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Pair names a package and its copy.
type Pair struct {
	// Root is the repository root, as a path from the test's working
	// directory (the original package's folder), such as "../..".
	Root string
	// Orig and Copy are the folders of the package and of its copy, from
	// Root, with slashes, such as "internal/waitq" and
	// "cmd/stormguard/internal/waitq".
	Orig, Copy string
	// OrigPrefix and CopyPrefix are the import-path prefixes the copy
	// rewrites, such as "github.com/stormguard/stormguard/internal/" and
	// "github.com/stormguard/stormguard/cmd/stormguard/internal/". Both
	// empty: the copy is byte-identical.
	OrigPrefix, CopyPrefix string
}

// Compare returns one line per difference between p.Orig and p.Copy: a
// shipped file of the original that the copy lacks or holds with other
// content (with the command, run from the repository root, that brings it
// over), or a .go file of the copy that the original does not ship. No
// line: the copy is equal. The error reports a folder or file it could not
// read, or an original with no shipped .go file.
func Compare(p Pair) ([]string, error) {
	orig, err := shipped(filepath.Join(p.Root, filepath.FromSlash(p.Orig)))
	if err != nil {
		return nil, err
	}
	if len(orig) == 0 {
		return nil, fmt.Errorf("copycheck: %s has no shipped .go file", p.Orig)
	}
	copies, err := goFiles(filepath.Join(p.Root, filepath.FromSlash(p.Copy)))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range orig {
		src := p.Orig + "/" + name
		dst := p.Copy + "/" + name
		data, err := os.ReadFile(filepath.Join(p.Root, filepath.FromSlash(src)))
		if err != nil {
			return nil, fmt.Errorf("copycheck: %w", err)
		}
		want := p.rewrite(data)
		got, err := os.ReadFile(filepath.Join(p.Root, filepath.FromSlash(dst)))
		switch {
		case os.IsNotExist(err):
			out = append(out, fmt.Sprintf("%s is missing: the copy of %s; bring it over (from the repository root): %s", dst, src, p.command(src, dst, data)))
		case err != nil:
			return nil, fmt.Errorf("copycheck: %w", err)
		case !bytes.Equal(got, want):
			out = append(out, fmt.Sprintf("%s differs from %s; bring it over (from the repository root): %s", dst, src, p.command(src, dst, data)))
		}
	}
	for _, name := range copies {
		if !slices.Contains(orig, name) {
			out = append(out, fmt.Sprintf("%s/%s is not in %s (the copy holds the original's shipped files only): remove it (rm %s/%s)", p.Copy, name, p.Orig, p.Copy, name))
		}
	}
	return out, nil
}

// rewrite returns data with every quoted import path beginning with
// p.OrigPrefix made to begin with p.CopyPrefix.
func (p Pair) rewrite(data []byte) []byte {
	if p.OrigPrefix == p.CopyPrefix {
		return data
	}
	return bytes.ReplaceAll(data, []byte(`"`+p.OrigPrefix), []byte(`"`+p.CopyPrefix))
}

// command returns the shell command that makes dst the copy of src (whose
// content is data): cp, or sed when data holds a path to rewrite.
func (p Pair) command(src, dst string, data []byte) string {
	if p.OrigPrefix == p.CopyPrefix || !bytes.Contains(data, []byte(`"`+p.OrigPrefix)) {
		return fmt.Sprintf("cp %s %s", src, dst)
	}
	return fmt.Sprintf(`sed 's#"%s#"%s#g' %s > %s`, p.OrigPrefix, p.CopyPrefix, src, dst)
}

// shipped returns the names of the non-test .go files in dir, sorted.
func shipped(dir string) ([]string, error) {
	all, err := goFiles(dir)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(name string) bool { return strings.HasSuffix(name, "_test.go") }), nil
}

// goFiles returns the names of the .go files in dir, sorted.
func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("copycheck: %w", err)
	}
	var out []string
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".go") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}
