//go:build race

package admission_test

// raceEnabled reports whether the tests run under the race detector: the
// simulations (TestNoShedAtNormalLoad, TestNaiveClientsRecover: thousands
// of payments, a goroutine each, over 30 s of model time; TestAdaptiveLimit)
// run at full length only without it (make test runs this package in its
// pass without -race, NORACE_PKGS in the Makefile), and shorter under it,
// where they check the same code for data races.
const raceEnabled = true
