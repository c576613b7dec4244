package modules

import (
	"slices"
	"testing"

	"github.com/stormguard/stormguard/scripts/internal/treetest"
)

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	treetest.Write(t, dir, map[string]string{
		"go.mod":          "module example.com/r\n\ngo 1.25.0\n",
		"a/go.mod":        "module example.com/r/a\n\ngo 1.25.0\n",
		"a/test/go.mod":   "// Tests of a with heavy dependencies.\n//stormguard:unpublished\nmodule example.com/r/a/test\n\ngo 1.25.0\n",
		"b/go.mod":        "// Says //stormguard:unpublished only inside a sentence.\nmodule example.com/r/b\n\ngo 1.25.0\n",
		"testdata/go.mod": "module example.com/ignored\n",
		"_x/go.mod":       "module example.com/ignored2\n",
		".y/go.mod":       "module example.com/ignored3\n",
		"vendor/go.mod":   "module example.com/ignored4\n",
	})
	mods, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range mods {
		s := m.Dir + " " + m.Path
		if !m.Published {
			s += " unpublished"
		}
		got = append(got, s)
	}
	want := []string{". example.com/r", "a example.com/r/a", "a/test example.com/r/a/test unpublished", "b example.com/r/b"}
	if !slices.Equal(got, want) {
		t.Errorf("Load = %q, want %q", got, want)
	}

	for rel, wantDir := range map[string]string{
		"x.go":             ".",
		"a":                "a",
		"a/p/x.go":         "a",
		"a/test/x_test.go": "a/test",
		"ab/x.go":          ".",
		"b/x.go":           "b",
	} {
		if m := Of(mods, rel); m == nil || m.Dir != wantDir {
			t.Errorf("Of(%q) = %v, want the module in %q", rel, m, wantDir)
		}
	}
}

func TestLoadDuplicatePath(t *testing.T) {
	dir := t.TempDir()
	treetest.Write(t, dir, map[string]string{
		"go.mod":   "module example.com/r\n",
		"a/go.mod": "module example.com/r\n",
	})
	if _, err := Load(dir); err == nil {
		t.Error("Load of two modules with one path: no error")
	}
}

func TestLoadNoRoot(t *testing.T) {
	dir := t.TempDir()
	treetest.Write(t, dir, map[string]string{"a/go.mod": "module example.com/a\n"})
	if _, err := Load(dir); err == nil {
		t.Error("Load without a root go.mod: no error")
	}
}
