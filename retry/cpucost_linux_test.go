package retry_test

import (
	"context"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// cpuVariant is one thing TestCPUCostLimiter measures.
type cpuVariant struct {
	name string
	run  func()
}

// threadCPU returns the CPU time the calling OS thread has used (Linux:
// getrusage RUSAGE_THREAD).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestCPUCostLimiter is a measurement, not a test: it runs when
// STORMGUARD_CPU_COST is set. It measures the CPU time of a successful
// call through budget + breaker with and without a limiter, and of the
// limiter's Acquire + Release alone, on one locked OS thread, alternating
// the variants round after round: unlike a benchmark's wall time, CPU time
// does not count the time the thread is descheduled, so the figures hold
// on a loaded machine. Run:
//
//	STORMGUARD_CPU_COST=1 go test ./retry -run TestCPUCostLimiter -v
func TestCPUCostLimiter(t *testing.T) {
	if os.Getenv("STORMGUARD_CPU_COST") == "" {
		t.Skip("a measurement: set STORMGUARD_CPU_COST=1 to run it")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dl, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	lim := mustLimiter(t, limit.Config{})
	variants := []cpuVariant{
		{"limiter alone (Acquire+Release)", func() { s, _ := lim.Acquire(context.Background()); lim.Release(s, false) }},
	}
	for _, v := range []struct {
		name string
		ctx  context.Context
	}{{"", context.Background()}, {"deadline, ", dl}} {
		p, pl := newGuarded(t), newLimited(t)
		variants = append(variants,
			cpuVariant{v.name + "budget+breaker", func() { _ = p.Do(v.ctx, succeed) }},
			cpuVariant{v.name + "budget+breaker+limiter", func() { _ = pl.Do(v.ctx, succeed) }})
	}
	const n, rounds = 1_000_000, 15
	res := make([][]float64, len(variants))
	for range rounds {
		for i, v := range variants {
			start := threadCPU()
			for range n {
				v.run()
			}
			res[i] = append(res[i], float64(threadCPU()-start)/n)
		}
	}
	for i, v := range variants {
		slices.Sort(res[i])
		t.Logf("%-40s CPU ns/op: min %5.1f  median %5.1f", v.name, res[i][0], res[i][rounds/2])
	}
}
