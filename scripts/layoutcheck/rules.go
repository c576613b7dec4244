package main

import (
	"fmt"
	"go/ast"
	"slices"
	"strconv"
	"strings"

	"github.com/stormguard/stormguard/scripts/internal/modules"
)

// Limits of the size rules.
const (
	maxFileLines = 600
	maxFuncLines = 100
)

// longDirective, followed by a reason, in the doc comment of a function
// lets it run over maxFuncLines.
const longDirective = "//stormguard:long"

// httpretryUsers are the packages, by folder from the repository root, that
// may import httpretry in non-test code: HTTP client adapters, code whose
// job is to send HTTP requests through stormguard's client. Everything else
// (servers, other protocols, the fleet) takes the wire names and shared
// types from the packages below the client. A folder covers its subfolders.
var httpretryUsers = map[string]string{
	"cmd/stormguard":    "the CLI's demo sends its clients' requests through httpretry's transport",
	"internal/idemtest": "the HTTP end-to-end harness drives its payments through httpretry's client",
}

// A rule is one check over the parsed files.
type rule struct {
	name  string
	rule  string // the rule, for the report
	check func([]*goFile, []*modules.Module) []string
}

var rules = []rule{
	{"internal", "a shipped (non-test) file of a published module imports another module's internal package", checkInternal},
	{"httpretry", "a non-test file imports httpretry outside the HTTP client adapters allowed in scripts/layoutcheck (httpretryUsers)", checkHTTPRetry},
	{"file size", fmt.Sprintf("a non-test .go file has more than %d lines", maxFileLines), checkFileSize},
	{"function size", fmt.Sprintf("a non-test function has more than %d lines and no %s <reason> in its doc comment", maxFuncLines, longDirective), checkFuncSize},
}

// checkInternal finds the imports of another module's internal package in
// shipped files.
func checkInternal(files []*goFile, mods []*modules.Module) []string {
	var out []string
	for _, f := range files {
		if !f.shipped() {
			continue
		}
		for _, imp := range f.ast.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil || !isInternal(p) {
				continue
			}
			if m := owner(mods, p); m != nil && m != f.mod {
				out = append(out, fmt.Sprintf("%s: imports %s, internal to module %s", f.pos(imp.Pos()), p, m.Path))
			}
		}
	}
	return out
}

// isInternal reports whether import path p is of an internal package.
func isInternal(p string) bool {
	return strings.HasSuffix(p, "/internal") || strings.Contains(p, "/internal/") || strings.HasPrefix(p, "internal/")
}

// checkHTTPRetry finds the imports of httpretry in non-test files of
// packages that are not in httpretryUsers.
func checkHTTPRetry(files []*goFile, mods []*modules.Module) []string {
	httpretry := mods[0].Path + "/httpretry"
	var out []string
	for _, f := range files {
		if f.test || allowedHTTPRetryUser(f.rel) {
			continue
		}
		for _, imp := range f.ast.Imports {
			if p, err := strconv.Unquote(imp.Path.Value); err == nil && (p == httpretry || strings.HasPrefix(p, httpretry+"/")) && !strings.HasPrefix(f.pkg+"/", httpretry+"/") {
				out = append(out, fmt.Sprintf("%s: package %s imports %s", f.pos(imp.Pos()), strings.TrimPrefix(f.pkg, mods[0].Path+"/"), p))
			}
		}
	}
	return out
}

// allowedHTTPRetryUser reports whether the file at rel is in a folder of
// httpretryUsers.
func allowedHTTPRetryUser(rel string) bool {
	for dir := range httpretryUsers {
		if strings.HasPrefix(rel, dir+"/") {
			return true
		}
	}
	return false
}

// checkFileSize finds the non-test files over maxFileLines, longest first.
func checkFileSize(files []*goFile, _ []*modules.Module) []string {
	var big []*goFile
	for _, f := range files {
		if !f.test && f.lines > maxFileLines {
			big = append(big, f)
		}
	}
	slices.SortStableFunc(big, func(a, b *goFile) int { return b.lines - a.lines })
	var out []string
	for _, f := range big {
		out = append(out, fmt.Sprintf("%s: %d lines", f.rel, f.lines))
	}
	return out
}

// checkFuncSize finds the non-test functions over maxFuncLines whose doc
// comment has no longDirective with a reason, longest first; a directive
// with no reason is a finding of its own.
func checkFuncSize(files []*goFile, _ []*modules.Module) []string {
	type long struct {
		where string
		n     int
		note  string
	}
	var found []long
	for _, f := range files {
		if f.test {
			continue
		}
		for _, d := range f.ast.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := f.fset.Position(fd.End()).Line - f.fset.Position(fd.Pos()).Line + 1
			if n <= maxFuncLines {
				continue
			}
			reason, marked := longReason(fd.Doc)
			switch {
			case marked && reason != "":
				continue
			case marked:
				found = append(found, long{f.pos(fd.Pos()) + ": " + funcName(fd), n, "; " + longDirective + " has no reason"})
			default:
				found = append(found, long{f.pos(fd.Pos()) + ": " + funcName(fd), n, ""})
			}
		}
	}
	slices.SortStableFunc(found, func(a, b long) int { return b.n - a.n })
	var out []string
	for _, l := range found {
		out = append(out, fmt.Sprintf("%s, %d lines%s", l.where, l.n, l.note))
	}
	return out
}

// longReason returns the reason of the longDirective in a doc comment, and
// whether the directive is there.
func longReason(doc *ast.CommentGroup) (string, bool) {
	if doc == nil {
		return "", false
	}
	for _, c := range doc.List {
		if rest, ok := strings.CutPrefix(c.Text, longDirective); ok && (rest == "" || rest[0] == ' ' || rest[0] == '\t') {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

// funcName returns a function's name, with its receiver's type for a
// method: "(*Breaker).Done".
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	return "(" + typeString(fd.Recv.List[0].Type) + ")." + fd.Name.Name
}

func typeString(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return "*" + typeString(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.IndexExpr:
		return typeString(t.X)
	case *ast.IndexListExpr:
		return typeString(t.X)
	case *ast.ParenExpr:
		return typeString(t.X)
	}
	return "?"
}

func itoa(n int) string { return strconv.Itoa(n) }
