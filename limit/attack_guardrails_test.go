package limit_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// Black-box attacks on the learning guardrails of package limit (the
// package doc's "The limit", "Waiting" and "Throttling", Config's fields),
// in testing/synctest bubbles against a simulated dependency written
// here: workers servers, each attempt served for the service time, the
// rest queued first come first served; an attempt that does not finish
// within its timeout is released as dropped.

// grDest is the simulated dependency.
type grDest struct {
	slots   chan struct{}
	service atomic.Int64 // ns per attempt
	down    atomic.Bool  // answers every attempt at once with an overload
	hung    atomic.Bool  // answers nothing: every attempt times out
	served  atomic.Int64
	// room, when positive, bounds the attempts inside (served and queued):
	// one beyond it is shed at once with an overload answer (a drop).
	room   int64
	inside atomic.Int64
	shed   atomic.Int64
}

func grNewDest(workers int, service time.Duration) *grDest {
	d := &grDest{slots: make(chan struct{}, workers)}
	d.service.Store(int64(service))
	return d
}

// call runs one attempt with timeout and reports whether it was dropped.
func (d *grDest) call(timeout time.Duration) (dropped bool) {
	if d.down.Load() {
		time.Sleep(100 * time.Microsecond)
		return true
	}
	if d.room > 0 {
		if d.inside.Add(1) > d.room {
			d.inside.Add(-1)
			d.shed.Add(1)
			time.Sleep(100 * time.Microsecond)
			return true
		}
		defer d.inside.Add(-1)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	if d.hung.Load() {
		<-t.C
		return true
	}
	select {
	case d.slots <- struct{}{}:
	case <-t.C:
		return true
	}
	defer func() { <-d.slots }()
	w := time.NewTimer(time.Duration(d.service.Load()))
	defer w.Stop()
	select {
	case <-w.C:
		d.served.Add(1)
		return false
	case <-t.C:
		return true
	}
}

// grLoad runs clients closed-loop callers through l to d until stop is
// closed: Acquire within deadline, the attempt with timeout, Release with
// its outcome; a refused call pauses 1 ms. It returns their WaitGroup.
func grLoad(l *limit.Limiter, d *grDest, clients int, deadline, timeout time.Duration, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				p, err := l.Acquire(ctx)
				cancel()
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				l.Release(p, d.call(timeout))
			}
		})
	}
	return &wg
}

// grTrace samples l.Limit() every millisecond until stop.
type grTrace struct {
	mu    sync.Mutex
	start time.Time
	at    []time.Duration
	lim   []int
	done  chan struct{}
}

func grTraceOf(l *limit.Limiter, stop <-chan struct{}) *grTrace {
	tr := &grTrace{start: time.Now(), done: make(chan struct{})}
	go func() {
		defer close(tr.done)
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				tr.mu.Lock()
				tr.at = append(tr.at, time.Since(tr.start))
				tr.lim = append(tr.lim, l.Limit())
				tr.mu.Unlock()
			}
		}
	}()
	return tr
}

// between returns the lowest and highest limit in [from, to) since the
// trace's start.
func (tr *grTrace) between(from, to time.Duration) (lo, hi int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	lo = 1 << 30
	for i, v := range tr.lim {
		if tr.at[i] >= from && tr.at[i] < to {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return lo, hi
}

// firstAtLeast returns when, at or after from, the limit first reached n
// (since from), or -1.
func (tr *grTrace) firstAtLeast(from time.Duration, n int) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, v := range tr.lim {
		if tr.at[i] >= from && v >= n {
			return tr.at[i] - from
		}
	}
	return -1
}

func grNew(t testing.TB, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return l
}

func grDone() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// grFastest reads the limiter's baseline black-box: with every slot held
// (taken with a done context, which is no sample), a call with a 1 s
// deadline is refused when its deadline comes within the fastest answer.
// Call it with no other caller running.
func grFastest(t *testing.T, l *limit.Limiter) time.Duration {
	t.Helper()
	var ps []limit.Permit
	for {
		p, err := l.Acquire(grDone())
		if err != nil {
			break
		}
		ps = append(ps, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(ctx)
	waited := time.Since(start)
	for _, p := range ps {
		l.Release(p, false)
	}
	if err == nil || !strings.Contains(err.Error(), "fastest answer") {
		t.Fatalf("probe of the fastest answer: %v after %v", err, waited)
	}
	return time.Second - waited
}

func (tr *grTrace) profile(from, to, step time.Duration) []int {
	var out []int
	for s := from; s < to; s += step {
		lo, _ := tr.between(s, s+step)
		out = append(out, lo)
	}
	return out
}

// changes returns the distinct successive limits in [from, to).
func (tr *grTrace) changes(from, to time.Duration) []int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var seq []int
	for i, v := range tr.lim {
		if tr.at[i] >= from && tr.at[i] < to && (len(seq) == 0 || seq[len(seq)-1] != v) {
			seq = append(seq, v)
		}
	}
	return seq
}

// TestAttackGuardrailsRecoveryRestoresHealthyNotDouble: the package doc's Recovery:
// "after an outage window, the first clean window near the baseline
// restores the last healthy limit (...) and slow start doubles from there
// while the latency stays near the baseline", and "the limit grows only
// in windows that used at least half of it". A dependency of 50 workers
// (10 ms) that admits 80 attempts at once and sheds the rest with an
// overload answer: the limiter learns 57-58 and sheds nothing; after a
// 2 s outage the first limit above the outage's floor must be the healthy
// one (at most the limit before the outage), and the recovery must not
// be met by sheds. Observed: the restoring window also doubles the
// restored limit (the window ran at limit 1, "utilized" by one attempt),
// so the limit goes 1 -> 116 at once, 2x the healthy limit and above
// what the dependency admits, and it sheds thousands of attempts in the
// 100 ms after it is back (none in a healthy second).
func TestAttackGuardrailsRecoveryRestoresHealthyNotDouble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := grNewDest(50, 10*time.Millisecond)
		d.room = 80
		l := grNew(t, limit.Config{Timeout: time.Second})
		stop := make(chan struct{})
		wg := grLoad(l, d, 400, 2*time.Second, time.Second, stop)
		time.Sleep(3 * time.Second)
		tr := grTraceOf(l, stop)
		sh0 := d.shed.Load()
		time.Sleep(time.Second)
		healthyShed := d.shed.Load() - sh0
		_, before := tr.between(0, time.Second)
		d.down.Store(true)
		time.Sleep(2 * time.Second)
		during := l.Limit()
		d.down.Store(false)
		s0 := d.shed.Load()
		time.Sleep(100 * time.Millisecond)
		shed := d.shed.Load() - s0
		time.Sleep(time.Second)
		close(stop)
		wg.Wait()
		<-tr.done
		seq := tr.changes(3*time.Second, 3*time.Second+100*time.Millisecond)
		first := 0
		for _, v := range seq {
			if v > 2 {
				first = v
				break
			}
		}
		t.Logf("limit at most %d before the outage (shed %d in a healthy second), %d at its end; limits in the 100 ms after: %v; shed %d in them", before, healthyShed, during, seq, shed)
		if healthyShed != 0 {
			t.Fatalf("the dependency shed %d in a healthy second: the scenario is off", healthyShed)
		}
		if first > before {
			t.Errorf("first limit after the outage %d, above the last healthy limit %d (restored and doubled in one window)", first, before)
		}
		if shed > 0 {
			t.Errorf("the dependency shed %d attempts in the 100 ms after the outage (none in a healthy second)", shed)
		}
	})
}

// TestAttackGuardrailsCeilingOfTinyTimeout: Config.Timeout: "Half of it is the latency
// ceiling: an attempt released after Timeout/2 or later counts as a drop
// (...) 0 means no ceiling". Timeout 1 ns is positive and valid, so every
// answer is past its ceiling and the limit falls to 1, as it does with
// Timeout 2 ns; observed: Timeout 1 ns has no ceiling at all (Timeout/2
// rounds to 0, read as none), and the limit settles at 58.
func TestAttackGuardrailsCeilingOfTinyTimeout(t *testing.T) {
	for _, to := range []time.Duration{2 * time.Nanosecond, time.Nanosecond} {
		synctest.Test(t, func(t *testing.T) {
			d := grNewDest(50, 10*time.Millisecond)
			l := grNew(t, limit.Config{Timeout: to})
			stop := make(chan struct{})
			wg := grLoad(l, d, 400, 2*time.Second, time.Second, stop)
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()
			t.Logf("Timeout %v: limit %d after 2 s of 10 ms answers", to, l.Limit())
			if l.Limit() > 2 {
				t.Errorf("Timeout %v: limit %d after 2 s of answers at 10 ms, far past the ceiling (Timeout/2); want at most 2", to, l.Limit())
			}
		})
	}
}

// TestAttackGuardrailsHangNeverRaises: "a dropped attempt is never a latency sample
// (...) Nothing in a window with drops raises the limit: a hang lowers
// it, window after window, down to 1". A dependency that stops answering
// for 10 s, callers that time out after 300 ms or 1 s and release their
// attempt as dropped, with and without Config.Timeout: from one round
// trip into the hang the limit never rises, and it ends at 1 or 2; after
// the hang it is back at the capacity once the attempts sent into the
// hang have timed out.
func TestAttackGuardrailsHangNeverRaises(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Second} {
		for _, callerTimeout := range []time.Duration{300 * time.Millisecond, time.Second} {
			synctest.Test(t, func(t *testing.T) {
				d := grNewDest(50, 10*time.Millisecond)
				l := grNew(t, limit.Config{Timeout: timeout})
				stop := make(chan struct{})
				wg := grLoad(l, d, 400, 2*time.Second, callerTimeout, stop)
				time.Sleep(3 * time.Second)
				tr := grTraceOf(l, stop)
				time.Sleep(time.Second)
				d.hung.Store(true)
				time.Sleep(10 * time.Second)
				d.hung.Store(false)
				time.Sleep(3 * time.Second)
				close(stop)
				wg.Wait()
				<-tr.done
				_, before := tr.between(0, time.Second)
				seq := tr.changes(time.Second+20*time.Millisecond, 11*time.Second)
				rises := 0
				for i := 1; i < len(seq); i++ {
					if seq[i] > seq[i-1] {
						rises++
						t.Errorf("Timeout %v, caller timeout %v: the limit rose from %d to %d in the hang", timeout, callerTimeout, seq[i-1], seq[i])
					}
				}
				lo, _ := tr.between(10*time.Second, 11*time.Second)
				at := tr.firstAtLeast(11*time.Second, 50)
				t.Logf("Timeout %v, caller timeout %v: limit %d before, in the hang %v (down to %d); back to 50 %v after it", timeout, callerTimeout, before, seq, lo, at)
				if lo > 2 {
					t.Errorf("Timeout %v, caller timeout %v: limit %d at the end of a 10 s hang, want 1 or 2", timeout, callerTimeout, lo)
				}
				if at < 0 || at > callerTimeout+100*time.Millisecond {
					t.Errorf("Timeout %v, caller timeout %v: back at capacity %v after the hang, want within the caller's timeout and 10 round trips", timeout, callerTimeout, at)
				}
			})
		}
	}
}

// TestAttackGuardrailsIncidentBaselineHolds: "Buckets of an incident (...) do not push
// healthy ones out, so the baseline holds through an incident instead of
// drifting up to its latency" and "a 5x slower service for 60 s leaves
// the baseline at 10 ms while the limit stays near 57". 10 s healthy, a
// 60 s incident at 5x the service time, then healthy again: the baseline
// (probed from outside) is 10 ms after it, the dependency served at least
// 90% of its reduced capacity in it, the limit is back at the capacity
// within 1 s after, and it serves 95% of the capacity in the 5 s after.
// Under the race detector the incident lasts 20 s.
func TestAttackGuardrailsIncidentBaselineHolds(t *testing.T) {
	secs := 60
	if raceEnabled {
		secs = 20
	}
	incident := time.Duration(secs) * time.Second
	for _, timeout := range []time.Duration{0, time.Second} {
		synctest.Test(t, func(t *testing.T) {
			d := grNewDest(50, 10*time.Millisecond)
			l := grNew(t, limit.Config{Timeout: timeout})
			stop := make(chan struct{})
			wg := grLoad(l, d, 400, 2*time.Second, time.Second, stop)
			time.Sleep(10 * time.Second)
			tr := grTraceOf(l, stop)
			time.Sleep(time.Second)
			d.service.Store(int64(50 * time.Millisecond))
			s0 := d.served.Load()
			time.Sleep(incident)
			s1 := d.served.Load()
			d.service.Store(int64(10 * time.Millisecond))
			time.Sleep(5 * time.Second)
			s2 := d.served.Load()
			close(stop)
			wg.Wait()
			<-tr.done
			base := grFastest(t, l)
			_, before := tr.between(0, time.Second)
			lo, hi := tr.between(time.Second+3*time.Second, time.Second+incident)
			at := tr.firstAtLeast(time.Second+incident, 50)
			t.Logf("Timeout %v: limit %d before; %d..%d from 3 s into the %v incident (per second: %v); served %d of %d in it; back at 50 %v after; served %d of 25000 in the 5 s after; baseline %v", timeout, before, lo, hi, incident, tr.profile(time.Second, 5*time.Second, time.Second), s1-s0, secs*1000, at, s2-s1, base)
			if base != 10*time.Millisecond {
				t.Errorf("Timeout %v: baseline %v after the incident, want 10 ms", timeout, base)
			}
			if s1-s0 < int64(secs)*900 {
				t.Errorf("Timeout %v: served %d in the incident, want 90%% of %d", timeout, s1-s0, secs*1000)
			}
			// Near 57; under the race detector the scheduler's order of
			// the callers dipped it for a moment to 46 (a CI run) and 38
			// (1 of 30 runs): the doc gives it.
			least := 50
			if raceEnabled {
				least = 35
			}
			if lo < least || hi > 70 {
				t.Errorf("Timeout %v: limit %d..%d in the incident after its first 3 s, want near 57 (at least %d)", timeout, lo, hi, least)
			}
			if at < 0 || at > time.Second || s2-s1 < 23750 {
				t.Errorf("Timeout %v: back at capacity %v after the incident, served %d of 25000 in 5 s", timeout, at, s2-s1)
			}
		})
	}
}

// TestAttackGuardrailsCeilingNeverRaises: "with Config.Timeout set, a latency sample
// (...) released after half the timeout or later counts as a drop, so
// that latency sitting near the callers' timeout (with no attempt
// actually timing out) lowers the limit instead of raising it". The
// dependency slows to 60 ms and 90 ms per attempt with Timeout 100 ms
// (callers' timeout 1 s: none times out): the limit never rises and falls
// to 1 or 2.
func TestAttackGuardrailsCeilingNeverRaises(t *testing.T) {
	for _, svc := range []time.Duration{60 * time.Millisecond, 90 * time.Millisecond} {
		synctest.Test(t, func(t *testing.T) {
			d := grNewDest(50, 10*time.Millisecond)
			l := grNew(t, limit.Config{Timeout: 100 * time.Millisecond})
			stop := make(chan struct{})
			wg := grLoad(l, d, 400, 2*time.Second, time.Second, stop)
			time.Sleep(3 * time.Second)
			tr := grTraceOf(l, stop)
			time.Sleep(time.Second)
			d.service.Store(int64(svc))
			time.Sleep(10 * time.Second)
			close(stop)
			wg.Wait()
			<-tr.done
			_, before := tr.between(0, time.Second)
			seq := tr.changes(time.Second+20*time.Millisecond, 11*time.Second)
			for i := 1; i < len(seq); i++ {
				if seq[i] > seq[i-1] {
					t.Errorf("service %v: limit rose from %d to %d with every answer past the ceiling", svc, seq[i-1], seq[i])
				}
			}
			lo, _ := tr.between(10*time.Second, 11*time.Second)
			t.Logf("service %v (ceiling 50 ms): limit %d before, then %v", svc, before, seq)
			if lo > 2 {
				t.Errorf("service %v: limit %d after 9 s past the ceiling, want 1 or 2", svc, lo)
			}
		})
	}
}

// TestAttackGuardrailsThrottleK2Recovers: Config.Throttle 2, "lets healthy traffic
// through again about 2.5 s after a recovery (measured at 1,000 and
// 10,000 calls per second)": closed-loop callers (a throttled call pauses
// 10 ms) at about 1,000 and 10,000 calls per second, a 10 s outage
// answered with overloads: the throttle rejects in it and its last
// rejection of healthy traffic comes within 3 s of the recovery.
func TestAttackGuardrailsThrottleK2Recovers(t *testing.T) {
	for _, callers := range []int{10, 100} {
		synctest.Test(t, func(t *testing.T) {
			l := grNew(t, limit.Config{Throttle: 2, Timeout: time.Second})
			d := grNewDest(2000, 10*time.Millisecond)
			var recovered atomic.Int64
			start := time.Now()
			var mu sync.Mutex
			var last time.Duration
			var inOutage int
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() {
					for {
						select {
						case <-stop:
							return
						default:
						}
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						p, err := l.Acquire(ctx)
						cancel()
						if err != nil {
							if strings.Contains(err.Error(), "throttled") {
								mu.Lock()
								if r := recovered.Load(); r > 0 {
									last = time.Since(start) - time.Duration(r)
								} else if d.down.Load() {
									inOutage++
								}
								mu.Unlock()
							}
							time.Sleep(10 * time.Millisecond)
							continue
						}
						l.Release(p, d.call(time.Second))
					}
				})
			}
			time.Sleep(5 * time.Second)
			d.down.Store(true)
			time.Sleep(10 * time.Second)
			d.down.Store(false)
			recovered.Store(int64(time.Since(start)))
			time.Sleep(10 * time.Second)
			close(stop)
			wg.Wait()
			t.Logf("%d callers: %d throttled in the outage; the last healthy call throttled %v after the recovery", callers, inOutage, last)
			if inOutage == 0 {
				t.Errorf("%d callers: nothing throttled in a 10 s outage", callers)
			}
			if last > 3*time.Second {
				t.Errorf("%d callers: healthy calls throttled %v after the recovery, want about 2.5 s", callers, last)
			}
		})
	}
}

// TestAttackGuardrailsManyWaitersBounded: "A waiting call holds no lock and starts no
// goroutine", Config.Waiting bounds the waiting calls, and the limit
// bounds the attempts in flight. Limit 10, Waiting 100,000: 100,000
// callers (half with a deadline, half without; 20,000 under the race
// detector) plus 1,000 more that find the list full: the extra ones are
// refused at once with the documented reason, the waiting ones add no
// goroutine of the limiter's, the attempts in flight never exceed 10, and
// every waiting call is served once the slots come back.
func TestAttackGuardrailsManyWaitersBounded(t *testing.T) {
	n := 100_000
	if raceEnabled {
		n = 20_000
	}
	synctest.Test(t, func(t *testing.T) {
		l := grNew(t, limit.Config{Max: 10, Waiting: n})
		var held []limit.Permit
		for range 10 {
			p, err := l.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, p)
		}
		if _, err := l.Acquire(grDone()); err == nil {
			t.Fatal("an 11th slot under limit 10")
		}
		base := runtime.NumGoroutine()
		var inFlight, peak, served, refused atomic.Int64
		var wg sync.WaitGroup
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		call := func(c context.Context) {
			p, err := l.Acquire(c)
			if err != nil {
				if !errors.Is(err, limit.ErrLimited) || !strings.Contains(err.Error(), "too many calls are waiting") {
					t.Errorf("Acquire: %v, want ErrLimited, too many calls waiting", err)
				}
				refused.Add(1)
				return
			}
			v := inFlight.Add(1)
			for {
				m := peak.Load()
				if v <= m || peak.CompareAndSwap(m, v) {
					break
				}
			}
			time.Sleep(time.Millisecond)
			inFlight.Add(-1)
			served.Add(1)
			l.Release(p, false)
		}
		for i := range n {
			c := ctx
			if i%2 == 0 {
				c = context.Background()
			}
			wg.Go(func() { call(c) })
		}
		synctest.Wait()
		got := runtime.NumGoroutine() - base
		_, waiting := l.SetCap(-1)
		for range 1000 {
			wg.Go(func() { call(ctx) })
		}
		synctest.Wait()
		t.Logf("%d waiting, %d goroutines for them (callers included), %d refused beyond Waiting", waiting, got, refused.Load())
		if waiting != n || got > n+2 || refused.Load() != 1000 {
			t.Errorf("%d waiting (want %d), %d goroutines (want at most %d), %d refused (want 1000)", waiting, n, got, n+2, refused.Load())
		}
		for _, p := range held {
			l.Release(p, false)
		}
		wg.Wait()
		t.Logf("served %d, peak in flight %d (limit %d)", served.Load(), peak.Load(), l.Limit())
		if served.Load() != int64(n) || peak.Load() > 10 {
			t.Errorf("served %d of %d, peak in flight %d (limit 10)", served.Load(), n, peak.Load())
		}
	})
}

// TestAttackGuardrailsColdStart: "a cold limiter reaches the capacity (50 in flight) in
// 3 round trips (200 in 5 to 7, 1000 in 7 to 9, up to about twice that in
// rare runs ...) and then holds 57 or 58 (... 65 to 78 in 3 of 90 runs
// under -race on a loaded machine)": against this file's dependency (3
// callers per worker, 10 ms), within twice the first figures and half a
// round trip, and at capacity 50 the limit holds 55..80 in the second
// second (57..58 in 87 of 90 runs here; 68 once in CI).
func TestAttackGuardrailsColdStart(t *testing.T) {
	for _, tt := range []struct {
		capacity int
		rounds   float64
	}{{50, 3}, {200, 5}, {1000, 8}} {
		synctest.Test(t, func(t *testing.T) {
			d := grNewDest(tt.capacity, 10*time.Millisecond)
			l := grNew(t, limit.Config{Max: 5000, Timeout: time.Second})
			stop := make(chan struct{})
			tr := grTraceOf(l, stop)
			wg := grLoad(l, d, 3*tt.capacity, 2*time.Second, time.Second, stop)
			time.Sleep(2 * time.Second)
			close(stop)
			wg.Wait()
			<-tr.done
			at := tr.firstAtLeast(0, tt.capacity)
			lo, hi := tr.between(time.Second, 2*time.Second)
			rounds := float64(at) / float64(10*time.Millisecond)
			t.Logf("capacity %d: reached in %.1f round trips (doc: %v); %d..%d in the second second", tt.capacity, rounds, tt.rounds, lo, hi)
			// Which calls the limiter samples follows the scheduler's
			// order of the callers, which -race and a loaded machine move:
			// 200 in 5.0-7.0 round trips in 12 runs here and 10.1 in one
			// CI run, 1000 in 7.1-9.1 here and 10.1 in another CI run.
			if at < 0 || rounds > 2*tt.rounds+0.5 {
				t.Errorf("capacity %d: reached in %v, want about %v round trips", tt.capacity, at, tt.rounds)
			}
			if tt.capacity == 50 && (lo < 55 || hi > 90) {
				t.Errorf("capacity 50: limit %d..%d in the second second, want 57 or 58 (at most 90 in rare runs: 86 once in CI)", lo, hi)
			}
		})
	}
}

// TestAttackGuardrailsConfigErrors: New "returns an error naming the field when Max is
// negative or above 2^30, Timeout is negative, or Throttle is NaN,
// infinite, negative or in (0, 1). Every Waiting is valid."
func TestAttackGuardrailsConfigErrors(t *testing.T) {
	bad := []struct {
		c     limit.Config
		field string
	}{
		{limit.Config{Max: -1}, "Config.Max"},
		{limit.Config{Max: math.MinInt}, "Config.Max"},
		{limit.Config{Max: 1<<30 + 1}, "Config.Max"},
		{limit.Config{Max: math.MaxInt}, "Config.Max"},
		{limit.Config{Timeout: -1}, "Config.Timeout"},
		{limit.Config{Timeout: math.MinInt64}, "Config.Timeout"},
		{limit.Config{Throttle: math.NaN()}, "Config.Throttle"},
		{limit.Config{Throttle: math.Inf(1)}, "Config.Throttle"},
		{limit.Config{Throttle: math.Inf(-1)}, "Config.Throttle"},
		{limit.Config{Throttle: -1}, "Config.Throttle"},
		{limit.Config{Throttle: math.Copysign(0, -1) - 1e-300}, "Config.Throttle"},
		{limit.Config{Throttle: 0.5}, "Config.Throttle"},
		{limit.Config{Throttle: math.Nextafter(1, 0)}, "Config.Throttle"},
		{limit.Config{Throttle: math.SmallestNonzeroFloat64}, "Config.Throttle"},
	}
	for _, tt := range bad {
		l, err := limit.New(tt.c)
		if err == nil || l != nil || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("New(%+v) = %v, %v; want an error naming %s", tt.c, l, err, tt.field)
		}
	}
	for _, c := range []limit.Config{
		{}, {Max: 1}, {Max: 1 << 30}, {Timeout: 1}, {Timeout: math.MaxInt64},
		{Throttle: 1}, {Throttle: math.MaxFloat64}, {Throttle: math.Copysign(0, -1)},
		{Waiting: -1}, {Waiting: math.MinInt}, {Waiting: math.MaxInt},
	} {
		l, err := limit.New(c)
		if err != nil || l == nil {
			t.Errorf("New(%+v) = %v, %v; want a Limiter", c, l, err)
			continue
		}
		want := min(c.Max, 10)
		if c.Max == 0 {
			want = 10
		}
		if l.Limit() != want {
			t.Errorf("New(%+v): cold limit %d, want min(Max, 10) = %d", c, l.Limit(), want)
		}
	}
}
