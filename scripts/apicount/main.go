// Command apicount counts the exported names of the repository's API: for
// every package a user can import (a non-main, non-internal package of a
// published module; see scripts/internal/modules), the exported top-level
// names (constants, variables, types, functions), the exported methods (of
// any type) and the exported struct fields and interface methods of its
// exported types, in its non-test files. Embedded fields are not counted.
//
// It prints one line per package (its folder, then the top-level names,
// methods, fields and their sum), and a last line with the totals.
//
// With -max-top, a package with more top-level names fails; with
// -max-total, a sum of all names above it fails: each is named on a line
// of its own and the exit status is 1.
//
// Usage, from the scripts folder (make api):
//
//	GOWORK=off go run ./apicount [-root dir] [-max-top n] [-max-total n]
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stormguard/stormguard/scripts/internal/modules"
)

func main() {
	root := flag.String("root", "", "the repository's root `folder` (default: the git work tree around the current folder)")
	maxTop := flag.Int("max-top", 0, "fail if a package has more than `n` top-level names (0: no limit)")
	maxTotal := flag.Int("max-total", 0, "fail if all packages together have more than `n` names (0: no limit)")
	flag.Parse()
	if *root == "" {
		r, err := modules.Root()
		if err != nil {
			fmt.Fprintln(os.Stderr, "apicount:", err)
			os.Exit(2)
		}
		*root = r
	}
	counts, err := count(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "apicount:", err)
		os.Exit(2)
	}
	if over := report(os.Stdout, counts, *maxTop, *maxTotal); over > 0 {
		os.Exit(1)
	}
}

// A pkgCount is the exported names of one package.
type pkgCount struct {
	dir                 string // slash folder from the repository root
	top, methods, field int
}

func (c pkgCount) sum() int { return c.top + c.methods + c.field }

// count returns the counts of every package of the API, by folder.
func count(root string) ([]pkgCount, error) {
	mods, err := modules.Load(root)
	if err != nil {
		return nil, err
	}
	byDir := map[string]*pkgCount{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (modules.SkipDir(d.Name()) || d.Name() == "internal") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if !modules.Of(mods, rel).Published {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		dir := path.Dir(rel)
		c := byDir[dir]
		if c == nil {
			c = &pkgCount{dir: dir}
			byDir[dir] = c
		}
		addFile(c, f)
		return nil
	})
	var out []pkgCount
	for _, c := range byDir {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b pkgCount) int { return strings.Compare(a.dir, b.dir) })
	return out, err
}

// addFile adds the exported names of one file to c.
func addFile(c *pkgCount, f *ast.File) {
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			switch {
			case !d.Name.IsExported():
			case d.Recv != nil:
				c.methods++
			default:
				c.top++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if n.IsExported() {
							c.top++
						}
					}
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						c.top++
						c.field += members(s.Type)
					}
				}
			}
		}
	}
}

// members returns the exported named fields of a struct type, or the
// exported methods of an interface type.
func members(t ast.Expr) int {
	var list *ast.FieldList
	switch t := t.(type) {
	case *ast.StructType:
		list = t.Fields
	case *ast.InterfaceType:
		list = t.Methods
	default:
		return 0
	}
	n := 0
	for _, f := range list.List {
		for _, name := range f.Names {
			if name.IsExported() {
				n++
			}
		}
	}
	return n
}

// report prints the table and returns how many limits were exceeded.
func report(w io.Writer, counts []pkgCount, maxTop, maxTotal int) int {
	fmt.Fprintf(w, "%-28s %5s %9s %7s %5s\n", "package", "top", "methods", "fields", "sum")
	var total pkgCount
	over := 0
	var notes []string
	for _, c := range counts {
		fmt.Fprintf(w, "%-28s %5d %9d %7d %5d\n", c.dir, c.top, c.methods, c.field, c.sum())
		total.top += c.top
		total.methods += c.methods
		total.field += c.field
		if maxTop > 0 && c.top > maxTop {
			over++
			notes = append(notes, fmt.Sprintf("over: %s has %d top-level names, more than %d", c.dir, c.top, maxTop))
		}
	}
	fmt.Fprintf(w, "%-28s %5d %9d %7d %5d\n", "total", total.top, total.methods, total.field, total.sum())
	if maxTotal > 0 && total.sum() > maxTotal {
		over++
		notes = append(notes, fmt.Sprintf("over: %d names in all, more than %d", total.sum(), maxTotal))
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return over
}
