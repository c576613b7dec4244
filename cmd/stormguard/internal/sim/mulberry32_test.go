package sim

import "testing"

// The first outputs for seed 42 match the JavaScript original.
func TestMulberry32MatchesJavaScript(t *testing.T) {
	// node -e 'function m(a){return function(){var t=a+=0x6D2B79F5;t=Math.imul(t^t>>>15,t|1);t^=t+Math.imul(t^t>>>7,t|61);return((t^t>>>14)>>>0)/4294967296}};const r=m(42);for(let i=0;i<5;i++)console.log(r())'
	want := []float64{0.6011037519201636, 0.44829055899754167, 0.8524657934904099, 0.6697340414393693, 0.17481389874592423}
	m := &mulberry32{state: 42}
	for i, w := range want {
		if got := m.float64(); got != w {
			t.Errorf("mulberry32(42) output #%d = %v, want %v", i, got, w)
		}
	}
	var zero mulberry32
	if got, want := zero.uint32(), (&mulberry32{}).uint32(); got != want {
		t.Errorf("zero mulberry32 first output %d, want seed-0 output %d", got, want)
	}
}
