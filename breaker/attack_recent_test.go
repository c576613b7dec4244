// Black-box attack on the recent promises of ConsecutiveFailures, SlowCall
// and Wait (AREA recent).
package breaker_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Config.ConsecutiveFailures: "trips the breaker when that many
// closed-state failures come in a row ... A success ends the run; so does
// every state change". Cancel: "gives p back without an outcome": it is
// neither, so it must not end the run; SlowCall: a slow success "count[s]
// as a failure", so it extends the run.
func TestAttackRecentConsecutiveRunCancelAndSlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkRecentNew(t, breaker.Config{ConsecutiveFailures: 3, MinCalls: 1000, SlowCall: 100 * time.Millisecond, Window: time.Minute})
		fail := func() { atkRecentFail(t, b) }
		fail()
		p, _ := b.Allow()
		b.Cancel(p) // no outcome
		fail()
		if s := b.State(); s != breaker.Closed {
			t.Fatalf("tripped after 2 failures: %v", s)
		}
		p, _ = b.Allow()
		time.Sleep(100 * time.Millisecond) // exactly SlowCall: slow
		b.Done(p, true)
		if s := b.State(); s != breaker.Open {
			t.Errorf("failure, cancel, failure, slow success (a failure): state %v, want open (3 failures in a row)", s)
		}
	})
}

// Config.ConsecutiveFailures: "when that many closed-state failures come in
// a row, whatever the ratio and MinCalls": the run is not windowed, so three
// failures a minute apart (the window is 1 s) are still three in a row; and
// a Reset (a state change) starts the run from 0.
func TestAttackRecentConsecutiveRunOutlivesWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := atkRecentNew(t, breaker.Config{ConsecutiveFailures: 3, Window: time.Second, Buckets: 1})
		fail := func() { atkRecentFail(t, b) }
		fail()
		time.Sleep(time.Minute)
		fail()
		time.Sleep(time.Minute)
		fail()
		if s := b.State(); s != breaker.Open {
			t.Errorf("3 failures in a row, a minute apart: state %v, want open", s)
		}
		b.Reset()
		fail()
		fail()
		if s := b.State(); s != breaker.Closed {
			t.Errorf("2 failures after a Reset: state %v, want closed (the run starts from 0)", s)
		}
	})
}

// atkRecentNew returns a breaker of c, failing the test on an error.
func atkRecentNew(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// atkRecentFail records one failure through b.
func atkRecentFail(t *testing.T, b *breaker.Breaker) {
	t.Helper()
	p, err := b.Allow()
	if err != nil {
		t.Fatalf("Allow: %v", err)
	}
	b.Done(p, false)
}
