// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Waiting calls get the round's probes first, even against an Allow at the round's instant.
func TestAttackWaiterBeatsAllowAtRound(t *testing.T) {
	for i := 0; i < 20; i++ {
		synctest.Test(t, func(t *testing.T) {
			b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: atkHalf})
			b.Trip(0)
			got := make(chan breaker.Permit, 1)
			go func() {
				p, err := b.Wait(context.Background(), 5*time.Second)
				if err != nil {
					got <- breaker.Permit{}
					return
				}
				got <- p
			}()
			synctest.Wait()
			time.Sleep(time.Second)
			p, err := b.Allow()
			if err == nil {
				t.Errorf("iter %d: Allow at the round's instant took the probe (probe=%v) ahead of the waiting call", i, p.Probe())
				b.Done(p, true)
			}
			wp := <-got
			if wp.Probe() {
				b.Done(wp, true)
			} else {
				b.Cancel(wp)
			}
		})
	}
}

// State at the round's instant moving to half-open must still give the waiter the probe.
func TestAttackWaiterBeatsStateAtRound(t *testing.T) {
	for i := 0; i < 20; i++ {
		synctest.Test(t, func(t *testing.T) {
			b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: atkHalf})
			b.Trip(0)
			got := make(chan error, 1)
			go func() {
				p, err := b.Wait(context.Background(), 5*time.Second)
				if err == nil {
					b.Done(p, true)
				}
				got <- err
			}()
			synctest.Wait()
			time.Sleep(time.Second)
			_ = b.State()
			_, _ = b.Allow() // may take it if the waiter didn't
			if err := <-got; err != nil {
				t.Errorf("iter %d: waiter got %v", i, err)
			}
		})
	}
}

// Callbacks: one at a time, in order, reentrant calls allowed. (It hung
// once for the attack that wrote it: it held its own mutex while calling a
// breaker method, which delivered a callback that took the same mutex.)
func TestAttackCallbacksOrderReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inCb atomic.Int32
		var mu sync.Mutex
		var seq []string
		var b *breaker.Breaker
		b = atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: atkHalf, OnStateChange: func(f, to breaker.State) {
			if inCb.Add(1) != 1 {
				t.Errorf("concurrent callbacks")
			}
			mu.Lock()
			seq = append(seq, fmt.Sprintf("%v>%v", f, to))
			n := len(seq)
			mu.Unlock()
			if to == breaker.Open && n < 6 {
				b.Reset() // reentrant
				_ = b.Snapshot()
			}
			time.Sleep(time.Millisecond)
			inCb.Add(-1)
		}})
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					if (g+i)%2 == 0 {
						b.Trip(0)
					} else {
						b.Reset()
					}
					time.Sleep(time.Duration(g) * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		time.Sleep(time.Second)
		// State may deliver a callback still due, on this goroutine: read
		// it before taking mu, which the callback takes.
		st := b.State().String()
		mu.Lock()
		defer mu.Unlock()
		prev := "closed"
		for i, s := range seq {
			var f, to string
			fmt.Sscanf(s, "%s", &f)
			for j := range s {
				if s[j] == '>' {
					f, to = s[:j], s[j+1:]
				}
			}
			if f != prev {
				t.Errorf("callback %d %q does not follow %q: %v", i, s, prev, seq)
				break
			}
			prev = to
		}
		if prev != st {
			t.Errorf("last callback to %q, state %q", prev, st)
		}
	})
}

func TestAttackSnapshotOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{MinCalls: 3, Rand: atkHalf})
		for i := 0; i < 3; i++ {
			atkTrip(b)
		}
		s := b.Snapshot()
		if s.State != breaker.Open || s.Calls != 0 || s.Failures != 0 {
			t.Errorf("open snapshot %+v", s)
		}
		time.Sleep(s.HalfOpenIn)
		s = b.Snapshot()
		if s.State != breaker.HalfOpen || s.HalfOpenIn != 0 || s.Calls != 0 {
			t.Errorf("half-open snapshot %+v", s)
		}
	})
}

// A waiter that gives up during the release gets State Closed, Wait 0, its own message.
func TestAttackGiveUpDuringRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 1, ReleaseRate: 1, Rand: atkHalf})
		b.Trip(0)
		var wg sync.WaitGroup
		errs := make(chan error, 10)
		for i := 0; i < 5; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p, err := b.Wait(context.Background(), 2500*time.Millisecond)
				if err != nil {
					errs <- err
					return
				}
				b.Done(p, true)
			}()
		}
		wg.Wait()
		close(errs)
		n := 0
		for err := range errs {
			n++
			var oe *breaker.OpenError
			if !errors.As(err, &oe) {
				t.Fatalf("%v", err)
			}
			if oe.State != breaker.Closed || oe.Wait != 0 || oe.RetryAfter() != 0 {
				t.Errorf("gave up in release: %+v %q", oe, oe.Error())
			}
			if n == 1 {
				t.Logf("message %q", oe.Error())
			}
		}
		if n == 0 {
			t.Errorf("no waiter gave up")
		}
	})
}

// Half-open with a free probe: Wait gets it at once. Cancel of a probe frees the slot.
func TestAttackHalfOpenWaitAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 2, Rand: atkHalf})
		b.Trip(0)
		time.Sleep(time.Second)
		start := time.Now()
		p1, err := b.Wait(context.Background(), time.Millisecond)
		if err != nil || !p1.Probe() || time.Since(start) != 0 {
			t.Fatalf("wait in half-open: %v", err)
		}
		p2, _ := b.Allow()
		if !p2.Probe() {
			t.Fatal("p2")
		}
		if _, err := b.Allow(); err == nil {
			t.Fatal("third probe")
		}
		b.Cancel(p2)
		p3, err := b.Allow()
		if err != nil || !p3.Probe() {
			t.Fatalf("after Cancel: %v", err)
		}
		b.Done(p1, true)
		if b.State() != breaker.HalfOpen {
			t.Errorf("closed after 1 of 2 probes")
		}
		b.Done(p3, true)
		if b.State() != breaker.Closed {
			t.Errorf("not closed after 2 successes (1 cancelled): %v", b.State())
		}
	})
}

// Cancel of every probe: the round goes on, not stuck.
func TestAttackCancelAllProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 2, Rand: atkHalf})
		b.Trip(0)
		time.Sleep(time.Second)
		for r := 0; r < 5; r++ {
			p1, _ := b.Allow()
			p2, _ := b.Allow()
			b.Cancel(p1)
			b.Cancel(p2)
		}
		p1, _ := b.Allow()
		p2, _ := b.Allow()
		b.Done(p1, true)
		b.Done(p2, true)
		if b.State() != breaker.Closed {
			t.Errorf("state %v", b.State())
		}
	})
}
