package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go"
	fsbudget "github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/sony/gobreaker/v2"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// Every breaker is configured alike: trip at 50% failures over a 10 s
// window with at least 20 calls, stay open 30 s (the stormguard defaults).
const (
	tripRatio   = 0.5
	tripWindow  = 10 * time.Second
	tripMin     = 20
	openPeriod  = 30 * time.Second
	windowSlice = time.Second
)

// A guard is one library's way to run a call through a circuit breaker,
// optionally inside a retry policy with a retry budget. setup builds the
// shared objects once; the returned function runs one call of op and is
// safe to use from many goroutines at once (each with its own op).
type guard struct {
	name string
	// retries reports whether the setup retries (retry policy + budget +
	// breaker) rather than only guarding with a breaker.
	retries bool
	setup   func(tb testing.TB) func(op func() error) error
}

var guards = []guard{
	{"stormguard", true, func(tb testing.TB) func(op func() error) error {
		// retry.Policy with a budget.Budget and a breaker.Breaker, all
		// built once and shared.
		bud, err := budget.New(budget.Config{})
		if err != nil {
			tb.Fatal(err)
		}
		brk, err := breaker.New(breaker.Config{OpenFor: openPeriod})
		if err != nil {
			tb.Fatal(err)
		}
		p, err := retry.New(retry.WithMaxAttempts(maxAttempts), retry.WithBackoff(zeroBackoff(tb)),
			retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk}))
		if err != nil {
			tb.Fatal(err)
		}
		ctx := context.Background()
		return func(op func() error) error {
			return p.Do(ctx, func(ctx context.Context, attempt int) error { return op() })
		}
	}},
	{"stormguard-breaker", false, func(tb testing.TB) func(op func() error) error {
		// The breaker alone, as gobreaker is used.
		brk, err := breaker.New(breaker.Config{OpenFor: openPeriod})
		if err != nil {
			tb.Fatal(err)
		}
		return brk.Execute
	}},
	{"gobreaker", false, func(tb testing.TB) func(op func() error) error {
		// gobreaker v2 with a rolling 10 s window of 1 s buckets; built
		// once and shared.
		cb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
			Name:         "bench",
			Interval:     tripWindow,
			BucketPeriod: windowSlice,
			Timeout:      openPeriod,
			ReadyToTrip: func(c gobreaker.Counts) bool {
				return c.Requests >= tripMin && float64(c.TotalFailures) >= tripRatio*float64(c.Requests)
			},
		})
		return func(op func() error) error {
			_, err := cb.Execute(func() (struct{}, error) { return struct{}{}, op() })
			return err
		}
	}},
	{"failsafe", true, func(tb testing.TB) func(op func() error) error {
		// failsafe-go: a retry policy with its retry budget, around a
		// time-based circuit breaker, in one executor built once.
		cb := circuitbreaker.NewBuilder[any]().
			WithFailureRateThreshold(tripRatio, tripMin, tripWindow).
			WithDelay(openPeriod).
			Build()
		rp := retrypolicy.NewBuilder[any]().
			WithMaxAttempts(maxAttempts).
			WithDelay(0).
			WithBudget(fsbudget.NewBuilder().WithMaxRate(0.1).Build()).
			Build()
		exec := failsafe.With[any](rp, cb)
		return exec.Run
	}},
	{"failsafe-breaker", false, func(tb testing.TB) func(op func() error) error {
		// failsafe-go's circuit breaker alone, in an executor built once.
		cb := circuitbreaker.NewBuilder[any]().
			WithFailureRateThreshold(tripRatio, tripMin, tripWindow).
			WithDelay(openPeriod).
			Build()
		exec := failsafe.With[any](cb)
		return exec.Run
	}},
}

// TestGuardsBehave checks every benchmarked guard: a success passes
// through with one call; a dependency that always fails trips the breaker
// within a few hundred calls, after which calls are rejected without
// running the operation.
func TestGuardsBehave(t *testing.T) {
	for _, g := range guards {
		t.Run(g.name, func(t *testing.T) {
			call := g.setup(t)
			calls := 0
			if err := call(func() error { calls++; return nil }); err != nil || calls != 1 {
				t.Fatalf("success: call = %v after %d calls, want nil after 1", err, calls)
			}
			failing := func() error { calls++; return errTransient }
			for i := range 500 {
				before := calls
				err := call(failing)
				if calls == before {
					if err == nil || errors.Is(err, errTransient) && !g.retries {
						t.Fatalf("call %d rejected with %v, want a breaker error", i, err)
					}
					t.Logf("open after %d calls of the operation; rejection: %v", calls, err)
					return
				}
				if err == nil {
					t.Fatalf("call %d: nil error from an always failing operation", i)
				}
			}
			t.Fatalf("breaker still closed after %d failed calls", calls)
		})
	}
}

// BenchmarkGuardedSuccess is the success path through each guard, from one
// goroutine.
func BenchmarkGuardedSuccess(b *testing.B) {
	for _, g := range guards {
		b.Run(g.name, func(b *testing.B) {
			call := g.setup(b)
			b.ReportAllocs()
			for b.Loop() {
				if err := call(succeed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGuardedSuccessParallel is the success path through one shared
// guard from every P (RunParallel; GOMAXPROCS goroutines).
func BenchmarkGuardedSuccessParallel(b *testing.B) {
	for _, g := range guards {
		b.Run(g.name, func(b *testing.B) {
			call := g.setup(b)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := call(succeed); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
