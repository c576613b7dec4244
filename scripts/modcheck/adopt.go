package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
)

// adopterMain is the program a user writes: an HTTP client that retries
// through httpretry, as the README shows it, and a PostgreSQL store for the
// idempotency middleware.
const adopterMain = `package main

import (
	"fmt"
	"os"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/store"
)

func main() {
	client, err := httpretry.NewClient(httpretry.WithTimeout(10 * time.Second))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var keys store.Store = (*pgstore.Store)(nil)
	fmt.Println(client.Transport != nil, keys != nil)
}
`

// checkAdoption checks that a module outside the repository can use the
// released modules, in two ways. First, as a user does: go get the root and
// pgstore modules at the release version through the proxy, then build and
// run a program importing httpretry and pgstore with -mod=readonly, so that
// go.mod and go.sum must be complete. Second, as a user developing against a
// clone: the same module in a go.work that uses it and every module of the
// repository, with no replace anywhere; the go command then builds the
// repository's folders, reading only the go.mod of the required versions
// from the proxy.
func (r *repo) checkAdoption(env *goEnv, tmp string, out io.Writer) error {
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(tmp, "adopter-")
	if err != nil {
		return err
	}
	if rel, err := filepath.Rel(r.root, dir); err == nil && !strings.HasPrefix(rel, "..") {
		return fmt.Errorf("temporary folder %s is inside the repository; set TMPDIR elsewhere", dir)
	}
	pg := r.rootPath + "/idempotency/pgstore"
	if r.byPath[pg] == nil {
		return fmt.Errorf("no module %s in the repository", pg)
	}
	steps := [][]string{
		{"go", "mod", "init", "example.com/adopter"},
		{"go", "get", r.rootPath + "@" + r.version, pg + "@" + r.version},
	}
	for _, s := range steps {
		if _, err := env.run(dir, s[0], s[1:]...); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(adopterMain), 0o644); err != nil {
		return err
	}
	if _, err := env.run(dir, "go", "mod", "tidy"); err != nil {
		return err
	}
	readonly := env.with("GOFLAGS", strings.ReplaceAll(env.vars["GOFLAGS"], "-mod=mod", "-mod=readonly"))
	if err := buildAndRun(readonly, dir); err != nil {
		return err
	}
	// The versions selected are the released ones, from module zips.
	for _, p := range []string{r.rootPath, pg} {
		got, err := readonly.run(dir, "go", "list", "-m", "-f", "{{.Version}} {{.Dir}}", p)
		if err != nil {
			return err
		}
		v, d, _ := strings.Cut(strings.TrimSpace(got), " ")
		if v != r.version || !strings.HasPrefix(d, env.vars["GOMODCACHE"]) {
			return fmt.Errorf("go list -m %s = %q, want version %s from the module cache", p, got, r.version)
		}
	}
	fmt.Fprintf(out, "== adopt: go get %s@%s %s@%s outside the repository, build and run: ok\n", r.rootPath, r.version, pg, r.version)

	// The same module in a go.work with the repository's modules.
	ws, err := os.MkdirTemp(tmp, "workspace-")
	if err != nil {
		return err
	}
	for _, name := range []string{"go.mod", "go.sum", "main.go"} {
		if err := copyFile(filepath.Join(ws, name), filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	work := readonly.with("GOWORK", filepath.Join(ws, "go.work"), "GOFLAGS", strings.ReplaceAll(env.vars["GOFLAGS"], "-mod=mod", ""))
	args := []string{"work", "init", "."}
	for _, m := range r.modules {
		args = append(args, filepath.Join(r.root, filepath.FromSlash(m.Dir)))
	}
	if _, err := work.run(ws, "go", args...); err != nil {
		return err
	}
	if err := noReplace(filepath.Join(ws, "go.work"), filepath.Join(ws, "go.mod")); err != nil {
		return err
	}
	if err := buildAndRun(work, ws); err != nil {
		return err
	}
	for _, m := range []*repoModule{r.byPath[r.rootPath], r.byPath[pg]} {
		got, err := work.run(ws, "go", "list", "-m", "-f", "{{.Dir}}", m.Path)
		if err != nil {
			return err
		}
		if want := filepath.Join(r.root, filepath.FromSlash(m.Dir)); strings.TrimSpace(got) != want {
			return fmt.Errorf("in the workspace, go list -m %s = %s, want the repository folder %s", m.Path, got, want)
		}
	}
	fmt.Fprintf(out, "== adopt: the same program in a go.work using the repository's %d modules, no replace: ok\n", len(r.modules))
	return nil
}

// buildAndRun builds the program in dir and checks what it prints.
func buildAndRun(env *goEnv, dir string) error {
	bin := filepath.Join(dir, "adopter")
	if _, err := env.run(dir, "go", "build", "-trimpath", "-o", bin, "."); err != nil {
		return err
	}
	got, err := env.run(dir, bin)
	if err != nil {
		return err
	}
	if got != "true true\n" {
		return fmt.Errorf("%s printed %q, want %q", bin, got, "true true\n")
	}
	return nil
}

// noReplace checks that the go.mod and go.work files named have no replace.
func noReplace(names ...string) error {
	for _, name := range names {
		data, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		var n int
		if strings.HasSuffix(name, ".work") {
			f, err := modfile.ParseWork(name, data, nil)
			if err != nil {
				return err
			}
			n = len(f.Replace)
		} else {
			f, err := modfile.Parse(name, data, nil)
			if err != nil {
				return err
			}
			n = len(f.Replace)
		}
		if n > 0 {
			return fmt.Errorf("%s has %d replace directives, want none:\n%s", name, n, data)
		}
	}
	return nil
}
