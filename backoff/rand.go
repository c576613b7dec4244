package backoff

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
