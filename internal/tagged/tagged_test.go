package tagged_test

import (
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
