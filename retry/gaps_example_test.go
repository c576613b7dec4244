package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/retry"
)

// A job's status is an answer, not an error; DoValueIf asks again while it
// is not done, and gives back the last status when the attempts run out.
func ExampleDoValueIf() {
	b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})
	p, err := retry.New(retry.WithMaxAttempts(5), retry.WithBackoff(b))
	if err != nil {
		panic(err)
	}
	statuses := []string{"queued", "running", "done"}
	status, err := retry.DoValueIf(context.Background(), p,
		func(ctx context.Context, attempt int) (string, error) {
			return statuses[min(attempt, len(statuses))-1], nil
		},
		func(status string) bool { return status != "done" })
	fmt.Println(status, err)
	// Output:
	// done <nil>
}

// perCall is a limiter of the example's own that lets n attempts go and
// refuses the rest; a *rate.Limiter of golang.org/x/time/rate fits the
// same place. It is safe for concurrent use, as a policy's limiter must be.
type perCall struct{ left atomic.Int64 }

func (l *perCall) Wait(ctx context.Context) error {
	if l.left.Add(-1) < 0 {
		return errors.New("no more attempts today")
	}
	return ctx.Err()
}

// WithRateLimit makes every attempt wait for a limiter first; one that
// refuses ends the call.
func ExampleWithRateLimit() {
	lim := new(perCall)
	lim.left.Store(2)
	p, err := retry.New(retry.WithRateLimit(lim), retry.WithMaxAttempts(3),
		retry.WithClassifier(func(error) bool { return true }))
	if err != nil {
		panic(err)
	}
	calls := 0
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		return errors.New("unavailable")
	})
	fmt.Println("calls:", calls)
	fmt.Println(err)
	// Output:
	// calls: 2
	// retry: deadline after 2 attempts (cause: retry: rate limit: no more attempts today): unavailable
}
