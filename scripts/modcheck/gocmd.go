package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/mod/module"
)

// A goEnv runs the go command the way a user outside the repository would,
// with the repository's modules published at the release version.
type goEnv struct {
	vars map[string]string // variables set on top of the process environment
}

// newGoEnv returns the environment for the checks: no workspace, the local
// proxy first, then the local module cache's download folder (itself a proxy
// of what the real one already served; go.sum still checks every hash), then
// the environment's own GOPROXY; checksum database lookups off for the
// repository's own modules only (their hashes exist nowhere yet); direct VCS
// fetches of them off, so that a version the local proxy lacks fails at once
// instead of trying the network; and a module cache of the checks' own.
func newGoEnv(proxyDir, modcache, rootPath string) (*goEnv, error) {
	out, err := exec.Command("go", "env", "-json", "GOPROXY", "GOFLAGS", "GONOSUMDB", "GOVCS", "GOMODCACHE").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	var cur map[string]string
	if err := json.Unmarshal(out, &cur); err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	proxies := []string{fileURL(proxyDir)}
	if cur["GOMODCACHE"] != "" {
		proxies = append(proxies, fileURL(filepath.Join(cur["GOMODCACHE"], "cache", "download")))
	}
	if p := cur["GOPROXY"]; p != "" && p != "off" {
		proxies = append(proxies, p)
	}
	return &goEnv{vars: map[string]string{
		"GOWORK":     "off",
		"GOPROXY":    strings.Join(proxies, ","),
		"GONOSUMDB":  joinList(cur["GONOSUMDB"], rootPath),
		"GOVCS":      joinList(rootPath+":off", cur["GOVCS"]),
		"GOFLAGS":    strings.TrimSpace(cur["GOFLAGS"] + " -mod=mod -modcacherw"),
		"GOMODCACHE": modcache,
	}}, nil
}

func fileURL(dir string) string {
	return "file://" + filepath.ToSlash(dir)
}

func joinList(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "," + b
}

// with returns a copy of e with more variables set.
func (e *goEnv) with(kv ...string) *goEnv {
	c := &goEnv{vars: map[string]string{}}
	for k, v := range e.vars {
		c.vars[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		c.vars[kv[i]] = kv[i+1]
	}
	return c
}

// environ returns the process environment with e's variables set.
func (e *goEnv) environ() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := e.vars[k]; !ok {
			env = append(env, kv)
		}
	}
	for k, v := range e.vars {
		env = append(env, k+"="+v)
	}
	return env
}

// run runs a command in dir and returns its standard output; the error holds
// the command line and everything it printed.
func (e *goEnv) run(dir, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = e.environ()
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s (in %s): %w\n%s%s", name, strings.Join(args, " "), dir, err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// keepDownloads runs go mod download, with the environment's own settings,
// for each third-party module version that this run fetched from the network
// and the local module cache lacks, so that the next run finds it there
// instead of fetching it again. The repository's own modules never go there.
func keepDownloads(env *goEnv, r *repo) error {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return err
	}
	userDL := filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
	ourDL := filepath.Join(env.vars["GOMODCACHE"], "cache", "download")
	var missing []string
	err = filepath.WalkDir(ourDL, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".zip") {
			return err
		}
		rel, err := filepath.Rel(ourDL, p)
		if err != nil {
			return err
		}
		escPath, escFile, ok := strings.Cut(filepath.ToSlash(rel), "/@v/")
		if !ok {
			return nil
		}
		modPath, err1 := module.UnescapePath(escPath)
		ver, err2 := module.UnescapeVersion(strings.TrimSuffix(escFile, ".zip"))
		if err1 != nil || err2 != nil || r.ours(modPath) || modPath == "golang.org/toolchain" {
			return nil
		}
		if _, err := os.Stat(filepath.Join(userDL, rel)); err == nil {
			return nil
		}
		missing = append(missing, modPath+"@"+ver)
		return nil
	})
	if err != nil || len(missing) == 0 {
		return err
	}
	cmd := exec.Command("go", append([]string{"mod", "download"}, missing...)...)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go mod download: %w\n%s", err, out)
	}
	return nil
}
