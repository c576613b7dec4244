package fleet

import (
	"testing"
	"time"

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
