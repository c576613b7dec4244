// Black-box attack on the breaker's core rules (AREA=brkcore): each test
// names the documented sentence it checks.

package breaker_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// zcClock is a fake clock for Config.Now.
type zcClock struct {
	base time.Time
	ns   atomic.Int64
}

func newZC() *zcClock { return &zcClock{base: time.Unix(1_000_000, 0)} }

func (c *zcClock) Now() time.Time          { return c.base.Add(time.Duration(c.ns.Load())) }
func (c *zcClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }
func zcHalf() float64                      { return 0.5 }
func zcNew(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

// doc.go: "if the window holds at least MinCalls calls and failures >=
// FailureRatio·calls ... the breaker trips to Open"; Config.FailureRatio:
// "the fraction of failed calls, in (0, 1], at or above which the breaker
// trips". Ratios whose product with the call count is an integer exactly
// (7 of 25 is 28%, 55 of 100 is 55%) must trip.
func TestAttack11RatioExactProducts(t *testing.T) {
	for _, tc := range []struct {
		ratio           float64
		calls, failures int
	}{
		{0.28, 25, 7}, {0.56, 25, 14}, {0.14, 50, 7}, {0.55, 100, 55}, {0.07, 100, 7}, {0.68, 75, 51},
	} {
		clk := newZC()
		b := zcNew(t, breaker.Config{FailureRatio: tc.ratio, MinCalls: tc.calls, Now: clk.Now, Rand: zcHalf})
		for range tc.calls - tc.failures {
			p, err := b.Allow()
			if err != nil {
				t.Fatal(err)
			}
			b.Done(p, true)
		}
		tripped := -1
		for i := range tc.failures {
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("ratio %v: rejected at failure %d", tc.ratio, i)
			}
			b.Done(p, false)
			if b.State() == breaker.Open {
				tripped = i + 1
				break
			}
		}
		if tripped != tc.failures {
			s := b.Snapshot()
			t.Errorf("FailureRatio %v, MinCalls %d: %d failures of %d calls (exactly %v) did not trip (state %v, window %d calls %d failures)",
				tc.ratio, tc.calls, tc.failures, tc.calls, tc.ratio, s.State, s.Calls, s.Failures)
		}
	}
}

// Config.MaxOpenFor: "each consecutive failed probe doubles the open
// period, up to MaxOpenFor"; Config.Rand: "A Rand pinned at 0.5 makes every
// open period exactly OpenFor" (no jitter). OpenFor 1 s doubled once is 2 s,
// below a MaxOpenFor of 2 s + 1 ns.
func TestAttack11MaxOpenForDoublesExactly(t *testing.T) {
	clk := newZC()
	b := zcNew(t, breaker.Config{OpenFor: time.Second, MaxOpenFor: 2*time.Second + 1, Probes: 1, Now: clk.Now, Rand: zcHalf})
	b.Trip(0)
	_, err := b.Allow()
	var oe *breaker.OpenError
	if !errors.As(err, &oe) || oe.Wait != time.Second {
		t.Fatalf("after the trip: %v, want open for 1s", err)
	}
	want := []time.Duration{2 * time.Second, 2*time.Second + 1, 2*time.Second + 1}
	for i, w := range want {
		clk.Advance(oe.Wait)
		p, err := b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("round %d: %v", i, err)
		}
		b.Done(p, false)
		_, err = b.Allow()
		if !errors.As(err, &oe) {
			t.Fatalf("round %d: %v", i, err)
		}
		if oe.Wait != w {
			t.Errorf("failed probe %d: open for %v, want %v (OpenFor 1s doubled %d time(s), up to MaxOpenFor 2.000000001s)", i+1, oe.Wait, w, i+1)
		}
	}
}

// Config.Rand: "A Rand pinned at 0.5 makes every open period exactly
// OpenFor (to the nanosecond below 2^53 ns, about 104 days; within one
// above)." An OpenFor of 2^53+1 ns (an attack found the doc's "exactly"
// off by that nanosecond).
func TestAttack11RandHalfExactLongOpenFor(t *testing.T) {
	clk := newZC()
	openFor := time.Duration(1<<53 + 1)
	b := zcNew(t, breaker.Config{OpenFor: openFor, Now: clk.Now, Rand: zcHalf})
	b.Trip(0)
	_, err := b.Allow()
	var oe *breaker.OpenError
	if !errors.As(err, &oe) {
		t.Fatal(err)
	}
	if d := oe.Wait - openFor; d < -1 || d > 1 {
		t.Errorf("open period %d ns, want OpenFor %d ns within a nanosecond (the documented rounding above 2^53 ns)", oe.Wait, openFor)
	}
}

// doc.go: "Waiting calls get the next round's probes first, those with the
// most time left first"; Wait: "If the breaker reopens first, the call
// keeps waiting" (and gets a later round's probe). A round hands a probe
// to the waiting call; the round fails on another probe before the
// waiting call's goroutine has run, and the next round starts (fake
// clock) still before it ran. Does the waiting call get a probe of the
// next round?
func TestAttack11StaleGrantSkippedNextRound(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	synctest.Test(t, func(t *testing.T) {
		clk := newZC()
		b := zcNew(t, breaker.Config{Probes: 2, OpenFor: time.Second, Now: clk.Now, Rand: zcHalf})
		b.Trip(0)
		type res struct {
			p   breaker.Permit
			err error
		}
		done := make(chan res, 1)
		go func() {
			p, err := b.Wait(context.Background(), time.Hour)
			done <- res{p, err}
		}()
		synctest.Wait() // the call waits
		if n := b.Snapshot().Waiters; n != 1 {
			t.Fatalf("%d waiters, want 1", n)
		}
		// Round 1: the waiting call is handed one probe, this goroutine
		// takes the other and it fails; nothing here blocks, so the
		// waiting goroutine has not run (GOMAXPROCS 1).
		clk.Advance(time.Second)
		p, err := b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("round 1: %v", err)
		}
		b.Done(p, false)
		// Round 2.
		clk.Advance(time.Second)
		if s := b.State(); s != breaker.HalfOpen {
			t.Fatalf("round 2: state %v", s)
		}
		synctest.Wait() // the waiting call runs
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("Wait: %v", r.err)
			}
			b.Done(r.p, true)
			return // it got round 2's probe: as documented
		default:
		}
		// The waiting call still waits in a half-open round with free
		// probes. With no other traffic, it waits to its deadline.
		time.Sleep(time.Hour)
		synctest.Wait()
		var waitErr error
		select {
		case r := <-done:
			waitErr = r.err
		default:
		}
		// The round's probes were free all along: a new call takes them.
		var got []breaker.Permit
		for range 2 {
			if p, err := b.Allow(); err == nil && p.Probe() {
				got = append(got, p)
			}
		}
		t.Errorf("a call waiting since before round 1 got no probe of round 2 (half-open, probes free): after its 1h maxWait Wait returned %v; then %d new Allow call(s) were admitted as probes of that round",
			waitErr, len(got))
		for _, p := range got {
			b.Cancel(p)
		}
		if waitErr != nil {
			return
		}
		b.Reset()
		synctest.Wait()
		r := <-done
		b.Done(r.p, true)
	})
}

// zcModel is the documented core of the breaker (doc.go, Config, Done,
// Fail, Cancel, Trip, Reset, Snapshot) for one goroutine, with no waiting
// calls, a fake clock and Rand pinned at 0.5 (no jitter, spread of a hint
// h is h + h/4).
type zcModel struct {
	cfg       breaker.Config
	bucket    time.Duration
	state     breaker.State
	gen       int
	counts    map[int64][2]int // bucket number -> successes, failures (closed generation only)
	streak    int
	openUntil time.Duration
	reopens   int
	admitted  int
	succeeded int
}

type zcPermit struct {
	real   breaker.Permit
	gen    int
	probe  bool
	issued time.Duration
}

func (m *zcModel) interval() time.Duration {
	d := m.cfg.OpenFor
	if m.cfg.MaxOpenFor > 0 {
		for range m.reopens {
			d *= 2
			if d >= m.cfg.MaxOpenFor {
				d = m.cfg.MaxOpenFor
				break
			}
		}
	}
	return d
}

func zcSpread(h time.Duration) time.Duration { return h + time.Duration(0.5*float64(h/2)) }

func (m *zcModel) set(s breaker.State) {
	m.state = s
	m.gen++
	m.streak = 0
	if s == breaker.Closed {
		m.counts = map[int64][2]int{}
	}
}

func (m *zcModel) open(now, hint time.Duration) {
	d := m.interval()
	if hint > 0 {
		d = max(d, zcSpread(hint))
	}
	m.openUntil = now + d
	m.set(breaker.Open)
}

func (m *zcModel) close() {
	m.reopens = 0
	m.set(breaker.Closed)
}

func (m *zcModel) window(now time.Duration) (calls, fails int) {
	cur := int64(now / m.bucket)
	for e := cur - int64(m.cfg.Buckets) + 1; e <= cur; e++ {
		c := m.counts[e]
		calls += c[0] + c[1]
		fails += c[1]
	}
	return
}

func (m *zcModel) trips(calls, fails int) bool {
	return calls >= m.cfg.MinCalls && float64(fails) >= m.cfg.FailureRatio*float64(calls)
}

// halfOpenIfDue is State's Open-to-HalfOpen move.
func (m *zcModel) halfOpenIfDue(now time.Duration) {
	if m.state == breaker.Open && now >= m.openUntil {
		m.admitted, m.succeeded = 0, 0
		m.set(breaker.HalfOpen)
	}
}

// allow returns the expected outcome: admitted (probe or not), or the
// rejection's state and wait.
func (m *zcModel) allow(now time.Duration) (ok, probe bool, rs breaker.State, wait time.Duration) {
	m.halfOpenIfDue(now)
	switch m.state {
	case breaker.Closed:
		return true, false, 0, 0
	case breaker.Open:
		return false, false, breaker.Open, m.openUntil - now
	}
	if m.admitted < m.cfg.Probes {
		m.admitted++
		return true, true, 0, 0
	}
	return false, false, breaker.HalfOpen, 0
}

func (m *zcModel) done(p *zcPermit, now time.Duration, success bool, hint time.Duration) {
	if p.gen != m.gen {
		return
	}
	if success && m.cfg.SlowCall > 0 && now-p.issued >= m.cfg.SlowCall {
		success = false
	}
	if !p.probe {
		e := int64(now / m.bucket)
		c := m.counts[e]
		if success {
			c[0]++
			m.counts[e] = c
			m.streak = 0
			return
		}
		c[1]++
		m.counts[e] = c
		m.streak++
		wc, wf := m.window(now)
		if (m.cfg.ConsecutiveFailures > 0 && m.streak >= m.cfg.ConsecutiveFailures) || m.trips(wc, wf) || m.trips(c[0]+c[1], c[1]) {
			m.reopens = 0
			m.open(now, hint)
		}
		return
	}
	if m.state != breaker.HalfOpen {
		return
	}
	if success {
		m.succeeded++
		if m.succeeded >= m.cfg.Probes {
			m.close()
		}
		return
	}
	m.reopens++
	m.open(now, hint)
}

// TestAttack11Model runs random single-goroutine sequences of Allow,
// Done, Fail, Cancel, State, Snapshot, Trip, Reset and clock steps against
// the model of the documented rules, for several configurations.
func TestAttack11Model(t *testing.T) {
	configs := []breaker.Config{
		{Window: 400 * time.Millisecond, Buckets: 4, MinCalls: 4, Probes: 2, OpenFor: 100 * time.Millisecond},
		{Window: 400 * time.Millisecond, Buckets: 4, MinCalls: 6, FailureRatio: 0.25, Probes: 3, OpenFor: 100 * time.Millisecond, MaxOpenFor: 800 * time.Millisecond},
		{Window: 300 * time.Millisecond, Buckets: 3, MinCalls: 3, FailureRatio: 1, Probes: 1, OpenFor: 50 * time.Millisecond, MaxOpenFor: 300 * time.Millisecond, ConsecutiveFailures: 3},
		{Window: 100 * time.Millisecond, Buckets: 1, MinCalls: 5, FailureRatio: 0.75, Probes: 2, OpenFor: 70 * time.Millisecond, SlowCall: 30 * time.Millisecond, ConsecutiveFailures: 4},
		{Window: 1000 * time.Millisecond, Buckets: 10, MinCalls: 8, Probes: 3, OpenFor: 100 * time.Millisecond, MaxOpenFor: 250 * time.Millisecond, SlowCall: 40 * time.Millisecond},
	}
	for ci, cfg := range configs {
		for seed := uint64(1); seed <= 40; seed++ {
			if !zcRunModel(t, ci, seed, cfg) {
				break
			}
		}
	}
}

func zcRunModel(t *testing.T, ci int, seed uint64, cfg breaker.Config) bool {
	t.Helper()
	clk := newZC()
	var changes []string
	cfg.Now, cfg.Rand = clk.Now, zcHalf
	cfg.OnStateChange = func(from, to breaker.State) { changes = append(changes, from.String()+">"+to.String()) }
	b := zcNew(t, cfg)
	full := b.Config()
	m := &zcModel{cfg: full, bucket: full.Window / time.Duration(full.Buckets), counts: map[int64][2]int{}, gen: 1}
	rng := uint64(seed*0x9E3779B97F4A7C15 + uint64(ci))
	next := func(n int) int {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		return int(rng % uint64(n))
	}
	var out []*zcPermit
	var log []string
	fail := func(format string, args ...any) bool {
		t.Helper()
		start := max(0, len(log)-12)
		t.Errorf("config %d seed %d step %d: "+format+"\nlast ops: %v", append([]any{ci, seed, len(log)}, append(args, log[start:])...)...)
		return false
	}
	nchanges := 0
	for step := 0; step < 400; step++ {
		now := time.Duration(clk.ns.Load())
		switch op := next(100); {
		case op < 30:
			p, err := b.Allow()
			ok, probe, rs, wait := m.allow(now)
			log = append(log, "allow")
			if (err == nil) != ok {
				return fail("Allow: err %v, model admits %v (state %v)", err, ok, m.state)
			}
			if err != nil {
				var oe *breaker.OpenError
				if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) || oe.State != rs || oe.Wait != wait || oe.RetryAfter() != wait {
					return fail("Allow: %#v, want state %v wait %v", err, rs, wait)
				}
				continue
			}
			if p.Probe() != probe {
				return fail("Allow: probe %v, model %v", p.Probe(), probe)
			}
			out = append(out, &zcPermit{real: p, gen: m.gen, probe: probe, issued: now})
		case op < 60 && len(out) > 0:
			i := next(len(out))
			p := out[i]
			out = append(out[:i], out[i+1:]...)
			switch k := next(10); {
			case k < 5:
				log = append(log, "done ok")
				b.Done(p.real, true)
				m.done(p, now, true, 0)
			case k < 8:
				log = append(log, "done fail")
				b.Done(p.real, false)
				m.done(p, now, false, 0)
			case k < 9:
				h := time.Duration(next(300)) * time.Millisecond
				log = append(log, "fail "+h.String())
				b.Fail(p.real, h)
				m.done(p, now, false, h)
			default:
				log = append(log, "cancel")
				b.Cancel(p.real)
				if p.probe && p.gen == m.gen && m.state == breaker.HalfOpen && m.admitted > m.succeeded {
					m.admitted--
				}
			}
		case op < 80:
			d := time.Duration(next(60)) * time.Millisecond
			if next(8) == 0 && m.state == breaker.Open && m.openUntil > now {
				d = m.openUntil - now - time.Duration(next(2))
			}
			log = append(log, "+"+d.String())
			clk.Advance(d)
		case op < 86:
			log = append(log, "state")
			m.halfOpenIfDue(now)
			if s := b.State(); s != m.state {
				return fail("State %v, model %v", s, m.state)
			}
		case op < 94:
			log = append(log, "snapshot")
			s := b.Snapshot()
			m.halfOpenIfDue(now)
			var want breaker.Snapshot
			want.State = m.state
			switch m.state {
			case breaker.Closed:
				want.Calls, want.Failures = m.window(now)
			case breaker.Open:
				want.HalfOpenIn = m.openUntil - now
			}
			if s != want {
				return fail("Snapshot %+v, model %+v", s, want)
			}
		case op < 97:
			h := time.Duration(0)
			if next(2) == 0 {
				h = time.Duration(next(400)) * time.Millisecond
			}
			log = append(log, "trip "+h.String())
			b.Trip(h)
			switch m.state {
			case breaker.Closed:
				m.reopens = 0
				m.open(now, h)
			case breaker.HalfOpen:
				m.reopens++
				m.open(now, h)
			case breaker.Open:
				if h > 0 {
					m.openUntil = max(m.openUntil, now+zcSpread(h))
				}
			}
		default:
			log = append(log, "reset")
			b.Reset()
			if m.state != breaker.Closed {
				m.close()
			}
		}
		if len(changes) != m.gen-1 {
			return fail("%d OnStateChange calls, model %d state changes (%v)", len(changes), m.gen-1, changes[nchanges:])
		}
		nchanges = len(changes)
	}
	if seed == 1 {
		t.Logf("config %d seed 1: %d state changes in 400 steps", ci, len(changes))
	}
	return true
}

type zcRes struct {
	id  int
	p   breaker.Permit
	err error
}

// doc.go: "Waiting calls get the next round's probes first, those with the
// most time left first"; grant order of equal deadlines: the first to come
// (probe.go's doc of grantProbesLocked is internal; the public one is
// "the calls with the most time left first"). Waiters with 2 s, 9 s, 5 s,
// 9 s, 9 s left (in that order of arrival), Probes 2: the first two 9 s
// ones get the probes, then on a cancel the third 9 s one, then the 5 s.
func TestAttack11ProbeOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var changes atomic.Int32
		b := zcNew(t, breaker.Config{Probes: 2, OpenFor: time.Second, Rand: zcHalf,
			OnStateChange: func(from, to breaker.State) { changes.Add(1) }})
		b.Trip(0)
		waits := []time.Duration{2 * time.Second, 9 * time.Second, 5 * time.Second, 9 * time.Second, 9 * time.Second}
		res := make(chan zcRes, len(waits))
		for i, w := range waits {
			go func() {
				p, err := b.Wait(context.Background(), w)
				res <- zcRes{i, p, err}
			}()
			synctest.Wait()
		}
		if n := b.Snapshot().Waiters; n != len(waits) {
			t.Fatalf("%d waiters, want %d", n, len(waits))
		}
		// A new call meets the half-open round with the probes taken.
		time.Sleep(time.Second)
		synctest.Wait()
		var got []zcRes
		for range 2 {
			select {
			case r := <-res:
				got = append(got, r)
			default:
			}
		}
		if len(got) != 2 || !(got[0].id == 1 && got[1].id == 3 || got[0].id == 3 && got[1].id == 1) {
			t.Fatalf("round 1's probes went to %v, want waiters 1 and 3 (9 s left, first to come)", got)
		}
		for _, r := range got {
			if r.err != nil || !r.p.Probe() {
				t.Fatalf("waiter %d: %v probe %v", r.id, r.err, r.p.Probe())
			}
		}
		_, err := b.Allow()
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.State != breaker.HalfOpen || oe.Wait != 0 || oe.RetryAfter() != 0 {
			t.Fatalf("Allow in a full round: %v", err)
		}
		b.Cancel(got[0].p)
		synctest.Wait()
		r := <-res
		if r.id != 4 || !r.p.Probe() {
			t.Fatalf("the canceled probe went to waiter %d (probe %v), want 4", r.id, r.p.Probe())
		}
		b.Cancel(r.p)
		synctest.Wait()
		r = <-res
		if r.id != 2 || !r.p.Probe() {
			t.Fatalf("the next canceled probe went to waiter %d, want 2", r.id)
		}
		// Both probes succeed: closed; waiter 0 is released.
		b.Done(got[1].p, true)
		b.Done(r.p, true)
		if s := b.State(); s != breaker.Closed {
			t.Fatalf("state %v after Probes successes", s)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		r = <-res
		if r.id != 0 || r.err != nil || r.p.Probe() {
			t.Fatalf("last waiter: %+v", r)
		}
		b.Done(r.p, true)
		if n := changes.Load(); n != 3 {
			t.Errorf("%d OnStateChange calls, want 3 (open, half-open, closed)", n)
		}
	})
}

// Config.MaxWaiters: "0 means 10,000"; "beyond it a call is rejected at
// once". doc.go: "a waiting call holds no lock and starts no goroutine".
func TestAttack11DefaultMaxWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := zcNew(t, breaker.Config{OpenFor: time.Second, Rand: zcHalf})
		b.Trip(0)
		ctx, cancel := context.WithCancel(context.Background())
		before := runtime.NumGoroutine()
		errs := make(chan error, 10_000)
		for range 10_000 {
			go func() {
				_, err := b.Wait(ctx, 10*time.Second)
				errs <- err
			}()
		}
		synctest.Wait()
		if n := b.Snapshot().Waiters; n != 10_000 {
			t.Fatalf("%d waiters, want 10,000", n)
		}
		if n := runtime.NumGoroutine() - before; n > 10_000 {
			t.Errorf("10,000 waiting calls run %d goroutines, want at most 10,000 (their own)", n)
		}
		start := time.Now()
		_, err := b.Wait(ctx, 10*time.Second)
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.State != breaker.Open || time.Since(start) != 0 || oe.Wait != time.Second {
			t.Errorf("the 10,001st: %v after %v, want an open rejection at once", err, time.Since(start))
		}
		cancel()
		for range 10_000 {
			if err := <-errs; !errors.As(err, &oe) || oe.State != breaker.Open || oe.Wait != time.Second {
				t.Fatalf("canceled waiter: %v", err)
			}
		}
		if n := b.Snapshot().Waiters; n != 0 {
			t.Errorf("%d waiters after all left", n)
		}
	})
}

// Wait: "the [*OpenError] of the rejection when ... ctx ends or maxWait
// passes before the call is admitted"; "If the breaker reopens first, the
// call keeps waiting." A context with a deadline before maxWait; a reopen.
func TestAttack11WaitThroughReopen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := zcNew(t, breaker.Config{Probes: 1, OpenFor: time.Second, MaxOpenFor: 4 * time.Second, Rand: zcHalf})
		b.Trip(0)
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		res := make(chan zcRes, 2)
		go func() { // the context ends first, at 2.5 s
			p, err := b.Wait(ctx, 20*time.Second)
			res <- zcRes{0, p, err}
		}()
		synctest.Wait()
		go func() { // 30 s left: the probe of each round
			p, err := b.Wait(context.Background(), 30*time.Second)
			res <- zcRes{1, p, err}
		}()
		synctest.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		r := <-res
		if r.id != 1 || !r.p.Probe() {
			t.Fatalf("round 1's probe: %+v", r)
		}
		b.Done(r.p, false) // reopens, for 2 s (doubled)
		go func() {
			p, err := b.Wait(context.Background(), 30*time.Second)
			res <- zcRes{1, p, err}
		}()
		synctest.Wait()
		time.Sleep(1500 * time.Millisecond) // 2.5 s: the context ends
		synctest.Wait()
		r = <-res
		var oe *breaker.OpenError
		if r.id != 0 || !errors.As(r.err, &oe) || oe.State != breaker.Open || oe.Wait != 500*time.Millisecond {
			t.Fatalf("the call whose context ended: %+v (%v), want an open rejection with 0.5s left", r, r.err)
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		r = <-res
		if r.id != 1 || !r.p.Probe() || r.err != nil {
			t.Fatalf("round 2's probe: %+v", r)
		}
		b.Done(r.p, true)
		if b.State() != breaker.Closed {
			t.Fatalf("not closed after the probe")
		}
	})
}

// doc.go: "In the closed state, Allow, Wait and Done take no lock and
// allocate nothing"; Execute: "While the breaker is closed, Execute itself
// takes no lock and allocates nothing"; Done: "It takes no lock and
// allocates nothing unless it trips the breaker". With ConsecutiveFailures
// and SlowCall set too.
func TestAttack11ClosedAllocs(t *testing.T) {
	ctx := context.Background()
	errX := errors.New("x")
	fnOK := func() error { return nil }
	fnErr := func() error { return errX }
	for _, c := range []breaker.Config{{MinCalls: 1 << 30}, {ConsecutiveFailures: 1 << 30, SlowCall: time.Hour, MinCalls: 1 << 30}} {
		b := zcNew(t, c)
		for name, f := range map[string]func(){
			"Allow+Done":    func() { p, _ := b.Allow(); b.Done(p, true) },
			"Allow+Fail":    func() { p, _ := b.Allow(); b.Fail(p, time.Second) },
			"Wait+Done":     func() { p, _ := b.Wait(ctx, time.Second); b.Done(p, false) },
			"Allow+Cancel":  func() { p, _ := b.Allow(); b.Cancel(p) },
			"Execute ok":    func() { _ = b.Execute(fnOK) },
			"Execute error": func() { _ = b.Execute(fnErr) },
			"State":         func() { _ = b.State() },
		} {
			if a := testing.AllocsPerRun(200, f); a != 0 {
				t.Errorf("config %+v: closed %s: %v allocs, want 0", c, name, a)
			}
		}
		if s := b.State(); s != breaker.Closed {
			t.Fatalf("tripped: %v", s)
		}
	}
}

// doc.go: "A Breaker is safe for concurrent use"; OnStateChange is called
// "one at a time, in the order of the state changes". Many goroutines
// Allow, Wait, Done, Fail, Cancel, Execute, Trip and Reset over 20 s of a
// synctest bubble; the callbacks must form one chain (each from is the
// previous to, no self-change, none at once), the last to the final state,
// and a probe permit is only ever handed out after a change to half-open.
func TestAttack11ConcurrentChain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			inCB   atomic.Int32
			chain  []breaker.State
			bad    atomic.Value
			halfs  atomic.Int32
			probes atomic.Int32
		)
		chain = append(chain, breaker.Closed)
		var b *breaker.Breaker
		b = zcNew(t, breaker.Config{Window: time.Second, Buckets: 4, MinCalls: 4, Probes: 2, OpenFor: 200 * time.Millisecond,
			MaxOpenFor: time.Second, ConsecutiveFailures: 5, SlowCall: 150 * time.Millisecond, MaxWaiters: 50,
			OnStateChange: func(from, to breaker.State) {
				if inCB.Add(1) != 1 {
					bad.Store("two callbacks at once")
				}
				if last := chain[len(chain)-1]; from != last || from == to {
					bad.Store("change " + from.String() + ">" + to.String() + " after " + last.String())
				}
				chain = append(chain, to)
				if to == breaker.HalfOpen {
					halfs.Add(1)
				}
				_ = b.Snapshot() // a callback may call any method
				inCB.Add(-1)
			}})
		errX := errors.New("x")
		stop := time.Now().Add(20 * time.Second)
		done := make(chan struct{})
		const n = 24
		for g := range n {
			go func() {
				defer func() { done <- struct{}{} }()
				r := uint64(g*7919 + 1)
				rnd := func(k int) int { r ^= r << 13; r ^= r >> 7; r ^= r << 17; return int(r % uint64(k)) }
				for time.Now().Before(stop) {
					var p breaker.Permit
					var err error
					switch rnd(4) {
					case 0:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rnd(800))*time.Millisecond)
						p, err = b.Wait(ctx, time.Duration(rnd(1500))*time.Millisecond)
						cancel()
					case 1:
						_ = b.Execute(func() error {
							time.Sleep(time.Duration(rnd(200)) * time.Millisecond)
							if rnd(3) == 0 {
								return errX
							}
							return nil
						})
						continue
					default:
						p, err = b.Allow()
					}
					if err != nil {
						if !errors.Is(err, breaker.ErrOpen) {
							bad.Store("rejection not ErrOpen: " + err.Error())
						}
						time.Sleep(time.Duration(rnd(100)+1) * time.Millisecond)
						continue
					}
					if p.Probe() {
						probes.Add(1)
						if halfs.Load() == 0 {
							bad.Store("a probe before any half-open")
						}
					}
					time.Sleep(time.Duration(rnd(200)) * time.Millisecond)
					switch rnd(10) {
					case 0:
						b.Cancel(p)
					case 1:
						b.Fail(p, time.Duration(rnd(300))*time.Millisecond)
					case 2, 3, 4:
						b.Done(p, false)
					default:
						b.Done(p, true)
					}
					if rnd(200) == 0 {
						b.Trip(0)
					}
					if rnd(300) == 0 {
						b.Reset()
					}
				}
			}()
		}
		for range n {
			<-done
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if v := bad.Load(); v != nil {
			t.Fatal(v)
		}
		s := b.Snapshot()
		if last := chain[len(chain)-1]; last != s.State {
			t.Errorf("last change to %v, state %v", last, s.State)
		}
		if s.Waiters != 0 {
			t.Errorf("%d waiters left", s.Waiters)
		}
		t.Logf("%d state changes, %d half-opens, %d probes", len(chain)-1, halfs.Load(), probes.Load())
	})
}
