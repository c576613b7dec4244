package budget_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

func benchBudget(b *testing.B, slices int) *budget.Budget {
	b.Helper()
	c := budget.Config{}
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

// BenchmarkDepositAt leaves the clock out.
func BenchmarkDepositAt(b *testing.B) {
	bg := benchBudget(b, 10)
	at := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		bg.DepositAt(at)
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

// BenchmarkWithdrawRefused is a spent budget: every withdrawal is refused.
func BenchmarkWithdrawRefused(b *testing.B) {
	bg := benchBudget(b, 10)
	at := time.Now()
	for bg.WithdrawAt(at) {
	}
	b.ReportAllocs()
	for b.Loop() {
		bg.WithdrawAt(at)
	}
}

// BenchmarkWithdrawSlices shows the O(Slices) cost of a withdrawal.
func BenchmarkWithdrawSlices100(b *testing.B) {
	bg := benchBudget(b, 100)
	at := time.Now()
	b.ReportAllocs()
	for b.Loop() {
		bg.DepositAt(at)
		bg.WithdrawAt(at)
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
