//go:build !race

package grpcretry_test

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = false
