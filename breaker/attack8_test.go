// Black-box attacks on package breaker (AREA breaker8): each test names the
// documented sentence it checks.

package breaker_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func b8Half() float64 { return 0.5 }

func b8New(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

// doc.go: "If failures reach the trip rule again (while it releases, Probes
// failing calls in the window are enough), the breaker opens and the calls
// not yet released go back to waiting." Breaker.Done: "While the calls that
// waited are being released after a close, Probes calls in the window are
// enough".
//
// Probes 1, ReleaseRate 1/s (one call a second), Rand 0.5. Three waiting
// calls: P gets the probe at 1 s and succeeds (close). The pacer releases A
// at 1.5 s and B at 2.5 s (its tick at 2 s schedules B). A's call fails at
// 2.2 s: B has not been released yet, so the release is still running and
// one failing call (Probes) in the window must reopen the breaker and send
// B back to waiting.
func TestAttackBreaker8ReleaseTailFailureRetrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{Probes: 1, OpenFor: time.Second, ReleaseRate: 1, Rand: b8Half})
		b.Trip(0)
		start := time.Now()
		type res struct {
			name  string
			at    time.Duration
			probe bool
			err   error
		}
		ch := make(chan res, 3)
		var wg sync.WaitGroup
		// P, with the most time left, gets the probe; A and B are released
		// earliest deadline first.
		for _, name := range []string{"P", "A", "B"} {
			maxWait := map[string]time.Duration{"P": 30 * time.Second, "A": 10 * time.Second, "B": 20 * time.Second}[name]
			wg.Go(func() {
				p, err := b.Wait(context.Background(), maxWait)
				ch <- res{name, time.Since(start), p.Probe(), err}
				if err != nil {
					return
				}
				switch name {
				case "P":
					b.Done(p, true)
				case "A":
					time.Sleep(2200*time.Millisecond - time.Since(start))
					b.Done(p, false)
				default:
					b.Done(p, true)
				}
			})
		}
		time.Sleep(2200*time.Millisecond + time.Millisecond)
		snap := b.Snapshot()
		stateAfterFail := snap.State
		if snap.Waiters != 1 && stateAfterFail == breaker.Closed {
			t.Errorf("setup: Snapshot.Waiters %d at 2.2s, want 1 (B, scheduled for release: \"those already scheduled for release included\")", snap.Waiters)
		}
		wg.Wait()
		close(ch)
		got := map[string]res{}
		for r := range ch {
			got[r.name] = r
		}
		t.Logf("P %+v, A %+v, B %+v; state just after A failed: %v", got["P"], got["A"], got["B"], stateAfterFail)
		if !got["P"].probe || got["A"].at != 1500*time.Millisecond {
			t.Fatalf("setup: want P the probe at 1s and A released at 1.5s")
		}
		if stateAfterFail != breaker.Open {
			t.Errorf("A (released) failed at 2.2s while B still waited for its release (2.5s): state %v, want open (Probes=1 failing call during the release)", stateAfterFail)
		}
		if b := got["B"]; b.err == nil && b.at <= 2500*time.Millisecond {
			t.Errorf("B was released at %v after the release's failure, want it back to waiting", b.at)
		}
	})
}

// Control for TestAttackBreaker8ReleaseTailFailureRetrips: the same failure at 1.9 s,
// before the pacer's tick at 2 s, reopens the breaker (passes).
func TestAttackBreaker8ReleaseMidFailureRetrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{Probes: 1, OpenFor: time.Second, ReleaseRate: 1, Rand: b8Half})
		b.Trip(0)
		start := time.Now()
		var wg sync.WaitGroup
		var bAt atomic.Int64
		// P, with the most time left, gets the probe; A and B are released
		// earliest deadline first.
		for _, name := range []string{"P", "A", "B"} {
			maxWait := map[string]time.Duration{"P": 30 * time.Second, "A": 10 * time.Second, "B": 20 * time.Second}[name]
			wg.Go(func() {
				p, err := b.Wait(context.Background(), maxWait)
				if name == "B" {
					bAt.Store(int64(time.Since(start)))
				}
				if err != nil {
					return
				}
				switch name {
				case "P":
					b.Done(p, true)
				case "A":
					time.Sleep(1900*time.Millisecond - time.Since(start))
					b.Done(p, false)
				default:
					b.Done(p, true)
				}
			})
		}
		time.Sleep(1901 * time.Millisecond)
		if s := b.State(); s != breaker.Open {
			t.Errorf("state after A failed at 1.9s: %v, want open", s)
		}
		wg.Wait()
	})
}

// Concurrency: "A Breaker is safe for concurrent use", Snapshot's Calls and
// Failures are "the outcomes in the closed-state window", Shared.Outcome
// "is told every closed-state outcome". 8 goroutines x 5000 outcomes, a
// quarter failures, a breaker that cannot trip (FailureRatio 1, MinCalls
// huge): every outcome is counted exactly, under -race.
type b8Shared struct{ succ, fail atomic.Int64 }

func (s *b8Shared) Outcome(ok bool) {
	if ok {
		s.succ.Add(1)
	} else {
		s.fail.Add(1)
	}
}
func (s *b8Shared) ProbeRound() bool                    { return true }
func (s *b8Shared) StateChanged(from, to breaker.State) {}

func TestAttackBreaker8ConcurrentCountsExact(t *testing.T) {
	sh := &b8Shared{}
	b := b8New(t, breaker.Config{FailureRatio: 1, MinCalls: 1 << 30, Window: time.Hour, Buckets: 1, Shared: sh})
	const G, N = 8, 5000
	var wg sync.WaitGroup
	for g := 0; g < G; g++ {
		wg.Go(func() {
			for i := 0; i < N; i++ {
				var p breaker.Permit
				var err error
				if i%2 == 0 {
					p, err = b.Allow()
				} else {
					p, err = b.Wait(context.Background(), time.Second)
				}
				if err != nil {
					t.Errorf("rejected: %v", err)
					return
				}
				b.Done(p, i%4 != 3)
			}
		})
	}
	wg.Wait()
	s := b.Snapshot()
	if s.Calls != G*N || s.Failures != G*N/4 || s.State != breaker.Closed {
		t.Errorf("Snapshot %+v, want Calls %d Failures %d", s, G*N, G*N/4)
	}
	if sh.succ.Load() != G*N*3/4 || sh.fail.Load() != G*N/4 {
		t.Errorf("Shared.Outcome told %d successes %d failures, want %d %d", sh.succ.Load(), sh.fail.Load(), G*N*3/4, G*N/4)
	}
}

// ConsecutiveFailures 3. A success given with a permit from before a Trip
// and Reset is stale ("such an outcome changes nothing"): it neither ends
// the new run nor counts. A run in the new generation: F, F, stale
// success, F trips; a fresh success instead of the stale one does not.
func TestAttackBreaker8ConsecutiveStaleSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, fresh := range []bool{false, true} {
			b := b8New(t, breaker.Config{ConsecutiveFailures: 3, Rand: b8Half})
			old, _ := b.Allow()
			b.Trip(0)
			b.Reset()
			fail := func() {
				p, err := b.Allow()
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				b.Done(p, false)
			}
			fail()
			fail()
			if fresh {
				p, _ := b.Allow()
				b.Done(p, true)
			} else {
				b.Done(old, true)
			}
			fail()
			want := breaker.Open
			if fresh {
				want = breaker.Closed
			}
			if s := b.State(); s != want {
				t.Errorf("fresh success %v: state %v, want %v", fresh, s, want)
			}
		}
	})
}

// Wait: "An open one makes the call wait ... when the next probe round
// comes before maxWait ends". maxWait one nanosecond beyond the round:
// the call waits and gets the round's probe at exactly the round.
func TestAttackBreaker8WaitOneNanosecondMore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: b8Half})
		b.Trip(0)
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		p, err := b.Wait(context.Background(), 700*time.Millisecond+time.Nanosecond)
		if err != nil || !p.Probe() {
			t.Fatalf("Wait = %+v, %v; want the round's probe", p, err)
		}
		if d := time.Since(start); d != 700*time.Millisecond {
			t.Errorf("admitted after %v, want 700ms", d)
		}
		b.Done(p, true)
		if s := b.State(); s != breaker.Closed {
			t.Errorf("state %v after the probe succeeded", s)
		}
	})
}

// Fail: "retryAfter 0 is Done(p, false)" and a negative one is clamped to
// 0: a probe failed with a negative hint reopens for OpenFor (Rand 0.5).
func TestAttackBreaker8ProbeFailNegativeHint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: b8Half})
		b.Trip(0)
		time.Sleep(time.Second)
		p, err := b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("Allow = %+v, %v", p, err)
		}
		b.Fail(p, -time.Hour)
		s := b.Snapshot()
		if s.State != breaker.Open || s.HalfOpenIn != time.Second {
			t.Errorf("after Fail(probe, -1h): %+v, want open for 1s", s)
		}
	})
}

// Execute: "a panic in the closure is recorded as a failure and continues
// to unwind (it is never recovered)". A half-open breaker's probe run by
// Execute panics: the panic reaches the caller unchanged and the probe's
// failure reopens the breaker.
func TestAttackBreaker8ExecutePanicProbeReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{OpenFor: time.Second, Probes: 2, Rand: b8Half})
		b.Trip(0)
		time.Sleep(time.Second)
		sentinel := errors.New("boom")
		func() {
			defer func() {
				if r := recover(); r != sentinel {
					t.Errorf("recovered %v, want the closure's panic value", r)
				}
			}()
			_ = b.Execute(func() error { panic(sentinel) })
		}()
		s := b.Snapshot()
		if s.State != breaker.Open || s.HalfOpenIn != time.Second {
			t.Errorf("after a panicking probe: %+v, want open for 1s", s)
		}
	})
}

// OnStateChange: "called one at a time, in the order of the state
// changes", once per change. Under concurrent Allow/Done/Fail/Wait/Trip/
// Reset/State from many goroutines, the callbacks must form a chain (each
// from is the previous to, from Closed), never overlap, and end at the
// state the breaker reports once quiet.
func TestAttackBreaker8CallbackChainUnderStress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var events [][2]breaker.State
		var in atomic.Int32
		overlap := false
		b := b8New(t, breaker.Config{MinCalls: 3, OpenFor: 20 * time.Millisecond, Probes: 2, Window: 100 * time.Millisecond,
			ConsecutiveFailures: 2, ReleaseRate: 50,
			OnStateChange: func(from, to breaker.State) {
				if in.Add(1) != 1 {
					overlap = true
				}
				mu.Lock()
				events = append(events, [2]breaker.State{from, to})
				mu.Unlock()
				time.Sleep(time.Millisecond)
				in.Add(-1)
			}})
		var wg sync.WaitGroup
		for g := 0; g < 16; g++ {
			wg.Go(func() {
				r := rand.New(rand.NewPCG(uint64(g), 1))
				for i := 0; i < 300; i++ {
					switch r.IntN(10) {
					case 0:
						b.Trip(time.Duration(r.IntN(30)) * time.Millisecond)
					case 1:
						b.Reset()
					case 2:
						b.State()
					case 3, 4:
						p, err := b.Wait(context.Background(), time.Duration(r.IntN(100))*time.Millisecond)
						if err == nil {
							time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond)
							b.Done(p, r.IntN(2) == 0)
						}
					default:
						p, err := b.Allow()
						if err == nil {
							time.Sleep(time.Duration(r.IntN(5)) * time.Millisecond)
							if r.IntN(3) == 0 {
								b.Fail(p, time.Duration(r.IntN(30))*time.Millisecond)
							} else {
								b.Done(p, r.IntN(2) == 0)
							}
						}
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(10 * time.Second) // round timers armed for waiters that left fire now
		final := b.State()
		time.Sleep(time.Second) // the callbacks that State delivered end
		b.Reset()
		time.Sleep(time.Second)
		final2 := b.State()
		mu.Lock()
		defer mu.Unlock()
		if overlap {
			t.Errorf("two callbacks ran at once")
		}
		prev := breaker.Closed
		for i, e := range events {
			if e[0] != prev || e[0] == e[1] {
				t.Errorf("event %d %v->%v after %v: not a chain", i, e[0], e[1], prev)
				break
			}
			prev = e[1]
		}
		if prev != final2 {
			t.Errorf("last callback to %v, breaker reports %v (%d events; before Reset %v)", prev, final2, len(events), final)
		}
		t.Logf("%d callbacks", len(events))
	})
}

// MaxOpenFor "bounds the growth of the open period"; doc.go: "it doubles on
// every consecutive failed probe, up to MaxOpenFor". With Rand near 1 the
// ±20% jitter is applied after the cap: an open period of 1.2·MaxOpenFor.
// (Probe: the doc can be read either way; kept to record the behaviour.)
func TestAttackBreaker8MaxOpenForWithJitter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{OpenFor: time.Second, MaxOpenFor: 2 * time.Second, Probes: 1, Rand: func() float64 { return 0.999 }})
		b.Trip(0)
		for range 3 {
			time.Sleep(b.Snapshot().HalfOpenIn)
			p, err := b.Allow()
			if err != nil {
				t.Fatal(err)
			}
			b.Done(p, false)
		}
		t.Logf("open period after 3 failed probes with MaxOpenFor 2s: %v", b.Snapshot().HalfOpenIn)
	})
}

// Shared.ProbeRound: "false keeps the breaker open for another probe
// interval. It may do a short round trip". A round trip of 300 ms that
// refuses: the breaker must stay open about OpenFor (±20%) after the
// refusal, not OpenFor counted from before the ask; and the rejection's
// OpenError.Wait must say when it half-opens.
type b8SlowRefuse struct{ b8Shared }

func (*b8SlowRefuse) ProbeRound() bool { time.Sleep(300 * time.Millisecond); return false }

func TestAttackBreaker8SharedSlowRefusalInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: b8Half, Shared: &b8SlowRefuse{}})
		b.Trip(0)
		time.Sleep(time.Second)
		_, err := b.Allow() // asks the fleet: 300 ms, refused
		var oe *breaker.OpenError
		if !errors.As(err, &oe) {
			t.Fatalf("Allow = %v, want a rejection", err)
		}
		in := b.Snapshot().HalfOpenIn
		t.Logf("after the refusal: OpenError.Wait %v, HalfOpenIn %v", oe.Wait, in)
		// OpenError.Wait: "how long after the rejection the breaker
		// half-opens": read at the instant of the rejection, as HalfOpenIn.
		if oe.Wait != in {
			t.Errorf("rejection after a 300ms refused ask: OpenError.Wait %v, but the breaker half-opens %v after it (Snapshot.HalfOpenIn at the same instant)", oe.Wait, in)
		}
		if in < 800*time.Millisecond {
			t.Errorf("refused round: open for %v more, want another probe interval (OpenFor 1s ±20%%)", in)
		}
	})
}

// Wait: "A maxWait near the largest Duration means no bound". A breaker
// opened by a failure with a Retry-After near the largest Duration keeps
// such a call waiting (its round is beyond any other bound) and Reset
// releases it.
func TestAttackBreaker8HugeHintUnboundedWaiterReleasedByReset(t *testing.T) {
	for _, delay := range []time.Duration{0, time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) { b8HugeHint(t, delay) })
	}
}

func b8HugeHint(t *testing.T, delay time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		b := b8New(t, breaker.Config{ConsecutiveFailures: 1, Rand: b8Half})
		p, _ := b.Allow()
		b.Fail(p, time.Duration(1<<63-1))
		got := make(chan error, 1)
		go func() {
			time.Sleep(delay)
			p, err := b.Wait(context.Background(), time.Duration(1<<63-1))
			if err == nil {
				b.Done(p, true)
			}
			got <- err
		}()
		time.Sleep(time.Hour)
		if s := b.Snapshot(); s.Waiters != 1 || s.State != breaker.Open {
			t.Fatalf("after an hour: %+v, want open with the call waiting", s)
		}
		b.Reset()
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("waiting call after Reset: %v, want released", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("waiting call not released 10s after Reset")
		}
	})
}

// The trip rule against a model of doc.go's words: "After a failure, if
// the window holds at least MinCalls calls and failures >= FailureRatio·calls,
// or the current bucket alone does, the breaker trips to Open; so it does
// after ConsecutiveFailures failures in a row". Buckets are taken as
// aligned to New's instant. Random outcomes at random times; the model's
// verdict after every outcome must be the breaker's state (passes).
func TestAttackBreaker8TripRuleModel(t *testing.T) {
	const bucket = 250 * time.Millisecond
	for seed := uint64(0); seed < 300; seed++ {
		synctest.Test(t, func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 7))
			ratio := []float64{0.5, 0.25, 1, 0.34}[seed%4]
			minCalls := 1 + r.IntN(8)
			consec := r.IntN(5)
			start := time.Now()
			b := b8New(t, breaker.Config{Window: time.Second, Buckets: 4, MinCalls: minCalls, FailureRatio: ratio, ConsecutiveFailures: consec, Rand: b8Half})
			type ev struct {
				bucket int64
				fail   bool
			}
			var evs []ev
			run := 0
			for i := 0; i < 80; i++ {
				time.Sleep(time.Duration(r.IntN(120)) * time.Millisecond)
				fail := r.IntN(100) < 40
				p, err := b.Allow()
				if err != nil {
					t.Fatalf("seed %d step %d: rejected while the model says closed", seed, i)
				}
				b.Done(p, !fail)
				cur := int64(time.Since(start) / bucket)
				evs = append(evs, ev{cur, fail})
				want := breaker.Closed
				if fail {
					run++
					var wc, wf, bc, bf int
					for _, e := range evs {
						if e.bucket > cur-4 {
							wc++
							if e.fail {
								wf++
							}
						}
						if e.bucket == cur {
							bc++
							if e.fail {
								bf++
							}
						}
					}
					trips := func(c, f int) bool { return c >= minCalls && float64(f) >= ratio*float64(c) }
					if trips(wc, wf) || trips(bc, bf) || (consec > 0 && run >= consec) {
						want = breaker.Open
					}
				} else {
					run = 0
				}
				if got := b.State(); got != want {
					t.Fatalf("seed %d step %d (ratio %v MinCalls %d consec %d): state %v, model %v", seed, i, ratio, minCalls, consec, got, want)
				}
				if want == breaker.Open {
					return
				}
			}
		})
	}
}

// Config.ReleaseRate: "the most waiting calls per second released when the
// breaker closes". 300 waiting calls, ReleaseRate 20 and 400, random
// jitter: no second after the close (sliding, 1 ms steps) holds more
// releases than ReleaseRate plus one tick's worth (the pacer's slack).
func TestAttackBreaker8ReleaseRateSlidingBound(t *testing.T) {
	for _, rate := range []float64{20, 400} {
		synctest.Test(t, func(t *testing.T) {
			b := b8New(t, breaker.Config{Probes: 1, OpenFor: time.Second, ReleaseRate: rate})
			b.Trip(0)
			var mu sync.Mutex
			var times []time.Duration
			var closedAt time.Time
			var wg sync.WaitGroup
			for i := 0; i < 300; i++ {
				maxWait := time.Hour + time.Duration(i)*time.Second
				wg.Go(func() {
					p, err := b.Wait(context.Background(), maxWait)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					if p.Probe() {
						closedAt = time.Now()
					} else {
						times = append(times, time.Since(closedAt))
					}
					mu.Unlock()
					b.Done(p, true)
				})
			}
			wg.Wait()
			slack := max(1, int(rate/100)+1)
			worst, at := 0, time.Duration(0)
			for s := time.Duration(0); s < 20*time.Second; s += time.Millisecond {
				n := 0
				for _, x := range times {
					if x >= s && x < s+time.Second {
						n++
					}
				}
				if n > worst {
					worst, at = n, s
				}
			}
			t.Logf("rate %v: most releases in a second: %d (from %v)", rate, worst, at)
			if worst > int(rate)+slack {
				t.Errorf("rate %v: %d calls released in the second from %v", rate, worst, at)
			}
		})
	}
}
