package budget_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

func benchBudget(b *testing.B, slices int) *budget.Budget {
	return benchBudgetOn(b, slices, nil)
}

// benchBudgetOn is benchBudget on clock now (nil: the default clock).
func benchBudgetOn(b *testing.B, slices int, now func() time.Time) *budget.Budget {
	b.Helper()
	c := budget.Config{Now: now}
	c.Slices = slices
	bg, err := budget.New(c)
	if err != nil {
		b.Fatal(err)
	}
	return bg
}

// BenchmarkDeposit measures the hot path of an original request, with the
// real clock.
func BenchmarkDeposit(b *testing.B) {
	bg := benchBudget(b, 10)
	b.ReportAllocs()
	for b.Loop() {
		bg.Deposit()
	}
}

// BenchmarkDepositFakeClock leaves the clock's cost out: a clock that
// returns a fixed time.
func BenchmarkDepositFakeClock(b *testing.B) {
	at := time.Now()
	bg := benchBudgetOn(b, 10, func() time.Time { return at })
	b.ReportAllocs()
	for b.Loop() {
		bg.Deposit()
	}
}

// BenchmarkWithdraw is a client in steady state: ten requests per retry, so
// most withdrawals are admitted.
func BenchmarkWithdraw(b *testing.B) {
	bg := benchBudget(b, 10)
	b.ReportAllocs()
	for b.Loop() {
		for range 10 {
			bg.Deposit()
		}
		bg.Withdraw()
	}
}

// BenchmarkWithdrawRefused is a spent budget: every withdrawal is refused
// (on a fixed clock, so that the window stays spent).
func BenchmarkWithdrawRefused(b *testing.B) {
	at := time.Now()
	bg := benchBudgetOn(b, 10, func() time.Time { return at })
	for bg.Withdraw() {
	}
	b.ReportAllocs()
	for b.Loop() {
		bg.Withdraw()
	}
}

// BenchmarkWithdrawSlices shows the O(Slices) cost of a withdrawal.
func BenchmarkWithdrawSlices100(b *testing.B) {
	at := time.Now()
	bg := benchBudgetOn(b, 100, func() time.Time { return at })
	b.ReportAllocs()
	for b.Loop() {
		bg.Deposit()
		bg.Withdraw()
	}
}

// BenchmarkParallel is many goroutines sharing one budget: each iteration
// is a request, and every tenth also asks for a retry.
func BenchmarkParallel(b *testing.B) {
	bg := benchBudget(b, 10)
	var seq atomic.Uint32
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := seq.Add(1)
		for pb.Next() {
			bg.Deposit()
			if i++; i%10 == 0 {
				bg.Withdraw()
			}
		}
	})
}

// BenchmarkParallelDeposit is the contended deposit alone.
func BenchmarkParallelDeposit(b *testing.B) {
	bg := benchBudget(b, 10)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bg.Deposit()
		}
	})
}
