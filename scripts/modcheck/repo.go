package main

import (
	"fmt"
	"go/version"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"

	"github.com/stormguard/stormguard/scripts/internal/modules"
)

// A repoModule is one module of the repository.
type repoModule = modules.Module

// A repo is the repository's modules and the version they are released at.
type repo struct {
	root     string // absolute path of the work tree
	version  string // release version, such as v0.1.0
	rootPath string // module path of the root module
	modules  []*repoModule
	byPath   map[string]*repoModule
}

// loadRepo reads the go.mod of every module under root.
func loadRepo(root, version string) (*repo, error) {
	mods, err := modules.Load(root)
	if err != nil {
		return nil, err
	}
	r := &repo{root: root, version: version, rootPath: mods[0].Path, modules: mods, byPath: map[string]*repoModule{}}
	for _, m := range mods {
		r.byPath[m.Path] = m
	}
	return r, nil
}

// dirs returns the module folders.
func (r *repo) dirs() []string {
	var ds []string
	for _, m := range r.modules {
		ds = append(ds, m.Dir)
	}
	return ds
}

// wantPath returns the module path the go command expects for the module in
// folder dir: a module in a subfolder of the repository is fetched as the
// root's path plus that folder.
func (r *repo) wantPath(dir string) string {
	if dir == "." {
		return r.rootPath
	}
	return r.rootPath + "/" + dir
}

// tag returns the git tag that releases module m at version v.
func tag(m *repoModule, v string) string {
	if m.Dir == "." {
		return v
	}
	return m.Dir + "/" + v
}

// ours reports whether a module path belongs to this repository's path space.
func (r *repo) ours(p string) bool {
	return p == r.rootPath || strings.HasPrefix(p, r.rootPath+"/")
}

// checkStatic checks the go.mod files and go.work without running the go
// command. It returns one message per problem.
func (r *repo) checkStatic() []string {
	var errs []string
	report := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	for _, m := range r.modules {
		name := path.Join(m.Dir, "go.mod")
		if want := r.wantPath(m.Dir); m.Path != want {
			report("%s: module %s: folder %s of this repository is fetched as module %s, so go.mod must declare that path", name, m.Path, m.Dir, want)
		}
		for _, rep := range m.File.Replace {
			report("%s:%d: replace %s => %s: a replace in a go.mod never reaches the module's users (the go command ignores it outside the main module); develop against sibling modules through go.work", name, rep.Syntax.Start.Line, modString(rep.Old), modString(rep.New))
		}
		for _, req := range m.File.Require {
			if !r.ours(req.Mod.Path) {
				continue
			}
			sib := r.byPath[req.Mod.Path]
			switch {
			case sib == nil:
				report("%s:%d: require %s: no module of this repository has that path", name, req.Syntax.Start.Line, modString(req.Mod))
			case module.IsPseudoVersion(req.Mod.Version):
				report("%s:%d: require %s: a pseudo-version of a sibling cannot be resolved by users; require the release version %s", name, req.Syntax.Start.Line, modString(req.Mod), r.version)
			case req.Mod.Version != r.version && !gitTagExists(r.root, tag(sib, req.Mod.Version)):
				report("%s:%d: require %s: neither the release version %s nor tagged (no git tag %s)", name, req.Syntax.Start.Line, modString(req.Mod), r.version, tag(sib, req.Mod.Version))
			case m.Published && !sib.Published:
				report("%s:%d: require %s: %s is published but %s/go.mod says %s (it is never tagged, so users cannot resolve it)", name, req.Syntax.Start.Line, modString(req.Mod), m.Dir, sib.Dir, modules.UnpublishedDirective)
			}
		}
	}
	errs = append(errs, r.checkWork()...)
	return errs
}

func modString(v module.Version) string {
	if v.Version == "" {
		return v.Path
	}
	return v.Path + " " + v.Version
}

// checkWork checks that go.work uses every module and nothing else, that its
// go version is at least every module's, and that its replace lines point the
// release version of modules at their folders, one at least for each module
// that a sibling requires at that version.
func (r *repo) checkWork() []string {
	data, err := os.ReadFile(filepath.Join(r.root, "go.work"))
	if err != nil {
		return []string{fmt.Sprintf("go.work: %v; want:\n%s", err, r.workFile(""))}
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return []string{err.Error()}
	}
	var errs []string
	var used []string
	for _, u := range wf.Use {
		used = append(used, path.Clean(filepath.ToSlash(u.Path)))
	}
	slices.Sort(used)
	if !slices.Equal(used, r.dirs()) {
		errs = append(errs, fmt.Sprintf("go.work uses %v, want every module of the repository: %v", used, r.dirs()))
	}
	for _, m := range r.modules {
		if wf.Go != nil && m.File.Go != nil && version.Compare("go"+wf.Go.Version, "go"+m.File.Go.Version) < 0 {
			errs = append(errs, fmt.Sprintf("go.work: go %s is older than %s/go.mod's go %s", wf.Go.Version, m.Dir, m.File.Go.Version))
		}
	}
	// A replace may only point a module's release version at its folder; one
	// is needed for each module that a sibling requires at that version.
	allowed := map[string]string{}
	for _, m := range r.modules {
		allowed[m.Path] = workDir(m.Dir)
	}
	replaced := map[string]bool{}
	for _, rep := range wf.Replace {
		dir, ok := allowed[rep.Old.Path]
		if !ok || rep.Old.Version != r.version || rep.New.Version != "" || path.Clean(rep.New.Path) != path.Clean(dir) {
			errs = append(errs, fmt.Sprintf("go.work:%d: replace %s => %s: the only replace go.work may have points a module's release version at its folder (%s %s => %s)",
				rep.Syntax.Start.Line, modString(rep.Old), modString(rep.New), rep.Old.Path, r.version, dir))
			continue
		}
		replaced[rep.Old.Path] = true
	}
	for _, m := range r.modules {
		for _, req := range m.File.Require {
			if sib := r.byPath[req.Mod.Path]; sib != nil && req.Mod.Version == r.version && !replaced[sib.Path] {
				errs = append(errs, fmt.Sprintf("go.work lacks replace %s %s => %s, which %s/go.mod needs until %s is published", sib.Path, r.version, workDir(sib.Dir), m.Dir, r.version))
				replaced[sib.Path] = true // once
			}
		}
	}
	if len(errs) > 0 {
		goLine := ""
		if wf.Go != nil {
			goLine = wf.Go.Version
		}
		errs = append(errs, "a go.work that passes:\n"+r.workFile(goLine))
	}
	return errs
}

// writeWork rewrites go.work as [repo.workFile] makes it, keeping its go line.
func (r *repo) writeWork() error {
	name := filepath.Join(r.root, "go.work")
	goLine := ""
	if data, err := os.ReadFile(name); err == nil {
		if wf, err := modfile.ParseWork(name, data, nil); err == nil && wf.Go != nil {
			goLine = wf.Go.Version
		}
	}
	return os.WriteFile(name, []byte(r.workFile(goLine)), 0o644)
}

// workDir returns the go.work spelling of a module folder.
func workDir(dir string) string {
	if dir == "." {
		return "./"
	}
	return "./" + dir
}

// workFile returns the go.work this repository needs, with go line goLine
// unless a module needs a newer one, and a replace line for every module, so
// that a sibling can start requiring any of them.
func (r *repo) workFile(goLine string) string {
	var b strings.Builder
	newest := goLine
	if newest == "" {
		newest = "1.21"
	}
	for _, m := range r.modules {
		if m.File.Go != nil && version.Compare("go"+m.File.Go.Version, "go"+newest) > 0 {
			newest = m.File.Go.Version
		}
	}
	fmt.Fprintf(&b, "go %s\n\nuse (\n", newest)
	for _, m := range r.modules {
		fmt.Fprintf(&b, "\t%s\n", workDir(m.Dir))
	}
	b.WriteString(")\n\n")
	b.WriteString(workReplaceComment)
	b.WriteString("replace (\n")
	for _, m := range r.modules {
		fmt.Fprintf(&b, "\t%s %s => %s\n", m.Path, r.version, workDir(m.Dir))
	}
	b.WriteString(")\n")
	return b.String()
}

// workReplaceComment explains go.work's replace lines in go.work itself.
const workReplaceComment = `// Each workspace module stands in for itself at every version, but the go
// command still reads the go.mod of the release version a sibling requires
// to build the module graph. Until that version is published, these lines
// point it at the local folder. They apply only in workspace mode: no go.mod
// has a replace, and users resolve the released versions.
`
