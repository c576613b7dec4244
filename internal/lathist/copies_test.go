package lathist_test

import (
	"testing"

	"github.com/stormguard/stormguard/internal/copycheck"
)

// TestCopiesMatch: grpcretry, a module of its own, may not import this
// internal package, and its hedging learns its delay the same way as
// httpretry's, so it holds a copy (grpcretry/internal/lathist) that must
// stay equal to this package, file for file, byte for byte.
func TestCopiesMatch(t *testing.T) {
	diffs, err := copycheck.Compare(copycheck.Pair{
		Root: "../..",
		Orig: "internal/lathist",
		Copy: "grpcretry/internal/lathist",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range diffs {
		t.Error(d)
	}
}
