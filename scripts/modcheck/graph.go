package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// A leanModule is a published module whose users must not download a
// heavy dependency it does not need: a module that requires only it has
// none of the modules in forbid (module paths, each matching itself and the
// paths below it) in its module graph, except where a module in excuse
// requires it (a dependency the module cannot do without, whose own go.mod
// brings it in).
type leanModule struct {
	dir    string   // folder of the module in the repository
	why    string   // what it is, for the report
	forbid []string // module paths; "./x" is the repository's module in folder x
	excuse []string // module paths whose requirements of a forbidden module are theirs, not ours
}

// leanModules are the modules the graph check checks: a gRPC user does not
// download a PostgreSQL or Redis driver (grpcretry's end-to-end tests over
// the stores live in the test-only module grpcretry/test), nor an
// OpenTelemetry SDK beyond the one grpc's own go.mod requires; a user of the
// OpenTelemetry adapter gets the OpenTelemetry API only, not the SDK or the
// Prometheus exporter (its SDK tests live in otelstormguard/test; the CLI
// serves Prometheus).
var leanModules = []leanModule{
	{dir: "grpcretry", why: "gRPC interceptors", forbid: []string{
		"github.com/jackc/pgx", "github.com/redis/go-redis", "go.opentelemetry.io/otel/sdk",
		"./idempotency/pgstore", "./idempotency/redisstore", "./fleet", "./otelstormguard",
	}, excuse: []string{"google.golang.org/grpc"}},
	{dir: "otelstormguard", why: "OpenTelemetry adapter", forbid: []string{
		"github.com/jackc/pgx", "github.com/redis/go-redis", "go.opentelemetry.io/otel/sdk",
		"go.opentelemetry.io/otel/exporters", "github.com/prometheus",
	}},
}

// checkGraphs checks every [leanModule]: in a new module outside the
// repository, go get of the module alone at the release version (through
// the local proxy, as [repo.checkAdoption] does), then go mod graph; then a
// program that imports the module's package, go mod tidy and go mod graph
// again. Neither graph may reach a forbidden module but through an excused
// one.
func (r *repo) checkGraphs(env *goEnv, tmp string, out io.Writer) error {
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return err
	}
	var problems []string
	for _, lm := range leanModules {
		m := r.byDir(lm.dir)
		if m == nil {
			return fmt.Errorf("no module in folder %s", lm.dir)
		}
		forbid := make([]string, len(lm.forbid))
		for i, f := range lm.forbid {
			if dir, ok := strings.CutPrefix(f, "./"); ok {
				f = r.wantPath(dir)
			}
			forbid[i] = f
		}
		start := time.Now()
		bad, err := r.graphOf(env, tmp, m.Path, forbid, lm.excuse)
		if err != nil {
			return err
		}
		took := time.Since(start).Round(100 * time.Millisecond)
		if len(bad) > 0 {
			problems = append(problems, fmt.Sprintf("a module that requires only %s (%s) downloads what it should not (%v):\n\t%s", m.Path, lm.why, took, strings.Join(bad, "\n\t")))
			continue
		}
		also := ""
		if len(lm.excuse) > 0 {
			also = " (but what " + strings.Join(lm.excuse, ", ") + " requires)"
		}
		fmt.Fprintf(out, "== graph: a module requiring only %s@%s: no %s%s in go mod graph: ok (%v)\n", m.Path, r.version, strings.Join(lm.forbid, ", "), also, took)
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "\n"))
	}
	return nil
}

// graphOf returns how the forbidden modules get into the module graphs of a
// new module requiring only modPath, one line each: the chain of
// requirements from the new module to the first forbidden module on it
// (see [forbiddenPaths]).
func (r *repo) graphOf(env *goEnv, tmp, modPath string, forbid, excuse []string) ([]string, error) {
	dir, err := os.MkdirTemp(tmp, "lean-")
	if err != nil {
		return nil, err
	}
	var chains []string
	when := map[string][]string{}
	graph := func(step string) error {
		g, err := env.run(dir, "go", "mod", "graph")
		if err != nil {
			return err
		}
		for _, c := range forbiddenPaths(g, forbid, excuse) {
			if when[c] == nil {
				chains = append(chains, c)
			}
			when[c] = append(when[c], step)
		}
		return nil
	}
	if _, err := env.run(dir, "go", "mod", "init", "example.com/lean"); err != nil {
		return nil, err
	}
	if _, err := env.run(dir, "go", "get", modPath+"@"+r.version); err != nil {
		return nil, err
	}
	if err := graph("after go get"); err != nil {
		return nil, err
	}
	prog := fmt.Sprintf("package main\n\nimport _ %q\n\nfunc main() {}\n", modPath)
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(prog), 0o644); err != nil {
		return nil, err
	}
	if _, err := env.run(dir, "go", "mod", "tidy"); err != nil {
		return nil, err
	}
	if err := graph("once a program imports it, after go mod tidy"); err != nil {
		return nil, err
	}
	var bad []string
	for _, c := range chains {
		bad = append(bad, c+" ("+strings.Join(when[c], "; ")+")")
	}
	return bad, nil
}

// forbiddenPaths reads go mod graph output (one "A B" line per requirement:
// A requires B, each path@version, the main module a bare path, first) and
// returns, for each forbidden module (one of forbid or below one) that the
// main module reaches without an edge from a module in excuse (or below
// one) to a forbidden module, the shortest chain of requirements that
// reaches it, as "main -> A@v -> B@v". Chains through a forbidden module
// stop there: the first forbidden module is the finding.
func forbiddenPaths(graph string, forbid, excuse []string) []string {
	under := func(p string, list []string) bool {
		p, _, _ = strings.Cut(p, "@")
		for _, x := range list {
			if p == x || strings.HasPrefix(p, x+"/") {
				return true
			}
		}
		return false
	}
	next := map[string][]string{}
	main := ""
	for line := range strings.Lines(graph) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if main == "" {
			main = f[0]
		}
		if under(f[1], forbid) && under(f[0], excuse) {
			continue
		}
		next[f[0]] = append(next[f[0]], f[1])
	}
	from := map[string]string{main: ""}
	queue := []string{main}
	var found []string
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n != main && under(n, forbid) {
			found = append(found, n)
			continue
		}
		for _, m := range next[n] {
			if _, seen := from[m]; !seen {
				from[m] = n
				queue = append(queue, m)
			}
		}
	}
	var chains []string
	for _, n := range found {
		chain := []string{n}
		for p := from[n]; p != ""; p = from[p] {
			chain = append(chain, p)
		}
		slices.Reverse(chain)
		chains = append(chains, strings.Join(chain, " -> "))
	}
	slices.Sort(chains)
	return chains
}

// byDir returns the module in folder dir, or nil.
func (r *repo) byDir(dir string) *repoModule {
	for _, m := range r.modules {
		if m.Dir == dir {
			return m
		}
	}
	return nil
}
