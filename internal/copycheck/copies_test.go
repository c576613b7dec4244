package copycheck_test

import (
	"testing"

	"github.com/stormguard/stormguard/internal/copycheck"
)

// TestRepositoryCopies: every copy of one of the root module's internal
// packages in another module (which may not import it) stays equal to its
// original, file for file, byte for byte, but for the import paths of the
// root's internal packages where the copy rewrites them. A difference fails
// with the command that copies the original over.
func TestRepositoryCopies(t *testing.T) {
	const (
		rootInternal = "github.com/stormguard/stormguard/internal/"
		cmdInternal  = "github.com/stormguard/stormguard/cmd/stormguard/internal/"
	)
	copies := []struct {
		why  string
		pair copycheck.Pair
	}{
		// grpcretry builds a destination's guards and policy as httpretry
		// does, and follows the same capacity hint.
		{"grpcretry's guards", copycheck.Pair{Orig: "internal/guards", Copy: "grpcretry/internal/guards"}},
		// grpcretry's hedging learns its delay and bounds its hedges as
		// httpretry's does.
		{"grpcretry's latency histogram", copycheck.Pair{Orig: "internal/lathist", Copy: "grpcretry/internal/lathist"}},
		// cmd/stormguard's simulator steps the breaker's own pacer and wait
		// order, and their saturating time arithmetic.
		{"the simulator's pacer", copycheck.Pair{Orig: "internal/pace", Copy: "cmd/stormguard/internal/pace", OrigPrefix: rootInternal, CopyPrefix: cmdInternal}},
		{"the simulator's wait order", copycheck.Pair{Orig: "internal/waitq", Copy: "cmd/stormguard/internal/waitq", OrigPrefix: rootInternal, CopyPrefix: cmdInternal}},
		{"the simulator's time arithmetic", copycheck.Pair{Orig: "internal/sat", Copy: "cmd/stormguard/internal/sat", OrigPrefix: rootInternal, CopyPrefix: cmdInternal}},
	}
	for _, c := range copies {
		t.Run(c.why, func(t *testing.T) {
			c.pair.Root = "../.."
			diffs, err := copycheck.Compare(c.pair)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range diffs {
				t.Error(d)
			}
		})
	}
}
