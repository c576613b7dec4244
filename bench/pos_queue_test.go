package bench

import (
	"slices"
	"testing"
)

// TestPOSQueues: STORMGUARD_LIVE_POS_QUEUE's values, and the queue each
// scenario then gives the provider (scaled like the workers).
func TestPOSQueues(t *testing.T) {
	tests := []struct {
		in   string
		want []int
		bad  bool
	}{
		{"", []int{posQueue}, false},
		{"  ", []int{posQueue}, false},
		{"300", []int{300}, false},
		{"300, 1500", []int{300, 1500}, false},
		{"0", nil, true},
		{"-300", nil, true},
		{"300,", nil, true},
		{"3e2", nil, true},
		{"1000001", nil, true},
	}
	for _, tt := range tests {
		got, err := posQueues(tt.in)
		if (err != nil) != tt.bad || !slices.Equal(got, tt.want) {
			t.Errorf("posQueues(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.bad)
		}
	}
	for _, tt := range []struct {
		queue int
		scale float64
		want  int
	}{{300, 1, 300}, {1500, 1, 1500}, {300, 0.1, 30}, {3, 0.1, 1}} {
		if pc, _ := posScenario(0, tt.queue, tt.scale); pc.Queue != tt.want {
			t.Errorf("posScenario(queue %d, scale %v) gives the provider a queue of %d, want %d", tt.queue, tt.scale, pc.Queue, tt.want)
		}
	}
}
