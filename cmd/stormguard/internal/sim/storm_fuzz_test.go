package sim_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// The fuzz targets feed arbitrary settings to the simulations: each must
// return a result or an error wrapping ErrInvalidConfig, never panic or
// hang. Settings that would merely run long are skipped.

func FuzzLayersConfig(f *testing.F) {
	f.Add(4, 3, 1000.0, int64(2e10), int64(1e10), 0.1, 1.0, int64(1e10), 10, uint64(42))
	f.Add(1, 1, 1e-300, int64(1<<62), int64(0), 0.0, 0.0, int64(1e6), 1, uint64(0))
	f.Fuzz(func(t *testing.T, l, a int, rate float64, dur, warm int64, ratio, floor float64, win int64, slices int, seed uint64) {
		c := sim.LayersConfig{
			Layers: l, Attempts: a, Rate: rate, Duration: time.Duration(dur), Warmup: time.Duration(warm),
			Budget: sim.BudgetSettings{Ratio: ratio, MinPerSecond: floor, Window: time.Duration(win), Slices: slices},
			Seed:   seed,
		}
		if rate*time.Duration(dur).Seconds() > 2e4 || slices > 100 {
			t.Skip("would run long")
		}
		r, err := sim.Layers(c)
		if err != nil {
			if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
				t.Fatalf("Layers(%+v) = %v, %v; want nil and ErrInvalidConfig", c, r, err)
			}
			return
		}
		for _, row := range r.Rows {
			if row.Signal != int64(a) || row.Naive < row.Signal || row.Budget < 0 || row.SignalBudget < 0 {
				t.Fatalf("Layers(%+v) row %+v", c, row)
			}
		}
	})
}

func FuzzContentionConfig(f *testing.F) {
	f.Add(10, 2, int64(5e6), int64(2e9), int64(1e7), int64(2e6), uint8(2), uint64(42))
	f.Add(1, 1, int64(1), int64(1), int64(0), int64(0), uint8(0), uint64(0))
	f.Fuzz(func(t *testing.T, n, runs int, base, capNs, mean, sd int64, s uint8, seed uint64) {
		if n > 30 || runs > 3 {
			t.Skip("would run long")
		}
		c := sim.ContentionConfig{
			Clients: []int{n}, Runs: runs, Base: time.Duration(base), Cap: time.Duration(capNs),
			DelayMean: time.Duration(mean), DelayStdDev: time.Duration(sd), Seed: seed,
			Strategies: []sim.ContentionStrategy{sim.ContentionStrategy(s)},
		}
		r, err := sim.Contention(c)
		if err != nil {
			if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
				t.Fatalf("Contention(%+v) = %v, %v; want nil and ErrInvalidConfig", c, r, err)
			}
			return
		}
		if p := r.Series[0].Points[0]; p.Calls < float64(n) || p.Completion < 0 {
			t.Fatalf("Contention(%+v) = %+v", c, p)
		}
	})
}

func FuzzOutageConfig(f *testing.F) {
	d := sim.DefaultOutageConfig()
	f.Add(8, 10.0, 1000.0, 200, int64(d.Timeout), int64(d.TriggerStart), int64(d.TriggerEnd), int64(d.RetryAfter),
		int64(20e9), int64(d.Window), int64(d.RecoveryWindow), 0.9, int64(d.Base), int64(d.Cap), int64(0), 3, uint8(0), uint8(7), uint64(42))
	f.Add(40, 5.0, 100.0, 50, int64(d.Timeout), int64(d.TriggerStart), int64(d.TriggerEnd), int64(0),
		int64(20e9), int64(d.Window), int64(d.RecoveryWindow), 0.9, int64(d.Base), int64(d.Cap), int64(0), 3, uint8(0), uint8(0xff), uint64(7))
	f.Add(1, 1e-300, 1e-300, 1<<62, int64(1<<62), int64(0), int64(0), int64(1<<62),
		int64(1e9), int64(1e8), int64(1e8), 1.0, int64(1), int64(1<<62), int64(1<<62), 100, uint8(3), uint8(15), uint64(0))
	f.Fuzz(func(t *testing.T, clients int, rate, capacity float64, queue int, timeout, ts, te, ra, horizon, window, rw int64,
		ratio float64, base, capNs, interval int64, attempts int, strategy, flags uint8, seed uint64) {
		if float64(clients)*rate*time.Duration(horizon).Seconds() > 5000 || clients > 2000 || attempts > 10 ||
			(window > 0 && horizon/window > 10000) {
			t.Skip("would run long")
		}
		c := d
		c.Clients, c.RatePerClient, c.Capacity, c.Queue = clients, rate, capacity, queue
		c.Timeout, c.TriggerStart, c.TriggerEnd, c.RetryAfter, c.ShedRetryAfter = time.Duration(timeout),
			time.Duration(ts), time.Duration(te), time.Duration(ra), time.Duration(ra)
		c.Horizon, c.Window, c.RecoveryWindow, c.RecoveryRatio = time.Duration(horizon), time.Duration(window), time.Duration(rw), ratio
		c.Base, c.Cap, c.Seed = time.Duration(base), time.Duration(capNs), seed
		c.Deadline = time.Duration(timeout) * time.Duration(flags>>5)
		c.Policies = []sim.OutagePolicy{{
			Name: "fuzz", Interval: time.Duration(interval), Backoff: backoff.Strategy(strategy), Attempts: attempts,
			Budget: flags&1 != 0, Breaker: flags&2 != 0, RetryAfter: flags&4 != 0, Wait: flags&8 != 0, Fleet: flags&16 != 0,
		}}
		r, err := sim.Outage(c)
		if err != nil {
			if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
				t.Fatalf("Outage(%+v) = %v, %v; want nil and ErrInvalidConfig", c, r, err)
			}
			return
		}
		p := r.Policies[0]
		var load int
		for _, n := range p.Load {
			load += n
		}
		if load != p.Attempts || p.Succeeded > p.Offered || p.RecoverAfter < 0 || p.OutageSucceeded > p.OutageOffered ||
			p.Succeeded+p.BudgetDenied+p.BreakerRejected+p.DeadlineExceeded > p.Offered {
			t.Fatalf("Outage(%+v) = %+v", c, p)
		}
	})
}
