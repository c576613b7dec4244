package fleet

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
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

// TestScriptFleetLimitShares: ten processes always wanting more than a
// fleet limit of 6 (one or three attempts at a time, attempts lasting one
// or two sync intervals) share it: the attempts in flight of the whole
// fleet never exceed the limit, even counting those a process starts
// under its old grant while its sync is in flight, and every process is
// served, in turn (none is stuck behind the others).
func TestScriptFleetLimitShares(t *testing.T) {
	const n, rounds, lim = 10, 60, 6
	s := newLimitScript(t, lim)
	type proc struct {
		pid    string
		want   int   // attempts it would have in flight
		dur    int   // rounds an attempt lasts
		cap    int64 // its grant (0 before the first sync)
		ends   []int // the round each attempt in flight ends
		served int   // attempts ended
	}
	ps := make([]*proc, n)
	for i := range ps {
		ps[i] = &proc{pid: string(rune('a' + i)), want: 1 + 2*(i%2), dur: 1 + i%3/2}
	}
	total := func() (x int) {
		for _, p := range ps {
			x += len(p.ends)
		}
		return x
	}
	start := func(p *proc, r int, upTo int64) {
		for int64(len(p.ends)) < upTo && len(p.ends) < p.want {
			p.ends = append(p.ends, r+p.dur)
		}
	}
	used := 0
	for r := range rounds {
		for i, p := range ps {
			inFlight := int64(len(p.ends))
			// Between the collect and the reply, the old grant is in force.
			start(p, r, p.cap)
			if x := total(); x > lim {
				t.Fatalf("round %d, %s's round trip: %d in flight, fleet limit %d", r, p.pid, x, lim)
			}
			g, l := s.report(int64(t0+r*1_000_000+i+1), p.pid, inFlight, int64(p.want), 0, 0)
			if l != lim {
				t.Fatalf("round %d: fleet limit %d, want %d", r, l, lim)
			}
			p.cap = g
			start(p, r, g)
			if x := total(); x > lim {
				t.Fatalf("round %d, after %s's grant of %d: %d in flight, fleet limit %d", r, p.pid, g, x, lim)
			}
		}
		used += total()
		for _, p := range ps {
			kept := p.ends[:0]
			for _, e := range p.ends {
				if e <= r+1 {
					p.served++
				} else {
					kept = append(kept, e)
				}
			}
			p.ends = kept
		}
	}
	for _, p := range ps {
		t.Logf("process %s (wants %d, attempts of %d rounds): %d attempts served", p.pid, p.want, p.dur, p.served)
		if p.served < 3 {
			t.Errorf("process %s served %d attempts in %d rounds: stuck behind the others", p.pid, p.served, rounds)
		}
	}
	t.Logf("slot-rounds used: %d of %d (%.0f%%)", used, rounds*lim, 100*float64(used)/float64(rounds*lim))
	if used < rounds*lim/3 {
		t.Errorf("the fleet used %d of %d slot-rounds", used, rounds*lim)
	}
}

// TestScriptFleetLimitForgets: the slots of a process that stops
// reporting go back to the fleet after 10 windows; one that leaves gives
// them back at once.
func TestScriptFleetLimitForgets(t *testing.T) {
	s := newLimitScript(t, 8)
	if g, _ := s.report(t0+1, "gone", 8, 8, 0, 0); g != 8 {
		t.Fatalf("a lone process's grant: %d, want 8", g)
	}
	for w := int64(1); w <= 12; w++ {
		g, _ := s.report(t0+w*1_000_000+1, "b", 0, 8, 0, 0)
		switch {
		case w <= 10 && g != 0:
			t.Fatalf("window %d: grant %d while the silent process is remembered holding all 8", w, g)
		case w > 11 && g != 8:
			t.Fatalf("window %d: grant %d after the silent process was forgotten, want 8", w, g)
		}
	}
	s2 := newLimitScript(t, 8)
	s2.report(t0+1, "a", 5, 8, 0, 0)
	s2.report(t0+2, "a", 0, -1, 0, 0) // leaves (Close)
	if g, _ := s2.report(t0+3, "b", 0, 8, 0, 0); g != 8 {
		t.Fatalf("grant %d after the other process left, want 8", g)
	}
}

// limitWorkers runs callers on the limiters of fleets: each takes a slot
// (deadline 10 s), holds it a moment and gives it back, counting the
// attempts in flight across every fleet (the fleet's sum) and the most
// seen.
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
		for range perFleet {
			until(&w.wg, w.stop, func() { w.call(g.Limiter, i) })
		}
	}
	return w
}

func (w *limitWorkers) call(l *limit.Limiter, i int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := l.Acquire(ctx)
	if err != nil {
		w.refused.Add(1)
		return
	}
	n := w.inFlight.Add(1)
	for m := w.most.Load(); n > m && !w.most.CompareAndSwap(m, n); m = w.most.Load() {
	}
	time.Sleep(200 * time.Microsecond)
	w.inFlight.Add(-1)
	l.Release(p, false)
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
// syncing every 20 ms), three callers each, one call in flight per caller,
// share a fleet limit of 4: the attempts in flight of all of them never
// exceed 4, and every process is served, in turn; closed, they give
// their slots back. No timing is asserted: the bound holds by
// construction (see the package documentation), and "served" waits as
// long as it needs (up to 30 s).
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
	w.end()
	t.Logf("served %v, refused %d, most in flight %d", servedCounts(w), w.refused.Load(), w.most.Load())
	if m := w.most.Load(); m > 4 {
		t.Errorf("%d attempts in flight across the fleet, fleet limit 4", m)
	}
	if w.refused.Load() != 0 {
		t.Errorf("%d calls refused (10 s deadlines)", w.refused.Load())
	}
	for _, f := range fs {
		if n := f.modeChanges.Load(); n != 0 {
			t.Errorf("%d mode changes (%+v)", n, f.Stats())
		}
		if m := f.Mode(); m != ModeFleet {
			t.Errorf("mode %v, want fleet", m)
		}
		if l := f.hostFor("api").fleetLimit.Load(); l != 4 {
			t.Errorf("fleet limit %d, want 4", l)
		}
	}
}

func servedCounts(w *limitWorkers) []int64 {
	out := make([]int64, len(w.served))
	for i := range w.served {
		out[i] = w.served[i].Load()
	}
	return out
}

// TestFleetLimitRedisCut: three processes share a fleet limit of 3
// through a proxy the test controls. Cut, each goes to local mode: its
// limiter's cap is lifted and its own limit (at most Limit.Max, never
// unlimited) decides, and callers are still served. Restored, each comes
// back to fleet mode and the fleet's bound holds again.
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
	if !eventually(10*time.Second, func() bool { return w.each(20) }) {
		t.Fatalf("healthy: served %v", servedCounts(w))
	}
	if m := w.most.Load(); m > 3 {
		t.Fatalf("healthy: %d in flight, fleet limit 3", m)
	}

	px.set(cut, 0)
	if !eventually(5*time.Second, func() bool {
		return all(func(f *Fleet, h *host) bool { return f.Mode() == ModeLocal && h.capped.Load() < 0 })
	}) {
		t.Fatalf("cut: not every process is local and uncapped")
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
		return all(func(f *Fleet, h *host) bool { return f.Mode() == ModeFleet && h.capped.Load() >= 0 })
	}) {
		t.Fatalf("restored: not every process is back in fleet mode with a share")
	}
	// From one sync of every process after the last one came back, every
	// attempt in flight is one the fleet counts.
	marks := make([]int64, len(fs))
	for i, f := range fs {
		marks[i] = f.syncs.Load()
	}
	if !eventually(5*time.Second, func() bool {
		return all(func(f *Fleet, _ *host) bool { return f.syncs.Load() > marks[slicesIndex(fs, f)] })
	}) {
		t.Fatal("restored: no sync")
	}
	w.most.Store(0)
	before = served()
	if !eventually(10*time.Second, func() bool { return served() >= before+100 && w.each(before/3) }) {
		t.Fatalf("restored: served %v", servedCounts(w))
	}
	t.Logf("served %v, refused %d, most in flight after the restore %d", servedCounts(w), w.refused.Load(), w.most.Load())
	if m := w.most.Load(); m > 3 {
		t.Errorf("restored: %d in flight, fleet limit 3", m)
	}
}

func slicesIndex(fs []*Fleet, f *Fleet) int {
	for i := range fs {
		if fs[i] == f {
			return i
		}
	}
	return -1
}

// TestFleetLimitFallsAndRecovers: through retry policies on the fleet's
// guards, the fleet's limit grows by slow start while the callers use it,
// falls to 1 or 2 while the destination fails (the breakers' outcomes are
// the fleet's drops), and comes back by slow start once it is healthy.
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
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, f := range fs {
		p := newPolicy(t, f, "api")
		for range 16 {
			until(&wg, stop, func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = p.Do(ctx, op)
				cancel()
			})
		}
	}
	defer func() { close(stop); wg.Wait() }()
	h := fs[0].hostFor("api")
	lim := func() int64 { return h.fleetLimit.Load() }
	var path []int64
	watch := func(cond func(int64) bool) bool {
		return eventually(20*time.Second, func() bool {
			l := lim()
			if len(path) == 0 || path[len(path)-1] != l {
				path = append(path, l)
			}
			return cond(l)
		})
	}
	if !watch(func(l int64) bool { return l >= 32 }) {
		t.Fatalf("healthy: fleet limit %d, want it to grow to 32 (path %v)", lim(), path)
	}
	failing.Store(true)
	if !watch(func(l int64) bool { return l <= 2 }) {
		t.Fatalf("failing: fleet limit %d, want it down to 2 or less (path %v)", lim(), path)
	}
	failing.Store(false)
	if !watch(func(l int64) bool { return l >= 16 }) {
		t.Fatalf("recovered: fleet limit %d, want it back to 16 (path %v)", lim(), path)
	}
	t.Logf("fleet limit path: %v", path)
}

// TestSuccessPathAllocsWithLimit: with a fleet limit, a successful call
// through retry, the fleet's budget and breaker and the capped limiter
// allocates nothing (the cap is set by the sync, not on the call's path).
func TestSuccessPathAllocsWithLimit(t *testing.T) {
	rc := redisClient(t)
	// No sync runs during the measurement but the one the new host starts.
	cfg := Config{Name: uniqueName(t), SyncEvery: time.Hour, Timeout: 5 * time.Second, Limit: &limit.Config{}}
	cleanup(t, rc, cfg.Name)
	f := newFleets(t, rc, 1, cfg)[0]
	p := policy(t, f, "api")
	h := f.hostFor("api")
	if !eventually(10*time.Second, func() bool { return h.capped.Load() > 0 && !f.syncing.Load() }) {
		t.Fatalf("no share after the new host's sync: cap %d", h.capped.Load())
	}
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() { _ = p.Do(ctx, ok) }); n != 0 {
		t.Errorf("retry.Do success with a fleet limit: %v allocs per run, want 0", n)
	}
	if l := h.lim.Limit(); l < 1 || int64(l) > h.capped.Load() {
		t.Errorf("limit %d with a cap of %d", l, h.capped.Load())
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
