package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/stormguard/stormguard/scripts/internal/modules"
)

// A goFile is one .go file of the repository, parsed.
type goFile struct {
	rel   string          // slash path from the repository root
	mod   *modules.Module // the module that holds it
	pkg   string          // import path of its package
	test  bool            // a _test.go file
	lines int
	fset  *token.FileSet
	ast   *ast.File
}

// shipped reports whether f is code a user of a published module builds.
func (f *goFile) shipped() bool { return f.mod.Published && !f.test }

// pos returns "file:line" for a position in f.
func (f *goFile) pos(p token.Pos) string {
	return f.rel + ":" + itoa(f.fset.Position(p).Line)
}

// load parses every .go file of every module under root, generated files
// left out.
func load(root string) ([]*goFile, []*modules.Module, error) {
	mods, err := modules.Load(root)
	if err != nil {
		return nil, nil, err
	}
	var files []*goFile
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && modules.SkipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		af, err := parser.ParseFile(fset, rel, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if ast.IsGenerated(af) {
			return nil
		}
		m := modules.Of(mods, rel)
		files = append(files, &goFile{
			rel:   rel,
			mod:   m,
			pkg:   pkgPath(m, path.Dir(rel)),
			test:  strings.HasSuffix(rel, "_test.go"),
			lines: bytes.Count(src, []byte("\n")) + boolInt(len(src) > 0 && src[len(src)-1] != '\n'),
			fset:  fset,
			ast:   af,
		})
		return nil
	})
	return files, mods, err
}

// pkgPath returns the import path of the package in folder dir (slash path
// from the repository root) of module m.
func pkgPath(m *modules.Module, dir string) string {
	if dir == m.Dir || m.Dir == "." && dir == "." {
		return m.Path
	}
	if m.Dir == "." {
		return m.Path + "/" + dir
	}
	return m.Path + "/" + strings.TrimPrefix(dir, m.Dir+"/")
}

// owner returns the module of the repository that holds the package with
// import path p (the module with the longest path that is p or a parent of
// it), or nil if p is not the repository's.
func owner(mods []*modules.Module, p string) *modules.Module {
	var best *modules.Module
	for _, m := range mods {
		if (p == m.Path || strings.HasPrefix(p, m.Path+"/")) && (best == nil || len(m.Path) > len(best.Path)) {
			best = m
		}
	}
	return best
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
