package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// Serve cached data when the circuit is open: the loop gives up, and the
// caller tests why. The breaker trips at 50% failures over at least one
// call, stays open for 20 ms here and closes after one good probe. The
// price service answers 200, then 404 (its real answer, passed on: a 404 is
// not a dependency failure), then 503s: after the second 503 the window
// holds 2 failures in 4 calls, the breaker opens, and the loop stops
// without a third attempt; the cache serves. The next call is rejected
// without calling the service at all (these calls have no deadline, so they
// do not wait for the breaker). Once the open period is over, one probe
// goes through and closes the breaker.
func Example_fallback() {
	brk, err := breaker.New(breaker.Config{
		MinCalls: 1,
		Probes:   1,
		OpenFor:  20 * time.Millisecond,
		Rand:     func() float64 { return 0.5 }, // no jitter: open for exactly OpenFor
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	bud, err := budget.New(budget.Config{}) // the defaults: 10% + 1/s
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := retry.New(retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk}), retry.WithBackoff(quick()))
	if err != nil {
		fmt.Println(err)
		return
	}

	cache := map[string]string{"espresso": "2.50 (cached)"}
	calls := 0
	price := func(item string, status int) (string, error) {
		v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (string, error) {
			calls++
			if status != 200 {
				return "", &statusErr{Code: status}
			}
			return "2.60", nil
		})
		var re *retry.Error
		if errors.As(err, &re) {
			switch re.Reason {
			case retry.CircuitOpen, retry.BudgetExhausted, retry.AttemptsExhausted:
				if v, ok := cache[item]; ok {
					return v, nil
				}
			}
		}
		return v, err
	}

	show := func(v string, err error) { fmt.Printf("%q %v\n", v, err) }
	show(price("espresso", 200))
	show(price("latte", 404))
	show(price("espresso", 503))
	show(price("espresso", 200))
	fmt.Println("calls:", calls, "breaker:", brk.State())
	time.Sleep(20 * time.Millisecond) // the open period: the probe closes the breaker
	show(price("espresso", 200))
	fmt.Println("calls:", calls, "breaker:", brk.State())
	// Output:
	// "2.60" <nil>
	// "" retry: not retryable after 1 attempt: HTTP 404
	// "2.50 (cached)" <nil>
	// "2.50 (cached)" <nil>
	// calls: 4 breaker: open
	// "2.60" <nil>
	// calls: 5 breaker: closed
}

// A retry budget shared by every call: it allows 0.5 retries per call plus
// 1.5 per 10 s window, so the first failing call may retry twice and the
// second may not retry at all. Once the window's retries are spent, a
// failing call stops at once with the dependency's own last error (Reason
// BudgetExhausted) instead of adding load.
func ExampleGuards_budget() {
	bud, err := budget.New(budget.Config{Ratio: 0.5, MinPerSecond: 0.15, Window: 10 * time.Second, Slices: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := retry.New(retry.WithGuards(retry.Guards{Budget: bud}), retry.WithBackoff(quick()), retry.WithMaxAttempts(3))
	if err != nil {
		fmt.Println(err)
		return
	}
	down := func(ctx context.Context, attempt int) error { return &statusErr{Code: 503} }
	for range 2 {
		fmt.Println(p.Do(context.Background(), down))
	}
	// Output:
	// retry: attempts exhausted after 3 attempts: HTTP 503
	// retry: budget exhausted after 1 attempt: HTTP 503
}
