package retry_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/retry"
)

// recordingClock is a fake retry.Clock: Sleep records the delay and moves
// the fake time forward at once, so nothing sleeps for real. It is safe for
// concurrent use.
type recordingClock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
}

func newRecordingClock() *recordingClock {
	return &recordingClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *recordingClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *recordingClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sleeps = append(c.sleeps, d)
	c.now = c.now.Add(d)
	return nil
}

// Advance moves the fake time forward by d, as an operation that takes d
// would.
func (c *recordingClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Sleeps returns a copy of the recorded sleeps.
func (c *recordingClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// seedPolicy is the seed's smoke-test configuration: random source fixed at
// 0.5, full jitter, base 100 ms, cap 10 s, 5 attempts, 30 s deadline.
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
	)
}

// The seed's smoke test: a 503 asking for 1500 ms, a plain 503, then
// success. Retry 1 computes 0.5 × 200 ms = 100 ms, but the server's hint is
// a floor, so it sleeps 1.5 s; retry 2 sleeps 0.5 × 400 ms = 200 ms. A 404
// is not retried at all.
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
			return &retry.StatusError{Code: 503, After: 1500 * time.Millisecond}
		case 2:
			return &retry.StatusError{Code: 503}
		}
		return nil
	})
	if err == nil {
		fmt.Printf("ok calls=%d sleeps=%v\n", calls, clock.Sleeps())
	}

	calls = 0
	err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		return &retry.StatusError{Code: 404}
	})
	var se *retry.StatusError
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
			return "", &retry.StatusError{Code: 502}
		}
		return "paid", nil
	})
	fmt.Println(v, err)

	_, err = retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (string, error) {
		return "", &retry.StatusError{Code: 503}
	})
	var re *retry.Error
	if errors.As(err, &re) {
		fmt.Println(re.Reason, re.Attempts, errors.Is(err, retry.ErrAttemptsExhausted))
	}
	fmt.Println(err)
	// Output:
	// paid <nil>
	// attempts exhausted 3 true
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
	fmt.Println(errors.Is(err, retry.ErrNotRetryable), errors.Is(err, errCardDeclined))
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
