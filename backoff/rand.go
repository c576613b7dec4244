package backoff

import "math/rand/v2"

// Source is a source of uniformly distributed random numbers in [0, 1).
//
// A Source used by a [Backoff] that is shared between goroutines must be
// safe for concurrent use; [Runtime] is. [Mulberry32] is not: give each
// goroutine (or each simulation) its own.
type Source interface {
	// Float64 returns a number in the half-open interval [0, 1).
	Float64() float64
}

// Runtime is the default [Source]. It draws from the Go runtime's per-thread
// random generator (math/rand/v2's top-level functions), so it is safe for
// concurrent use, takes no lock and allocates nothing. Its sequence cannot be
// seeded; use [Mulberry32] for reproducible figures.
type Runtime struct{}

// Float64 returns a number in [0, 1).
func (Runtime) Float64() float64 { return rand.Float64() }

// Fixed is a [Source] that always returns the same number, clamped into
// [0, 1): values below 0 (and NaN) read as 0, values at or above 1 read as the
// largest float64 below 1. It is meant for tests and examples, e.g.
// Fixed(0.5) reproduces the seed's smoke test. It is safe for concurrent use.
type Fixed float64

// Float64 returns f clamped into [0, 1).
func (f Fixed) Float64() float64 {
	v := float64(f)
	switch {
	case !(v >= 0): // also catches NaN
		return 0
	case v >= 1:
		return 1 - 0x1p-53
	}
	return v
}

// Mulberry32 is the small seeded generator the seed's JavaScript simulation
// used, reproduced bit for bit: for the same seed it yields exactly the
// numbers that
//
//	function mulberry32(a) { return function() {
//	  var t = a += 0x6D2B79F5;
//	  t = Math.imul(t ^ t >>> 15, t | 1);
//	  t ^= t + Math.imul(t ^ t >>> 7, t | 61);
//	  return ((t ^ t >>> 14) >>> 0) / 4294967296; } }
//
// yields. It exists so that published figures can be reproduced; it is not a
// cryptographic generator and its period is 2^32.
//
// A Mulberry32 is not safe for concurrent use. Its zero value is the
// generator seeded with 0.
type Mulberry32 struct {
	state uint32
}

// NewMulberry32 returns a generator seeded with seed.
func NewMulberry32(seed uint32) *Mulberry32 {
	return &Mulberry32{state: seed}
}

// Uint32 advances the generator and returns the next 32-bit output.
func (m *Mulberry32) Uint32() uint32 {
	m.state += 0x6D2B79F5
	t := m.state
	t = (t ^ t>>15) * (t | 1)
	t ^= t + (t^t>>7)*(t|61)
	return t ^ t>>14
}

// Float64 returns the next number in [0, 1): Uint32() / 2^32, exactly as the
// JavaScript original divides by 4294967296.
func (m *Mulberry32) Float64() float64 {
	return float64(m.Uint32()) / 4294967296
}
