//go:build race

package limit

// raceEnabled reports whether the tests run under the race detector: the
// long runs of the Baseline tests (minutes of model time, hundreds of
// goroutines) run at full length only without it (make test runs them in
// its pass without -race, NORACE_PKGS in the Makefile), and shorter under
// it, where they check the same code for data races.
const raceEnabled = true
