package sim

// mulberry32 is the small seeded generator of the original JavaScript
// simulation, reproduced bit for bit: for the same seed it yields exactly the
// numbers that
//
//	function mulberry32(a) { return function() {
//	  var t = a += 0x6D2B79F5;
//	  t = Math.imul(t ^ t >>> 15, t | 1);
//	  t ^= t + Math.imul(t ^ t >>> 7, t | 61);
//	  return ((t ^ t >>> 14) >>> 0) / 4294967296; } }
//
// yields. The jitter experiment draws from it so that its table reproduces
// the reference table in docs/backoff.md digit for digit; it is not a
// cryptographic generator and its period is 2^32. It is not safe for
// concurrent use; its zero value is the generator seeded with 0.
type mulberry32 struct {
	state uint32
}

// uint32 advances the generator and returns the next 32-bit output.
func (m *mulberry32) uint32() uint32 {
	m.state += 0x6D2B79F5
	t := m.state
	t = (t ^ t>>15) * (t | 1)
	t ^= t + (t^t>>7)*(t|61)
	return t ^ t>>14
}

// float64 returns the next number in [0, 1): uint32() / 2^32, exactly as the
// JavaScript original divides by 4294967296.
func (m *mulberry32) float64() float64 {
	return float64(m.uint32()) / 4294967296
}
