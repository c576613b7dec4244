package grpcretry_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// anyBudget grants every retry and hedge.
type anyBudget struct{}

func (anyBudget) Deposit()       {}
func (anyBudget) Withdraw() bool { return true }

// TestHedgeHeldRaceLooksAgain, as httpretry's: a slow call (1 s) that
// reaches its delay among a burst of queued ones (55 ms each) is held back
// by the due-share bound (more than 5 races in flight past their delay),
// but gets its hedge once the burst has cleared, a delay later, instead of
// taking its whole second. 300 calls a second of 10 ms keep a window of
// races. The server's calls come in a known order: 600 background calls,
// the burst's 10, the slow one, the burst's 5 hedges (the floor), the slow
// call's hedge.
func TestHedgeHeldRaceLooksAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			switch {
			case i >= 600 && i < 610, i >= 611 && i < 616:
				return legAnswer{delay: 55 * time.Millisecond}
			case i == 610:
				return legAnswer{delay: time.Second}
			}
			return legAnswer{delay: 10 * time.Millisecond}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(20*time.Millisecond, 0.95, 1, unaryMethod),
			grpcretry.WithLimit(nil), withGuards(retry.Guards{Budget: anyBudget{}}))...)
		call := func() (string, time.Duration) {
			name, took, err := hedgeCall(context.Background(), c)
			if err != nil {
				t.Errorf("call: %v", err)
			}
			return name, took
		}
		var wg sync.WaitGroup
		for range 600 { // 2 s of background calls
			wg.Go(func() { call() })
			time.Sleep(time.Second / 300)
		}
		time.Sleep(time.Millisecond) // the burst, after the last background call
		for range 10 {
			wg.Go(func() { call() })
		}
		time.Sleep(time.Millisecond)
		var name string
		var slow time.Duration
		wg.Go(func() { name, slow = call() })
		wg.Wait()
		srv.settle(t)

		// The slow call (1 ms after the burst) is due at 20 ms, with 10
		// burst races past their delay: held. It looks again every 10 ms
		// (half the delay): at 30, 40 and 50 ms the burst is still in
		// flight. At 60 ms it has ended (at 54 ms from the slow one's
		// start), but its answers all came late, the last at 54 ms: a
		// queue at the host, a hedge held for half a delay after the last
		// late answer (to 64 ms). At 70 ms the hedge goes, and answers 10
		// ms later.
		if want := 80 * time.Millisecond; slow != want || name != "call-616" {
			t.Errorf("slow call took %v, answered by %s; want %v, by call-616 (its hedge, once the burst cleared)", slow, name, want)
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		hedges := 0
		for _, p := range srv.prev {
			if p != "" {
				hedges++
			}
		}
		if len(srv.prev) != 617 || hedges != 6 {
			t.Errorf("%d server calls, %d hedges; want 617 and 6 (the floor's 5 in the burst, the slow call's)", len(srv.prev), hedges)
		}
	})
}
