package limit

import (
	"bytes"
	"os"
	"testing"
)

// TestLearnIsTheLibrarys: learn.go is the root module's limit/learn.go, byte
// for byte, so that the simulator's limiter learns by the library's rules.
// Bring it over with: cp limit/learn.go cmd/stormguard/internal/limit/
// (from the repository root). It is skipped only in a tree without the
// root's package limit.
func TestLearnIsTheLibrarys(t *testing.T) {
	orig, err := os.ReadFile("../../../../limit/learn.go")
	if os.IsNotExist(err) {
		t.Skip("no limit/learn.go in this tree")
	}
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("learn.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig, got) {
		t.Error("cmd/stormguard/internal/limit/learn.go differs from limit/learn.go; bring it over (from the repository root): cp limit/learn.go cmd/stormguard/internal/limit/")
	}
}
