package breaker_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func benchBreaker(b *testing.B, edit func(c *breaker.Config)) *breaker.Breaker {
	b.Helper()
	c := breaker.Config{}
	c.MinCalls = 1 << 30 // never trips
	if edit != nil {
		edit(&c)
	}
	br, err := breaker.New(c)
	if err != nil {
		b.Fatal(err)
	}
	return br
}

// BenchmarkAllowDone is the closed-state two-step path with the real clock.
func BenchmarkAllowDone(b *testing.B) {
	br := benchBreaker(b, nil)
	b.ReportAllocs()
	for b.Loop() {
		p, _ := br.Allow()
		br.Done(p, true)
	}
}

// BenchmarkAllowDoneFakeClock leaves the cost of time.Now out.
func BenchmarkAllowDoneFakeClock(b *testing.B) {
	now := time.Now()
	br := benchBreaker(b, func(c *breaker.Config) { c.Now = func() time.Time { return now } })
	b.ReportAllocs()
	for b.Loop() {
		p, _ := br.Allow()
		br.Done(p, true)
	}
}

// BenchmarkExecute is the wrapping form, closed, with a succeeding closure.
func BenchmarkExecute(b *testing.B) {
	br := benchBreaker(b, nil)
	fn := func() error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		_ = br.Execute(fn)
	}
}

// BenchmarkExecuteFailing: closed, a failing closure (below the minimum).
func BenchmarkExecuteFailing(b *testing.B) {
	br := benchBreaker(b, nil)
	boom := errors.New("boom")
	fn := func() error { return boom }
	b.ReportAllocs()
	for b.Loop() {
		_ = br.Execute(fn)
	}
}

// BenchmarkOpenReject is a rejection by an open breaker (allocates the
// *OpenError).
func BenchmarkOpenReject(b *testing.B) {
	br := benchBreaker(b, func(c *breaker.Config) { c.MinCalls = 1; c.OpenFor = time.Hour })
	_ = br.Execute(func() error { return errors.New("boom") })
	b.ReportAllocs()
	for b.Loop() {
		if _, err := br.Allow(); err == nil {
			b.Fatal("allowed")
		}
	}
}

// BenchmarkParallelExecute is many goroutines sharing one closed breaker.
func BenchmarkParallelExecute(b *testing.B) {
	br := benchBreaker(b, nil)
	fn := func() error { return nil }
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = br.Execute(fn)
		}
	})
}

// BenchmarkParallelAllowDoneFakeClock: the shared-counter cost without
// the clock.
func BenchmarkParallelAllowDoneFakeClock(b *testing.B) {
	now := time.Now()
	br := benchBreaker(b, func(c *breaker.Config) { c.Now = func() time.Time { return now } })
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, _ := br.Allow()
			br.Done(p, true)
		}
	})
}
