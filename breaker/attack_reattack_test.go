// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package breaker_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Execute with an IsFailure that panics: the permit is given back (as a
// failure) and the panic goes on. A half-open breaker with one probe must
// not keep its probe slot forever.
func TestReattackExecuteIsFailurePanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{Probes: 1, OpenFor: time.Second, IsFailure: func(error) bool { panic("classifier") }})
		if err != nil {
			t.Fatal(err)
		}
		b.Trip(0)
		time.Sleep(2 * time.Second)
		func() {
			defer func() {
				if recover() == nil {
					t.Error("panic not propagated")
				}
			}()
			b.Execute(func() error { return errors.New("x") })
		}()
		// The probe counted as a failure: open again.
		if s := b.Snapshot(); s.State != breaker.Open {
			t.Errorf("state after a panicking IsFailure on the probe: %v", s.State)
		}
	})
}

type ratkRefuse struct{ asked int }

func (z *ratkRefuse) Outcome(bool)                        {}
func (z *ratkRefuse) ProbeRound() bool                    { z.asked++; return false }
func (z *ratkRefuse) StateChanged(from, to breaker.State) {}

// A probe round the fleet refuses waits another probe interval (OpenFor
// ±20%), not the Retry-After that set the open period again.
func TestReattackRefusedRoundWaitsOpenFor(t *testing.T) {
	for _, maxOpen := range []time.Duration{0, 8 * time.Second} {
		synctest.Test(t, func(t *testing.T) {
			sh := &ratkRefuse{}
			b, err := breaker.New(breaker.Config{OpenFor: time.Second, MaxOpenFor: maxOpen, Shared: sh})
			if err != nil {
				t.Fatal(err)
			}
			b.Trip(time.Hour)
			in := b.Snapshot().HalfOpenIn
			time.Sleep(in + time.Millisecond)
			synctest.Wait()
			if _, err := b.Allow(); err == nil {
				t.Fatal("admitted")
			}
			if sh.asked == 0 {
				t.Fatal("round not asked")
			}
			s := b.Snapshot()
			if s.State != breaker.Open || s.HalfOpenIn > 1200*time.Millisecond || s.HalfOpenIn < 700*time.Millisecond {
				t.Errorf("maxOpen %v: after a refused round: %+v (asked %d)", maxOpen, s, sh.asked)
			}
			// And the next refusal too.
			time.Sleep(s.HalfOpenIn + time.Millisecond)
			synctest.Wait()
			b.Allow()
			s = b.Snapshot()
			if s.State != breaker.Open || s.HalfOpenIn > 2400*time.Millisecond {
				t.Errorf("maxOpen %v: after a second refused round: %+v (asked %d)", maxOpen, s, sh.asked)
			}
			b.Reset()
		})
	}
}
