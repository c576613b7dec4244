package retry_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// quick is a backoff of a few milliseconds, so that the examples run fast
// on the real clock (the default is full jitter from 100 ms, capped at
// 10 s). Its random source is pinned at 0.5.
func quick() *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond,
		Rand: func() float64 { return 0.5 }})
	if err != nil {
		panic(err)
	}
	return b
}

// A 503, another 503, then success: the caller sees only the success. A
// 404 is not retried at all, and the error says why the loop stopped.
// (statusErr is the examples' own error type: Temporary for 503; the loop
// itself knows no status codes.)
func ExamplePolicy_Do() {
	p, err := retry.New(retry.WithMaxAttempts(5), retry.WithBackoff(quick()))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // the call's deadline
	defer cancel()

	calls := 0
	err = p.Do(ctx, func(ctx context.Context, attempt int) error {
		calls++
		if attempt < 3 {
			return &statusErr{Code: 503}
		}
		return nil
	})
	fmt.Println("calls:", calls, "error:", err)

	calls = 0
	err = p.Do(ctx, func(ctx context.Context, attempt int) error {
		calls++
		return &statusErr{Code: 404}
	})
	var se *statusErr
	if errors.As(err, &se) {
		fmt.Printf("%d calls=%d\n", se.Code, calls)
	}
	fmt.Println(err)
	// Output:
	// calls: 3 error: <nil>
	// 404 calls=1
	// retry: not retryable after 1 attempt: HTTP 404
}

// DoValue returns the operation's value. When it gives up, the error tells
// why, how many attempts ran, and wraps the last error.
func ExampleDoValue() {
	p, err := retry.New(retry.WithMaxAttempts(3), retry.WithBackoff(quick()))
	if err != nil {
		fmt.Println(err)
		return
	}

	v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (string, error) {
		if attempt < 2 {
			return "", &statusErr{Code: 502}
		}
		return "paid", nil
	})
	fmt.Println(v, err)

	_, err = retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (string, error) {
		return "", &statusErr{Code: 503}
	})
	var re *retry.Error
	if errors.As(err, &re) {
		// A Reason is an error: Println shows its Error text.
		fmt.Println(re.Reason, re.Attempts, errors.Is(err, retry.AttemptsExhausted))
	}
	fmt.Println(err)
	// Output:
	// paid <nil>
	// retry: attempts exhausted 3 true
	// retry: attempts exhausted after 3 attempts: HTTP 503
}

// Permanent stops the loop even for an error the classifier would retry;
// errors.Is still finds the original error.
func ExamplePermanent() {
	p, err := retry.New()
	if err != nil {
		fmt.Println(err)
		return
	}
	errCardDeclined := errors.New("card declined")

	calls := 0
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		// A timeout is normally retried, but this one reached the bank:
		// repeating the charge is not safe.
		return retry.Permanent(fmt.Errorf("charge: %w: %w", errCardDeclined, context.DeadlineExceeded))
	})
	fmt.Println("calls:", calls)
	fmt.Println(errors.Is(err, retry.NotRetryable), errors.Is(err, errCardDeclined))
	// Output:
	// calls: 1
	// true true
}

// The classifier can be extended: retry one more error of your own, and
// everything the default retries.
func ExampleWithClassifier() {
	errBusy := errors.New("busy")
	p, err := retry.New(
		retry.WithClassifier(func(err error) bool {
			return errors.Is(err, errBusy) || retry.IsRetryable(err)
		}),
		retry.WithBackoff(quick()),
	)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		if attempt == 1 {
			return errBusy
		}
		return nil
	})
	fmt.Println(err)
	// Output:
	// <nil>
}

// Plan is the loop's decision step for code that runs its own loop: a job
// queue that re-queues a failed job instead of sleeping. It is told each
// failure and answers when to try again, or why to stop. The server's 5 s
// hint beats the 4 s backoff delay and is spread above it (U is 0.5 here:
// 5 s + 0.5 × 2.5 s).
func ExamplePolicy_Plan() {
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Second, Rand: func() float64 { return 0.5 }})
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := retry.New(retry.WithBackoff(b), retry.WithMaxAttempts(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	next := p.Plan() // one per job
	failures := []error{&statusErr{Code: 503}, &statusErr{Code: 503, After: 5 * time.Second}, &statusErr{Code: 503}, &statusErr{Code: 503}}
	for i, err := range failures {
		sleep, stop := next(err, 0) // 0: the job has no deadline
		if stop != 0 {
			fmt.Printf("give up after %d attempts: %v\n", i+1, stop)
			break
		}
		fmt.Println("re-queue in", sleep)
	}
	// Output:
	// re-queue in 2s
	// re-queue in 6.25s
	// re-queue in 8s
	// give up after 4 attempts: retry: attempts exhausted
}

// An observer sees every step of the loop: attempts, retries with the delay
// chosen and why, and the give-up with its reason. Metrics and traces are
// built on it; here it prints.
func ExampleWithObserver() {
	obs := observe.Func(func(ctx context.Context, e observe.Event) {
		switch e.Kind {
		case observe.AttemptEnd:
			fmt.Println(e.Name, e.Kind, e.Attempt, e.Outcome)
		case observe.Retry:
			fmt.Println(e.Name, e.Kind, e.Attempt, e.Delay, e.Outcome)
		case observe.GiveUp:
			fmt.Println(e.Name, e.Kind, e.Attempt, e.Reason)
		}
	})
	// No jitter, base 1 ms; U 0 sleeps a server's hint exactly.
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := retry.New(retry.WithName("payments"), retry.WithObserver(obs), retry.WithBackoff(b))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		if attempt == 1 {
			return &statusErr{Code: 429, After: 10 * time.Millisecond}
		}
		return &statusErr{Code: 503}
	})
	// Output:
	// payments attempt-end 1 failure
	// payments retry 1 10ms hint
	// payments attempt-end 2 failure
	// payments retry 2 4ms backoff
	// payments attempt-end 3 failure
	// payments give-up 3 attempts-exhausted
}
