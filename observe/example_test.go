package observe_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// An observer of one's own: an observe.Func that prints what a retry
// policy named "payments" reports while its call fails once and then
// succeeds, and another that gives up. Metrics, traces and logs are built
// the same way (otelstormguard is such an observer).
func Example() {
	printer := observe.Func(func(_ context.Context, e observe.Event) {
		switch e.Kind {
		case observe.AttemptEnd:
			fmt.Println(e.Name, e.Kind, e.Attempt, e.Outcome)
		case observe.Retry:
			fmt.Println(e.Name, e.Kind, "after attempt", e.Attempt, "sleeps", e.Delay)
		case observe.GiveUp:
			fmt.Println(e.Name, e.Kind, "after", e.Attempt, "attempts:", e.Reason)
		}
	})
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Millisecond})
	if err != nil {
		panic(err)
	}
	p, err := retry.New(retry.WithName("payments"), retry.WithObserver(printer), retry.WithBackoff(b),
		retry.WithClassifier(func(error) bool { return true })) // every error is worth a retry here
	if err != nil {
		panic(err)
	}
	reset := errors.New("connection reset")
	_ = p.Do(context.Background(), func(_ context.Context, attempt int) error {
		if attempt == 1 {
			return reset
		}
		return nil
	})
	_ = p.Do(context.Background(), func(context.Context, int) error { return reset })
	// Output:
	// payments attempt-end 1 failure
	// payments retry after attempt 1 sleeps 2ms
	// payments attempt-end 2 success
	// payments attempt-end 1 failure
	// payments retry after attempt 1 sleeps 2ms
	// payments attempt-end 2 failure
	// payments retry after attempt 2 sleeps 4ms
	// payments attempt-end 3 failure
	// payments give-up after 3 attempts: attempts-exhausted
}
