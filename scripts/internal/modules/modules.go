// Package modules finds the modules of this repository and tells which of
// them are published, for the tools in scripts (modcheck, layoutcheck,
// apicount and, through modcheck, the release tags).
//
// A module is every folder with a go.mod, skipping testdata, vendor and
// folders whose name starts with "." or "_", as the go command's ./...
// patterns and the Makefile do. A module is published (tagged by make
// release-tags, resolvable by users, its non-test code "shipped") unless its
// go.mod has the line
//
//	//stormguard:unpublished
//
// on its own, in a comment above the module line with a sentence that says
// why: the benchmarks (bench), the repository's tools (scripts) and the
// test-only modules that keep heavy test dependencies out of a published
// module's go.mod (otelstormguard/test, grpcretry/test).
package modules

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

// UnpublishedDirective is the go.mod line that marks a module as not
// published.
const UnpublishedDirective = "//stormguard:unpublished"

// A Module is one module of the repository.
type Module struct {
	Dir       string // slash-separated folder from the repository root; "." for the root
	Path      string // module path declared by its go.mod
	GoMod     []byte // go.mod as in the working tree
	File      *modfile.File
	Published bool // the go.mod has no [UnpublishedDirective] line
}

// SkipDir reports whether a folder is left out of the module search (and of
// the packages of a module): the go command ignores testdata, vendor and
// names starting with "." or "_" in ./... patterns.
func SkipDir(name string) bool {
	return name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")
}

// FindDirs returns the folders under root that hold a go.mod, as
// slash-separated paths relative to root ("." for root itself), sorted.
func FindDirs(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && SkipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Name() == "go.mod" && d.Type().IsRegular() {
			rel, err := filepath.Rel(root, filepath.Dir(p))
			if err != nil {
				return err
			}
			dirs = append(dirs, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(dirs)
	return dirs, err
}

// Load reads the go.mod of every module under root, sorted by folder (the
// root module first). It fails if two modules declare the same path or if
// root has no go.mod.
func Load(root string) ([]*Module, error) {
	dirs, err := FindDirs(root)
	if err != nil {
		return nil, err
	}
	var mods []*Module
	byPath := map[string]*Module{}
	for _, dir := range dirs {
		name := path.Join(dir, "go.mod")
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, err
		}
		if f.Module == nil {
			return nil, fmt.Errorf("%s: no module line", name)
		}
		m := &Module{Dir: dir, Path: f.Module.Mod.Path, GoMod: data, File: f, Published: !Unpublished(data)}
		if prev := byPath[m.Path]; prev != nil {
			return nil, fmt.Errorf("%s and %s/go.mod both declare module %s", name, prev.Dir, m.Path)
		}
		byPath[m.Path] = m
		mods = append(mods, m)
	}
	if len(mods) == 0 || mods[0].Dir != "." {
		return nil, errors.New("no go.mod at the repository root")
	}
	return mods, nil
}

// Unpublished reports whether a go.mod's text has the [UnpublishedDirective]
// line.
func Unpublished(goMod []byte) bool {
	for line := range bytes.Lines(goMod) {
		if string(bytes.TrimSpace(line)) == UnpublishedDirective {
			return true
		}
	}
	return false
}

// Of returns the module that holds the slash-separated path rel (a file or
// folder relative to the repository root): the module with the longest
// folder that is rel or a parent of it. mods must come from [Load].
func Of(mods []*Module, rel string) *Module {
	var best *Module
	for _, m := range mods {
		switch {
		case m.Dir == ".":
			if best == nil {
				best = m
			}
		case rel == m.Dir || strings.HasPrefix(rel, m.Dir+"/"):
			if best == nil || best.Dir == "." || len(m.Dir) > len(best.Dir) {
				best = m
			}
		}
	}
	return best
}

// Root returns the root of the git work tree around the current folder.
func Root() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("finding the repository: git rev-parse --show-toplevel: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}
