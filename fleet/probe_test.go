package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
)

// TestScriptFleetRateSlowProbe: the fleet's breaker closes on a process's
// probes, whose report (with the probe's time) goes with the close. A probe
// slower than twice the baseline and 5% of a window above it found a slow
// host (live: a x5 slowdown; the breaker closed on a 100 ms probe against
// a 20 ms baseline and released at the rate before the outage, 5x what the
// host served; it reopened 1.7 s later, and what the release queued was
// served after the slowdown for callers who had left, 7.4% of the work).
// For 10 windows from the open the fleet refuses such a close (it opens
// again, a new epoch); after that it closes, as does a probe near the
// baseline or a close without a probe's time, with R as it was, and the
// first window near the baseline ends the outage (the last healthy rate
// back). A sync
// without a report returns the rate alone (no share), so that a process
// between two reports scales its share when R moves.
func TestScriptFleetRateSlowProbe(t *testing.T) {
	type probe struct {
		at int64 // µs after the open
		us int64 // the probe's time (0: unknown)
	}
	for _, c := range []struct {
		name    string
		probes  []probe // the last one is the close that must be taken
		refused int     // the probes before it that the fleet refused
	}{
		{"near the baseline: closed at once", []probe{{3_000_000, 30_000}}, 0},
		{"60 ms, within 5% of a window of it: closed at once", []probe{{3_000_000, 60_000}}, 0},
		{"no probe time: closed at once", []probe{{3_000_000, 0}}, 0},
		{"x5, then back: refused, then closed", []probe{{3_000_000, 100_000}, {6_000_000, 100_000}, {9_000_000, 20_000}}, 2},
		{"x5 for good: closed after 10 windows", []probe{{3_000_000, 200_000}, {9_900_000, 100_000}, {10_000_000, 150_000}}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLimitScript(t, 1000)
			report := func(now int64, ok uint64, waiting, latUS, latN, fastest int64, seen int64) hostWindow {
				return s.sync(now, syncHost{successes: ok, seen: seen,
					limit: &limitReport{pid: "p1", waiting: waiting, ok: ok, latUS: latUS, latN: latN, latMinUS: fastest}})
			}
			var w hostWindow
			for i := range 12 { // warm at 400 a window, a 20 ms baseline
				w = report(int64(t0+i*1_000_000+1), 400, 0, 400*20_000, 400, 15_000, 0)
			}
			healthy := float64(w.fleetRate) / 1000
			if healthy < 300 {
				t.Fatalf("no warm rate: %.1f", healthy)
			}
			// The fleet's breaker opens at open (epoch 1); the calls wait
			// (no outcomes) and p1 reports every window.
			open := int64(t0 + 12*1_000_000 + 1)
			if err := s.rc.HSet(context.Background(), s.key, "st", fleetOpen, "ep", 1, "so", open).Err(); err != nil {
				t.Fatal(err)
			}
			before := 0.0
			epoch := int64(1)
			last := open
			for k, p := range c.probes {
				for ; last+1_000_000 <= open+p.at; last += 1_000_000 {
					w = report(last+1_000_000, 0, 400, 0, 0, 0, epoch)
				}
				before = float64(w.fleetRate) / 1000
				// p2's report carries a fast sample of its own, from before
				// the open: the probe's time decides, not its samples.
				w = s.sync(open+p.at, syncHost{successes: 1, seen: epoch, close: true,
					limit: &limitReport{pid: "p2", waiting: 1, ok: 1, latUS: 1_000, latN: 1, latMinUS: 1_000, probeUS: p.us}})
				if k < c.refused {
					if w.state != fleetOpen || w.epoch != epoch+1 || float64(w.fleetRate)/1000 != before {
						t.Fatalf("probe %d (%d µs at %d µs): state %d, epoch %d, R %.1f; want the close refused (open, epoch %d, R %.1f)",
							k, p.us, p.at, w.state, w.epoch, float64(w.fleetRate)/1000, epoch+1, before)
					}
					epoch = w.epoch
				}
			}
			after := float64(w.fleetRate) / 1000
			t.Logf("healthy %.1f, during the outage %.1f, after the close %.1f (share %.3f)", healthy, before, after, float64(w.rate)/1000)
			if w.state != fleetClosed {
				t.Fatalf("the fleet's breaker did not close: state %d", w.state)
			}
			if after != before {
				t.Fatalf("R %.2f after the close, %.2f before it: want it unchanged", after, before)
			}
			if w.rate <= 0 || float64(w.rate)/1000 > after+0.001 {
				t.Fatalf("the closing process's share %.3f of R %.3f", float64(w.rate)/1000, after)
			}
			epoch = w.epoch
			now := open + c.probes[len(c.probes)-1].at
			// A sync without a report: the rate alone.
			w = s.sync(now+100_000, syncHost{successes: 2, seen: epoch})
			if w.rate != 0 || float64(w.fleetRate)/1000 != after {
				t.Fatalf("a sync without a report: share %d, rate %d; want 0 and %.0f", w.rate, w.fleetRate, after*1000)
			}
			// The host serves near the baseline again: the outage ends,
			// the last healthy rate (what the host served, 400) is back.
			for k := int64(1); k <= 2; k++ {
				w = report(last+k*1_000_000+1_000_000, 100, 400, 100*20_000, 100, 15_000, epoch)
			}
			if back := float64(w.fleetRate) / 1000; back < 400 {
				t.Fatalf("R %.1f after a window near the baseline, want the last healthy 400 back (R was %.1f)", back, healthy)
			}
		})
	}
}

// TestSlowProbeKeepsFleetOpen, end to end against a real Redis: a fleet
// with a rate learns a baseline from fast calls, a failing dependency opens
// its breaker, and the dependency then answers, but 150 ms late (about
// 150x its baseline): the probes succeed and close the process's breaker,
// and the fleet refuses each close (a new epoch, still open), so the calls
// keep waiting; once the dependency is fast again a probe closes it.
func TestSlowProbeKeepsFleetOpen(t *testing.T) {
	rc := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 100 * time.Millisecond, Timeout: time.Second,
		Limit: &limit.Config{Max: 64}, MinCalls: 10, // the fleet's breaker trips, the process's does not alone
		Breaker: breaker.Config{MinCalls: 1 << 30, Window: 2 * time.Second, OpenFor: 300 * time.Millisecond}}
	cleanup(t, rc, cfg.Name)
	f := newFleets(t, rc, 1, cfg)[0]
	const (
		fast = iota
		failing
		slow
	)
	var mode atomic.Int32
	op := func(ctx context.Context, _ int) error {
		switch mode.Load() {
		case failing:
			time.Sleep(time.Millisecond)
			return errDependency
		case slow:
			select {
			case <-time.After(150 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		time.Sleep(time.Millisecond)
		return nil
	}
	keepCalling(t, newPolicy(t, f, "api"), 8, 3*time.Second, op)
	h := f.hostFor("api")
	baseline := func() float64 {
		v, _ := rc.HGet(context.Background(), h.key, "rb").Float64()
		return v
	}
	if !eventually(15*time.Second, func() bool { return baseline() > 0 }) {
		t.Fatalf("no baseline learned from the fast calls")
	}
	mode.Store(failing)
	if !eventually(10*time.Second, func() bool { return h.fleetState.Load() == fleetOpen }) {
		t.Fatalf("the failing dependency did not open the fleet's breaker")
	}
	mode.Store(slow)
	ep0, closes0 := h.fleetEpoch.Load(), h.closes.Load()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s := h.fleetState.Load(); s != fleetOpen {
			t.Fatalf("the fleet's breaker closed on probes 150 ms slow (baseline %.0f µs), 2 s into the 10 windows", baseline())
		}
	}
	ep, closes := h.fleetEpoch.Load(), h.closes.Load()
	t.Logf("baseline %.0f µs; in 2 s of slow answers: %d closes by the process's probes, epoch %d -> %d", baseline(), closes-closes0, ep0, ep)
	if closes == closes0 || ep == ep0 {
		t.Fatalf("no close refused in 2 s of slow answers: %d closes, epoch %d -> %d", closes-closes0, ep0, ep)
	}
	mode.Store(fast)
	if !eventually(10*time.Second, func() bool { return h.fleetState.Load() == fleetClosed }) {
		t.Fatalf("the fleet's breaker did not close once the dependency was fast again")
	}
}
