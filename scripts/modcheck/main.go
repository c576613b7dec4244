// Command modcheck checks that every module of this repository resolves for a
// user outside it, the way it will once its release tags are published.
//
// It finds the modules (every folder with a go.mod, skipping testdata, vendor
// and folders whose name starts with "." or "_", as the Makefile does; see
// package scripts/internal/modules, which also says how a go.mod marks its
// module as not published) and runs four checks:
//
//   - static: each go.mod declares the module path its folder is fetched as,
//     has no replace directive (a replace in a go.mod never reaches the
//     module's users), and requires each sibling module at a released version
//     (the release version or an existing tag), never at a pseudo-version,
//     and a published module requires no unpublished one; go.work uses
//     every module and nothing else.
//   - tidy: each module, copied out of the workspace, is tidy: with
//     GOWORK=off, go mod tidy through a local module proxy that serves every
//     module of the repository at the release version changes nothing in
//     go.mod and nothing in go.sum but the lines of the repository's own
//     modules.
//   - adopt: a new module outside the repository runs go get on the root and
//     pgstore modules at the release version through that proxy and builds a
//     program that imports httpretry and pgstore; then the same program builds
//     in a go.work that uses the repository's modules, with no replace
//     anywhere.
//   - graph: a new module that requires only grpcretry, or only
//     otelstormguard, lists no PostgreSQL or Redis driver and no
//     OpenTelemetry SDK (nor, for otelstormguard, the Prometheus exporter)
//     in go mod graph, right after go get and again once a program imports
//     it and go mod tidy ran (see leanModules in graph.go).
//
// The local proxy is a folder laid out as GOPROXY=file://... expects. Each
// module is in it as a real module zip (golang.org/x/mod/zip: no nested
// modules, no vendor, no .git), taken from the git tag of the release
// ("v0.1.0" for the root, "<folder>/v0.1.0" for the others) if it exists,
// else from the working tree (tracked files and untracked ones git does not
// ignore). Modules not in it are fetched through the GOPROXY of the
// environment, with the local module cache's download folder tried first. The
// checks use a module cache of their own, removed at the end, so a zip built
// from a changed working tree never meets a stale copy of the same version.
//
// Usage, from the scripts folder (its module needs no sibling, so it builds
// with the workspace off even while a go.mod of the repository is broken):
//
//	GOWORK=off go run ./modcheck [-version v0.1.0] [-proxy dir] [-fix] [-published] [check ...]
//
// make modules-check runs it with every check, make tidy with -fix.
//
// With no check named, all four run. With -published, it prints the folder
// of every published module, one a line (scripts/tag-release tags those), and
// checks nothing. With -fix, the static check rewrites
// a go.work that fails it, and the tidy check writes the tidy go.mod and
// go.sum of a module that is not tidy (make tidy). With -proxy, the proxy is written to
// dir and kept, so that it can be used by hand:
//
//	GOPROXY=file://dir,$(go env GOPROXY) GONOSUMDB=github.com/stormguard/stormguard GOWORK=off go get ...
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "modcheck:", err)
		os.Exit(1)
	}
}

// checks lists the checks in the order they run.
var checks = []string{"static", "tidy", "adopt", "graph"}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("modcheck", flag.ContinueOnError)
	version := fs.String("version", "v0.1.0", "release `version` every module is served at")
	proxyDir := fs.String("proxy", "", "write the module proxy to `dir` and keep it")
	fix := fs.Bool("fix", false, "rewrite go.work, and the go.mod and go.sum of an untidy module, instead of failing")
	published := fs.Bool("published", false, "print the folder of each published module, one a line, and check nothing")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: modcheck [flags] [%s ...]\n", strings.Join(checks, " | "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !semver.IsValid(*version) || semver.Canonical(*version) != *version || semver.Prerelease(*version) != "" || semver.Build(*version) != "" {
		return fmt.Errorf("-version %q: want a release version such as v0.1.0", *version)
	}
	want := fs.Args()
	if len(want) == 0 {
		want = checks
	}
	for _, c := range want {
		if !slices.Contains(checks, c) {
			return fmt.Errorf("unknown check %q (have %s)", c, strings.Join(checks, ", "))
		}
	}

	root, err := gitOutput(".", "rev-parse", "--show-toplevel")
	if err != nil {
		return fmt.Errorf("finding the repository: %w", err)
	}
	repo, err := loadRepo(strings.TrimSpace(root), *version)
	if err != nil {
		return err
	}
	if *published {
		for _, m := range repo.modules {
			if m.Published {
				fmt.Fprintln(out, m.Dir)
			}
		}
		return nil
	}
	fmt.Fprintf(out, "== modules (%d): %s\n", len(repo.modules), strings.Join(repo.dirs(), " "))

	if slices.Contains(want, "static") {
		if err := repo.runStatic(out, *fix); err != nil {
			return err
		}
	}
	if !slices.Contains(want, "tidy") && !slices.Contains(want, "adopt") && !slices.Contains(want, "graph") && *proxyDir == "" {
		return nil
	}
	return repo.runWithProxy(want, *proxyDir, *fix, out)
}

// runStatic runs the static check; with fix, it first rewrites a go.work
// that fails it.
func (r *repo) runStatic(out io.Writer, fix bool) error {
	errs := r.checkStatic()
	if len(errs) > 0 && fix && len(r.checkWork()) > 0 {
		if err := r.writeWork(); err != nil {
			return err
		}
		fmt.Fprintln(out, "== static: go.work rewritten")
		errs = r.checkStatic()
	}
	if len(errs) > 0 {
		for _, e := range errs {
			fmt.Fprintln(out, e)
		}
		return fmt.Errorf("static check: %d problems", len(errs))
	}
	fmt.Fprintln(out, "== static: go.mod paths, no replace, sibling requirements at released versions, go.work: ok")
	return nil
}

// runWithProxy builds the module proxy (in proxyDir, if set, and kept) and
// runs the checks of want that need it: tidy, adopt and graph.
func (r *repo) runWithProxy(want []string, proxyDir string, fix bool, out io.Writer) error {
	work, err := os.MkdirTemp("", "stormguard-modcheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	dir := proxyDir
	if dir == "" {
		dir = filepath.Join(work, "proxy")
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return err
	}
	px, err := r.buildProxy(dir, filepath.Join(work, "zips"))
	if err != nil {
		return err
	}
	for _, m := range r.modules {
		fmt.Fprintf(out, "== proxy: %s %s from %s\n", m.Path, r.version, px.source[m.Path])
	}
	env, err := newGoEnv(dir, filepath.Join(work, "modcache"), r.rootPath)
	if err != nil {
		return err
	}
	// The module cache is made writable (-modcacherw) so that it can be removed.
	defer os.RemoveAll(filepath.Join(work, "modcache"))

	failed := 0
	if slices.Contains(want, "tidy") {
		for _, m := range r.modules {
			start := time.Now()
			fixed, err := r.checkTidy(m, px, env, filepath.Join(work, "tidy"), fix)
			took := time.Since(start).Round(100 * time.Millisecond)
			switch {
			case err != nil:
				fmt.Fprintf(out, "== tidy %s: FAIL (%v)\n%v\n", m.Dir, took, err)
				failed++
			case fixed:
				fmt.Fprintf(out, "== tidy %s: fixed: go.mod and go.sum rewritten (%v)\n", m.Dir, took)
			default:
				fmt.Fprintf(out, "== tidy %s: ok (%v)\n", m.Dir, took)
			}
		}
	}
	if slices.Contains(want, "adopt") {
		if err := r.checkAdoption(env, filepath.Join(work, "adopt"), out); err != nil {
			fmt.Fprintf(out, "== adopt: FAIL\n%v\n", err)
			failed++
		}
	}
	if slices.Contains(want, "graph") {
		if err := r.checkGraphs(env, filepath.Join(work, "graph"), out); err != nil {
			fmt.Fprintf(out, "== graph: FAIL\n%v\n", err)
			failed++
		}
	}
	if err := keepDownloads(env, r); err != nil {
		fmt.Fprintf(out, "== note: could not add this run's downloads to the module cache: %v\n", err)
	}
	if failed > 0 {
		return fmt.Errorf("%d checks failed", failed)
	}
	return nil
}
