//go:build race

package limit

// raceEnabled reports whether the tests run under the race detector: the
// long runs of the Baseline tests (minutes of model time, hundreds of
// goroutines) and the 100,000 callers of the bound tests run at full size
// only without it (make test runs this package in its pass without -race,
// NORACE_PKGS in the Makefile), and smaller under it, where they check the
// same code for data races.
const raceEnabled = true
