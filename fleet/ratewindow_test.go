package fleet

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
)

// TestRateReportOncePerWindow: whatever SyncEvery, a host reports to the
// fleet's rate once per window of max(SyncEvery, 1 s), with the outcomes
// of every sync since its last report; the syncs in between carry none
// (the breaker still gets each sync's outcomes). The first report comes
// at the first sync when SyncEvery is the window, else a window after it
// (a window's demand, not a sync's). The last report (final) goes whenever
// it comes, and a failed sync (ungate) makes the next one report. Before,
// every sync reported: at 250 ms the rate's rules counted each process
// four times a window.
func TestRateReportOncePerWindow(t *testing.T) {
	for _, tc := range []struct {
		every      time.Duration
		window     time.Duration // the rate's window
		syncsEvery int           // syncs per report
	}{
		{every: 100 * time.Millisecond, window: time.Second, syncsEvery: 10},
		{every: 250 * time.Millisecond, window: time.Second, syncsEvery: 4},
		{every: time.Second, window: time.Second, syncsEvery: 1},
		{every: 2 * time.Second, window: 2 * time.Second, syncsEvery: 1},
	} {
		t.Run(tc.every.String(), func(t *testing.T) {
			c, s, err := Config{Name: "w", SyncEvery: tc.every, Limit: &limit.Config{}}.resolve()
			if err != nil {
				t.Fatal(err)
			}
			if got := time.Duration(s.limitWindowUS) * time.Microsecond; got != tc.window {
				t.Fatalf("the rate's window: %v, want %v", got, tc.window)
			}
			f := &Fleet{cfg: c, set: s}
			h, err := newHost(f, "api")
			if err != nil {
				t.Fatal(err)
			}
			const syncs = 40
			reports, firstAt := 0, 0
			since := 0 // syncs since the last report
			for i := 1; i <= syncs; i++ {
				// Each sync comes a little late or early, as a ticker's do.
				jitter := time.Duration(i%3-1) * tc.every / 20
				now := int64(time.Duration(i)*tc.every + jitter)
				since++
				r := h.rateReport(now, 2, 1, false)
				if r == nil {
					continue
				}
				if want := tc.syncsEvery; reports > 0 && since != want {
					t.Errorf("sync %d: a report after %d syncs, want one every %d", i, since, want)
				}
				if r.ok != uint64(2*since) || r.bad != uint64(since) {
					t.Errorf("sync %d: report with %d successes and %d failures, want the %d and %d of the %d syncs since the last",
						i, r.ok, r.bad, 2*since, since, since)
				}
				if reports == 0 {
					firstAt = i
				}
				reports++
				since = 0
			}
			first := 1 // the sync of the first report
			if tc.syncsEvery > 1 {
				first += tc.syncsEvery
			}
			if firstAt != first {
				t.Errorf("the first report at sync %d, want %d", firstAt, first)
			}
			if want := 1 + (syncs-first)/tc.syncsEvery; reports != want {
				t.Errorf("%d syncs: %d reports, want %d", syncs, reports, want)
			}
			// A failed sync lifts the gate: the next sync reports, as does
			// the last one.
			f.list.Store(&[]*host{h})
			f.ungate()
			if r := h.rateReport(int64(time.Duration(syncs+1)*tc.every), 0, 0, false); r == nil {
				t.Errorf("no report at the first sync after a failed one")
			}
			if r := h.rateReport(int64(time.Duration(syncs+1)*tc.every+time.Millisecond), 0, 0, true); r == nil || r.waiting != -1 {
				t.Errorf("the final sync's report: %+v, want one that leaves", r)
			}
		})
	}
}

// TestCloseReportsAndShareFollowsRate: news of a close by this process's
// probes goes with a report to the rate, due or not (it carries the
// probe's time: a slow probe's close may be refused, see
// TestScriptFleetRateSlowProbe); and a sync without a report, whose reply
// carries the rate alone, scales the process's share by the rate's change
// (at a 250 ms sync a cut of R would otherwise reach a process only at its
// next report, up to a window later).
func TestCloseReportsAndShareFollowsRate(t *testing.T) {
	c, s, err := Config{Name: "w", SyncEvery: 250 * time.Millisecond, Limit: &limit.Config{}}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	f := &Fleet{cfg: c, set: s}
	h, err := newHost(f, "api")
	if err != nil {
		t.Fatal(err)
	}
	every := int64(250 * time.Millisecond)
	h.collect(every, false) // the first sync: the first window starts
	if r := h.collect(2*every, false); r.limit != nil {
		t.Fatalf("a report a sync after the first: %+v", r.limit)
	}
	h.closes.Add(1) // the breaker (closed) closed on its probes
	r := h.collect(3*every, false)
	if !r.close || r.limit == nil {
		t.Fatalf("the sync after a close: close %v, report %v; want both", r.close, r.limit != nil)
	}
	if r.limit.probeUS != 0 {
		t.Fatalf("a close without a probe round's time: probe %d µs, want none", r.limit.probeUS)
	}
	h.synced(r, hostWindow{rate: 10_000, fleetRate: 400_000}) // a share of 10/s of 400/s
	share := func() float64 { return math.Float64frombits(h.rate.Load()) }
	if share() != 10 {
		t.Fatalf("share %.3f after a report, want 10", share())
	}
	r = h.collect(4*every, false)
	if r.close || r.limit != nil {
		t.Fatalf("the next sync: close %v, report %v; want neither", r.close, r.limit != nil)
	}
	h.synced(r, hostWindow{fleetRate: 80_000}) // R cut to a fifth, no report
	if got := share(); math.Abs(got-2) > 1e-9 {
		t.Fatalf("share %.3f after R fell from 400/s to 80/s between reports, want 2", got)
	}
	h.synced(h.collect(5*every, false), hostWindow{fleetRate: 80_000}) // unchanged: unchanged
	if got := share(); math.Abs(got-2) > 1e-9 {
		t.Fatalf("share %.3f after a sync with R unchanged, want 2", got)
	}
}

// TestProbeTimeGoesWithTheClose: a probe round the fleet granted with
// calls waiting (one takes the probe at once) and that closed the breaker
// gives the report that goes with the close the probe's time, from the
// grant to the close (not the limiter's samples: about one call in 16,
// and those of the calls before the breaker opened); a round that reopened
// the breaker gives none.
func TestProbeTimeGoesWithTheClose(t *testing.T) {
	for _, tc := range []struct {
		name string
		to   breaker.State
		want bool // a probe time in the report
	}{
		{"the probe closed the breaker", breaker.Closed, true},
		{"the probe failed", breaker.Open, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s, err := Config{Name: "w", SyncEvery: time.Second, Limit: &limit.Config{}}.resolve()
			if err != nil {
				t.Fatal(err)
			}
			f := &Fleet{cfg: c, set: s, kick: make(chan struct{}, 1)}
			h, err := newHost(f, "api")
			if err != nil {
				t.Fatal(err)
			}
			h.addSamples(0, time.Millisecond, time.Millisecond, 1) // a fast call before the breaker opened
			const probe = 120 * time.Millisecond
			h.probeAt.Store(f.since() - int64(probe))      // granted 120 ms ago
			h.StateChanged(breaker.Open, breaker.HalfOpen) // the round starts
			h.StateChanged(breaker.HalfOpen, tc.to)
			r := h.collect(f.since(), false)
			if r.limit == nil {
				t.Fatalf("no report")
			}
			if got := r.limit.probeUS > 0; got != tc.want {
				t.Fatalf("probe time %d µs in the report, want one: %v", r.limit.probeUS, tc.want)
			}
			if tc.want && (r.limit.probeUS < probe.Microseconds() || r.limit.probeUS > (probe+time.Second).Microseconds()) {
				t.Fatalf("the probe's time: %d µs, want about %d µs", r.limit.probeUS, probe.Microseconds())
			}
			if h.probeAt.Load() != 0 {
				t.Fatalf("the probe round's grant time kept after the round ended")
			}
		})
	}
}
