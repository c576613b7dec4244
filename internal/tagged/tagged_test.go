package tagged_test

import (
	"sync"
	"testing"

	"github.com/stormguard/stormguard/internal/tagged"
)

func TestPackUnpack(t *testing.T) {
	tests := []struct {
		slot int64
		n    uint64
	}{
		{0, 0}, {1, 1}, {-1, 7}, {tagged.Never, 0}, {1 << 38, tagged.MaxCount}, {-(1 << 38), 42},
	}
	for _, tt := range tests {
		tag, n := tagged.Unpack(tagged.Pack(tt.slot, tt.n))
		if tag != tagged.Tag(tt.slot) || n != tt.n {
			t.Errorf("Unpack(Pack(%d, %d)) = %d, %d; want %d, %d", tt.slot, tt.n, tag, n, tagged.Tag(tt.slot), tt.n)
		}
	}
}

func TestDiff(t *testing.T) {
	tests := []struct{ a, b int64 }{
		{5, 3}, {3, 5}, {0, -1}, {-1, 0}, {1<<38 - 5, -(1 << 38) + 10}, {tagged.Never, 0},
	}
	for _, tt := range tests {
		if got, want := tagged.Diff(tagged.Tag(tt.a), tagged.Tag(tt.b)), tt.a-tt.b; got != want {
			t.Errorf("Diff(Tag(%d), Tag(%d)) = %d, want %d", tt.a, tt.b, got, want)
		}
	}
}

func TestStriped(t *testing.T) {
	s := tagged.NewStriped(10)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				s.Add(3, 42, 1)
			}
		})
	}
	wg.Wait()
	if got := s.Get(3, 42); got != 8000 {
		t.Errorf("Get(3, 42) = %d after 8000 adds, want 8000", got)
	}
	if got := s.Get(3, 41); got != 0 {
		t.Errorf("Get(3, 41) = %d, want 0 (another slot)", got)
	}
	if got := s.Get(4, 42); got != 0 {
		t.Errorf("Get(4, 42) = %d, want 0 (another position)", got)
	}
	s.Add(3, 52, 5) // a later slot takes over the stripe it lands on
	s.Add(3, 41, 7) // an older one is dropped wherever it finds a later slot
	if got := s.Get(3, 52); got != 5 {
		t.Errorf("Get(3, 52) = %d, want 5", got)
	}
	if got := s.Get(3, 42); got != 0 {
		t.Errorf("Get(3, 42) = %d once a stripe moved on to slot 52, want 0 (expired)", got)
	}
	big := tagged.NewStriped(3600) // fewer stripes for a long ring
	for range 100 {
		big.Add(3599, 1, tagged.MaxCount)
	}
	if got := big.Get(3599, 1); got == 0 || got%tagged.MaxCount != 0 {
		t.Errorf("saturated stripes sum to %d, want a multiple of MaxCount", got)
	}
	if n := testing.AllocsPerRun(100, func() { s.Add(1, 1, 1) }); n != 0 {
		t.Errorf("Add allocates %v times", n)
	}
}
