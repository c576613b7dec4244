// Black-box attacks on package breaker's public API (AREA brkapi): Execute,
// the two-step form, Snapshot, Trip/Reset, OnStateChange, Config, Shared.

package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func bkaHalf() float64 { return 0.5 }

func bkaNew(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return b
}

// bkaShared records every call of the Shared interface.
type bkaShared struct {
	mu       sync.Mutex
	outcomes []bool
	changes  []string
	asks     int
	answer   func(n int) bool // n: 1-based ask number
}

func (s *bkaShared) Outcome(ok bool) {
	s.mu.Lock()
	s.outcomes = append(s.outcomes, ok)
	s.mu.Unlock()
}

func (s *bkaShared) ProbeRound() bool {
	s.mu.Lock()
	s.asks++
	n := s.asks
	s.mu.Unlock()
	if s.answer == nil {
		return true
	}
	return s.answer(n)
}

func (s *bkaShared) StateChanged(from, to breaker.State) {
	s.mu.Lock()
	s.changes = append(s.changes, from.String()+">"+to.String())
	s.mu.Unlock()
}

func (s *bkaShared) snapshot() (outcomes []bool, changes []string, asks int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.outcomes), slices.Clone(s.changes), s.asks
}

// bkaSubprocess runs test name in a child process with ZZ_CHILD=name set and
// returns its combined output and whether it exited with success.
func bkaSubprocess(t *testing.T, name string) (string, bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "ZZ_CHILD="+name)
	out, err := cmd.CombinedOutput()
	return string(out), err == nil
}

// ---------------------------------------------------------------------------
// FINDING: a callback (OnStateChange, Shared.StateChanged) or
// Shared.ProbeRound that panics while the round timer starts a probe round
// for the waiting calls panics on the breaker's own timer goroutine: nobody
// can recover it, the program ends.
//
// New: "A Breaker that was built never fails or panics later (except by
// re-raising a closure's panic)." A panic re-raised on a goroutine of the
// breaker's own is not re-raised to any caller.

// errBkaReRaised is what the waiter of bkaChildRoundTimerPanic reports when
// the panic was re-raised to it.
var errBkaReRaised = errors.New("the panic was re-raised to the caller")

func bkaChildRoundTimerPanic(t *testing.T, which string) {
	synctest.Test(t, func(t *testing.T) {
		c := breaker.Config{OpenFor: time.Second, Rand: bkaHalf, Probes: 1}
		switch which {
		case "callback":
			c.OnStateChange = func(from, to breaker.State) {
				if to == breaker.HalfOpen {
					panic("bka callback panic")
				}
			}
		case "probe-round":
			var n atomic.Int32
			c.Shared = &bkaShared{answer: func(int) bool {
				if n.Add(1) == 1 {
					panic("bka fleet ProbeRound panic")
				}
				return true
			}}
		}
		b := bkaNew(t, c)
		b.Trip(0)
		done := make(chan error, 1)
		go func() {
			defer func() {
				// A panic re-raised to the caller is fine (the program
				// goes on): which goroutine starts the round, the timer's
				// or this caller's, follows the scheduler.
				if r := recover(); r != nil {
					done <- errBkaReRaised
				}
			}()
			p, err := b.Wait(context.Background(), 5*time.Second)
			if err == nil {
				b.Done(p, true)
			}
			done <- err
		}()
		time.Sleep(6 * time.Second)
		synctest.Wait()
		select {
		case err := <-done:
			t.Logf("waiter: %v", err)
			if err != nil && err != errBkaReRaised {
				return // the waiting call must still get its probe (the round asked again)
			}
		default:
			return
		}
		fmt.Println("ZZ-CHILD-SURVIVED")
	})
}

func TestAttackBrkAPIRoundTimerCallbackPanicRecovered(t *testing.T) {
	if os.Getenv("ZZ_CHILD") == t.Name() {
		bkaChildRoundTimerPanic(t, "callback")
		return
	}
	out, ok := bkaSubprocess(t, t.Name())
	if !ok || !strings.Contains(out, "ZZ-CHILD-SURVIVED") {
		i := strings.Index(out, "panic:")
		if i < 0 {
			i = 0
		}
		t.Errorf("an OnStateChange that panics on the probe round started by the round timer (a call waiting in Wait) ended the program:\n%.1500s", out[i:])
	}
}

func TestAttackBrkAPIRoundTimerProbeRoundPanicRecovered(t *testing.T) {
	if os.Getenv("ZZ_CHILD") == t.Name() {
		bkaChildRoundTimerPanic(t, "probe-round")
		return
	}
	out, ok := bkaSubprocess(t, t.Name())
	if !ok || !strings.Contains(out, "ZZ-CHILD-SURVIVED") {
		i := strings.Index(out, "panic:")
		if i < 0 {
			i = 0
		}
		t.Errorf("a Shared.ProbeRound that panics when the round timer asks it (a call waiting in Wait) ended the program:\n%.1500s", out[i:])
	}
}

// ---------------------------------------------------------------------------
// A callback that panics while another goroutine's state change is queued
// behind it: "the goroutine that made a change delivers it before returning
// unless another goroutine is already delivering, in which case that one
// delivers it"; Shared.StateChanged "is told every state change". The
// delivering goroutine panics out of its loop, so the queued change is
// told to nobody until some later state change.
func TestAttackBrkAPIQueuedChangeDeliveredWhenDelivererPanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		entered := make(chan struct{})
		unblock := make(chan struct{})
		var mu sync.Mutex
		var got []string
		sh := &bkaShared{}
		b := bkaNew(t, breaker.Config{OpenFor: time.Second, Rand: bkaHalf, Shared: sh,
			OnStateChange: func(from, to breaker.State) {
				mu.Lock()
				got = append(got, from.String()+">"+to.String())
				mu.Unlock()
				if to == breaker.Open {
					close(entered)
					<-unblock
					panic("bka callback")
				}
			}})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { recover() }()
			b.Trip(0) // delivers closed>open, blocks in the callback, then panics
		}()
		<-entered
		b.Reset() // open>closed: queued; the other goroutine is delivering
		close(unblock)
		wg.Wait()
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		_, shChanges, _ := sh.snapshot()
		if b.State() != breaker.Closed {
			t.Fatalf("state %v, want closed", b.State())
		}
		if !slices.Contains(got, "open>closed") || !slices.Contains(shChanges, "open>closed") {
			t.Errorf("the breaker is closed, but its change open>closed was never delivered: OnStateChange saw %q, Shared.StateChanged saw %q (the goroutine that was delivering panicked in the previous callback; Reset returned without delivering)", got, shChanges)
		}
	})
}

// ---------------------------------------------------------------------------
// Shared, recorded: Outcome for every closed-state outcome (and no other),
// StateChanged like OnStateChange, ProbeRound false keeps the breaker open
// for another probe interval, true half-opens it.
func TestAttackBrkAPISharedRecorded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var onChange []string
		sh := &bkaShared{answer: func(n int) bool { return n >= 2 }}
		b := bkaNew(t, breaker.Config{MinCalls: 4, OpenFor: time.Second, Rand: bkaHalf, Probes: 2, Shared: sh,
			OnStateChange: func(from, to breaker.State) { onChange = append(onChange, from.String()+">"+to.String()) }})
		// 2 successes, 2 failures: trips on the 4th (2/4 >= 0.5).
		for _, ok := range []bool{true, true, false, false} {
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("Allow: %v", err)
			}
			b.Done(p, ok)
		}
		if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn != time.Second || s.Calls != 0 || s.Failures != 0 {
			t.Fatalf("after trip: %+v, want open, HalfOpenIn 1s, no counts", s)
		}
		time.Sleep(time.Second)
		// State must not move with a Shared fleet.
		if s := b.State(); s != breaker.Open {
			t.Errorf("State with Shared after the open period: %v, want open (waits for a call)", s)
		}
		if s := b.Snapshot(); s.HalfOpenIn != 0 {
			t.Errorf("Snapshot.HalfOpenIn after the period: %v", s.HalfOpenIn)
		}
		_, err := b.Allow() // ask 1: refused
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.State != breaker.Open || oe.Wait != time.Second {
			t.Fatalf("refused round: %v, want open error with Wait 1s", err)
		}
		time.Sleep(999 * time.Millisecond)
		if _, err := b.Allow(); err == nil {
			t.Fatalf("admitted before the next interval")
		}
		time.Sleep(time.Millisecond)
		p1, err := b.Allow() // ask 2: granted
		if err != nil || !p1.Probe() {
			t.Fatalf("granted round: %v probe=%v", err, p1.Probe())
		}
		p2, err := b.Allow()
		if err != nil || !p2.Probe() {
			t.Fatalf("second probe: %v", err)
		}
		if _, err := b.Allow(); err == nil {
			t.Fatalf("third call admitted with Probes 2")
		} else if errors.As(err, &oe); oe.State != breaker.HalfOpen || oe.Wait != 0 {
			t.Errorf("half-open rejection: %+v", oe)
		}
		b.Done(p1, true)
		b.Done(p2, true)
		if s := b.State(); s != breaker.Closed {
			t.Errorf("2 successful probes: %v, want closed", s)
		}
		// Closed-state outcomes after the close are told too.
		p, _ := b.Allow()
		b.Done(p, true)
		outs, changes, asks := sh.snapshot()
		t.Logf("outcomes %v changes %q asks %d onChange %q", outs, changes, asks, onChange)
		if !slices.Equal(outs, []bool{true, true, false, false, true}) {
			t.Errorf("Shared.Outcome saw %v, want the 4 closed-state outcomes", outs)
		}
		if !slices.Equal(changes, onChange) {
			t.Errorf("Shared.StateChanged %q != OnStateChange %q", changes, onChange)
		}
		if asks != 2 {
			t.Errorf("ProbeRound asked %d times, want 2", asks)
		}
	})
}

// Execute: a panic is a failure and unwinds; a value is returned through a
// captured variable; nested Execute counts both calls.
func TestAttackBrkAPIExecuteNestedAndPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := bkaNew(t, breaker.Config{MinCalls: 100, OpenFor: time.Second, Rand: bkaHalf, Probes: 1})
		var v int
		err := b.Execute(func() error {
			return b.Execute(func() error { v = 42; return nil })
		})
		if err != nil || v != 42 {
			t.Fatalf("nested: %v %d", err, v)
		}
		func() {
			defer func() {
				if r := recover(); r != "bka" {
					t.Errorf("recovered %v", r)
				}
			}()
			_ = b.Execute(func() error {
				return b.Execute(func() error { panic("bka") })
			})
		}()
		if s := b.Snapshot(); s.Calls != 4 || s.Failures != 2 {
			t.Errorf("after 2 nested successes and a nested panic: %+v, want 4 calls, 2 failures", s)
		}
		// Half-open with 1 probe: a nested Execute is rejected, the outer is the probe.
		b.Trip(0)
		time.Sleep(time.Second)
		inner := b.Execute(func() error {
			return b.Execute(func() error { return nil })
		})
		if !errors.Is(inner, breaker.ErrOpen) {
			t.Errorf("inner Execute with the probe taken: %v, want ErrOpen", inner)
		}
		if s := b.State(); s != breaker.Open {
			t.Errorf("outer probe returned the inner rejection (a failure): state %v, want open", s)
		}
	})
}

// Fail's hint: open period at least the hint, spread up to half again.
func TestAttackBrkAPIFailHintSpread(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999999} {
		synctest.Test(t, func(t *testing.T) {
			b := bkaNew(t, breaker.Config{MinCalls: 1, OpenFor: time.Second, Rand: func() float64 { return r }})
			p, _ := b.Allow()
			b.Fail(p, 10*time.Second)
			s := b.Snapshot()
			lo, hi := 10*time.Second, 15*time.Second
			if s.State != breaker.Open || s.HalfOpenIn < lo || s.HalfOpenIn > hi {
				t.Errorf("rand %v: %+v, want open for [10s, 15s]", r, s)
			}
			// Probe failure with a hint smaller than the interval: interval wins.
			time.Sleep(s.HalfOpenIn)
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("probe: %v", err)
			}
			b.Fail(p, time.Millisecond)
			if s := b.Snapshot(); s.HalfOpenIn < 800*time.Millisecond || s.HalfOpenIn > 1200*time.Millisecond {
				t.Errorf("rand %v: a 1ms hint on a probe: %v", r, s.HalfOpenIn)
			}
		})
	}
}

// Done/Cancel with zero and stale permits; Cancel frees a probe slot; a
// probe of an earlier round given back after Trip/Reset changes nothing.
func TestAttackBrkAPIStaleAndZeroPermits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var changes []string
		b := bkaNew(t, breaker.Config{MinCalls: 1, OpenFor: time.Second, Rand: bkaHalf, Probes: 2,
			OnStateChange: func(f, to breaker.State) { changes = append(changes, f.String()+">"+to.String()) }})
		b.Done(breaker.Permit{}, false)
		b.Fail(breaker.Permit{}, time.Hour)
		b.Cancel(breaker.Permit{})
		if s := b.Snapshot(); s.Calls != 0 || s.State != breaker.Closed {
			t.Fatalf("zero permits counted: %+v", s)
		}
		old, _ := b.Allow()
		b.Trip(0)
		b.Reset()
		b.Done(old, false) // stale closed permit
		if s := b.Snapshot(); s.State != breaker.Closed || s.Calls != 0 {
			t.Fatalf("stale permit counted: %+v", s)
		}
		b.Trip(0)
		time.Sleep(time.Second)
		p1, _ := b.Allow()
		p2, _ := b.Allow()
		if !p1.Probe() || !p2.Probe() {
			t.Fatal("no probes")
		}
		b.Cancel(p1)
		p3, err := b.Allow()
		if err != nil || !p3.Probe() {
			t.Fatalf("Cancel did not free the probe slot: %v", err)
		}
		b.Trip(0) // reopens: p2, p3 stale
		b.Done(p2, true)
		b.Done(p3, true)
		b.Cancel(p2)
		if s := b.Snapshot(); s.State != breaker.Open {
			t.Fatalf("stale probes moved the breaker: %+v", s)
		}
		time.Sleep(time.Second)
		q1, _ := b.Allow()
		b.Reset() // round in progress closed
		b.Fail(q1, time.Hour)
		if s := b.State(); s != breaker.Closed {
			t.Errorf("a probe of the round Reset ended reopened it: %v", s)
		}
		want := []string{"closed>open", "open>closed", "closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>closed"}
		if !slices.Equal(changes, want) {
			t.Errorf("changes %q, want %q", changes, want)
		}
	})
}

// Snapshot.Waiters and HalfOpenIn while calls wait; Trip on an open breaker
// moves the round later, and the waiters stay; Reset releases them.
func TestAttackBrkAPISnapshotWaitersTripReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := bkaNew(t, breaker.Config{OpenFor: time.Second, Rand: bkaHalf, Probes: 1, ReleaseRate: -1, MaxWaiters: 3})
		b.Trip(0)
		res := make(chan error, 5)
		for range 4 {
			go func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err == nil {
					if p.Probe() {
						b.Done(p, true)
					} else {
						b.Done(p, true)
					}
				}
				res <- err
			}()
		}
		synctest.Wait()
		// One was rejected at once (MaxWaiters 3).
		if err := <-res; !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("4th waiter: %v", err)
		}
		b.Trip(10 * time.Second) // rand 0.5: 12.5 s
		s := b.Snapshot()
		if s.State != breaker.Open || s.Waiters != 3 || s.HalfOpenIn != 12500*time.Millisecond {
			t.Errorf("after Trip(10s) on open: %+v, want open, 3 waiters, 12.5s", s)
		}
		time.Sleep(12 * time.Second)
		synctest.Wait()
		if s := b.Snapshot(); s.State != breaker.Open || s.Waiters != 3 {
			t.Errorf("before the moved round: %+v", s)
		}
		b.Reset()
		for range 3 {
			if err := <-res; err != nil {
				t.Errorf("waiter after Reset: %v", err)
			}
		}
		if s := b.Snapshot(); s.Waiters != 0 || s.State != breaker.Closed || s.Calls != 3 {
			t.Errorf("after release: %+v, want closed, 3 calls, 0 waiters", s)
		}
	})
}

// Config fills the defaults.
func TestAttackBrkAPIConfigDefaults(t *testing.T) {
	b := bkaNew(t, breaker.Config{})
	c := b.Config()
	if c.FailureRatio != 0.5 || c.Window != 10*time.Second || c.Buckets != 10 || c.MinCalls != 20 ||
		c.OpenFor != time.Second || c.Probes != 3 || c.MaxWaiters != 10000 || c.ConsecutiveFailures != 0 ||
		c.SlowCall != 0 || c.MaxOpenFor != 0 {
		t.Errorf("Config() = %+v", c)
	}
}

// ConsecutiveFailures and SlowCall together through Execute.
func TestAttackBrkAPIConsecutiveSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := bkaNew(t, breaker.Config{ConsecutiveFailures: 3, SlowCall: time.Second, OpenFor: time.Second, Rand: bkaHalf})
		for i := range 3 {
			if s := b.State(); s != breaker.Closed {
				t.Fatalf("opened after %d slow calls", i)
			}
			_ = b.Execute(func() error { time.Sleep(time.Second); return nil })
		}
		if s := b.State(); s != breaker.Open {
			t.Errorf("3 slow successes in a row with ConsecutiveFailures 3: %v", s)
		}
		time.Sleep(time.Second)
		// A probe just under SlowCall closes it after 3 probes.
		for range 3 {
			_ = b.Execute(func() error { time.Sleep(999 * time.Millisecond); return nil })
		}
		if s := b.State(); s != breaker.Closed {
			t.Errorf("3 probes under SlowCall: %v, want closed", s)
		}
	})
}

// bkaPanicShared's StateChanged panics on its first call.
type bkaPanicShared struct{ n atomic.Int32 }

func (s *bkaPanicShared) Outcome(bool)     {}
func (s *bkaPanicShared) ProbeRound() bool { return true }
func (s *bkaPanicShared) StateChanged(from, to breaker.State) {
	if s.n.Add(1) == 1 {
		panic("bka fleet StateChanged")
	}
}

// Config.OnStateChange "is called after each state change": a Shared whose
// StateChanged panics (re-raised to the caller, fine) also costs the
// user's OnStateChange that change.
func TestAttackBrkAPISharedPanicStillTellsOnStateChange(t *testing.T) {
	var got []string
	b := bkaNew(t, breaker.Config{Shared: &bkaPanicShared{},
		OnStateChange: func(from, to breaker.State) { got = append(got, from.String()+">"+to.String()) }})
	func() {
		defer func() { recover() }()
		b.Trip(0)
	}()
	b.Reset()
	if want := []string{"closed>open", "open>closed"}; !slices.Equal(got, want) {
		t.Errorf("OnStateChange saw %q, want %q (Shared.StateChanged panicked on closed>open)", got, want)
	}
}
