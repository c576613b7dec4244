package fleet

import (
	"context"
	"testing"
)

// tripScript is a limitScript whose breaker has buckets of 200 ms in a
// window of 2 s and a minimum of 20 calls, with the fields of the hash
// given set first (the fleet's rate rr, a close's time sc, the rate's
// window wu).
func tripScript(t *testing.T, fields map[string]any) *limitScript {
	t.Helper()
	s := newLimitScript(t, 1000)
	s.set.bucketUS, s.set.buckets, s.set.minCalls = 200_000, 10, 20
	if len(fields) > 0 {
		if err := s.rc.HSet(context.Background(), s.key, fields).Err(); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// TestScriptFleetTripTwoBuckets: after a second of successes, with the
// fleet's rate, "the bucket alone" is the bucket with the one before it
// (successes reach the fleet a sync late, failures at once: 30 failures
// and 5 successes in a bucket's first reports are no majority of the 90
// calls the bucket before held); without a rate, the rule is as before.
func TestScriptFleetTripTwoBuckets(t *testing.T) {
	tests := []struct {
		name     string
		rate     float64 // the fleet's rate, calls per second (0: none)
		failures []uint64
		want     []int64 // the breaker's state after each sync
	}{
		{"no rate: a bucket's majority trips", 0, []uint64{30}, []int64{1}},
		{"rate 450: 30 failures at a bucket's start do not", 450, []uint64{30}, []int64{0}},
		{"rate 450: a majority of the two buckets does", 450, []uint64{30, 70}, []int64{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fields := map[string]any{}
			if tt.rate > 0 {
				fields["rr"] = tt.rate
			}
			s := tripScript(t, fields)
			// A second of R's calls, all served, in the buckets before.
			for k := int64(5); k >= 1; k-- {
				if w := s.sync(t0+1-k*200_000, syncHost{successes: 90}); w.state != 0 {
					t.Fatalf("successes opened the breaker")
				}
			}
			for i, f := range tt.failures {
				now := int64(t0 + 1 + i*10_000) // one bucket
				succ := uint64(0)
				if i == 0 {
					succ = 5
				}
				w := s.sync(now, syncHost{successes: succ, failures: f, seen: 0})
				if w.state != tt.want[i] {
					t.Fatalf("sync %d (%d failures): state %d, want %d", i, f, w.state, tt.want[i])
				}
			}
		})
	}
}

// TestScriptFleetTripAfterCloseScaledByRate: for the rate's window after
// the breaker's close, the window trips it only when its failures are at
// least the failure ratio of the calls R sends since the close (the
// released calls' successes come at their processes' next syncs); after
// that window, the usual rule.
func TestScriptFleetTripAfterCloseScaledByRate(t *testing.T) {
	const closed = t0 + 1
	s := tripScript(t, map[string]any{"rr": 450, "sc": closed, "wu": 1_000_000})
	// 40 failures and 10 successes in each of two buckets, each bucket
	// under R's 45 failures a bucket: 80 of 100 by 500 ms after the
	// close, when R sent 225 (a trip needs 112.5 failures).
	for i, now := range []int64{closed + 300_000, closed + 500_000} {
		if w := s.sync(now, syncHost{successes: 10, failures: 40}); w.state != 0 {
			t.Fatalf("sync %d: the breaker opened %d ms after the close on 40 failures a bucket", i, (now-closed)/1000)
		}
	}
	// A rate's window after the close, one failure more: the window's
	// majority trips it.
	if w := s.sync(closed+1_100_000, syncHost{failures: 1}); w.state != 1 {
		t.Fatalf("a rate's window after the close, 81 failures of 101: state %d, want open", w.state)
	}
	// A host down again at the close: its failures come at the rate's
	// pace, and trip it at once.
	s = tripScript(t, map[string]any{"rr": 450, "sc": closed, "wu": 1_000_000})
	if w := s.sync(closed+100_000, syncHost{failures: 45, successes: 3}); w.state != 1 {
		t.Fatalf("45 failures of 48 100 ms after the close (the rate sent 45): state %d, want open", w.state)
	}
}

// rateStep is one window of TestScriptFleetRateShedAndPartialOutage: one
// process's report at the window's start (its successes and drops since
// the last one, a latency sample of 20 ms per success), the breaker's
// state after it (opened: it opened in the window and is closed again at
// its end), and the rate the report's reply must carry.
type rateStep struct {
	ok, bad uint64
	open    bool
	opened  bool
	want    float64
}

// runRateSteps runs steps, one a window, on a fresh host.
func runRateSteps(t *testing.T, steps []rateStep) {
	t.Helper()
	s := newLimitScript(t, 1000)
	for i, w := range steps {
		now := int64(t0 + i*1_000_000 + 1)
		n := int64(w.ok)
		_, r := s.report(now, "p1", 0, w.ok, w.bad, 20_000*n, n)
		fields := map[string]any{"st": 0}
		if w.open {
			fields["st"] = 1
		}
		if w.opened {
			fields["so"] = now + 400_000
		}
		if err := s.rc.HSet(context.Background(), s.key, fields).Err(); err != nil {
			t.Fatal(err)
		}
		if d := r - w.want; d > 0.002 || d < -0.002 {
			t.Fatalf("window %d: fleet rate %.3f, want %.3f", i, r, w.want)
		}
	}
}

// TestScriptFleetRateShedAndPartialOutage: drops that are a small share
// cut the rate by their share, not to 10% above the rate served (which
// reports a window late: the rate before the last raise); a window in
// which the breaker opened and closed again is an outage's (no cut, no
// evidence of the host's ceiling: the rate restarts from the last healthy
// one), and so is the window after it no cut (its reports are the
// outage's).
func TestScriptFleetRateShedAndPartialOutage(t *testing.T) {
	t.Run("a small share of drops", func(t *testing.T) {
		runRateSteps(t, []rateStep{
			{ok: 300},            // cold
			{ok: 300},            // the first window with demand: no rate yet
			{ok: 300, want: 300}, // the second window's demand
			{ok: 200, bad: 10, want: 450},
			// 10 drops of 210: 450 less 4.8%, not 1.1 x 300 served.
			{ok: 300, want: 450 * (1 - 10.0/210)},
		})
	})
	t.Run("the breaker opened and closed in a window", func(t *testing.T) {
		runRateSteps(t, []rateStep{
			{ok: 300},
			{ok: 300},
			{ok: 300, want: 300},
			{ok: 300, want: 450},
			{ok: 300, want: 318.75}, // demand met: the proven 300 + 1/16
			// A few served, some drops, the breaker open and closed again.
			{ok: 20, bad: 10, opened: true, want: 318.75},
			{ok: 40, bad: 5, want: 318.75}, // that window: an outage's, no cut
			{ok: 300, want: 318.75},        // the window after it: no cut either
			{ok: 300, want: 318.75},        // clean: the last healthy rate, not 1.0625 x 20
		})
	})
}
