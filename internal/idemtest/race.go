//go:build race

package idemtest

// raceDetector reports whether the race detector is on: [Payments] runs
// fewer payments under it.
const raceDetector = true
