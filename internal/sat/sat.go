// Package sat is saturating time arithmetic: sums and scalings of
// durations that stop at the largest (or smallest) time.Duration instead of
// wrapping around. A time that comes from outside (a server's Retry-After,
// a caller's maximum wait, a configured period) may be near the largest
// Duration; added to a clock reading it must mean "not before that time",
// never a time in the past.
//
// Module cmd/stormguard may not import this package and holds a copy of
// it, cmd/stormguard/internal/sat, for its copy of waitq; internal/copycheck's TestRepositoryCopies keeps the
// copy equal (only its import paths differ): change this folder, then
// bring the copy over with the command the test prints.
package sat

import (
	"math"
	"time"
)

// Add returns a + b, or the largest (smallest) Duration if the sum
// overflows upwards (downwards).
func Add(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// Scale returns d·f rounded towards zero, clamped to the Durations:
// math.MaxInt64 (math.MinInt64) when the product is at or beyond the
// largest (smallest) Duration, and 0 for a NaN f.
func Scale(d time.Duration, f float64) time.Duration {
	x := float64(d) * f
	switch {
	case x != x: // NaN
		return 0
	case x >= math.MaxInt64: // float64(MaxInt64) is 2^63, itself out of range
		return math.MaxInt64
	case x <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(x)
}
