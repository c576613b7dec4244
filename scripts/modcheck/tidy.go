package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// checkTidy reports whether module m is tidy outside the workspace: it
// unpacks the module zip of m's working tree into a fresh folder under tmp,
// runs go mod tidy there with env, and compares the result with the working
// tree: go.mod byte for byte, go.sum line for line except the lines of this
// repository's own modules.
//
// Those lines are left out because their hashes are of the release's module
// zips, which exist only once the release tags do: until then the local proxy
// serves zips of the working tree, whose hashes change with every edit, and
// after the tags the committed go.sum may still lack them. Everything a user
// resolves beyond them (every third-party module and version) must match.
//
// With fix set, an untidy module's go.mod and go.sum are replaced by the tidy
// ones (less the lines left out of the comparison), and fixed is true.
func (r *repo) checkTidy(m *repoModule, px *proxy, env *goEnv, tmp string, fix bool) (fixed bool, err error) {
	dir := filepath.Join(tmp, strings.ReplaceAll(m.Dir, "/", "_"))
	if err := os.RemoveAll(dir); err != nil {
		return false, err
	}
	if err := modzip.Unzip(dir, module.Version{Path: m.Path, Version: r.version}, px.wtZip[m.Path]); err != nil {
		return false, err
	}
	wantSum, err := readFileIfExists(filepath.Join(r.root, filepath.FromSlash(m.Dir), "go.sum"))
	if err != nil {
		return false, err
	}
	if _, err := env.run(dir, "go", "mod", "tidy"); err != nil {
		return false, err
	}
	gotMod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false, err
	}
	gotSum, err := readFileIfExists(filepath.Join(dir, "go.sum"))
	if err != nil {
		return false, err
	}
	var problems []string
	if !bytes.Equal(gotMod, m.GoMod) {
		problems = append(problems, fmt.Sprintf("%s/go.mod is not tidy; go mod tidy makes it:\n%s", m.Dir, diffLines(string(m.GoMod), string(gotMod))))
	}
	if w, g := r.sumLines(wantSum), r.sumLines(gotSum); !slices.Equal(w, g) {
		problems = append(problems, fmt.Sprintf("%s/go.sum is not tidy (lines of %s/... aside); go mod tidy makes it:\n%s", m.Dir, r.rootPath, diffLines(strings.Join(w, ""), strings.Join(g, ""))))
	}
	if len(problems) == 0 {
		return false, nil
	}
	if fix {
		modDir := filepath.Join(r.root, filepath.FromSlash(m.Dir))
		if err := os.WriteFile(filepath.Join(modDir, "go.mod"), gotMod, 0o644); err != nil {
			return false, err
		}
		return true, os.WriteFile(filepath.Join(modDir, "go.sum"), []byte(strings.Join(r.sumLines(gotSum), "")), 0o644)
	}
	return false, fmt.Errorf("%s\nto fix: make tidy", strings.Join(problems, "\n"))
}

// sumLines returns the lines of a go.sum, with their newlines, except those of
// this repository's modules.
func (r *repo) sumLines(data []byte) []string {
	var lines []string
	for _, l := range strings.SplitAfter(string(data), "\n") {
		if l == "" {
			continue
		}
		if f := strings.Fields(l); len(f) > 0 && r.ours(f[0]) {
			continue
		}
		lines = append(lines, l)
	}
	return lines
}

func readFileIfExists(name string) ([]byte, error) {
	data, err := os.ReadFile(name)
	if os.IsNotExist(err) {
		return nil, nil
	}
	return data, err
}

// diffLines returns a unified diff from a to b, by diff(1) when it is
// installed, else as the lines only in a (-) and only in b (+).
func diffLines(a, b string) string {
	dir, err := os.MkdirTemp("", "modcheck-diff-")
	if err == nil {
		defer os.RemoveAll(dir)
		an, bn := filepath.Join(dir, "want"), filepath.Join(dir, "tidy")
		if os.WriteFile(an, []byte(a), 0o644) == nil && os.WriteFile(bn, []byte(b), 0o644) == nil {
			out, _ := exec.Command("diff", "-u", "--label", "committed", "--label", "tidy", an, bn).Output()
			if len(out) > 0 {
				return string(out)
			}
		}
	}
	var out strings.Builder
	al, bl := strings.SplitAfter(a, "\n"), strings.SplitAfter(b, "\n")
	for _, l := range al {
		if l != "" && !slices.Contains(bl, l) {
			out.WriteString("-" + l)
		}
	}
	for _, l := range bl {
		if l != "" && !slices.Contains(al, l) {
			out.WriteString("+" + l)
		}
	}
	if out.Len() == 0 {
		return "(same lines in another order)\n"
	}
	return out.String()
}
