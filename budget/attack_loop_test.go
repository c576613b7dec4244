// Black-box attacks on the retry budget (AREA loop): exact accounting under
// concurrency, window edges, saturation. Each test names the sentence it
// checks.

package budget_test

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// doc.go, Concurrency: "Deposit and Withdraw take no lock ... two
// goroutines can never both take the last retry of a window. Under any
// interleaving the rule above holds at every admission". With a clock that
// does not move, the rule admits exactly ⌊Limit⌋ retries: concurrent
// withdrawals must neither over- nor under-admit, and concurrent deposits
// must all be counted.
func TestAttackLoopConcurrentExactCounts(t *testing.T) {
	for round := range 20 {
		c := &atkClock{}
		b, err := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: 0.3, Now: c.Now}) // floor 3 per window
		if err != nil {
			t.Fatal(err)
		}
		const g, per = 8, 250
		var wg sync.WaitGroup
		var admitted atomic.Int64
		for i := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range per {
					if (i+j)%2 == 0 {
						b.Deposit()
					} else if b.Withdraw() {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		s := b.Stats()
		if s.Requests != g*per/2 {
			t.Fatalf("round %d: Requests = %d, want %d", round, s.Requests, g*per/2)
		}
		if int64(s.Retries) != admitted.Load() {
			t.Fatalf("round %d: Stats.Retries = %d, admitted %d", round, s.Retries, admitted.Load())
		}
		// Withdrawals keep coming after the deposits end: the rest of the
		// window's allowance is admitted, exactly.
		for b.Withdraw() {
			admitted.Add(1)
		}
		if want := int64(math.Floor(0.5*float64(g*per/2) + 3)); admitted.Load() != want {
			t.Fatalf("round %d: admitted %d in total, want exactly ⌊Limit⌋ = %d", round, admitted.Load(), want)
		}
	}
}

// Concurrent withdrawals while the window slides (the head moves from
// slice to slice under contention): every admission is counted in Stats
// as long as its slice is in the window, none is lost or double-counted.
func TestAttackLoopConcurrentSlidingExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: 1e6, Window: 100 * time.Second, Slices: 100})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var admitted, deposits atomic.Int64
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 60 {
					for range 5 {
						if b.Withdraw() {
							admitted.Add(1)
						}
						b.Deposit()
						deposits.Add(1)
					}
					time.Sleep(time.Duration(300+100*i+j%7) * time.Millisecond)
				}
			}()
		}
		wg.Wait()
		// At most 60·0.9 s = 54 s have passed: everything is in the 100 s window.
		s := b.Stats()
		if int64(s.Retries) != admitted.Load() || int64(s.Requests) != deposits.Load() {
			t.Errorf("Stats %+v, want %d retries and %d requests", s, admitted.Load(), deposits.Load())
		}
		if admitted.Load() != 6*60*5 {
			t.Errorf("admitted %d of %d under a floor of 1e8", admitted.Load(), 6*60*5)
		}
	})
}

// Budget: "The zero value is a budget with the default settings whose
// window starts at its first use." The first use at t = 0.3 s aligns the
// 1 s slices to 0.3 s: a deposit at first use expires exactly 10 s later.
func TestAttackLoopZeroValueWindowStartsAtFirstUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b budget.Budget
		time.Sleep(300 * time.Millisecond)
		b.Deposit() // first use
		time.Sleep(10*time.Second - 1)
		if s := b.Stats(); s.Requests != 1 {
			t.Errorf("1 ns before the deposit's slice expires: %+v, want 1 request", s)
		}
		time.Sleep(time.Nanosecond)
		if s := b.Stats(); s.Requests != 0 {
			t.Errorf("when the 10th successor slice begins: %+v, want 0 requests", s)
		}
	})
}

// Stats.Limit: "Ratio·Requests + MinPerSecond·Window.Seconds(): the window
// admits retries while Retries+1 <= Limit, so ⌊Limit⌋ − Retries more are
// available if nothing else happens."
func TestAttackLoopStatsLimitPredictsAdmissions(t *testing.T) {
	cfgs := []budget.Config{
		{Ratio: 0.1, MinPerSecond: 0.25, Window: 4 * time.Second, Slices: 4},
		{Ratio: 0.3, MinPerSecond: -1},
		{Ratio: -5, MinPerSecond: 0.7},
		{Ratio: 1, MinPerSecond: 1e-9},
		{Ratio: 0.07, MinPerSecond: 0.0999999999},
	}
	for _, cfg := range cfgs {
		for _, reqs := range []int{0, 1, 3, 10, 29, 1000} {
			c := &atkClock{}
			cfg.Now = c.Now
			b, err := budget.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			b.DepositN(reqs)
			s := b.Stats()
			want := int(math.Floor(s.Limit)) - s.Retries
			got := 0
			for b.Withdraw() {
				got++
			}
			if got != max(want, 0) {
				t.Errorf("%+v, %d requests: Stats %+v predicts %d, admitted %d", cfg, reqs, s, want, got)
			}
		}
	}
}

// doc.go: "A withdrawal at t is admitted if and only if retries + 1 <=
// Ratio·requests + MinPerSecond·Window.Seconds() where requests and retries
// are the deposits and the admitted withdrawals whose slices lie in that
// window". A deposit made at the last instant of a slice and a withdrawal
// at the first instant of the slice that expires it.
func TestAttackLoopWindowEdgeSlices(t *testing.T) {
	c := &atkClock{}
	b, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: -1, Window: 3 * time.Second, Slices: 3, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	c.Advance(time.Second - 1) // last ns of slice 0
	b.DepositN(2)
	c.Advance(1) // slice 1
	b.Deposit()
	c.Advance(2*time.Second - 1) // last ns of slice 2: window = slices 0..2
	admitted := 0
	for range 4 {
		if b.Withdraw() {
			admitted++
		}
	}
	if admitted != 3 {
		t.Errorf("window with 3 requests: %d admitted of 4 asked (%+v), want exactly 3", admitted, b.Stats())
	}
	c.Advance(1) // slice 3: slice 0 (2 requests) leaves; retries of slice 2 stay
	if s := b.Stats(); s.Requests != 1 || s.Retries != 3 {
		t.Errorf("slice 3: %+v, want 1 request and 3 retries", s)
	}
	if b.Withdraw() {
		t.Error("admitted with 3 retries against 1 request")
	}
	c.Advance(2 * time.Second) // slice 5: slices 3..5, nothing
	if s := b.Stats(); s.Requests != 0 || s.Retries != 0 {
		t.Errorf("slice 5: %+v, want empty", s)
	}
}
