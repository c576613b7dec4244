//go:build !race

package limit_test

// raceEnabled reports whether the tests run under the race detector (see
// race_test.go).
const raceEnabled = false
