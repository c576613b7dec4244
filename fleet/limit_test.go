package fleet

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
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

// report sends one process's sync at now (µs): its calls waiting (-1: it
// leaves), its successes and drops since its last sync, and the sum (µs)
// and number of its latency samples. It returns the process's share of
// the fleet's rate and the rate, per second (0, 0 while cold).
func (s *limitScript) report(now int64, pid string, waiting int64, ok, failed uint64, latUS, latN int64) (rate, fleetRate float64) {
	return s.reportRefused(now, pid, waiting, 0, ok, failed, latUS, latN)
}

// reportRefused is report with the calls the process refused for want of
// a token since its last sync.
func (s *limitScript) reportRefused(now int64, pid string, waiting, refused int64, ok, failed uint64, latUS, latN int64) (rate, fleetRate float64) {
	s.t.Helper()
	return s.reportFastest(now, pid, waiting, refused, ok, failed, latUS, latN, 0)
}

// reportFastest is reportRefused with the fastest of the latency samples
// (µs, 0: none reported).
func (s *limitScript) reportFastest(now int64, pid string, waiting, refused int64, ok, failed uint64, latUS, latN, latMinUS int64) (rate, fleetRate float64) {
	s.t.Helper()
	w := s.sync(now, syncHost{successes: ok, failures: failed,
		limit: &limitReport{pid: pid, waiting: waiting, refused: refused, latUS: latUS, latN: latN, latMinUS: latMinUS, ok: ok, bad: failed}})
	return float64(w.rate) / 1000, float64(w.fleetRate) / 1000
}

// sync sends one process's sync at now (µs) of host h (its report to the
// rate, if not nil, with the script's settings filled in) and returns the
// reply's window of the host.
func (s *limitScript) sync(now int64, h syncHost) hostWindow {
	s.t.Helper()
	if h.limit != nil {
		h.limit.windowUS, h.limit.max, h.limit.initRate = s.set.limitWindowUS, s.set.limitMax, s.set.limitInit
	}
	args := appendSync(s.set.args("s", now), h)
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
	return r.hosts[0]
}

const t0 = 1_700_000_000_000_000 // µs, the start of a window

// TestScriptFleetRateLearns: one process reporting once per window (a
// window's outcomes set the rate returned at the next window's first
// report). The cold fleet takes the second window's demand as its rate and
// doubles in clean windows whose demand reaches 3/4 of it until the first
// window whose demand the rate met (slow start); from then on a clean
// window never leaves the rate above what the host has proven it serves
// (the highest two-window mean served, at most the rate in force, near
// the baseline) plus a margin of 1/16, or 8% while calls wait for it.
// Drops cut it by their share, at most halving, to 10% above the rate
// served; after an outage it restarts from the last healthy rate, and
// the margin while calls wait is 25% until the next cut; a
// window whose latency shows a queue brings it to what the host served
// less 3% and less the share that drains the queue in two windows, and
// what the host served then is the only evidence left of its capacity; no
// other cut for a queue in the three windows after one (its effect shows
// a window late), unless the rate rose since; a window the fleet did not
// use leaves it alone.
func TestScriptFleetRateLearns(t *testing.T) {
	s := newLimitScript(t, 1000)
	type window struct {
		ok, bad uint64 // outcomes reported in the window (its demand, waiting 0)
		lat     int64  // mean latency of the window's samples, µs (0: none)
		want    float64
	}
	steps := []window{
		{ok: 100, lat: 20_000, want: 0},          // cold: no rate yet
		{ok: 100, lat: 20_000, want: 0},          // the first window with demand: part of the fleet's, no rate yet
		{ok: 100, lat: 20_000, want: 100},        // the second window's demand
		{ok: 200, lat: 20_000, want: 150},        // slow start: max(R+√R, min(2R, 1.5·demand))
		{ok: 100, lat: 20_000, want: 300},        // 2x what the host proved (150, the rate in force)
		{ok: 400, lat: 20_000, want: 159.375},    // demand met (warm): 1/16 above the proven 150
		{bad: 100, want: 172.125},                // calls waited: 8% above the proven 159.375
		{bad: 100, want: 86.0625},                // all dropped: halved; an outage
		{ok: 50, bad: 50, want: 86.0625},         // not cut again in the window after a cut
		{ok: 100, lat: 20_000, want: 43.03125},   // half dropped: halved again
		{ok: 400, lat: 20_000, want: 159.375},    // clean: restarts from the last healthy rate
		{ok: 170, lat: 150_000, want: 199.21875}, // after an outage, no cut since: 25% above what the host proved
		{ok: 150, lat: 100_000, want: 180.68145}, // a queue: 0.97 · (1 − 0.13 s / 2 s) · 199.21875 served
		{ok: 160, lat: 150_000, want: 180.68145}, // latency above near the baseline, below a queue: held
		{ok: 400, lat: 20_000, want: 180.68145},  // a queue again 2 windows after a cut for a queue: held
		{want: 167.4},                            // 8% above what the host served when it last queued (155: two windows, at most R)
	}
	for i, w := range steps {
		now := int64(t0 + i*1_000_000 + 1)
		n := int64(w.ok)
		_, r := s.report(now, "p1", 0, w.ok, w.bad, w.lat*n, n)
		if math.Abs(r-w.want) > 0.002 {
			t.Fatalf("window %d: fleet rate %.3f, want %.3f", i, r, w.want)
		}
	}
}

// TestScriptFleetRateSlowStartPartialReports: the first windows of a cold
// fleet hold partial reports (live, 1000 processes each reporting at its
// own sync, their first calls ungated): a window whose demand R did not
// meet then leaves slow start only from the third window with a rate on.
// On the script before, the second window's partial count (150 of the 450
// offered) ended slow start and clamped R to 1/16 above it; from there it
// climbed 8% a window, below the offered load for 15 windows (live: 192/s
// of 450/s offered, 329/s at the trigger 15 s later).
func TestScriptFleetRateSlowStartPartialReports(t *testing.T) {
	s := newLimitScript(t, 1000)
	steps := []struct {
		ok   uint64
		want float64 // the rate returned at the window's report
	}{
		{ok: 100, want: 0},   // cold: the first window with demand, no rate yet
		{ok: 200, want: 0},   // cold: the second window's demand becomes R
		{ok: 150, want: 200}, // partial: under R
		{ok: 450, want: 225}, // still slow start: max(R+√R, min(2R, 1.5·150)) within 2x the 150 proven (old: 159.375)
		{ok: 450, want: 450}, // min(2R, 1.5·450) within 2x the 225 proven (two windows' mean, at most R)
	}
	for i, w := range steps {
		now := int64(t0 + i*1_000_000 + 1)
		n := int64(w.ok)
		_, r := s.report(now, "p1", 0, w.ok, 0, 20_000*n, n)
		if math.Abs(r-w.want) > 0.002 {
			t.Fatalf("window %d: fleet rate %.3f, want %.3f", i, r, w.want)
		}
	}
}

// TestScriptFleetRateRegainsAfterSlowdown: a slowdown (a queue that
// stands, windows after windows, the host serving a fifth of the rate)
// cuts the rate; once the host is back (clean windows near the baseline
// while calls wait), R climbs 25% a window until 90% of the healthy rate
// before the incident, not 8% a window from what the slowdown left. On
// the script before, live, a fleet whose breaker had closed during a 5x
// slowdown climbed from ~100/s to the 450/s offered over 20 windows and
// refused thousands of payments as hopeless meanwhile.
func TestScriptFleetRateRegainsAfterSlowdown(t *testing.T) {
	s := newLimitScript(t, 1000)
	i := 0
	window := func(ok uint64, waiting, mean, fastest int64) float64 {
		t.Helper()
		now := int64(t0 + i*1_000_000 + 1)
		i++
		n := int64(ok)
		_, r := s.reportFastest(now, "p1", waiting, 0, ok, 0, mean*n, n, fastest)
		return r
	}
	var healthy float64
	for range 12 { // warm at 400 a window
		healthy = window(400, 0, 20_000, 15_000)
	}
	for range 10 { // the slowdown: a fifth served, a queue that stands
		window(80, 1000, 800_000, 600_000)
	}
	low := window(90, 1000, 20_000, 15_000) // the host is back
	r := low
	for range 4 {
		r = window(uint64(r), 1000, 20_000, 15_000) // served what R let go, calls waiting
	}
	t.Logf("healthy %.1f, after the slowdown %.1f, 4 clean windows later %.1f", healthy, low, r)
	if low >= 0.5*healthy {
		t.Fatalf("the slowdown left R at %.1f of a healthy %.1f: no incident to regain from", low, healthy)
	}
	if r < 1.9*low {
		t.Fatalf("4 clean windows after the slowdown R is %.1f, from %.1f: want at least 1.9x (25%% a window)", r, low)
	}
}

// TestScriptFleetRateFastestSample: a window whose mean latency reads as
// a queue cuts the rate only when its fastest sample shows the queue stood
// the whole window; a few slow samples (live: the clients' own delays on
// 1000 goroutines) raise the mean but not the fastest, and such a window
// counts as near the baseline. A fleet whose processes report no fastest
// (0) keeps the mean alone. The fleet is warmed to a 20 ms baseline at 400
// calls a window, then one window of 400 calls has a 150 ms mean (above
// both twice the baseline and 100 ms above it) and the fastest listed.
func TestScriptFleetRateFastestSample(t *testing.T) {
	for _, c := range []struct {
		name    string
		fastest int64 // µs, of the window with the 150 ms mean
		cut     bool
	}{
		{"no fastest reported: the mean alone", 0, true},
		{"fastest at the baseline: slow samples, no queue", 18_000, false},
		{"fastest 30 ms: within 1.5x the baseline, no standing queue", 30_000, false},
		{"fastest 130 ms: a queue stood the whole window", 130_000, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLimitScript(t, 1000)
			var r float64
			i := 0
			window := func(ok uint64, mean, fastest int64) float64 {
				t.Helper()
				now := int64(t0 + i*1_000_000 + 1)
				i++
				n := int64(ok)
				_, r := s.reportFastest(now, "p1", 0, 0, ok, 0, mean*n, n, fastest)
				return r
			}
			for range 12 { // cold, slow start, warm at 400 a window
				r = window(400, 20_000, 15_000)
			}
			before := window(400, 150_000, c.fastest) // the rate set by the last clean window
			after := window(400, 20_000, 15_000)      // set by the window above
			if r <= 0 || before <= 0 {
				t.Fatalf("no rate after warm-up: %.3f, %.3f", r, before)
			}
			if cut := after < before; cut != c.cut {
				t.Fatalf("rate %.3f before the window with a 150 ms mean, %.3f after: cut %v, want %v", before, after, cut, c.cut)
			}
		})
	}
}

// TestScriptFleetRateOutageBehindBreaker: an outage the fleet's breaker
// hides from the rate: a window with a few drops among its successes
// opens the breaker, which then holds the calls (no outcomes) until
// probes, a handful of calls, close it. A window that closes with the
// breaker open is an outage (no cut, no evidence of capacity), and the
// first clean window after it restarts R from at least the last healthy
// rate. On the script before, the drops' window cut R and took the host
// for full (the evidence of capacity became what that window served), no
// window counted as an outage, and R then stayed under 1.08x that
// evidence (live, a fleet restarted at 47/s after a 503 outage).
func TestScriptFleetRateOutageBehindBreaker(t *testing.T) {
	s := newLimitScript(t, 1000)
	breaker := func(open bool) {
		st := 0
		if open {
			st = 1
		}
		if err := s.rc.HSet(context.Background(), s.key, "st", st).Err(); err != nil {
			t.Fatal(err)
		}
	}
	type window struct {
		ok, bad uint64
		waiting int64
		open    bool // the breaker's state after the window's report
		want    float64
	}
	steps := []window{
		{ok: 300},            // cold
		{ok: 300},            // the first window with demand: no rate yet
		{ok: 300, want: 300}, // the second window's demand
		{ok: 300, want: 450}, // slow start
		// Demand met: 1/16 above the proven 300 (the last healthy rate);
		// then a few drops (1 in 11) open the breaker.
		{ok: 200, bad: 20, open: true, want: 318.75},
		{waiting: 300, open: true, want: 318.75}, // the drops' window closed with the breaker open: an outage, no cut
		{ok: 3, waiting: 300, want: 318.75},      // held: no outcomes; then the probes close the breaker
		{ok: 300, want: 318.75},                  // the probes' window: no evidence of capacity
		{ok: 300, want: 318.75},                  // clean, after the outage: at least the last healthy rate
	}
	for i, w := range steps {
		now := int64(t0 + i*1_000_000 + 1)
		n := int64(w.ok)
		_, r := s.report(now, "p1", w.waiting, w.ok, w.bad, 20_000*n, n)
		breaker(w.open)
		if math.Abs(r-w.want) > 0.002 {
			t.Fatalf("window %d: fleet rate %.3f, want %.3f", i, r, w.want)
		}
	}
}

// TestScriptFleetRateShares: each process's share is its smoothed
// demand (starts per second, at least a tenth of a call per window) up to
// a fair floor (R / 4n for n processes), plus the rest of R in
// proportion to the demands; shares sum to the fleet's rate, and follow
// a process that leaves (at once) or stops reporting (after 10 windows).
func TestScriptFleetRateShares(t *testing.T) {
	s := newLimitScript(t, 1000)
	// Cold windows: a reports 30 calls, b 10, c none; the first window
	// with demand sets no rate, the second's does.
	for w := int64(0); w < 2; w++ {
		s.report(t0+w*1_000_000+1, "a", 0, 30, 0, 0, 0)
		s.report(t0+w*1_000_000+2, "b", 0, 10, 0, 0, 0)
		s.report(t0+w*1_000_000+3, "c", 0, 0, 0, 0, 0)
	}
	ra, R := s.report(t0+2_000_001, "a", 0, 30, 0, 0, 0)
	rb, _ := s.report(t0+2_000_002, "b", 0, 10, 0, 0, 0)
	rc, _ := s.report(t0+2_000_003, "c", 0, 0, 0, 0, 0)
	t.Logf("R %.1f: shares a %.2f, b %.2f, c %.2f", R, ra, rb, rc)
	// Each its demand up to the fair floor R/(4·3), and the rest of R in
	// proportion to the demands (c's at least the floor demand, 0.1).
	q := R / 12
	share := func(d float64) float64 {
		return min(d, q) + (R-min(30, q)-min(10, q)-min(0.1, q))*d/40.1
	}
	if R != 40 || math.Abs(ra-share(30)) > 0.01 || math.Abs(rb-share(10)) > 0.01 || math.Abs(rc-share(0.1)) > 0.01 ||
		math.Abs(ra+rb+rc-R) > 0.01 {
		t.Fatalf("R %.2f, shares %.3f %.3f %.3f; want 40 and %.3f %.3f %.3f", R, ra, rb, rc, share(30), share(10), share(0.1))
	}
	s.report(t0+2_000_004, "a", -1, 0, 0, 0, 0) // a leaves
	if rb, R := s.report(t0+2_000_005, "b", 0, 0, 0, 0, 0); rb < 0.98*R {
		t.Fatalf("after a left: b's share %.2f of %.2f, want nearly all", rb, R)
	}
	// c stops reporting: forgotten after 10 windows.
	for w := int64(3); w <= 14; w++ {
		rb, R = s.report(t0+w*1_000_000+2, "b", 0, 10, 0, 0, 0)
	}
	if rb < 0.999*R {
		t.Fatalf("c silent for 11 windows: b's share %.3f of %.3f, want all", rb, R)
	}
}

// limitWorkers runs callers through retry policies on the guards of
// fleets (deadline 10 s): each attempt lasts a moment; it counts the
// attempts in flight across every fleet and the most seen.
type limitWorkers struct {
	inFlight, most atomic.Int64
	served         []atomic.Int64 // per fleet
	refused        atomic.Int64
	stop           chan struct{}
	wg             sync.WaitGroup
}

func startLimitWorkers(t *testing.T, fs []*Fleet, perFleet int) *limitWorkers {
	w := &limitWorkers{served: make([]atomic.Int64, len(fs)), stop: make(chan struct{})}
	for i, f := range fs {
		g, err := f.Guards("api")
		if err != nil || g.Limiter == nil {
			t.Fatalf("Guards: %+v, %v; want a limiter", g, err)
		}
		p := newPolicy(t, f, "api")
		for range perFleet {
			until(&w.wg, w.stop, func() { w.call(p, i) })
		}
	}
	return w
}

func (w *limitWorkers) call(p *retry.Policy, i int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := p.Do(ctx, func(context.Context, int) error {
		n := w.inFlight.Add(1)
		for m := w.most.Load(); n > m && !w.most.CompareAndSwap(m, n); m = w.most.Load() {
		}
		time.Sleep(200 * time.Microsecond)
		w.inFlight.Add(-1)
		return nil
	})
	if err != nil {
		w.refused.Add(1)
		return
	}
	w.served[i].Add(1)
}

func (w *limitWorkers) end() {
	close(w.stop)
	w.wg.Wait()
}

// each reports whether every fleet has served at least n calls.
func (w *limitWorkers) each(n int64) bool {
	for i := range w.served {
		if w.served[i].Load() < n {
			return false
		}
	}
	return true
}

// TestFleetLimitProcesses: eight processes (fleets on the real Redis,
// syncing every 20 ms), three callers each in a loop through retry
// policies, share a fleet-wide rate: once it is learned every limiter is
// gated at its share, every process is still served, few calls are
// refused (10 s deadlines), and the shares add up to about the fleet's
// rate. No timing is asserted: "served" waits as long as it needs
// (up to 30 s).
func TestFleetLimitProcesses(t *testing.T) {
	rc := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 20 * time.Millisecond, Timeout: time.Second,
		Limit: &limit.Config{Max: 4}}
	cleanup(t, rc, cfg.Name)
	fs := newFleets(t, rc, 8, cfg)
	w := startLimitWorkers(t, fs, 3)
	if !eventually(30*time.Second, func() bool { return w.each(50) }) {
		t.Errorf("a process is stuck: served %v", servedCounts(w))
	}
	// The fleet's rate is learned at the first window's end: from then on
	// every process is gated.
	gated := func() bool {
		for _, f := range fs {
			if f.hostFor("api").rate.Load() == 0 {
				return false
			}
		}
		return true
	}
	if !eventually(30*time.Second, gated) {
		t.Errorf("not every process gated")
	}

	before := servedCounts(w)
	if !eventually(30*time.Second, func() bool { return w.each(before[0] + 50) }) {
		t.Errorf("a gated process is stuck: served %v", servedCounts(w))
	}
	w.end()
	t.Logf("served %v, refused %d, most in flight %d", servedCounts(w), w.refused.Load(), w.most.Load())
	var served int64
	for _, n := range servedCounts(w) {
		served += n
	}
	// A call refused is one the gate found hopeless (its token after its
	// deadline): when the fleet's rate falls at once (the attempts'
	// latency here is this test process's own, noisy under -race), a
	// caller's turn may be far off for a moment.
	if r := w.refused.Load(); r > served/10 {
		t.Errorf("%d calls refused (10 s deadlines), %d served", r, served)
	}
	var sum, fleet float64
	for _, f := range fs {
		if n := f.modeChanges.Load(); n != 0 {
			t.Errorf("%d mode changes (%+v)", n, f.Stats())
		}
		if m := f.Mode(); m != ModeFleet {
			t.Errorf("mode %v, want fleet", m)
		}
		h := f.hostFor("api")
		r := math.Float64frombits(h.rate.Load())
		if r <= 0 {
			t.Errorf("process's share %v: its limiter is not gated", r)
		}
		sum += r
		fleet = max(fleet, float64(h.fleetRate.Load())/1000)
	}
	t.Logf("fleet rate %.0f/s, the processes' shares add up to %.0f/s", fleet, sum)
	if fleet <= 0 || sum > 1.5*fleet {
		t.Errorf("shares add up to %.0f/s, fleet rate %.0f/s", sum, fleet)
	}
}

func servedCounts(w *limitWorkers) []int64 {
	out := make([]int64, len(w.served))
	for i := range w.served {
		out[i] = w.served[i].Load()
	}
	return out
}

// TestFleetLimitRedisCut: three processes share a fleet rate through a
// proxy the test controls. Cut, each goes to local mode: its limiter's
// rate gate is lifted and its own limit (at most Limit.Max, never
// unlimited) decides, and callers are still served. Restored, each comes
// back to fleet mode and is gated at its share again.
func TestFleetLimitRedisCut(t *testing.T) {
	rc := redisClient(t)
	px := newProxy(t, redisAddr(t))
	cfg := Config{Name: uniqueName(t), SyncEvery: 20 * time.Millisecond, Timeout: 50 * time.Millisecond,
		Limit: &limit.Config{Max: 3}}
	cleanup(t, rc, cfg.Name)
	fs := newFleets(t, newClient(t, px.addr()), 3, cfg)
	w := startLimitWorkers(t, fs, 3)
	defer w.end()
	hosts := make([]*host, len(fs))
	for i, f := range fs {
		hosts[i] = f.hostFor("api")
	}
	all := func(cond func(*Fleet, *host) bool) bool {
		for i, f := range fs {
			if !cond(f, hosts[i]) {
				return false
			}
		}
		return true
	}
	served := func() (n int64) {
		for i := range w.served {
			n += w.served[i].Load()
		}
		return n
	}
	gated := func(h *host) bool { return h.rate.Load() != 0 }
	if !eventually(10*time.Second, func() bool { return w.each(20) && all(func(_ *Fleet, h *host) bool { return gated(h) }) }) {
		t.Fatalf("healthy: served %v, not every limiter gated", servedCounts(w))
	}

	px.set(cut, 0)
	if !eventually(5*time.Second, func() bool {
		return all(func(f *Fleet, h *host) bool { return f.Mode() == ModeLocal && !gated(h) })
	}) {
		t.Fatalf("cut: not every process is local and ungated")
	}
	before := served()
	if !eventually(10*time.Second, func() bool { return served() >= before+100 }) {
		t.Fatalf("cut: served %d calls in local mode, want 100", served()-before)
	}
	for i, h := range hosts {
		if l := h.lim.Limit(); l < 1 || l > 3 {
			t.Errorf("process %d in local mode: limit %d, want its own, 1 to Limit.Max 3", i, l)
		}
	}

	px.set(pass, 0)
	if !eventually(5*time.Second, func() bool {
		return all(func(f *Fleet, h *host) bool { return f.Mode() == ModeFleet && gated(h) })
	}) {
		t.Fatalf("restored: not every process is back in fleet mode with a share")
	}
	before = served()
	if !eventually(10*time.Second, func() bool { return served() >= before+100 && w.each(before/3) }) {
		t.Fatalf("restored: served %v", servedCounts(w))
	}
	t.Logf("served %v, refused %d", servedCounts(w), w.refused.Load())
}

// TestFleetLimitFallsAndRecovers: through retry policies on the fleet's
// guards, the fleet's rate grows by slow start while the callers use it,
// falls while the destination fails (the breakers' outcomes are the
// fleet's drops), and comes back, from the last healthy rate, once it is
// healthy.
func TestFleetLimitFallsAndRecovers(t *testing.T) {
	rc := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 20 * time.Millisecond, Timeout: time.Second,
		Limit: &limit.Config{Max: 64}, MinCalls: 1 << 30, Breaker: breaker.Config{MinCalls: 1 << 30}}
	cleanup(t, rc, cfg.Name)
	fs := newFleets(t, rc, 2, cfg)
	var failing atomic.Bool
	op := func(context.Context, int) error {
		time.Sleep(100 * time.Microsecond)
		if failing.Load() {
			return errDependency
		}
		return nil
	}
	for _, f := range fs {
		keepCalling(t, newPolicy(t, f, "api"), 16, 5*time.Second, op)
	}
	h := fs[0].hostFor("api")
	rate := func() float64 { return float64(h.fleetRate.Load()) / 1000 }
	var path []float64
	watch := func(d time.Duration, cond func(float64) bool) bool {
		return eventually(d, func() bool {
			r := rate()
			if len(path) == 0 || path[len(path)-1] != r {
				path = append(path, r)
			}
			return cond(r)
		})
	}
	if !watch(20*time.Second, func(r float64) bool { return r >= 1000 }) {
		t.Fatalf("healthy: fleet rate %.0f, want it to grow to 1000/s (path %v)", rate(), path)
	}
	peak := rate()
	failing.Store(true)
	if !watch(20*time.Second, func(r float64) bool { return r <= peak/8 }) {
		t.Fatalf("failing: fleet rate %.0f, want it down to 1/8 of %.0f (path %v)", rate(), peak, path)
	}
	failing.Store(false)
	// 45 s: on a loaded machine under -race the windows after the
	// failures are seldom clean (the latency samples include the
	// machine's own delays), and R regains by R+sqrt(R) a window: in one
	// CI run it went from 2,311 to 2,934 in 20 s (a quarter of the peak was
	// 4,631). The speed of the regain is measured live (bench), not here.
	if !watch(45*time.Second, func(r float64) bool { return r >= peak/4 }) {
		t.Fatalf("recovered: fleet rate %.0f, want it back to a quarter of %.0f (path %v)", rate(), peak, path)
	}
	t.Logf("fleet rate path: %v", path)
}

// TestSuccessPathAllocsWithLimit: with a fleet rate, a successful call
// through retry, the fleet's budget and breaker and the gated limiter
// (a token due) allocates nothing (the rate is set by the sync, not on the
// call's path).
func TestSuccessPathAllocsWithLimit(t *testing.T) {
	rc := redisClient(t)
	// No sync runs during the measurement but the one the new host starts.
	cfg := Config{Name: uniqueName(t), SyncEvery: time.Hour, Timeout: 5 * time.Second, Limit: &limit.Config{}}
	cleanup(t, rc, cfg.Name)
	f := newFleets(t, rc, 1, cfg)[0]
	p := policy(t, f, "api")
	h := f.hostFor("api")
	if !eventually(10*time.Second, func() bool { return f.syncs.Load() > 0 && !f.syncing.Load() }) {
		t.Fatalf("no sync of the new host")
	}
	h.setRate(1e6) // a share, as a sync sets it (the cold fleet has none yet)
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _ = p.Do(ctx, ok) }); n != 0 {
		t.Errorf("retry.Do success with a fleet rate: %v allocs per run, want 0", n)
	}
}

// TestLimitConfigErrors: a bad Config.Limit is an error of New that wraps
// ErrInvalidConfig and names the field; Limit is copied.
func TestLimitConfigErrors(t *testing.T) {
	for _, lc := range []limit.Config{{Max: -1}, {Timeout: -time.Second}, {Throttle: 0.5}} {
		_, _, err := Config{Name: "a", Limit: &lc}.resolve()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "Limit") || !strings.Contains(err.Error(), "Config.") {
			t.Errorf("Limit %+v: %v, want an invalid-config error naming the field", lc, err)
		}
	}
	lc := limit.Config{Max: 7}
	c, s, err := Config{Name: "a", Limit: &lc}.resolve()
	if err != nil || c.Limit == &lc || s.limitMax != 7 || s.limitInit != 7 {
		t.Fatalf("resolve: %v, copied %v, max %d, initial %d", err, c.Limit != &lc, s.limitMax, s.limitInit)
	}
}

// TestRegistryKeyIsNoHostKey: the registry of host "h" and the hash of a
// host named "h:r" are different keys (the registry was once the host's key
// + ":r", so the two hashes were one and each corrupted the other).
func TestRegistryKeyIsNoHostKey(t *testing.T) {
	rc := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 20 * time.Millisecond, Timeout: 5 * time.Second, Limit: &limit.Config{}}
	cleanup(t, rc, cfg.Name)
	f := newFleets(t, rc, 1, cfg)[0]
	for _, h := range []string{"h", "h:r"} {
		if _, err := f.Guards(h); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	prefix := keyPrefix + "{" + cfg.Name + "}"
	registered := func(key string) bool {
		raw, err := rc.HGetAll(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		for k := range raw {
			if strings.HasSuffix(k, ":g") {
				return true
			}
		}
		return false
	}
	if !eventually(10*time.Second, func() bool {
		// (the key + ":r": where the registries were, with the fault)
		return (registered(prefix+"/r:h") || registered(prefix+":h:r")) &&
			(registered(prefix+"/r:h:r") || registered(prefix+":h:r:r"))
	}) {
		t.Fatalf("no registry of hosts h and h:r at %s/r:*", prefix)
	}
	for _, h := range []string{"h", "h:r"} {
		if registered(prefix + ":" + h) {
			t.Errorf("host %q's hash holds a registry's fields", h)
		}
	}
}
