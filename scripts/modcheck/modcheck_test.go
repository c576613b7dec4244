package main

import (
	"archive/zip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/scripts/internal/modules"
)

// fakeRepo is a git repository with a root module, a sibling that requires
// it, and a module nested in the root's tree.
var fakeRepo = map[string]string{
	"go.mod":           "module example.com/r\n\ngo 1.25.0\n",
	"r.go":             "package r\n\nconst V = 1\n",
	"LICENSE":          "the license\n",
	".gitignore":       "*.out\n",
	"junk.out":         "ignored\n",
	"vendor/v/v.go":    "package v\n",
	"nested/go.mod":    "module example.com/r/nested\n\ngo 1.25.0\n",
	"nested/n.go":      "package nested\n",
	"sub/go.mod":       "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.1.0\n",
	"sub/s.go":         "package sub\n\nimport \"example.com/r\"\n\nvar W = r.V\n",
	"testdata/go.mod":  "module example.com/ignored\n",
	"_skip/go.mod":     "module example.com/ignored2\n",
	"sub/.hidden/x.go": "package x\n",
}

// goodWork is a go.work that passes the static check for fakeRepo.
const goodWork = `go 1.26.0

use (
	./
	./nested
	./sub
)

replace (
	example.com/r v0.1.0 => ./
	example.com/r/nested v0.1.0 => ./nested
	example.com/r/sub v0.1.0 => ./sub
)
`

// newFakeRepo writes fakeRepo and goodWork into a new git repository with
// everything but untracked.go committed.
func newFakeRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"go.work": goodWork}
	for k, v := range fakeRepo {
		files[k] = v
	}
	for name, body := range files {
		write(t, dir, name, body)
	}
	git(t, dir, "init", "-q")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "-q", "-m", "first")
	write(t, dir, "untracked.go", "package r\n")
	return dir
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	p := filepath.Join(dir, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func git(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "tag.gpgSign=false", "-c", "commit.gpgSign=false"}, args...)...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
}

func TestFindModules(t *testing.T) {
	dir := newFakeRepo(t)
	got, err := modules.FindDirs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{".", "nested", "sub"}; !slices.Equal(got, want) {
		t.Errorf("modules.FindDirs = %v, want %v (testdata, vendor, _ and . folders skipped)", got, want)
	}
}

func TestCheckStatic(t *testing.T) {
	tests := []struct {
		name  string
		edit  map[string]string // files to overwrite
		wants []string          // substrings of the problems, in order; none: no problem
	}{
		{"good", nil, nil},
		{"replace", map[string]string{
			"sub/go.mod": "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.1.0\n\nreplace example.com/r => ../\n",
		}, []string{"sub/go.mod:7: replace example.com/r => ../: a replace in a go.mod never reaches"}},
		{"pseudo-version", map[string]string{
			"sub/go.mod": "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.0.0-00010101000000-000000000000\n",
		}, []string{"sub/go.mod:5: require example.com/r v0.0.0-00010101000000-000000000000: a pseudo-version"}},
		{"untagged version", map[string]string{
			"sub/go.mod": "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.0.9\n",
		}, []string{"neither the release version v0.1.0 nor tagged (no git tag v0.0.9)"}},
		{"no such sibling", map[string]string{
			"sub/go.mod": "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r/gone v0.1.0\n",
		}, []string{"require example.com/r/gone v0.1.0: no module of this repository has that path"}},
		{"wrong path", map[string]string{
			"nested/go.mod": "module example.com/other\n\ngo 1.25.0\n",
		}, []string{"nested/go.mod: module example.com/other: folder nested of this repository is fetched as module example.com/r/nested", "go.work:11: replace example.com/r/nested v0.1.0 => ./nested: the only replace"}},
		{"module missing from go.work", map[string]string{
			"go.work": strings.Replace(goodWork, "\t./sub\n", "", 1),
		}, []string{"go.work uses [. nested], want every module of the repository: [. nested sub]", "a go.work that passes:"}},
		{"extra replace in go.work", map[string]string{
			"go.work": goodWork + "\nreplace example.com/x => ../x\n",
		}, []string{"go.work:15: replace example.com/x => ../x: the only replace", "a go.work that passes:"}},
		{"needed replace missing from go.work", map[string]string{
			"go.work": strings.Replace(goodWork, "\texample.com/r v0.1.0 => ./\n", "", 1),
		}, []string{"go.work lacks replace example.com/r v0.1.0 => ./, which sub/go.mod needs"}},
		{"unneeded replace lines may be left out", map[string]string{
			"go.work": strings.Replace(goodWork, "\texample.com/r/nested v0.1.0 => ./nested\n", "", 1),
		}, nil},
		{"published module requires an unpublished one", map[string]string{
			"go.mod": "//stormguard:unpublished\nmodule example.com/r\n\ngo 1.25.0\n",
		}, []string{"sub/go.mod:5: require example.com/r v0.1.0: sub is published but ./go.mod says //stormguard:unpublished"}},
		{"unpublished module requires a published one", map[string]string{
			"sub/go.mod": "//stormguard:unpublished\nmodule example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.1.0\n",
		}, nil},
		{"old go.work", map[string]string{
			"go.work": strings.Replace(goodWork, "go 1.26.0", "go 1.24", 1),
		}, []string{"go.work: go 1.24 is older than ./go.mod's go 1.25.0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := newFakeRepo(t)
			for name, body := range tt.edit {
				write(t, dir, name, body)
			}
			r, err := loadRepo(dir, "v0.1.0")
			if err != nil {
				t.Fatal(err)
			}
			got := r.checkStatic()
			if len(got) < len(tt.wants) || (len(tt.wants) == 0) != (len(got) == 0) {
				t.Fatalf("checkStatic() = %q, want problems matching %q", got, tt.wants)
			}
			for i, want := range tt.wants {
				if !strings.Contains(got[i], want) {
					t.Errorf("checkStatic()[%d] = %q, want it to contain %q", i, got[i], want)
				}
			}
		})
	}
}

func TestCheckStaticTaggedVersion(t *testing.T) {
	dir := newFakeRepo(t)
	git(t, dir, "tag", "-a", "v0.0.9", "-m", "v0.0.9")
	write(t, dir, "sub/go.mod", "module example.com/r/sub\n\ngo 1.25.0\n\nrequire example.com/r v0.0.9\n")
	r, err := loadRepo(dir, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	if got := r.checkStatic(); len(got) > 0 {
		t.Errorf("checkStatic() = %q, want none: v0.0.9 is tagged", got)
	}
}

func TestWorkFilePasses(t *testing.T) {
	dir := newFakeRepo(t)
	write(t, dir, "go.work", "go 1.21\n")
	r, err := loadRepo(dir, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "go.work", r.workFile("1.26.8"))
	if got := r.checkStatic(); len(got) > 0 {
		t.Errorf("checkStatic() with go.work from workFile = %q, want none", got)
	}
}

// zipNames returns the names in a zip file.
func zipNames(t *testing.T, name string) []string {
	t.Helper()
	zr, err := zip.OpenReader(name)
	if err != nil {
		t.Fatal(err)
	}
	defer zr.Close()
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	return names
}

func TestBuildProxy(t *testing.T) {
	dir := newFakeRepo(t)
	// The sibling is released: its tag holds the first commit, the working
	// tree has moved on.
	git(t, dir, "tag", "-a", "sub/v0.1.0", "-m", "sub v0.1.0")
	write(t, dir, "sub/later.go", "package sub\n")
	r, err := loadRepo(dir, "v0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	px, err := r.buildProxy(filepath.Join(t.TempDir(), "proxy"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(px.dir, "example.com", "r", "@v")
	if got, want := zipNames(t, filepath.Join(root, "v0.1.0.zip")), []string{
		"example.com/r@v0.1.0/.gitignore",
		"example.com/r@v0.1.0/LICENSE",
		"example.com/r@v0.1.0/go.mod",
		"example.com/r@v0.1.0/go.work",
		"example.com/r@v0.1.0/r.go",
		"example.com/r@v0.1.0/untracked.go",
	}; !slices.Equal(got, want) {
		t.Errorf("root zip (working tree) = %q, want %q: no folder with a go.mod (even testdata), no vendor, no ignored files", got, want)
	}
	sub := filepath.Join(px.dir, "example.com", "r", "sub", "@v")
	if got, want := zipNames(t, filepath.Join(sub, "v0.1.0.zip")), []string{
		"example.com/r/sub@v0.1.0/.hidden/x.go",
		"example.com/r/sub@v0.1.0/LICENSE",
		"example.com/r/sub@v0.1.0/go.mod",
		"example.com/r/sub@v0.1.0/s.go",
	}; !slices.Equal(got, want) {
		t.Errorf("sub zip (tag) = %q, want %q: the tag's files and the root LICENSE", got, want)
	}
	if got := zipNames(t, px.wtZip["example.com/r/sub"]); !slices.Contains(got, "example.com/r/sub@v0.1.0/later.go") {
		t.Errorf("sub working-tree zip = %q, want later.go in it", got)
	}
	for _, name := range []string{"list", "v0.1.0.info", "v0.1.0.mod"} {
		if _, err := os.Stat(filepath.Join(sub, name)); err != nil {
			t.Errorf("proxy lacks %s: %v", name, err)
		}
	}
	if px.source["example.com/r/sub"] != "tag sub/v0.1.0" || !strings.HasPrefix(px.source["example.com/r"], "the working tree") {
		t.Errorf("sources = %v", px.source)
	}
}

func TestCheckTidy(t *testing.T) {
	tests := []struct {
		name   string
		subMod string
		want   string // substring of the error; "" for tidy
	}{
		{"tidy", fakeRepo["sub/go.mod"], ""},
		{"unused requirement", fakeRepo["sub/go.mod"] + "\nrequire example.com/r/nested v0.1.0\n", "sub/go.mod is not tidy"},
		{"go line below a requirement's", strings.Replace(fakeRepo["sub/go.mod"], "go 1.25.0", "go 1.24", 1), "-go 1.24"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := newFakeRepo(t)
			write(t, dir, "sub/go.mod", tt.subMod)
			r, err := loadRepo(dir, "v0.1.0")
			if err != nil {
				t.Fatal(err)
			}
			work := t.TempDir()
			px, err := r.buildProxy(filepath.Join(work, "proxy"), filepath.Join(work, "zips"))
			if err != nil {
				t.Fatal(err)
			}
			env, err := newGoEnv(px.dir, filepath.Join(work, "modcache"), r.rootPath)
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.checkTidy(r.byPath["example.com/r/sub"], px, env, filepath.Join(work, "tidy"), false)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("checkTidy: %v, want tidy", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("checkTidy: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestForbiddenPaths(t *testing.T) {
	graph := `example.com/lean example.com/r/grpcretry@v0.1.0
example.com/lean google.golang.org/grpc@v1.85.0
example.com/r/grpcretry@v0.1.0 github.com/jackc/pgx/v5@v5.12.0
example.com/r/grpcretry@v0.1.0 google.golang.org/grpc@v1.85.0
example.com/r/grpcretry@v0.1.0 example.com/r/stores@v0.1.0
example.com/r/stores@v0.1.0 github.com/redis/go-redis/v9@v9.23.0
example.com/r/stores@v0.1.0 go.opentelemetry.io/otel/sdkextra@v1.0.0
github.com/jackc/pgx/v5@v5.12.0 go.opentelemetry.io/otel/sdk@v1.45.0
google.golang.org/grpc@v1.85.0 go.opentelemetry.io/otel/sdk/metric@v1.45.0
google.golang.org/grpc@v1.85.0 go.opentelemetry.io/otel@v1.45.0
go.opentelemetry.io/otel/sdk/metric@v1.45.0 go.opentelemetry.io/otel/sdk@v1.45.0
`
	forbid := []string{"github.com/jackc/pgx", "github.com/redis/go-redis", "go.opentelemetry.io/otel/sdk"}
	got := forbiddenPaths(graph, forbid, []string{"google.golang.org/grpc"})
	want := []string{
		"example.com/lean -> example.com/r/grpcretry@v0.1.0 -> example.com/r/stores@v0.1.0 -> github.com/redis/go-redis/v9@v9.23.0",
		"example.com/lean -> example.com/r/grpcretry@v0.1.0 -> github.com/jackc/pgx/v5@v5.12.0",
	}
	if !slices.Equal(got, want) {
		t.Errorf("forbiddenPaths = %q, want %q (a path matches itself and the paths below it, not a longer name; grpc's SDK is excused; a chain stops at the first forbidden module)", got, want)
	}
	got = forbiddenPaths(graph, forbid, nil)
	if want := "example.com/lean -> google.golang.org/grpc@v1.85.0 -> go.opentelemetry.io/otel/sdk/metric@v1.45.0"; !slices.Contains(got, want) {
		t.Errorf("forbiddenPaths with no excuse = %q, want it to contain %q", got, want)
	}
}
