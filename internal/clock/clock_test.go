package clock_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

func TestMonotonicFollowsTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		now := clock.Monotonic()
		a := now()
		time.Sleep(1500 * time.Millisecond) // fake time inside the bubble
		b := now()
		if d := b.Sub(a); d != 1500*time.Millisecond {
			t.Errorf("Monotonic advanced %v over a 1.5s sleep, want 1.5s", d)
		}
		if d := time.Since(b); d != 0 {
			t.Errorf("Monotonic is %v behind time.Now, want 0", d)
		}
	})
}

func BenchmarkMonotonic(b *testing.B) {
	now := clock.Monotonic()
	for b.Loop() {
		now()
	}
}

func BenchmarkTimeNow(b *testing.B) {
	for b.Loop() {
		time.Now()
	}
}
