// Command layoutcheck checks the rules of the repository's layout that the
// compiler does not, over the .go files of every module (the folders
// scripts/internal/modules finds; testdata, vendor and folders starting
// with "." or "_" skipped, as the go command does):
//
//   - internal: no shipped file imports another module's internal package.
//     A shipped file is a non-test file of a published module. The go
//     command allows the import (the paths share a root), but a change to
//     the internal package would break the released versions of the module
//     that imports it: give it a public API, or its own copy.
//   - httpretry: no package imports httpretry (the HTTP client) but the
//     HTTP client adapters in [httpretryUsers]: wire names and shared types
//     belong below the client, not in it. Test files may import it (a test
//     drives its server with the real client).
//   - file size: no non-test file over 600 lines ([maxFileLines]).
//   - function size: no non-test function over 100 lines ([maxFuncLines]),
//     from its func keyword to its closing brace, unless its doc comment
//     says why with a "//stormguard:long <why it is one function>" line
//     (a directive, so go doc does not show it; the reason must not be
//     empty).
//
// Generated files (a "Code generated ... DO NOT EDIT." line) are skipped.
// It prints every finding, grouped by rule, and exits with status 1 if there
// is one. make test runs it (make layout-check).
//
// Usage, from the scripts folder:
//
//	GOWORK=off go run ./layoutcheck [-root dir]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/stormguard/stormguard/scripts/internal/modules"
)

func main() {
	root := flag.String("root", "", "the repository's root `folder` (default: the git work tree around the current folder)")
	flag.Parse()
	if *root == "" {
		r, err := modules.Root()
		if err != nil {
			fmt.Fprintln(os.Stderr, "layoutcheck:", err)
			os.Exit(2)
		}
		*root = r
	}
	n, err := run(*root, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "layoutcheck:", err)
		os.Exit(2)
	}
	if n > 0 {
		os.Exit(1)
	}
}

// run checks the repository at root, prints the findings to out and returns
// how many there are.
func run(root string, out io.Writer) (int, error) {
	files, mods, err := load(root)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, r := range rules {
		fs := r.check(files, mods)
		total += len(fs)
		if len(fs) == 0 {
			fmt.Fprintf(out, "== %s: ok\n", r.name)
			continue
		}
		fmt.Fprintf(out, "== %s: %d found (%s)\n", r.name, len(fs), r.rule)
		for _, f := range fs {
			fmt.Fprintf(out, "\t%s\n", f)
		}
	}
	return total, nil
}
