// Black-box attacks on package breaker (AREA breaker9): probe rounds with
// waiting calls, the round timer, Cancel of probes, Trip/Reset while calls
// wait, a Shared fleet of the test's own.

package breaker_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func b9Half() float64 { return 0.5 }

func b9New(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

type b9Res struct {
	name string
	at   time.Duration
	p    breaker.Permit
	err  error
}

// doc.go: "Breaker.Wait lets a caller with time to spare wait instead ...
// the probe rounds and the pacer run on one timer each per breaker";
// Wait: "An open one makes the call wait ... the call may be handed one of
// the round's probes". Breaker.Trip: "The next probe round comes after the
// usual open period".
//
// A first outage opens the breaker for a Retry-After of an hour; a call
// waits (the round timer is armed for 1.25 h). A fleet's Reset closes the
// breaker (the waiting call is released). The dependency fails again:
// Trip(0) opens it for OpenFor = 1 s. A call that waits now (10 s to
// spare) must be handed the probe of the round due at 1 s, with no other
// call arriving to start it.
func TestAttack9RoundTimerAfterResetAndTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b9New(t, breaker.Config{OpenFor: time.Second, Rand: b9Half, ReleaseRate: -1})
		b.Trip(time.Hour)
		first := make(chan error, 1)
		go func() {
			p, err := b.Wait(context.Background(), 2*time.Hour)
			if err == nil {
				b.Done(p, true)
			}
			first <- err
		}()
		synctest.Wait()
		time.Sleep(time.Minute)
		b.Reset() // a recovery found elsewhere
		synctest.Wait()
		if err := <-first; err != nil {
			t.Fatalf("first waiter after Reset: %v", err)
		}
		b.Trip(0) // down again: open for 1 s
		start := time.Now()
		res := make(chan b9Res, 1)
		go func() {
			p, err := b.Wait(context.Background(), 10*time.Second)
			res <- b9Res{at: time.Since(start), p: p, err: err}
		}()
		time.Sleep(3 * time.Second) // the round was due at 1 s
		synctest.Wait()
		select {
		case r := <-res:
			if r.err != nil || !r.p.Probe() {
				t.Errorf("waiter: permit probe=%v err=%v at %v; want a probe at 1s", r.p.Probe(), r.err, r.at)
			}
			b.Done(r.p, true)
		default:
			t.Errorf("3s after Trip(0) (round due at 1s) the waiting call is still not admitted: no timer starts the round")
			time.Sleep(8 * time.Second)
			r := <-res
			t.Logf("the waiter ended at %v: permit probe=%v err=%v", r.at, r.p.Probe(), r.err)
		}
	})
}

// Wait: "If the breaker reopens first, the call keeps waiting." doc.go:
// "Open: calls are not made."
//
// A probe round hands its only probe to the waiting call; before that
// call's goroutine has run, the breaker reopens (here a fleet's verdict,
// Trip, delivered by the OnStateChange of the half-open; a second probe's
// failure does the same). Does Wait then return the stale probe, so that
// the call goes to the dependency while the breaker is open?
func TestAttack9GrantedProbeAfterReopen(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	synctest.Test(t, func(t *testing.T) {
		var b *breaker.Breaker
		var returned atomic.Bool
		var returnedBeforeReopen atomic.Int32 // 0 unset, 1 yes, 2 no
		b = b9New(t, breaker.Config{Probes: 1, OpenFor: time.Second, Rand: b9Half,
			OnStateChange: func(from, to breaker.State) {
				if from == breaker.Open && to == breaker.HalfOpen && returnedBeforeReopen.Load() == 0 {
					b.Trip(0)
					if returned.Load() {
						returnedBeforeReopen.Store(1)
					} else {
						returnedBeforeReopen.Store(2)
					}
				}
			}})
		b.Trip(0)
		res := make(chan b9Res, 1)
		var stateAtReturn breaker.State
		go func() {
			p, err := b.Wait(context.Background(), 10*time.Second)
			returned.Store(true)
			stateAtReturn = b.Snapshot().State
			res <- b9Res{p: p, err: err}
		}()
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		select {
		case r := <-res:
			t.Logf("Wait returned probe=%v err=%v; breaker state then %v; returned before reopen: %v", r.p.Probe(), r.err, stateAtReturn, returnedBeforeReopen.Load() == 1)
			if r.err == nil && returnedBeforeReopen.Load() == 2 {
				t.Errorf("Wait returned a permit (probe=%v) after the breaker reopened (state %v at return): the call goes to the dependency while open", r.p.Probe(), stateAtReturn)
			}
			b.Done(r.p, false)
		default:
			t.Logf("the call keeps waiting (as documented)")
			b.Reset()
			<-res
		}
	})
}

// b9Shared is a fleet of the test's own: ProbeRound panics on its first
// call (a bug, a client library's panic) and grants every round after.
type b9Shared struct {
	asks   atomic.Int32
	panics int32
}

func (s *b9Shared) Outcome(bool) {}
func (s *b9Shared) ProbeRound() bool {
	if s.asks.Add(1) <= s.panics {
		panic("fleet client bug")
	}
	return true
}
func (s *b9Shared) StateChanged(from, to breaker.State) {}

// New: "A Breaker that was built never fails or panics later (except by
// re-raising a closure's panic)." doc.go: "HalfOpen: when the open period
// ends, a probe round admits Probes calls".
//
// The fleet's ProbeRound panics once (on the caller's goroutine). Does the
// breaker still start a probe round later, once the fleet answers again?
func TestAttack9SharedProbeRoundPanicOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &b9Shared{panics: 1}
		b := b9New(t, breaker.Config{OpenFor: time.Second, Rand: b9Half, Shared: s})
		b.Trip(0)
		time.Sleep(time.Second)
		func() {
			defer func() { t.Logf("first Allow panicked: %v", recover()) }()
			b.Allow()
		}()
		for i := range 5 {
			time.Sleep(time.Second)
			p, err := b.Allow()
			if err == nil {
				t.Logf("round %d: admitted probe=%v (fleet asked %d times)", i, p.Probe(), s.asks.Load())
				b.Done(p, true)
				return
			}
			t.Logf("%v later: Allow: %v (fleet asked %d times)", time.Duration(i+1)*time.Second, err, s.asks.Load())
		}
		t.Errorf("after one panic of Shared.ProbeRound the breaker never starts a probe round again (fleet asked %d times in 5 s, state %v)", s.asks.Load(), b.State())
	})
}

// Wait: "the call may be handed one of the round's probes (the calls with
// the most time left first)"; doc.go: "A maxWait near the largest Duration
// means no bound". Probes 2: waiters with 5 s, 20 s (A), 20 s (B, later),
// no bound (U), 8 s. The probes go to U and A; then Cancel of U's probe
// hands it to B.
func TestAttack9ProbesMostTimeLeftThenCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b9New(t, breaker.Config{Probes: 2, OpenFor: time.Second, Rand: b9Half, ReleaseRate: -1})
		b.Trip(0)
		res := make(chan b9Res, 5)
		waits := []struct {
			name string
			d    time.Duration
		}{{"5s", 5 * time.Second}, {"A", 20 * time.Second}, {"B", 20 * time.Second}, {"U", math.MaxInt64}, {"8s", 8 * time.Second}}
		start := time.Now()
		for _, w := range waits {
			go func() {
				p, err := b.Wait(context.Background(), w.d)
				res <- b9Res{name: w.name, at: time.Since(start), p: p, err: err}
			}()
			synctest.Wait() // same instant, in this order of arrival
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got := map[string]b9Res{}
		for len(res) > 0 {
			r := <-res
			got[r.name] = r
		}
		if len(got) != 2 || !got["U"].p.Probe() || !got["A"].p.Probe() {
			b.Reset()
			time.Sleep(time.Minute)
			t.Fatalf("after the round: %v; want probes for U and A", got)
		}
		if s := b.Snapshot(); s.Waiters != 3 || s.State != breaker.HalfOpen {
			t.Errorf("snapshot %+v; want half-open, 3 waiters", s)
		}
		b.Cancel(got["U"].p)
		synctest.Wait()
		r := <-res
		if r.name != "B" || !r.p.Probe() || r.err != nil {
			t.Errorf("after Cancel of U's probe: %s probe=%v err=%v; want B", r.name, r.p.Probe(), r.err)
		}
		b.Done(r.p, true)
		b.Done(got["A"].p, true)
		if st := b.State(); st != breaker.Closed {
			t.Fatalf("state %v after both probes succeeded", st)
		}
		synctest.Wait()
		// ReleaseRate -1: the rest at once, earliest deadline first.
		for range 2 {
			r := <-res
			if r.err != nil || r.p.Probe() {
				t.Errorf("release %s: probe=%v err=%v", r.name, r.p.Probe(), r.err)
			}
		}
		if n := b.Snapshot().Waiters; n != 0 {
			t.Errorf("%d waiters left", n)
		}
	})
}

// Cancel: "A probe's slot is freed for another probe (a waiting call
// first)". Probes 1; three waiters with 4 s, 6 s, 8 s. The 8 s call gets
// the probe at 1 s and cancels it at 7 s (its caller went away): the 6 s
// call has given up at 6 s and the 4 s at 4 s; the slot must be free for
// the next Allow, and the round still ends with one success.
func TestAttack9CancelProbeAfterWaitersExpired(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b9New(t, breaker.Config{Probes: 1, OpenFor: time.Second, Rand: b9Half})
		b.Trip(0)
		res := make(chan b9Res, 3)
		for _, d := range []time.Duration{4, 6, 8} {
			go func() {
				p, err := b.Wait(context.Background(), d*time.Second)
				res <- b9Res{at: d * time.Second, p: p, err: err}
			}()
		}
		time.Sleep(1100 * time.Millisecond)
		r := <-res
		if r.at != 8*time.Second || !r.p.Probe() {
			t.Fatalf("probe went to the %v call (probe=%v err=%v)", r.at, r.p.Probe(), r.err)
		}
		time.Sleep(6 * time.Second)
		for range 2 {
			x := <-res
			var oe *breaker.OpenError
			if !errors.As(x.err, &oe) || oe.State != breaker.HalfOpen {
				t.Errorf("the %v waiter: %v; want OpenError HalfOpen", x.at, x.err)
			}
		}
		b.Cancel(r.p)
		p, err := b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("Allow after Cancel: probe=%v err=%v", p.Probe(), err)
		}
		b.Done(p, true)
		if st := b.State(); st != breaker.Closed {
			t.Errorf("state %v", st)
		}
	})
}

// Concurrency under -race: many waiters with random deadlines, probes that
// fail or succeed or are cancelled, Trip and Reset from the side. Checks:
// no waiter outlives its maxWait by more than a moment, every Wait
// returns, OnStateChange is called in an order of valid transitions
// (from == previous to), and no more than Probes probes of one half-open
// generation are out at once.
func TestAttack9StormProbesWaitersTripReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		last := breaker.Closed
		var bad []string
		var b *breaker.Breaker
		var outstanding, maxOut atomic.Int32
		b = b9New(t, breaker.Config{Probes: 2, OpenFor: 200 * time.Millisecond, MaxOpenFor: time.Second, MinCalls: 4, Window: time.Second, Buckets: 10, ReleaseRate: 50,
			OnStateChange: func(from, to breaker.State) {
				mu.Lock()
				if from != last {
					bad = append(bad, from.String()+"->"+to.String()+" after "+last.String())
				}
				last = to
				mu.Unlock()
			}})
		var wg sync.WaitGroup
		seed := uint64(1)
		rnd := func() uint64 {
			mu.Lock()
			defer mu.Unlock()
			seed = seed*6364136223846793005 + 1442695040888963407
			return seed >> 33
		}
		for i := range 400 {
			maxWait := time.Duration(rnd()%3000) * time.Millisecond
			if i%17 == 0 {
				maxWait = math.MaxInt64
			}
			wg.Go(func() {
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				p, err := b.Wait(ctx, maxWait)
				if el := time.Since(start); maxWait != math.MaxInt64 && el > maxWait {
					mu.Lock()
					bad = append(bad, "waited "+el.String()+" > "+maxWait.String())
					mu.Unlock()
				}
				if err != nil {
					return
				}
				if p.Probe() {
					if n := outstanding.Add(1); n > maxOut.Load() {
						maxOut.Store(n)
					}
				}
				time.Sleep(time.Duration(rnd()%50) * time.Millisecond)
				if p.Probe() {
					outstanding.Add(-1)
				}
				switch rnd() % 4 {
				case 0:
					b.Cancel(p)
				case 1:
					b.Done(p, true)
				default:
					b.Done(p, false)
				}
			})
			if i%50 == 0 {
				if rnd()%2 == 0 {
					b.Trip(0)
				} else {
					b.Reset()
				}
			}
			time.Sleep(time.Duration(rnd()%20) * time.Millisecond)
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Errorf("%d violations, first: %v", len(bad), bad[:min(len(bad), 5)])
		}
		t.Logf("max outstanding probes %d; final %+v", maxOut.Load(), b.Snapshot())
	})
}

// Config.SlowCall: "A call's time runs from the Breaker.Allow or
// Breaker.Wait that issued its permit (for a call that waited, from its
// admission ...)". A waiter waits 1 s for the round and gives its probe
// back 50 ms after (SlowCall 100 ms): a success that closes the breaker.
// ConsecutiveFailures: "so does every state change, so a breaker that
// closes starts counting from 0".
func TestAttack9SlowCallProbeFromAdmissionAndRunReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b9New(t, breaker.Config{Probes: 1, OpenFor: time.Second, Rand: b9Half, SlowCall: 100 * time.Millisecond, ConsecutiveFailures: 3})
		for range 2 {
			p, _ := b.Allow()
			b.Done(p, false)
		}
		b.Trip(0)
		p, err := b.Wait(context.Background(), 5*time.Second)
		if err != nil || !p.Probe() {
			t.Fatalf("Wait: probe=%v err=%v", p.Probe(), err)
		}
		time.Sleep(50 * time.Millisecond)
		b.Done(p, true)
		if st := b.State(); st != breaker.Closed {
			t.Fatalf("state %v after a 50 ms probe (SlowCall 100 ms)", st)
		}
		for i := range 2 {
			p, _ := b.Allow()
			b.Done(p, false)
			if st := b.State(); st != breaker.Closed {
				t.Fatalf("state %v after %d failures since the close (ConsecutiveFailures 3)", st, i+1)
			}
		}
		p, _ = b.Allow()
		b.Done(p, false)
		if st := b.State(); st != breaker.Open {
			t.Errorf("state %v after 3 failures in a row", st)
		}
	})
}
