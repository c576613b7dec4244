package grpcretry_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// strictBudget is a caller's Budget type whose methods read their
// receiver: a nil one panics in them.
type strictBudget struct{ n int }

func (b *strictBudget) Deposit()       { b.n++ }
func (b *strictBudget) Withdraw() bool { b.n--; return true }

// TestHedgeTypedNilBudgetOfAnotherType: a supplied nil pointer of a type
// other than *budget.Budget is a budget like any value (its methods are
// called, as retry.Guards says): one that reads its receiver panics on the
// caller's goroutine at the call's deposit, before any copy is sent, never
// on a goroutine of the client's.
func TestHedgeTypedNilBudgetOfAnotherType(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			withGuards(retry.Guards{Budget: (*strictBudget)(nil)}))...)
		if v := panicking(func() { _, _, _ = hedgeCall(t.Context(), c) }); v == nil {
			t.Error("a call with a nil *strictBudget did not panic")
		}
		if n := srv.n(); n != 0 {
			t.Errorf("%d server calls before the panic, want 0", n)
		}
		srv.settle(t)
	})
}
