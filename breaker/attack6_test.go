// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package breaker_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Execute "gives the permit back on every path": a panicking IsFailure
// must not leave a probe slot held forever.
func TestAttackExecuteIsFailurePanicHoldsProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var boom atomic.Bool
		b := atkMust(t, breaker.Config{OpenFor: time.Second, Probes: 1, Rand: atkHalf, IsFailure: func(err error) bool {
			if boom.Load() {
				panic("isfailure")
			}
			return err != nil
		}})
		b.Trip(0)
		time.Sleep(time.Second)
		boom.Store(true)
		func() {
			defer func() { recover() }()
			b.Execute(func() error { return errors.New("x") })
		}()
		boom.Store(false)
		time.Sleep(time.Hour)
		_, err := b.Allow()
		var oe *breaker.OpenError
		if errors.As(err, &oe) && oe.State == breaker.HalfOpen {
			t.Errorf("an hour after Execute's IsFailure panicked in a probe, the breaker still rejects with %q: the probe permit was never given back", err)
		}
	})
}

type atkShared struct{ allow atomic.Bool }

func (s *atkShared) Outcome(bool)                        {}
func (s *atkShared) ProbeRound() bool                    { return s.allow.Load() }
func (s *atkShared) StateChanged(from, to breaker.State) {}

// Shared.ProbeRound false "keeps the breaker open for another probe interval" (OpenFor).
func TestAttackSharedRefusalInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := &atkShared{}
		b := atkMust(t, breaker.Config{OpenFor: time.Second, Rand: atkHalf, Shared: sh, ConsecutiveFailures: 1})
		p, _ := b.Allow()
		b.Fail(p, 60*time.Second)
		s := b.Snapshot()
		t.Logf("after Fail(60s): %+v", s)
		time.Sleep(s.HalfOpenIn)
		_, err := b.Allow() // refused by the fleet
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.State != breaker.Open {
			t.Fatalf("%v", err)
		}
		s = b.Snapshot()
		t.Logf("after refusal: %+v, err %q", s, err)
		if s.HalfOpenIn > 1200*time.Millisecond {
			t.Errorf("after a refused round the breaker stays open %v, not another probe interval (OpenFor 1s ±20%%)", s.HalfOpenIn)
		}
	})
}
