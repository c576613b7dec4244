package httpretry_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// TestOptionsSharedByTransports: "an Option is a value: it may be passed to
// any number of constructors", also at once. WithBudget, WithBreaker and
// WithLimit used to store their copy of the configuration in the variable
// the option captured, a write that -race reports when two transports are
// built from the same options concurrently (the bench's live POS smoke
// test found it with its setups run 6 at a time). Each transport still
// gets a configuration of its own.
func TestOptionsSharedByTransports(t *testing.T) {
	opts := []httpretry.Option{
		httpretry.WithBudget(&budget.Config{Ratio: 0.2}),
		httpretry.WithBreaker(&breaker.Config{MinCalls: 5}),
		httpretry.WithLimit(&limit.Config{Max: 8}),
		httpretry.WithHedging(0, 0, 0), // its defaults are filled in when it is made, not by each constructor
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := httpretry.NewTransport(http.DefaultTransport, opts...); err != nil {
				t.Errorf("NewTransport: %v", err)
			}
		})
	}
	wg.Wait()
}

// TestOptionsCopiedWhenMade: "an Option is a value". The configuration a
// WithBudget, WithBreaker or WithLimit points to, and the slice WithRetry
// is given, are copied when the option is made: a caller that reuses them
// afterwards (here: makes them invalid) does not change the option.
func TestOptionsCopiedWhenMade(t *testing.T) {
	bu, br, li := budget.Config{Ratio: 0.2}, breaker.Config{MinCalls: 5}, limit.Config{Max: 8}
	sched := []retry.ScheduleOption{retry.WithMaxAttempts(2)}
	opts := []httpretry.Option{
		httpretry.WithBudget(&bu), httpretry.WithBreaker(&br), httpretry.WithLimit(&li), httpretry.WithRetry(sched...),
	}
	bu.Ratio, br.FailureRatio, li.Max = -1, 2, -1
	sched[0] = retry.WithMaxAttempts(-1)
	if _, err := httpretry.NewTransport(http.DefaultTransport, opts...); err != nil {
		t.Errorf("NewTransport after the caller changed what the options were made from: %v, want nil", err)
	}
}
