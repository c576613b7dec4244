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

// seedPolicy is the seed's smoke-test configuration: random source fixed at
// 0.5, full jitter, base 100 ms, cap 10 s, 5 attempts, 30 s deadline, and
// server hints slept exactly (WithExactRetryAfter).
func seedPolicy(clock retry.Clock) (*retry.Policy, error) {
	b, err := backoff.New(backoff.Config{
		Strategy: backoff.FullJitter,
		Base:     100 * time.Millisecond,
		Cap:      10 * time.Second,
		Rand:     func() float64 { return 0.5 }, // U pinned at 0.5
	})
	if err != nil {
		return nil, err
	}
	return retry.New(
		retry.WithBackoff(b),
		retry.WithMaxAttempts(5),
		retry.WithTimeout(30*time.Second),
		retry.WithClock(clock),
		retry.WithExactRetryAfter(), // sleep the hint itself, not a time spread above it
	)
}

// The seed's smoke test: a 503 asking for 1500 ms, a plain 503, then
// success. Retry 1 computes 0.5 × 200 ms = 100 ms, but the server's hint is
// a floor, so it sleeps 1.5 s: exactly the hint, because the policy was
// built WithExactRetryAfter (by default it would sleep a random time in
// [1.5 s, 2.25 s), so that clients told the same do not return together).
// Retry 2 sleeps 0.5 × 400 ms = 200 ms. A 404 is not retried at all.
// (statusErr is the tests' own error type: Temporary for 503, RetryAfter
// for the hint; the loop itself knows no status codes.)
func ExamplePolicy_Do() {
	clock := newRecordingClock()
	p, err := seedPolicy(clock)
	if err != nil {
		fmt.Println(err)
		return
	}

	calls := 0
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		switch calls {
		case 1:
			return &statusErr{Code: 503, After: 1500 * time.Millisecond}
		case 2:
			return &statusErr{Code: 503}
		}
		return nil
	})
	if err == nil {
		fmt.Printf("ok calls=%d sleeps=%v\n", calls, clock.Sleeps())
	}

	calls = 0
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		return &statusErr{Code: 404}
	})
	var se *statusErr
	if errors.As(err, &se) {
		fmt.Printf("%d calls=%d\n", se.Code, calls)
	}
	fmt.Println(err)
	// Output:
	// ok calls=3 sleeps=[1.5s 200ms]
	// 404 calls=1
	// retry: not retryable after 1 attempt: HTTP 404
}

// DoValue returns the operation's value. When it gives up, the error tells
// why, how many attempts ran, and wraps the last error.
func ExampleDoValue() {
	p, err := retry.New(
		retry.WithMaxAttempts(3),
		retry.WithClock(newRecordingClock()), // no real sleeping in the example
	)
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
	p, err := retry.New(retry.WithClock(newRecordingClock()))
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
		retry.WithClock(newRecordingClock()),
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

// A Plan is the loop's decision step for code that runs its own loop: a job
// queue that re-queues a failed job instead of sleeping. Next is told each
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
	plan := p.Plan() // one per job
	failures := []error{&statusErr{Code: 503}, &statusErr{Code: 503, After: 5 * time.Second}, &statusErr{Code: 503}, &statusErr{Code: 503}}
	for _, err := range failures {
		sleep, stop := plan.Next(err, 0) // 0: the job has no deadline
		if stop != 0 {
			fmt.Printf("give up after %d attempts: %s\n", plan.Attempts(), stop.String())
			break
		}
		fmt.Println("re-queue in", sleep)
	}
	// Output:
	// re-queue in 2s
	// re-queue in 6.25s
	// re-queue in 8s
	// give up after 4 attempts: attempts exhausted
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
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter})
	if err != nil {
		fmt.Println(err)
		return
	}
	p, err := retry.New(retry.WithName("payments"), retry.WithObserver(obs), retry.WithBackoff(b),
		retry.WithExactRetryAfter(), retry.WithClock(newRecordingClock()))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		if attempt == 1 {
			return &statusErr{Code: 429, After: time.Second}
		}
		return &statusErr{Code: 503}
	})
	// Output:
	// payments attempt-end 1 failure
	// payments retry 1 1s hint
	// payments attempt-end 2 failure
	// payments retry 2 400ms backoff
	// payments attempt-end 3 failure
	// payments give-up 3 attempts exhausted
}
