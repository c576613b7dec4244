package live

import (
	"testing"
	"time"
)

// windows builds 100 ms windows, one per count, each all OK unless bad
// lists it (then one attempt of it was shed).
func windows(counts []int64, bad ...int) []Window {
	ws := make([]Window, len(counts))
	for i, n := range counts {
		ws[i] = Window{Start: time.Duration(i) * 100 * time.Millisecond, Attempts: n, OK: n}
	}
	for _, i := range bad {
		ws[i].OK--
		ws[i].Shed++
	}
	return ws
}

func repeat(n int, v int64) []int64 {
	xs := make([]int64, n)
	for i := range xs {
		xs[i] = v
	}
	return xs
}

func TestBackToNormal(t *testing.T) {
	const w = 100 * time.Millisecond
	end, stop := time.Second, 5*time.Second
	calm := repeat(50, 1) // 10 per second, as offered
	offered := repeat(50, 1)
	tests := []struct {
		name   string
		ws     []Window
		want   time.Duration
		normal bool
	}{
		{"calm at once", windows(calm), 0, true},
		{"a spike at 2.0 s", windows(append(append(repeat(20, 1), 20), repeat(29, 1)...)), 1100 * time.Millisecond, true},
		{"a shed attempt at 2.5 s", windows(calm, 25), 1600 * time.Millisecond, true},
		{"overloaded to the end", windows(repeat(50, 5)), 0, false},
		{"one retry more than offered is normal", windows(append(append(repeat(30, 1), 2), repeat(19, 1)...)), 0, true},
		{"three more is not", windows(append(append(repeat(30, 1), 4), repeat(19, 1)...)), 2100 * time.Millisecond, true},
		{"shedding in the last second", windows(calm, 48), 0, false},
		{"a spike during the outage does not count", windows(append([]int64{99}, repeat(49, 1)...)), 0, true},
	}
	for _, tt := range tests {
		got, ok := backToNormal(tt.ws, offered, w, end, stop)
		if got != tt.want || ok != tt.normal {
			t.Errorf("%s: backToNormal = %v, %v; want %v, %v", tt.name, got, ok, tt.want, tt.normal)
		}
	}
}

func TestPercentile(t *testing.T) {
	xs := make([]time.Duration, 100)
	for i := range xs {
		xs[i] = time.Duration(100-i) * time.Millisecond // unsorted
	}
	for _, tt := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 50 * time.Millisecond}, {0.99, 99 * time.Millisecond}, {1, 100 * time.Millisecond}} {
		if got := Percentile(xs, tt.q); got != tt.want {
			t.Errorf("Percentile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if got := Percentile(nil, 0.5); got != 0 {
		t.Errorf("Percentile(nil) = %v, want 0", got)
	}
}
