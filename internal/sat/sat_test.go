package sat_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/sat"
)

func TestAdd(t *testing.T) {
	const maxD, minD = time.Duration(math.MaxInt64), time.Duration(math.MinInt64)
	tests := []struct{ a, b, want time.Duration }{
		{1, 2, 3},
		{time.Hour, -time.Minute, 59 * time.Minute},
		{maxD, 1, maxD},
		{maxD - 5, 5, maxD},
		{maxD - 5, 6, maxD},
		{time.Second, maxD, maxD},
		{minD, -1, minD},
		{-time.Second, minD, minD},
		{maxD, minD, -1},
		{0, 0, 0},
	}
	for _, tt := range tests {
		if got := sat.Add(tt.a, tt.b); got != tt.want {
			t.Errorf("Add(%d, %d) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestScale(t *testing.T) {
	const maxD, minD = time.Duration(math.MaxInt64), time.Duration(math.MinInt64)
	tests := []struct {
		d    time.Duration
		f    float64
		want time.Duration
	}{
		{time.Second, 0.5, 500 * time.Millisecond},
		{time.Second, 1.2, 1200 * time.Millisecond},
		{maxD, 1, maxD},
		{maxD, 1.2, maxD},
		{maxD, 0.5, 1 << 62},
		{maxD / 2, 2.5, maxD},
		{maxD, -1.5, minD},
		{minD, 2, minD},
		{time.Second, math.NaN(), 0},
		{time.Second, math.Inf(1), maxD},
		{0, math.Inf(1), 0}, // 0·Inf is NaN
	}
	for _, tt := range tests {
		if got := sat.Scale(tt.d, tt.f); got != tt.want {
			t.Errorf("Scale(%d, %v) = %d, want %d", tt.d, tt.f, got, tt.want)
		}
	}
}
