// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package breaker_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func atkTrip(b *breaker.Breaker) {
	p, _ := b.Allow()
	b.Done(p, false)
}

func TestAttackConfigDefaults(t *testing.T) {
	b := atkMust(t, breaker.Config{})
	c := b.Config()
	if c.FailureRatio != 0.5 || c.Window != 10*time.Second || c.Buckets != 10 || c.MinCalls != 20 || c.OpenFor != time.Second || c.Probes != 3 || c.MaxWaiters != 10000 || c.ConsecutiveFailures != 0 || c.MaxOpenFor != 0 || c.SlowCall != 0 {
		t.Errorf("defaults %+v", c)
	}
}

// The bucket alone trips: healthy past, then MinCalls failures in one bucket at >= ratio.
func TestAttackBucketAloneTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{Rand: atkHalf})
		for i := 0; i < 200; i++ {
			p, _ := b.Allow()
			b.Done(p, true)
		}
		time.Sleep(time.Second)
		for i := 0; i < 10; i++ {
			p, _ := b.Allow()
			b.Done(p, true)
		}
		for i := 0; i < 10; i++ {
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("tripped early at %d", i)
			}
			b.Done(p, false)
		}
		if b.State() != breaker.Open {
			t.Errorf("current bucket 10/20 failed, not open; %+v", b.Snapshot())
		}
	})
}

func TestAttackMaxOpenForDoubling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, MaxOpenFor: 5 * time.Second, Probes: 1, Rand: atkHalf})
		atkTrip(b)
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
		for i, w := range want {
			s := b.Snapshot()
			if s.HalfOpenIn != w {
				t.Errorf("round %d: HalfOpenIn %v want %v", i, s.HalfOpenIn, w)
			}
			time.Sleep(s.HalfOpenIn)
			p, err := b.Allow()
			if err != nil || !p.Probe() {
				t.Fatalf("round %d: %v", i, err)
			}
			b.Done(p, false)
		}
		// close, trip again: OpenFor again
		time.Sleep(b.Snapshot().HalfOpenIn)
		p, _ := b.Allow()
		b.Done(p, true)
		if b.State() != breaker.Closed {
			t.Fatalf("not closed")
		}
		atkTrip(b)
		if s := b.Snapshot(); s.HalfOpenIn != time.Second {
			t.Errorf("after close, trip opens for %v, want 1s", s.HalfOpenIn)
		}
	})
}

func TestAttackMaxOpenForHugeSaturates(t *testing.T) {
	for _, r := range []float64{0, 0.5, math.Nextafter(1, 0)} {
		synctest.Test(t, func(t *testing.T) {
			b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, MaxOpenFor: math.MaxInt64, Probes: 1, Rand: func() float64 { return r }})
			atkTrip(b)
			prev := time.Duration(0)
			for i := 0; i < 40; i++ {
				s := b.Snapshot()
				if s.State != breaker.Open || s.HalfOpenIn <= 0 {
					t.Fatalf("rand %v round %d: %+v", r, i, s)
				}
				if s.HalfOpenIn < prev {
					t.Errorf("rand %v round %d: open period shrank from %v to %v", r, i, prev, s.HalfOpenIn)
					return
				}
				prev = s.HalfOpenIn
				if s.HalfOpenIn > 100*time.Hour*24*365 {
					break // effectively until Reset
				}
				time.Sleep(s.HalfOpenIn)
				p, err := b.Allow()
				if err != nil || !p.Probe() {
					t.Fatalf("rand %v round %d: %v (state %v)", r, i, err, b.State())
				}
				b.Done(p, false)
			}
		})
	}
}

func TestAttackFailRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		r    float64
		ra   time.Duration
		want time.Duration
	}{
		{0, 5 * time.Second, 5 * time.Second},
		{0.5, 5 * time.Second, 6250 * time.Millisecond},
		{0, 100 * time.Millisecond, 800 * time.Millisecond}, // OpenFor jittered 0.8s dominates
	} {
		synctest.Test(t, func(t *testing.T) {
			b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Rand: func() float64 { return tc.r }})
			p, _ := b.Allow()
			b.Fail(p, tc.ra)
			s := b.Snapshot()
			if s.State != breaker.Open {
				t.Fatalf("not open")
			}
			if s.HalfOpenIn < tc.ra || s.HalfOpenIn > tc.ra*3/2 && s.HalfOpenIn > 1200*time.Millisecond {
				t.Errorf("r %v ra %v: HalfOpenIn %v out of [ra, 1.5ra]", tc.r, tc.ra, s.HalfOpenIn)
			}
			t.Logf("r %v ra %v: HalfOpenIn %v (guess %v)", tc.r, tc.ra, s.HalfOpenIn, tc.want)
		})
	}
}

func TestAttackFailNegativeRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Rand: atkHalf})
		p, _ := b.Allow()
		b.Fail(p, math.MinInt64)
		if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn != time.Second {
			t.Errorf("negative retryAfter: %+v", s)
		}
	})
}

func TestAttackTripOnOpenOnlyLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var changes [][2]breaker.State
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: 10 * time.Second, Rand: atkHalf, OnStateChange: func(f, to breaker.State) {
			mu.Lock()
			changes = append(changes, [2]breaker.State{f, to})
			mu.Unlock()
		}})
		b.Reset() // closed: nothing
		b.Trip(0)
		if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn != 10*time.Second {
			t.Errorf("trip: %+v", s)
		}
		time.Sleep(4 * time.Second)
		b.Trip(0)
		if s := b.Snapshot(); s.HalfOpenIn != 6*time.Second {
			t.Errorf("Trip(0) on open moved the round: %v", s.HalfOpenIn)
		}
		b.Trip(time.Second)
		if s := b.Snapshot(); s.HalfOpenIn != 6*time.Second {
			t.Errorf("Trip(1s) on open moved the round: %v", s.HalfOpenIn)
		}
		b.Trip(20 * time.Second)
		if s := b.Snapshot(); s.HalfOpenIn < 20*time.Second || s.HalfOpenIn > 30*time.Second {
			t.Errorf("Trip(20s) on open: %v", s.HalfOpenIn)
		}
		time.Sleep(b.Snapshot().HalfOpenIn)
		if b.State() != breaker.HalfOpen {
			t.Fatal("not half-open")
		}
		p, _ := b.Allow()
		b.Trip(0)
		if b.State() != breaker.Open {
			t.Errorf("Trip on half-open did not reopen")
		}
		b.Done(p, true) // stale
		if s := b.Snapshot(); s.State != breaker.Open {
			t.Errorf("stale probe changed state")
		}
		b.Reset()
		b.Reset()
		mu.Lock()
		defer mu.Unlock()
		want := [][2]breaker.State{{breaker.Closed, breaker.Open}, {breaker.Open, breaker.HalfOpen}, {breaker.HalfOpen, breaker.Open}, {breaker.Open, breaker.Closed}}
		if len(changes) != len(want) {
			t.Fatalf("changes %v", changes)
		}
		for i := range want {
			if changes[i] != want[i] {
				t.Errorf("changes %v want %v", changes, want)
			}
		}
	})
}

// A closed-state permit from before a trip/reset must not count in the new window.
func TestAttackStaleClosedPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{MinCalls: 1, Rand: atkHalf})
		p, _ := b.Allow()
		b.Trip(0)
		b.Reset()
		b.Done(p, false)
		if s := b.Snapshot(); s.State != breaker.Closed || s.Calls != 0 {
			t.Errorf("stale permit counted: %+v", s)
		}
		var z breaker.Permit
		b.Done(z, false)
		b.Fail(z, time.Hour)
		b.Cancel(z)
		if s := b.Snapshot(); s.State != breaker.Closed || s.Calls != 0 {
			t.Errorf("zero permit counted: %+v", s)
		}
		if z.Probe() {
			t.Errorf("zero permit is a probe")
		}
	})
}

func TestAttackExecute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errX := errors.New("x")
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 2, IsFailure: func(err error) bool { return err != errX }, Rand: atkHalf})
		for i := 0; i < 5; i++ {
			if err := b.Execute(func() error { return errX }); err != errX {
				t.Fatalf("err %v", err)
			}
		}
		if b.State() != breaker.Closed {
			t.Fatalf("IsFailure ignored")
		}
		func() {
			defer func() {
				if recover() != "boom" {
					t.Errorf("panic not re-raised")
				}
			}()
			b.Execute(func() error { panic("boom") })
		}()
		func() {
			defer func() { recover() }()
			b.Execute(func() error { panic(nil) })
		}()
		if b.State() != breaker.Open {
			t.Errorf("two panics (one panic(nil)) not two failures: %v %+v", b.State(), b.Snapshot())
		}
		called := false
		err := b.Execute(func() error { called = true; return nil })
		if called || !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("open Execute: called %v err %v", called, err)
		}
	})
}

func TestAttackSlowCallBoundary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, SlowCall: time.Second, Rand: atkHalf})
		p, _ := b.Allow()
		time.Sleep(time.Second - 1)
		b.Done(p, true)
		if b.State() != breaker.Closed {
			t.Fatalf("SlowCall-1ns counted slow")
		}
		p, _ = b.Allow()
		time.Sleep(time.Second)
		b.Done(p, true)
		if b.State() != breaker.Open {
			t.Fatalf("SlowCall counted not slow")
		}
		// slow probe reopens
		time.Sleep(b.Snapshot().HalfOpenIn)
		p, _ = b.Allow()
		if !p.Probe() {
			t.Fatal("not probe")
		}
		time.Sleep(time.Second)
		b.Done(p, true)
		if b.State() != breaker.Open {
			t.Errorf("slow probe did not reopen: %v", b.State())
		}
		// waited call measured from admission
		ch := make(chan breaker.Permit)
		go func() {
			p, err := b.Wait(context.Background(), 10*time.Second)
			if err != nil {
				t.Error(err)
			}
			ch <- p
		}()
		p = <-ch
		time.Sleep(500 * time.Millisecond)
		b.Done(p, true)
		if b.State() != breaker.HalfOpen {
			t.Errorf("waited probe counted slow: %v", b.State())
		}
	})
}

// New calls during release are not held back; Wait on closed admits at once.
func TestAttackReleaseNewCallsPass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1, ReleaseRate: 4, Rand: atkHalf})
		atkTrip(b)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var times []time.Duration
		start := time.Now()
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				times = append(times, time.Since(start))
				mu.Unlock()
				b.Done(p, true)
			}()
		}
		synctest.Wait()
		if s := b.Snapshot(); s.Waiters != 20 {
			t.Errorf("waiters %d", s.Waiters)
		}
		wg.Wait()
		mu.Lock()
		t.Logf("release times %v", times)
		mu.Unlock()
	})
}
