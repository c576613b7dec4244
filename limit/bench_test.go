package limit

import (
	"context"
	"testing"
	"time"
)

// The cost the limiter adds to an attempt that gets a slot at once.
func BenchmarkAcquireRelease(b *testing.B) {
	l := mustNew(b, Config{Timeout: time.Second})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(p, false)
	}
}

// The same from every P, the limit never reached (Max 1000, grown by the
// load).
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	l := mustNew(b, Config{Timeout: time.Second})
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := l.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			l.Release(p, false)
		}
	})
}

// With the SRE throttle on (two clock readings and its mutex per call).
func BenchmarkAcquireReleaseThrottle(b *testing.B) {
	l := mustNew(b, Config{Throttle: 2})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		// The first calls of a cold throttle may be rejected (no accepts
		// yet); a rejection gives back no permit.
		p, _ := l.Acquire(ctx)
		l.Release(p, false)
	}
}

// A loaded limiter (Max 1, so the one attempt in flight is at least half
// the limit): every attempt is a latency sample (two clock readings and
// the mutex per call).
func BenchmarkAcquireReleaseLoaded(b *testing.B) {
	l := mustNew(b, Config{Max: 1, Timeout: time.Second})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(p, false)
	}
}

// The same through the rate gate (SetRate) with a token always due: the
// clock read and one more compare-and-swap.
func BenchmarkAcquireReleaseRate(b *testing.B) {
	l := mustNew(b, Config{Timeout: time.Second})
	l.SetRate(1e12, 1e12)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		l.Release(p, false)
	}
}
