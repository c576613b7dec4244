package fleet

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// limitScript runs the script's fleet limit on a real Redis at times the
// test chooses (explicit microseconds, not the server's clock), for one
// host key.
type limitScript struct {
	t      *testing.T
	rc     redis.UniversalClient
	key    string
	set    settings
	script *redis.Script
}

func newLimitScript(t *testing.T, max int64) *limitScript {
	rc := redisClient(t)
	name := uniqueName(t)
	cleanup(t, rc, name)
	return &limitScript{t: t, rc: rc, key: keyPrefix + "{" + name + "}:api", script: redis.NewScript(scriptSource),
		set: settings{sliceUS: 1_000_000, slices: 10, ratio: 0.1, reserve: 10, bucketUS: 1_000_000, buckets: 10,
			fratio: 0.5, minCalls: 1 << 40, ttlMS: 600_000, probeUS: 1_000_000, rounds: 1,
			limitWindowUS: 1_000_000, limitMax: max, limitInit: min(max, defaultLimitInit)}}
}

// report sends one process's sync at now (µs): its attempts in flight,
// its demand, and its successes and failures since its last sync. It
// returns the process's grant and the fleet's limit.
func (s *limitScript) report(now int64, pid string, inFlight, demand int64, ok, failed uint64) (grant, lim int64) {
	s.t.Helper()
	args := appendSync(s.set.args("s", now), syncHost{successes: ok, failures: failed,
		limit: &limitReport{pid: pid, inFlight: inFlight, demand: demand,
			windowUS: s.set.limitWindowUS, max: s.set.limitMax, initLimit: s.set.limitInit}})
	a := make([]any, len(args))
	for i := range args {
		a[i] = args[i]
	}
	v, err := s.script.Run(context.Background(), s.rc, []string{s.key}, a...).Int64Slice()
	if err != nil {
		s.t.Fatal(err)
	}
	r, err := decodeSync(v, 1)
	if err != nil {
		s.t.Fatal(err)
	}
	return r.hosts[0].grant, r.hosts[0].limit
}

const t0 = 1_700_000_000_000_000 // µs, the start of a window

// TestScriptFleetLimitLearns: the fleet's limit doubles in used clean
// windows (slow start), falls by the share of failures (at most halving)
// in windows with failures, remembers the first lowered limit as its
// slow-start threshold, doubles back to it and then grows by sqrt(limit)
// per window; a clean window that the fleet did not use leaves it alone.
func TestScriptFleetLimitLearns(t *testing.T) {
	s := newLimitScript(t, 1000)
	type window struct {
		demand  int64 // 0: the fleet's limit (the window is used)
		ok, bad uint64
		want    int64 // the limit read at the window's first sync
	}
	steps := []window{
		{want: 10, ok: 100},            // cold: min(Max, 10)
		{want: 20, ok: 100},            // slow start
		{want: 40, ok: 100},            //
		{want: 80, ok: 100},            //
		{want: 160, ok: 0, bad: 100},   // all dropped
		{want: 80, ok: 0, bad: 100},    // halved; the threshold is 80
		{want: 40, ok: 0, bad: 100},    //
		{want: 20, ok: 90, bad: 10},    //
		{want: 18, ok: 100},            // 10% dropped: × 0.9
		{want: 36, ok: 100},            // slow start back to the threshold
		{want: 72, ok: 100},            //
		{want: 80, ok: 100},            // capped at the threshold
		{want: 88, ok: 100},            // + floor(sqrt(80))
		{want: 97, ok: 100, demand: 1}, // + floor(sqrt(88)); then a window nobody used
		{want: 97, ok: 100},            // unchanged
		{want: 106},                    //
	}
	for i, w := range steps {
		now := int64(t0 + i*1_000_000 + 1)
		d := w.demand
		if d == 0 {
			d = w.want
		}
		_, lim := s.report(now, "p1", 0, d, w.ok, w.bad)
		if lim != w.want {
			t.Fatalf("window %d: fleet limit %d, want %d", i, lim, w.want)
		}
	}
	// Reported across processes: the outcomes of every process count.
	s2 := newLimitScript(t, 1000)
	s2.report(t0+1, "a", 0, 10, 50, 0)
	s2.report(t0+2, "b", 0, 0, 0, 50)
	if _, lim := s2.report(t0+1_000_001, "a", 0, 10, 0, 0); lim != 5 {
		t.Fatalf("half of the fleet's outcomes failed (in another process): limit %d, want 5", lim)
	}
}
