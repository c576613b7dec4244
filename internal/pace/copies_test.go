package pace_test

import (
	"testing"

	"github.com/stormguard/stormguard/internal/copycheck"
)

// TestCopiesMatch: cmd/stormguard, a module of its own, may not import this
// internal package, and its simulator steps the same code as the library,
// so it holds a copy (cmd/stormguard/internal/pace) that must stay equal to
// this package, file for file, byte for byte, but for its import paths of
// the root's internal packages, which begin with its own prefix.
func TestCopiesMatch(t *testing.T) {
	diffs, err := copycheck.Compare(copycheck.Pair{
		Root:       "../..",
		Orig:       "internal/pace",
		Copy:       "cmd/stormguard/internal/pace",
		OrigPrefix: "github.com/stormguard/stormguard/internal/",
		CopyPrefix: "github.com/stormguard/stormguard/cmd/stormguard/internal/",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
}
