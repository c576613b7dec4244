package admission_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// sharedProvider runs the admitted requests of W closed-loop callers on C
// cores shared between them: a request that starts with n running takes
// base·max(1, n/C). It returns the requests completed and their mean time
// to run over the second half of the run.
func sharedProvider(t *testing.T, ctl *admission.Controller, callers, cores int, base, run time.Duration) (perSecond float64, mean time.Duration) {
	var running atomic.Int64
	var done, total atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for time.Since(start) < run {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				p, d := ctl.Acquire(ctx, 1)
				if d.Outcome != admission.Admitted {
					cancel()
					time.Sleep(20 * time.Millisecond)
					continue
				}
				n := running.Add(1)
				st := base * time.Duration(max(1, (n+int64(cores)-1)/int64(cores)))
				time.Sleep(st)
				running.Add(-1)
				p.Release()
				cancel()
				if time.Since(start) > run/2 {
					done.Add(1)
					total.Add(int64(st))
				}
			}
		})
	}
	wg.Wait()
	if done.Load() == 0 {
		t.Fatal("no request completed")
	}
	return float64(done.Load()) / (run / 2).Seconds(), time.Duration(total.Load() / done.Load())
}

// TestAdaptiveLimit: 300 callers on a provider of 10 cores (10 ms a
// request alone: 1000/s). With a fixed limit of 1000 all 300 run at once
// and each takes 300 ms, over the 200 ms its callers wait; with the
// adaptive limit (LatencyCeiling 200 ms) the requests that run take at
// most about the reference (100 ms), at 90% or more of the provider's
// 1000/s. Under the race detector each run lasts 4 s instead of 10 (the
// same code, 40% of the CPU; see race_test.go).
func TestAdaptiveLimit(t *testing.T) {
	const ceiling = 200 * time.Millisecond
	run := 10 * time.Second
	if raceEnabled {
		run = 4 * time.Second
	}
	var fixedRate, adaptiveRate float64
	var fixedMean, adaptiveMean time.Duration
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1000, MaxQueue: -1})
		fixedRate, fixedMean = sharedProvider(t, ctl, 300, 10, 10*time.Millisecond, run)
	})
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 1000, MaxQueue: -1, LatencyCeiling: ceiling})
		adaptiveRate, adaptiveMean = sharedProvider(t, ctl, 300, 10, 10*time.Millisecond, run)
	})
	t.Logf("fixed limit: %.0f/s, requests take %v; adaptive: %.0f/s, %v", fixedRate, fixedMean, adaptiveRate, adaptiveMean)
	if fixedMean <= ceiling {
		t.Errorf("fixed limit: requests take %v, want over the %v ceiling (the scenario)", fixedMean, ceiling)
	}
	if adaptiveMean > ceiling/2+ceiling/10 {
		t.Errorf("adaptive limit: requests take %v, want about the %v reference at most", adaptiveMean, ceiling/2)
	}
	if capacity := 1000.0; adaptiveRate < 0.9*capacity {
		t.Errorf("adaptive limit: %.0f/s, want at least 90%% of the provider's %.0f/s", adaptiveRate, capacity)
	}
}

// TestAdaptiveCapacityHint: a request that ran past the latency ceiling
// cuts the adaptive limit by a tenth; a request shed for lack of room is
// told the limit in force.
func TestAdaptiveCapacityHint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := newController(t, admission.Config{MaxInFlight: 10, MaxQueue: -1, LatencyCeiling: 100 * time.Millisecond})
		p, _ := ctl.Acquire(context.Background(), 1)
		time.Sleep(150 * time.Millisecond)
		p.Release() // a drop: 10 -> 9
		var held []admission.Permit
		for {
			p, d := ctl.Acquire(context.Background(), 1)
			if d.Outcome != admission.Admitted {
				break
			}
			held = append(held, p)
		}
		if len(held) != 9 {
			t.Errorf("admitted %d at once after the cut, want 9", len(held))
		}
		rec := serve(ctl.Wrap(http.NotFoundHandler()), 0)
		if rec.Code != 503 || rec.Header().Get(wire.CapacityHeader) != "9" {
			t.Errorf("shed: %d with capacity hint %q, want 503 with 9", rec.Code, rec.Header().Get(wire.CapacityHeader))
		}
		for i := range held {
			held[i].Release()
		}
	})
}
