package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

// A proxy is a module proxy folder built from the repository.
type proxy struct {
	dir    string            // the folder, served as GOPROXY=file://dir
	source map[string]string // module path -> where its zip came from
	wtZip  map[string]string // module path -> zip of its working tree
}

// buildProxy writes every module at r.version into dir in the layout of the
// GOPROXY protocol: <path>/@v/list, <version>.info, <version>.mod and
// <version>.zip. A module's zip and go.mod come from its release tag when it
// exists, else from the working tree. The zips of the working trees are kept
// in zips, for the tidy check.
func (r *repo) buildProxy(dir, zips string) (*proxy, error) {
	px := &proxy{dir: dir, source: map[string]string{}, wtZip: map[string]string{}}
	if err := os.MkdirAll(zips, 0o755); err != nil {
		return nil, err
	}
	for i, m := range r.modules {
		mv := module.Version{Path: m.Path, Version: r.version}
		wt := filepath.Join(zips, fmt.Sprintf("%d.zip", i))
		if err := writeZip(wt, func(w io.Writer) error { return r.worktreeZip(w, m, mv) }); err != nil {
			return nil, err
		}
		px.wtZip[m.Path] = wt

		escPath, err := module.EscapePath(m.Path)
		if err != nil {
			return nil, err
		}
		escVer, err := module.EscapeVersion(mv.Version)
		if err != nil {
			return nil, err
		}
		vdir := filepath.Join(dir, filepath.FromSlash(escPath), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			return nil, err
		}
		base := filepath.Join(vdir, escVer)

		t := tag(m, r.version)
		var goMod []byte
		var when time.Time
		if rev, ok := gitTagCommit(r.root, t); ok {
			px.source[m.Path] = "tag " + t
			if goMod, err = gitBytes(r.root, "show", rev+":"+path.Join(m.Dir, "go.mod")); err != nil {
				return nil, err
			}
			out, err := gitOutput(r.root, "show", "-s", "--format=%cI", rev)
			if err != nil {
				return nil, err
			}
			if when, err = time.Parse(time.RFC3339, strings.TrimSpace(out)); err != nil {
				return nil, err
			}
			sub := m.Dir
			if sub == "." {
				sub = ""
			}
			if err := writeZip(base+".zip", func(w io.Writer) error { return modzip.CreateFromVCS(w, mv, r.root, rev, sub) }); err != nil {
				return nil, err
			}
		} else {
			px.source[m.Path] = "the working tree (no tag " + t + ")"
			goMod, when = m.GoMod, time.Now()
			if err := copyFile(base+".zip", wt); err != nil {
				return nil, err
			}
		}
		if err := os.WriteFile(base+".mod", goMod, 0o644); err != nil {
			return nil, err
		}
		info, err := json.Marshal(struct {
			Version string
			Time    time.Time
		}{mv.Version, when.UTC().Truncate(time.Second)})
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(base+".info", info, 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(vdir, "list"), []byte(mv.Version+"\n"), 0o644); err != nil {
			return nil, err
		}
	}
	return px, nil
}

// worktreeZip writes the module zip of m's working tree: the files git lists
// as tracked or untracked-but-not-ignored (what a commit of the tree would
// hold), with the zip rules of [modzip.Create] (no nested modules, no vendor
// packages, no symbolic links). Like the go command for a module in a
// subfolder, it adds the repository's LICENSE when the folder has none.
func (r *repo) worktreeZip(w io.Writer, m *repoModule, mv module.Version) error {
	out, err := gitBytes(r.root, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", m.Dir)
	if err != nil {
		return err
	}
	prefix := ""
	if m.Dir != "." {
		prefix = m.Dir + "/"
	}
	seen := map[string]bool{}
	var files []modzip.File
	for name := range strings.SplitSeq(string(out), "\x00") {
		if name == "" || seen[name] || !strings.HasPrefix(name, prefix) {
			continue
		}
		seen[name] = true
		full := filepath.Join(r.root, filepath.FromSlash(name))
		info, err := os.Lstat(full)
		if errors.Is(err, fs.ErrNotExist) {
			continue // tracked but deleted in the working tree
		}
		if err != nil {
			return err
		}
		if info.IsDir() {
			continue // a git submodule
		}
		files = append(files, diskFile{rel: strings.TrimPrefix(name, prefix), full: full, info: info})
	}
	if prefix != "" && !seen[prefix+"LICENSE"] {
		full := filepath.Join(r.root, "LICENSE")
		if info, err := os.Lstat(full); err == nil && info.Mode().IsRegular() {
			files = append(files, diskFile{rel: "LICENSE", full: full, info: info})
		}
	}
	return modzip.Create(w, mv, files)
}

// diskFile is a working-tree file as a [modzip.File].
type diskFile struct {
	rel  string // slash path within the module
	full string
	info fs.FileInfo
}

func (f diskFile) Path() string                 { return f.rel }
func (f diskFile) Lstat() (fs.FileInfo, error)  { return f.info, nil }
func (f diskFile) Open() (io.ReadCloser, error) { return os.Open(f.full) }

// writeZip creates file name with what write writes.
func writeZip(name string, write func(io.Writer) error) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func copyFile(dst, src string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// gitTagCommit returns the commit a tag points at, if the tag exists.
func gitTagCommit(root, tag string) (string, bool) {
	out, err := gitOutput(root, "rev-parse", "-q", "--verify", "refs/tags/"+tag+"^{commit}")
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(out), true
}

// gitTagExists reports whether tag exists.
func gitTagExists(root, tag string) bool {
	_, ok := gitTagCommit(root, tag)
	return ok
}

func gitOutput(dir string, args ...string) (string, error) {
	out, err := gitBytes(dir, args...)
	return string(out), err
}

func gitBytes(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
