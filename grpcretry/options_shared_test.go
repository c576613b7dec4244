package grpcretry_test

import (
	"sync"
	"testing"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
)

// TestOptionsSharedByClients: "an Option is a value: it may be passed to any
// number of constructors", also at once. WithBudget, WithBreaker and
// WithLimit used to store their copy of the configuration in the variable
// the option captured, a write that -race reports when two clients are
// built from the same options concurrently.
func TestOptionsSharedByClients(t *testing.T) {
	opts := []grpcretry.Option{
		grpcretry.WithBudget(&budget.Config{Ratio: 0.2}),
		grpcretry.WithBreaker(&breaker.Config{MinCalls: 5}),
		grpcretry.WithLimit(&limit.Config{Max: 8}),
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := grpcretry.DialOptions(opts...); err != nil {
				t.Errorf("DialOptions: %v", err)
			}
		})
	}
	wg.Wait()
}
