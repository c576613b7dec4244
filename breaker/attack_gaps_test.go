package breaker_test

import (
	"errors"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func agBrk(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func agOutcome(t *testing.T, b *breaker.Breaker, ok bool) {
	t.Helper()
	p, err := b.Allow()
	if err != nil {
		t.Fatalf("Allow: %v", err)
	}
	b.Done(p, ok)
}

// The run: n failures in a row trip, a success ends the run, the ratio
// and MinCalls do not matter.
func TestAttackGapsConsecutiveBasics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, n := range []int{1, 2, 3, 6} {
			b := agBrk(t, breaker.Config{ConsecutiveFailures: n, MinCalls: 1 << 30, FailureRatio: 1, Rand: func() float64 { return 0.5 }})
			// 99 successes first: a ratio far below 1.
			for range 99 {
				agOutcome(t, b, true)
			}
			for i := 1; i < n; i++ {
				agOutcome(t, b, false)
			}
			agOutcome(t, b, true) // ends the run
			for i := 1; i < n; i++ {
				agOutcome(t, b, false)
			}
			if s := b.State(); s != breaker.Closed {
				t.Errorf("n=%d: %v after n-1, success, n-1 failures", n, s)
			}
			agOutcome(t, b, false)
			if s := b.State(); s != breaker.Open {
				t.Errorf("n=%d: %v after n failures in a row", n, s)
			}
		}
	})
}

// Every state change ends the run, the close included; a stale permit's
// failure does not count.
func TestAttackGapsConsecutiveStateChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := agBrk(t, breaker.Config{ConsecutiveFailures: 3, MinCalls: 1 << 30, Probes: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
		agOutcome(t, b, false)
		agOutcome(t, b, false)
		stale, _ := b.Allow()
		b.Trip(0)
		b.Reset()
		agOutcome(t, b, false)
		b.Done(stale, false) // stale: ignored
		agOutcome(t, b, false)
		if s := b.State(); s != breaker.Closed {
			t.Errorf("%v: the run before Trip/Reset, or a stale permit, counted", s)
		}
		agOutcome(t, b, false)
		if s := b.State(); s != breaker.Open {
			t.Fatalf("%v after 3 in a row", s)
		}
		// Half-open, probe succeeds, closed: count from 0.
		time.Sleep(2 * time.Second)
		agOutcome(t, b, true)
		if s := b.State(); s != breaker.Closed {
			t.Fatalf("%v after the probe", s)
		}
		agOutcome(t, b, false)
		agOutcome(t, b, false)
		if s := b.State(); s != breaker.Closed {
			t.Errorf("%v: the run did not restart at the close", s)
		}
		agOutcome(t, b, false)
		if s := b.State(); s != breaker.Open {
			t.Errorf("%v after 3 in a row following a close", s)
		}
	})
}

// Slow successes are failures for the run; Fail's hint holds the open period.
func TestAttackGapsConsecutiveSlowAndHint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := agBrk(t, breaker.Config{ConsecutiveFailures: 2, MinCalls: 1 << 30, SlowCall: time.Second, Rand: func() float64 { return 0.5 }})
		for range 2 {
			p, _ := b.Allow()
			time.Sleep(time.Second)
			b.Done(p, true)
		}
		if s := b.State(); s != breaker.Open {
			t.Errorf("%v after 2 slow successes", s)
		}
		b2 := agBrk(t, breaker.Config{ConsecutiveFailures: 1, MinCalls: 1 << 30, Rand: func() float64 { return 0 }})
		p, _ := b2.Allow()
		b2.Fail(p, time.Hour)
		if s := b2.Snapshot(); s.State != breaker.Open || s.HalfOpenIn < time.Hour {
			t.Errorf("Fail(1h) trip: %+v", s)
		}
	})
}

// Limits: negative and above MaxUint32 are errors naming the field;
// MaxUint32 is accepted.
func TestAttackGapsConsecutiveLimits(t *testing.T) {
	for _, n := range []int{-1, math.MinInt, math.MaxUint32 + 1, math.MaxInt} {
		_, err := breaker.New(breaker.Config{ConsecutiveFailures: n})
		if err == nil || !strings.Contains(err.Error(), "ConsecutiveFailures") || !strings.HasPrefix(err.Error(), "breaker: invalid config: ") {
			t.Errorf("%d: %v", n, err)
		}
	}
	if _, err := breaker.New(breaker.Config{ConsecutiveFailures: math.MaxUint32}); err != nil {
		t.Errorf("MaxUint32: %v", err)
	}
}

// Concurrency: N goroutines each failing once trip a breaker of N in a row;
// with successes interleaved, no race, no panic.
func TestAttackGapsConsecutiveConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 64
		b := agBrk(t, breaker.Config{ConsecutiveFailures: n, MinCalls: 1 << 30})
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range n {
			wg.Go(func() {
				<-start
				p, err := b.Allow()
				if err != nil {
					t.Error(err)
					return
				}
				b.Done(p, false)
			})
		}
		close(start)
		wg.Wait()
		if s := b.State(); s != breaker.Open {
			t.Errorf("%v after %d concurrent failures", s, n)
		}
		b2 := agBrk(t, breaker.Config{ConsecutiveFailures: 5, MinCalls: 1 << 30})
		var trips atomic.Int64
		for i := range 16 {
			wg.Go(func() {
				for j := range 200 {
					err := b2.Execute(func() error {
						if (i+j)%8 == 0 {
							return nil
						}
						return errors.New("x")
					})
					var oe *breaker.OpenError
					if errors.As(err, &oe) {
						trips.Add(1)
						b2.Reset()
					}
				}
			})
		}
		wg.Wait()
		t.Logf("rejections %d", trips.Load())
	})
}

// A clock (Config.Now) that steps back by more than a window: failures in
// a row after the step are still failures in a row, and ConsecutiveFailures
// trips "whatever the ratio and MinCalls".
func TestAttackGapsConsecutiveClockStepsBack(t *testing.T) {
	for _, back := range []time.Duration{10 * time.Second, 15 * time.Second, time.Hour} {
		t.Run(back.String(), func(t *testing.T) {
			var now atomic.Int64
			t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
			clock := func() time.Time { return time.Unix(0, now.Load()) }
			now.Store(t0.UnixNano())
			b := agBrk(t, breaker.Config{ConsecutiveFailures: 3, MinCalls: 1 << 30, Now: clock})
			// A busy window: in every 1 s bucket a failure and a success.
			for i := range 10 {
				now.Store(t0.Add(time.Duration(i) * time.Second).UnixNano())
				agOutcome(t, b, false)
				agOutcome(t, b, true)
			}
			// The clock steps back (a wall clock set back by NTP, a VM
			// restored); then only failures, spread over 5 s.
			for i := range 1000 {
				now.Store(t0.Add(9*time.Second - back + time.Duration(i)*5*time.Millisecond).UnixNano())
				agOutcome(t, b, false)
				if b.State() == breaker.Open {
					if i+1 > 3 {
						t.Errorf("step back %v: tripped only after %d failures in a row (ConsecutiveFailures 3)", back, i+1)
					}
					return
				}
			}
			t.Errorf("step back %v: 1000 failures in a row over 5 s, breaker still %v (ConsecutiveFailures 3)", back, b.State())
		})
	}
}
