// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Wait whose maxWait ends exactly when the round comes.
func TestAttackWaitExactBoundary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Rand: atkHalf})
		atkTrip(b)
		start := time.Now()
		p, err := b.Wait(context.Background(), time.Second)
		el := time.Since(start)
		t.Logf("maxWait == round: p.Probe=%v err=%v after %v", p.Probe(), err, el)
		if err != nil && el != 0 {
			t.Errorf("waited %v and then was rejected (%v): the round did not come before maxWait ended, so it should be rejected at once", el, err)
		}
		if err == nil {
			b.Done(p, true)
		}
	})
}

// A waiter whose maxWait passes while open gets Open and the remaining wait.
func TestAttackWaitTimeoutError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1, Rand: atkHalf})
		atkTrip(b)
		// first waiter (the most time left) takes the single probe at 1s and holds it
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			p, err := b.Wait(context.Background(), 5*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(3 * time.Second)
			b.Done(p, false)
		}()
		synctest.Wait()
		start := time.Now()
		_, err := b.Wait(context.Background(), 2*time.Second)
		var oe *breaker.OpenError
		if !errors.As(err, &oe) {
			t.Fatalf("err %v", err)
		}
		if time.Since(start) != 2*time.Second {
			t.Errorf("gave up after %v", time.Since(start))
		}
		if oe.State != breaker.HalfOpen || oe.Wait != 0 {
			t.Errorf("gave up in half-open with probe taken: %+v %q", oe, oe.Error())
		}
		t.Logf("half-open timeout: %q", oe.Error())
	})
}

// Negative ReleaseRate releases every waiting call at once.
func TestAttackReleaseAllAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1, ReleaseRate: -1, Rand: atkHalf})
		atkTrip(b)
		var mu sync.Mutex
		var times []time.Duration
		start := time.Now()
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
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
		wg.Wait()
		for _, x := range times {
			if x != time.Second {
				t.Errorf("released at %v, want all at 1s", x)
				break
			}
		}
	})
}

// Default ReleaseRate: the rate before the trip.
func TestAttackReleaseDefaultRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: atkHalf, MinCalls: 100})
		// 100 calls/s for 10s, all succeed, then failures within one bucket trip it.
		for s := 0; s < 10; s++ {
			for i := 0; i < 100; i++ {
				p, _ := b.Allow()
				b.Done(p, true)
				time.Sleep(10 * time.Millisecond)
			}
		}
		for i := 0; i < 100 && b.State() == breaker.Closed; i++ {
			p, _ := b.Allow()
			b.Done(p, false)
			time.Sleep(10 * time.Millisecond)
		}
		if b.State() != breaker.Open {
			t.Fatalf("not open %+v", b.Snapshot())
		}
		var mu sync.Mutex
		var times []time.Duration
		start := time.Now()
		var wg sync.WaitGroup
		for i := 0; i < 400; i++ {
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
		wg.Wait()
		// count per 500ms after close
		counts := map[int]int{}
		for _, x := range times {
			counts[int(x/(500*time.Millisecond))]++
		}
		t.Logf("released per 500ms slot: %v", counts)
	})
}

// Failures during release: Probes failures re-trip; unreleased go back to waiting.
func TestAttackReleaseRetrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var changes []string
		b := atkMust(t, breaker.Config{ConsecutiveFailures: 0, OpenFor: time.Second, Probes: 2, ReleaseRate: 8, Rand: atkHalf, OnStateChange: func(f, to breaker.State) {
			mu.Lock()
			changes = append(changes, f.String()+">"+to.String())
			mu.Unlock()
		}})
		b.Trip(0)
		start := time.Now()
		var wg sync.WaitGroup
		var got, failed int
		var failedErrs []error
		for i := 0; i < 30; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := b.Wait(context.Background(), 20*time.Second)
				mu.Lock()
				if err != nil {
					failed++
					failedErrs = append(failedErrs, err)
					mu.Unlock()
					return
				}
				got++
				n := got
				mu.Unlock()
				// probes (first 2) succeed; next 2 released fail; rest succeed
				if n == 3 || n == 4 {
					b.Done(p, false)
				} else {
					b.Done(p, true)
				}
			}()
		}
		wg.Wait()
		mu.Lock()
		t.Logf("changes %v; got %d failed %d; end %v; errs %v", changes, got, failed, time.Since(start), failedErrs)
		mu.Unlock()
	})
}

// Concurrency stress under -race with every method.
func TestAttackStress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{MinCalls: 5, OpenFor: 100 * time.Millisecond, Probes: 2, Window: time.Second, MaxWaiters: 50, ConsecutiveFailures: 3, SlowCall: 50 * time.Millisecond, OnStateChange: func(f, to breaker.State) {}})
		var wg sync.WaitGroup
		for g := 0; g < 40; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 200; i++ {
					var p breaker.Permit
					var err error
					switch (g + i) % 3 {
					case 0:
						p, err = b.Allow()
					case 1:
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*50*time.Millisecond)
						p, err = b.Wait(ctx, time.Duration(i%5)*100*time.Millisecond)
						cancel()
					case 2:
						_ = b.Execute(func() error {
							time.Sleep(time.Duration(i%4) * 20 * time.Millisecond)
							if (g*i)%3 == 0 {
								return errors.New("x")
							}
							return nil
						})
						continue
					}
					if err != nil {
						if !errors.Is(err, breaker.ErrOpen) {
							t.Errorf("err %v", err)
						}
						time.Sleep(10 * time.Millisecond)
						continue
					}
					time.Sleep(time.Duration(i%3) * 10 * time.Millisecond)
					switch (g * i) % 5 {
					case 0:
						b.Done(p, false)
					case 1:
						b.Fail(p, 30*time.Millisecond)
					case 2:
						b.Cancel(p)
					default:
						b.Done(p, true)
					}
					if i%50 == 0 && g == 0 {
						b.Trip(0)
					}
					if i%70 == 0 && g == 1 {
						b.Reset()
					}
					_ = b.Snapshot()
				}
			}()
		}
		wg.Wait()
		time.Sleep(time.Minute)
		if s := b.Snapshot(); s.Waiters != 0 {
			t.Errorf("waiters left: %+v", s)
		}
		b.Reset()
		p, err := b.Allow()
		if err != nil {
			t.Errorf("after Reset: %v", err)
		}
		b.Done(p, true)
	})
}
