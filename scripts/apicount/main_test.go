package main

import (
	"bytes"
	"testing"

	"github.com/stormguard/stormguard/scripts/internal/treetest"
)

func TestCount(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.com/r\n",
		"a/a.go": `package a

const (
	A, b = 1, 2
	C    = 3
)

var V int

type T struct {
	X, y int
	Z    string
	*E
}

type E struct{}

type I interface {
	M()
	n()
	E2
}

type E2 interface{ O() }

type hidden struct{ Shown int }

func F()            {}
func f()            {}
func (T) M()        {}
func (hidden) M2()  {}
func (*T) private() {}
`,
		"a/a_test.go":          "package a\n\nfunc Test() {}\nconst TestC = 1\n",
		"a/internal/x/x.go":    "package x\n\nfunc Hidden() {}\n",
		"cmd/tool/main.go":     "package main\n\nfunc Main() {}\n",
		"testdata/t.go":        "package t\n\nfunc T() {}\n",
		"b/go.mod":             "module example.com/r/b\n",
		"b/b.go":               "package b\n\nfunc B() {}\n",
		"b/test/go.mod":        "//stormguard:unpublished\nmodule example.com/r/b/test\n",
		"b/test/helper/h.go":   "package helper\n\nfunc H() {}\n",
		"bench/go.mod":         "//stormguard:unpublished\nmodule example.com/r/bench\n",
		"bench/peers/peers.go": "package peers\n\nfunc P() {}\n",
	}
	treetest.Write(t, dir, files)
	got, err := count(dir)
	if err != nil {
		t.Fatal(err)
	}
	// a: top A C V T E I E2 F = 8; methods T.M, hidden.M2 = 2; fields X Z
	// (T), M (I), O (E2) = 4. b: B. Nothing from tests, internal, main,
	// testdata or unpublished modules.
	want := []pkgCount{{dir: "a", top: 8, methods: 2, field: 4}, {dir: "b", top: 1}}
	if len(got) != len(want) {
		t.Fatalf("count = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("count[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}

	var out bytes.Buffer
	if n := report(&out, got, 0, 0); n != 0 {
		t.Errorf("report with no limits = %d, want 0", n)
	}
	var limited bytes.Buffer
	if n := report(&limited, got, 7, 14); n != 2 {
		t.Errorf("report with -max-top 7 -max-total 14 = %d, want 2 (a has 8 top-level names; 15 in all)\n%s", n, limited.String())
	}
	for _, want := range []string{"over: a has 8 top-level names, more than 7\n", "over: 15 names in all, more than 14\n", "total                            9         2       4    15\n"} {
		if !bytes.Contains(limited.Bytes(), []byte(want)) {
			t.Errorf("report printed:\n%s\nwant a line %q", limited.String(), want)
		}
	}
}
