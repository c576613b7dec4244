package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	avast4 "github.com/avast/retry-go/v4"
	avast5 "github.com/avast/retry-go/v5"
	cenkalti "github.com/cenkalti/backoff/v5"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	sethvargo "github.com/sethvargo/go-retry"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/retry"
)

// transientError is the retryable failure every library sees: a 503 that
// says it is transient (retry.IsRetryable retries a Temporary error).
type transientError struct{}

func (transientError) Error() string   { return "HTTP 503" }
func (transientError) Temporary() bool { return true }

// errTransient is the one failure every library sees.
var errTransient error = transientError{}

// errTransientMarked is errTransient marked retryable for sethvargo/go-retry,
// which retries only errors wrapped with RetryableError. It is built once so
// the marking costs no allocation in the loop.
var errTransientMarked = sethvargo.RetryableError(errTransient)

// maxAttempts is the attempt limit every library is configured with (the
// first attempt included).
const maxAttempts = 3

// flaky returns an operation that fails with fail on every odd call and
// succeeds on every even one: each retried call fails once, then succeeds.
// The counter is the operation's own, so each goroutine needs its own flaky.
func flaky(fail error) func() error {
	n := 0
	return func() error {
		n++
		if n&1 == 1 {
			return fail
		}
		return nil
	}
}

func succeed() error { return nil }

// zeroBackoff is stormguard's zero delay: full jitter with the random source
// fixed at 0 (a backoff's base must be positive).
func zeroBackoff(tb testing.TB) *backoff.Backoff {
	tb.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// A peer is one library's way to run an operation under a retry policy of
// maxAttempts attempts and zero delay. setup builds what the library lets
// callers reuse, once, and returns the function that runs one call of op.
type peer struct {
	name  string
	setup func(tb testing.TB, op func() error, failWith error) func() error
}

// peers lists the retry libraries compared; stormguard first.
var peers = []peer{
	{"stormguard", func(tb testing.TB, op func() error, _ error) func() error {
		// The policy is immutable and shared.
		p, err := retry.New(retry.WithMaxAttempts(maxAttempts), retry.WithBackoff(zeroBackoff(tb)))
		if err != nil {
			tb.Fatal(err)
		}
		ctx := context.Background()
		fn := func(ctx context.Context, attempt int) error { return op() }
		return func() error { return p.Do(ctx, fn) }
	}},
	{"cenkalti", func(tb testing.TB, op func() error, _ error) func() error {
		// backoff.Retry takes its options per call and builds its state
		// (options struct, timer) per call; the option slice and the
		// stateless ZeroBackOff are built once. A stateful BackOff such as
		// ExponentialBackOff could not be shared between goroutines.
		opts := []cenkalti.RetryOption{cenkalti.WithBackOff(&cenkalti.ZeroBackOff{}), cenkalti.WithMaxTries(maxAttempts)}
		ctx := context.Background()
		fn := func() (struct{}, error) { return struct{}{}, op() }
		return func() error {
			_, err := cenkalti.Retry(ctx, fn, opts...)
			return err
		}
	}},
	{"avast-v4", func(tb testing.TB, op func() error, _ error) func() error {
		// retry-go v4 has no reusable retrier: Do applies its options to a
		// fresh config on every call. The option slice is built once.
		opts := []avast4.Option{avast4.Attempts(maxAttempts), avast4.Delay(0), avast4.DelayType(avast4.FixedDelay), avast4.LastErrorOnly(true)}
		return func() error { return avast4.Do(op, opts...) }
	}},
	{"avast-v5", func(tb testing.TB, op func() error, _ error) func() error {
		// retry-go v5's reusable retrier, built once.
		r := avast5.New(avast5.Attempts(maxAttempts), avast5.Delay(0), avast5.DelayType(avast5.FixedDelay), avast5.LastErrorOnly(true))
		return func() error { return r.Do(op) }
	}},
	{"sethvargo", func(tb testing.TB, op func() error, _ error) func() error {
		// go-retry's WithMaxRetries keeps a counter: a Backoff is
		// single-use, so one is built per call, around a stateless
		// zero-delay BackoffFunc built once (NewConstant(0) panics).
		zero := sethvargo.BackoffFunc(func() (time.Duration, bool) { return 0, false })
		ctx := context.Background()
		fn := func(ctx context.Context) error { return op() }
		return func() error {
			return sethvargo.Do(ctx, sethvargo.WithMaxRetries(maxAttempts-1, zero), fn)
		}
	}},
	{"failsafe", func(tb testing.TB, op func() error, _ error) func() error {
		// failsafe-go's executor and retry policy, built once (the default
		// delay is zero).
		rp := retrypolicy.NewBuilder[any]().WithMaxAttempts(maxAttempts).WithDelay(0).Build()
		exec := failsafe.With[any](rp)
		return func() error { return exec.Run(op) }
	}},
}

// failFor returns the error a library must see to retry: errTransient, or
// the marked copy for sethvargo/go-retry.
func failFor(name string) error {
	if name == "sethvargo" {
		return errTransientMarked
	}
	return errTransient
}

// TestPeersBehave checks that every benchmarked setup does what the
// benchmarks claim: one call on the success path; one failure, one retry
// and success on the one-retry path; maxAttempts calls and a failure when
// the operation always fails.
func TestPeersBehave(t *testing.T) {
	for _, pr := range peers {
		t.Run(pr.name, func(t *testing.T) {
			calls := 0
			counted := func(op func() error) func() error {
				return func() error { calls++; return op() }
			}
			call := pr.setup(t, counted(succeed), nil)
			if err := call(); err != nil || calls != 1 {
				t.Errorf("success: call() = %v after %d calls, want nil after 1", err, calls)
			}

			calls = 0
			call = pr.setup(t, counted(flaky(failFor(pr.name))), failFor(pr.name))
			for i := range 3 {
				calls = 0
				if err := call(); err != nil || calls != 2 {
					t.Errorf("one retry, call %d: call() = %v after %d calls, want nil after 2", i, err, calls)
				}
			}

			calls = 0
			always := func() error { return failFor(pr.name) }
			call = pr.setup(t, counted(always), failFor(pr.name))
			if err := call(); !errors.Is(err, errTransient) || calls != maxAttempts {
				t.Errorf("always failing: call() = %v after %d calls, want the 503 after %d", err, calls, maxAttempts)
			}
		})
	}
}

// BenchmarkSuccess is the success path: one call of an operation that
// returns nil, through each library's reused policy.
func BenchmarkSuccess(b *testing.B) {
	for _, pr := range peers {
		b.Run(pr.name, func(b *testing.B) {
			call := pr.setup(b, succeed, nil)
			b.ReportAllocs()
			for b.Loop() {
				if err := call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOneRetry is one failure and one retry with zero delay: the
// operation fails once with a retryable 503, then returns nil.
func BenchmarkOneRetry(b *testing.B) {
	for _, pr := range peers {
		b.Run(pr.name, func(b *testing.B) {
			fail := failFor(pr.name)
			call := pr.setup(b, flaky(fail), fail)
			b.ReportAllocs()
			for b.Loop() {
				if err := call(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
