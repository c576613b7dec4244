package breaker_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// slowShared is a Shared whose ProbeRound blocks until release is closed
// (a fleet's round trip to Redis on a loaded machine), counting its calls.
type slowShared struct {
	release chan struct{}
	asked   atomic.Int64
}

func (s *slowShared) Outcome(bool) {}
func (s *slowShared) ProbeRound() bool {
	s.asked.Add(1)
	<-s.release
	return false
}
func (s *slowShared) StateChanged(from, to breaker.State) {}

// TestRoundTimerWaitsForSharedAsk: while one goroutine asks Shared for a
// probe round (a slow round trip), the round timer of a breaker with
// waiting calls does not spin: it leaves the round to the ask, which
// re-arms it when it is refused. The clock is read a bounded number of
// times while the ask blocks; a spinning timer (re-armed at 0 each time it
// finds the ask in progress) reads it without end, and the test then
// releases the ask to stop it. Run on synctest's clock.
func TestRoundTimerWaitsForSharedAsk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := &slowShared{release: make(chan struct{})}
		var reads atomic.Int64
		var once sync.Once
		const spin = 100_000
		b, err := breaker.New(breaker.Config{OpenFor: 100 * time.Millisecond, Shared: sh, Rand: func() float64 { return 0.5 },
			Now: func() time.Time {
				if reads.Add(1) == spin {
					once.Do(func() { close(sh.release) })
				}
				return time.Now()
			}})
		if err != nil {
			t.Fatal(err)
		}
		b.Trip(0)
		time.Sleep(150 * time.Millisecond) // the open period is over
		asked := make(chan struct{})
		go func() {
			defer close(asked)
			_, _ = b.Allow() // asks Shared, which blocks
		}()
		synctest.Wait()
		waited := make(chan error, 1)
		go func() {
			_, err := b.Wait(context.Background(), 10*time.Second) // a call waiting behind the breaker: its round is due
			waited <- err
		}()
		before := reads.Load()
		time.Sleep(time.Second) // the ask blocks for 1 s (unless a spin ended it)
		during := reads.Load() - before
		once.Do(func() { close(sh.release) })
		<-asked
		if during >= 1000 {
			t.Errorf("the clock was read %d times while Shared's ask blocked for 1 s: the round timer spins", during)
		}
		// The refused ask re-armed the round: the waiting call gets its
		// round (and is refused again, as ProbeRound says false) in time.
		time.Sleep(time.Second)
		if n := sh.asked.Load(); n < 2 {
			t.Errorf("Shared asked %d times; want the round re-armed after the refused ask", n)
		}
		b.Reset()
		if err := <-waited; err != nil {
			t.Errorf("the waiting call after Reset: %v", err)
		}
	})
}
