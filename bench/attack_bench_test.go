package bench

// Attack tests of the bench module's measurement code (area: bench). This
// file is in package bench (an internal test) because the computing
// functions of the tail scenario (recovery, quantile) and the table
// helpers (recoverText, pct) are unexported; live.MetaOf and
// live.Percentile are called through the bench module's copy of package
// live. Every record is synthetic: no live run, no network.

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/bench/internal/live"
)

// bchMetaRun builds a run of the metastability scenario: calls every
// 100 ms from 0 to dur, ok(at) deciding whether each succeeded, and
// windows of 100 ms over dur+deadline, each with one attempt.
func bchMetaRun(failAt, failFor, dur time.Duration, ok func(at time.Duration) bool) *live.Result {
	pc := live.ProviderConfig{FailAt: failAt, FailFor: failFor, Capacity: 10, Work: 20 * time.Millisecond,
		Window: 100 * time.Millisecond, Horizon: dur + 25*time.Second}
	fc := live.FleetConfig{Clients: 1000, Every: 2222 * time.Millisecond, Duration: dur, Deadline: 20 * time.Second}
	r := &live.Result{Provider: pc, Fleet: fc}
	for at := time.Duration(0); at < dur; at += 100 * time.Millisecond {
		r.Stats.Calls = append(r.Stats.Calls, live.CallRecord{Start: at, Took: 50 * time.Millisecond, OK: ok(at)})
	}
	for at := time.Duration(0); at < pc.Horizon; at += pc.Window {
		r.Windows = append(r.Windows, live.Window{Start: at, Attempts: 1, Served: 1})
	}
	return r
}

// Goodput is "of the payments started in a span ..., the share that
// succeeded within their deadline" (docs/metastability.md, Columns). A
// call recorded OK that took longer than the fleet's deadline did not
// succeed within it.
func TestAttackBenchMetaGoodputCountsSuccessAfterDeadline(t *testing.T) {
	r := bchMetaRun(15*time.Second, 10*time.Second, 60*time.Second, func(time.Duration) bool { return true })
	// Every payment started during the trigger "succeeded" 30 s after it
	// started, 10 s past its 20 s deadline.
	for i := range r.Stats.Calls {
		c := &r.Stats.Calls[i]
		if c.Start >= 15*time.Second && c.Start < 25*time.Second {
			c.Took = 30 * time.Second
		}
	}
	m := live.MetaOf(r)
	if m.GoodDuring != 0 {
		t.Errorf("GoodDuring = %s with every payment of the trigger ending 10 s after its 20 s deadline; want 0%% (succeeded within their deadline)", pct(m.GoodDuring))
	}
}

// A payment that ended exactly at its deadline succeeded within it.
func TestAttackBenchMetaGoodputExactlyAtDeadline(t *testing.T) {
	r := bchMetaRun(15*time.Second, 10*time.Second, 60*time.Second, func(time.Duration) bool { return true })
	for i := range r.Stats.Calls {
		r.Stats.Calls[i].Took = r.Fleet.Deadline
	}
	if m := live.MetaOf(r); m.GoodDuring != 1 || m.GoodBefore != 1 {
		t.Errorf("GoodBefore %s, GoodDuring %s with every payment done exactly at its deadline; want 100%%", pct(m.GoodBefore), pct(m.GoodDuring))
	}
}

// Meta.RecoverAfter: "when that began, from the trigger's end (0 if it
// never dropped)". A trigger ending off a whole second, with goodput never
// below 95% after it, must read 0 (and "0 s" in the recovered column).
func TestAttackBenchMetaRecoverAfterNeverDroppedOffSecond(t *testing.T) {
	for _, end := range []time.Duration{15300 * time.Millisecond, 15500 * time.Millisecond, 15900 * time.Millisecond} {
		r := bchMetaRun(15*time.Second, end-15*time.Second, 60*time.Second, func(time.Duration) bool { return true })
		m := live.MetaOf(r)
		if !m.Recovered || m.RecoverAfter != 0 || recoverText(m) != "0 s" {
			t.Errorf("trigger 15 s to %v, every payment OK: recovered %v after %v (column %q); want true after 0 (it never dropped), \"0 s\"",
				end, m.Recovered, m.RecoverAfter, recoverText(m))
		}
	}
}

// Recovered: "how long after the trigger's end the goodput of the payments
// started in each 1 s span got to >= 95% and stayed there". A second in
// which no payment started has no goodput: it cannot be the second the
// goodput got to 95%.
func TestAttackBenchMetaRecoverAfterStartsOnEmptySecond(t *testing.T) {
	// Trigger 15-25 s; payments of 25-26 s fail, none start in 26-27 s
	// (the fleet was starved), from 27 s on all succeed.
	r := bchMetaRun(15*time.Second, 10*time.Second, 60*time.Second, func(at time.Duration) bool {
		return at < 15*time.Second || at >= 26*time.Second
	})
	r.Stats.Calls = bchDrop(r.Stats.Calls, 26*time.Second, 27*time.Second)
	m := live.MetaOf(r)
	if m.PerSecond[26] != -1 || m.PerSecond[25] != 0 || m.PerSecond[27] != 1 {
		t.Fatalf("per second 25..27: %v, want 0, -1, 1", m.PerSecond[25:28])
	}
	if !m.Recovered || m.RecoverAfter != 2*time.Second {
		t.Errorf("recovered %v after %v; want true after 2s (the first second with payments at >= 95%% is 27 s, 2 s after the end)", m.Recovered, m.RecoverAfter)
	}
}

// bchDrop removes the calls started in [from, to).
func bchDrop(cs []live.CallRecord, from, to time.Duration) []live.CallRecord {
	var out []live.CallRecord
	for _, c := range cs {
		if c.Start < from || c.Start >= to {
			out = append(out, c)
		}
	}
	return out
}

// A trigger that ends with the run leaves no second after it: nothing
// "never recovered", and a run whose seconds after the trigger merely
// hold no payment reads recovered. Both cases must read the same.
func TestAttackBenchMetaTriggerEndingAtRunEnd(t *testing.T) {
	// (a) the trigger ends exactly when the fleet stops.
	a := live.MetaOf(bchMetaRun(50*time.Second, 10*time.Second, 60*time.Second, func(at time.Duration) bool { return at < 50*time.Second }))
	// (b) the trigger ends at 55 s, no payment starts after it.
	rb := bchMetaRun(45*time.Second, 10*time.Second, 60*time.Second, func(at time.Duration) bool { return at < 45*time.Second })
	rb.Stats.Calls = bchDrop(rb.Stats.Calls, 55*time.Second, 60*time.Second)
	b := live.MetaOf(rb)
	if a.Recovered != b.Recovered {
		t.Errorf("no payment measured after the trigger: trigger ending with the run reads %q, trigger ending 5 s before it with no payment after reads %q; "+
			"want the same reading (no second after the trigger to judge)", recoverText(a), recoverText(b))
	}
	if b.Recovered && b.RecoverAfter == 0 {
		t.Errorf("no payment started after the trigger, yet recovered after 0 (%q): a second with no payment counted as >= 95%%", recoverText(b))
	}
	for _, m := range []live.Meta{a, b} {
		if !m.NoData || recoverText(m) != "no data" {
			t.Errorf("no payment after the trigger: NoData %v, column %q; want true, \"no data\"", m.NoData, recoverText(m))
		}
	}
}

// A run that recovers, then dips below 95% again, recovers only after the
// last dip; the spans and attempts are bucketed at their boundaries.
func TestAttackBenchMetaRecoverDipAgainAndSpans(t *testing.T) {
	// Trigger 15-25 s; 25-27 s fail, 27-40 s fine, 40-41 s fail, then fine.
	r := bchMetaRun(15*time.Second, 10*time.Second, 60*time.Second, func(at time.Duration) bool {
		switch {
		case at >= 15*time.Second && at < 27*time.Second:
			return false
		case at >= 40*time.Second && at < 41*time.Second:
			return false
		}
		return true
	})
	m := live.MetaOf(r)
	if !m.Recovered || m.RecoverAfter != 16*time.Second {
		t.Errorf("recovered %v after %v; want true after 16s (41 s, after the second dip)", m.Recovered, m.RecoverAfter)
	}
	// One bad payment in the last second (9 of 10 ok: 90%) is stuck.
	r.Stats.Calls[len(r.Stats.Calls)-1].OK = false
	if m := live.MetaOf(r); m.Recovered {
		t.Errorf("last second at 90%%: recovered after %v, want stuck", m.RecoverAfter)
	}
	r.Stats.Calls[len(r.Stats.Calls)-1].OK = true
	// Spans: first 10 s after = [25, 35): 20 failed of 100; rest [35, 60): 10 failed of 250.
	if want := 80.0 / 100; math.Abs(m.GoodAfter-want) > 1e-12 {
		t.Errorf("GoodAfter %v, want %v", m.GoodAfter, want)
	}
	if want := 240.0 / 250; math.Abs(m.GoodRest-want) > 1e-12 {
		t.Errorf("GoodRest %v, want %v", m.GoodRest, want)
	}
	// Attempts: one per 100 ms window; during: 100 windows for 100
	// payments; after: windows from 25 s to the horizon (85 s) 600 for
	// 350 payments.
	if m.AttemptsDuring != 1 || math.Abs(m.AttemptsAfter-600.0/350) > 1e-12 {
		t.Errorf("attempts during %v after %v; want 1 and %v", m.AttemptsDuring, m.AttemptsAfter, 600.0/350)
	}
}

// A payment started exactly at the trigger's end is in "first 10 s after";
// one at end+10 s in "rest"; one at FailAt in "during"; per-second buckets
// are [k, k+1) s.
func TestAttackBenchMetaBoundaries(t *testing.T) {
	pc := live.ProviderConfig{FailAt: 15 * time.Second, FailFor: 10 * time.Second, Capacity: 10, Work: 20 * time.Millisecond, Window: 100 * time.Millisecond}
	fc := live.FleetConfig{Clients: 1000, Every: 2222 * time.Millisecond, Duration: 60 * time.Second, Deadline: 20 * time.Second}
	r := &live.Result{Provider: pc, Fleet: fc, Stats: live.FleetStats{Calls: []live.CallRecord{
		{Start: 15*time.Second - 1, OK: true},
		{Start: 15 * time.Second, OK: false},
		{Start: 25*time.Second - 1, OK: false},
		{Start: 25 * time.Second, OK: true},
		{Start: 35*time.Second - 1, OK: true},
		{Start: 35 * time.Second, OK: false},
	}}}
	m := live.MetaOf(r)
	if m.GoodBefore != 1 || m.GoodDuring != 0 || m.GoodAfter != 1 || m.GoodRest != 0 {
		t.Errorf("goodput %s / %s / %s / %s; want 100%% / 0%% / 100%% / 0%%", pct(m.GoodBefore), pct(m.GoodDuring), pct(m.GoodAfter), pct(m.GoodRest))
	}
	if m.PerSecond[14] != 1 || m.PerSecond[15] != 0 || m.PerSecond[24] != 0 || m.PerSecond[25] != 1 || m.PerSecond[34] != 1 || m.PerSecond[35] != 0 || m.PerSecond[0] != -1 {
		t.Errorf("per second %v", m.PerSecond)
	}
}

// Bound: min(1, (1-rho)*D/(rho*O)), 0.22 at the default scenario (rho 0.9,
// D 20 s, O 10 s), 1 when capped, 0 for rho >= 1 or unknown.
func TestAttackBenchMetaBound(t *testing.T) {
	p := defaultMetaParams()
	for _, c := range []struct {
		rho, want float64
		of        time.Duration
	}{{0.9, 0.1 * 20 / (0.9 * 10), 10 * time.Second}, {0.8, 0.2 * 20 / (0.8 * 10), 10 * time.Second}, {0.5, 1, 10 * time.Second}, {0.95, 0.05 * 20 / (0.95 * 10), 10 * time.Second}} {
		p.of = c.of
		pc, fc := metaScenario(p, c.rho, live.Trigger503)
		m := live.MetaOf(&live.Result{Provider: pc, Fleet: fc})
		if math.Abs(m.Bound-c.want) > 1e-3 {
			t.Errorf("rho %v: bound %v, want %v", c.rho, m.Bound, c.want)
		}
	}
	pc, fc := metaScenario(p, 0.9, live.Trigger503)
	fc.Every = fc.Every / 2 // rho 1.8
	if m := live.MetaOf(&live.Result{Provider: pc, Fleet: fc}); m.Bound != 0 {
		t.Errorf("rho 1.8: bound %v, want 0", m.Bound)
	}
}

// Wasted, served and shed after end+5 s: work finished from the trigger's
// end on, and the failed, shed and refused attempts from end+5 s on.
func TestAttackBenchMetaWastedAndShedLate(t *testing.T) {
	r := bchMetaRun(15*time.Second, 10*time.Second, 60*time.Second, func(time.Duration) bool { return true })
	for i := range r.Windows {
		w := &r.Windows[i]
		switch w.Start {
		case 25*time.Second - 100*time.Millisecond: // the trigger's last window
			w.Wasted, w.Shed = 1, 7
		case 25 * time.Second: // the first window after
			w.Wasted = 1
		case 30*time.Second - 100*time.Millisecond:
			w.Shed = 3
		case 30 * time.Second:
			w.Shed, w.Refused = 2, 1
		}
	}
	m := live.MetaOf(r)
	if served := int64(len(r.Windows) - 250); m.Served != served || math.Abs(m.Wasted-1/float64(served)) > 1e-12 {
		t.Errorf("served %d wasted %v; want %d and %v", m.Served, m.Wasted, served, 1/float64(served))
	}
	if m.ShedLate != 3 {
		t.Errorf("ShedLate %d, want 3 (from 30 s on)", m.ShedLate)
	}
}

// live.Percentile: "the q-quantile (0 < q <= 1, nearest rank)": the
// element of rank ceil(q*n). The tail scenario's quantile the same.
func TestAttackBenchPercentileNearestRank(t *testing.T) {
	for _, q := range []struct {
		num, den int
	}{{50, 100}, {95, 100}, {99, 100}, {999, 1000}, {1, 1}} {
		qf := float64(q.num) / float64(q.den)
		for n := 1; n <= 3000; n++ {
			xs := make([]time.Duration, n)
			for i := range xs {
				xs[i] = time.Duration(i + 1)
			}
			rank := (q.num*n + q.den - 1) / q.den // exact ceil(q*n)
			if got := live.Percentile(xs, qf); got != time.Duration(rank) {
				t.Errorf("live.Percentile(1..%d, %v) = rank %d, want rank %d", n, qf, got, rank)
				break
			}
			if got := quantile(xs, qf); got != time.Duration(rank) {
				t.Errorf("quantile(1..%d, %v) = rank %d, want rank %d", n, qf, got, rank)
				break
			}
		}
	}
}

// bchTailRow builds a tail row: per second of a 40 s overload run (trigger
// 10-20 s), 100 calls of took(s) each, failed where bad(s).
func bchTailRow(took func(s int) time.Duration, bad func(s int) bool, skip func(s int) bool) (tailParams, tailRow) {
	p := tailScenarios(30 * time.Second)[2]
	var row tailRow
	for s := range int(p.duration / time.Second) {
		if skip != nil && skip(s) {
			continue
		}
		for k := range 100 {
			at := time.Duration(s)*time.Second + time.Duration(k)*10*time.Millisecond
			row.calls = append(row.calls, tailCall{start: at, took: took(s), ok: !bad(s)})
		}
	}
	n := int((p.duration+tailDeadline)/time.Second) + 2
	row.arrivedSec, row.hedgeSec = make([]int64, n), make([]int64, n)
	for i := range n {
		row.arrivedSec[i] = 100
		if i >= 10 && i < 20 {
			row.hedgeSec[i] = 1
		}
	}
	return p, row
}

// "Back to normal: the first second after the trigger that begins 3
// seconds in a row with no failed call and a median within 2x the row's
// median before the trigger" (docs/hedging.md); a later stall does not
// undo it.
func TestAttackBenchTailRecovery(t *testing.T) {
	p, row := bchTailRow(func(s int) time.Duration {
		if s >= 10 && s < 24 {
			return 500 * time.Millisecond
		}
		return 20 * time.Millisecond
	}, func(s int) bool { return s == 21 || s == 30 }, nil)
	rc := recovery(p, row)
	if !rc.recovered || rc.after != 4*time.Second {
		t.Errorf("recovered %v after %v; want true after 4s (24 s: 24, 25, 26 normal)", rc.recovered, rc.after)
	}
	if rc.before != 20*time.Millisecond || rc.failedDuring != 0 || rc.failedRest != 200 {
		t.Errorf("before %v, failed during %d, rest %d; want 20ms, 0, 200", rc.before, rc.failedDuring, rc.failedRest)
	}
	if rc.hedgesDuring != 10 || rc.arrDuring != 1000 {
		t.Errorf("hedges %d / %d requests in the trigger; want 10 / 1000", rc.hedgesDuring, rc.arrDuring)
	}
	// Exactly twice the median before is within 2x.
	p, row = bchTailRow(func(s int) time.Duration {
		if s >= 2 && s < 10 {
			return 20 * time.Millisecond
		}
		return 40 * time.Millisecond
	}, func(int) bool { return false }, nil)
	if rc := recovery(p, row); !rc.recovered || rc.after != 0 {
		t.Errorf("median exactly 2x: recovered %v after %v; want true after 0", rc.recovered, rc.after)
	}
	// Only the last two seconds normal: not within the run.
	p, row = bchTailRow(func(s int) time.Duration { return 20 * time.Millisecond }, func(s int) bool { return s >= 10 && s < 38 }, nil)
	if rc := recovery(p, row); rc.recovered {
		t.Errorf("two normal seconds at the end: recovered after %v; want not within the run", rc.after)
	}
}
