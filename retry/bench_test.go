package retry_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

func succeed(ctx context.Context, attempt int) error { return nil }

func succeedValue(ctx context.Context, attempt int) (int, error) { return attempt, nil }

// failOnce fails the first attempt with a retryable error.
func failOnce(ctx context.Context, attempt int) error {
	if attempt == 1 {
		return err503
	}
	return nil
}

// TestSuccessPathAllocs proves a reused policy's success path allocates
// nothing, with and without a deadline on the parent context.
func TestSuccessPathAllocs(t *testing.T) {
	p := mustNew(t)
	withDeadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	tests := []struct {
		name string
		run  func()
	}{
		{"Do", func() { _ = p.Do(context.Background(), succeed) }},
		{"Do with parent deadline", func() { _ = p.Do(withDeadline, succeed) }},
		{"DoValue", func() { _, _ = retry.DoValue(context.Background(), p, succeedValue) }},
	}
	for _, tt := range tests {
		if n := testing.AllocsPerRun(1000, tt.run); n != 0 {
			t.Errorf("%s: %v allocs per successful call, want 0", tt.name, n)
		}
	}
}

// benchDo measures p.Do(ctx, op) calls that succeed.
func benchDo(b *testing.B, p *retry.Policy, ctx context.Context, op func(context.Context, int) error) {
	b.Helper()
	b.ReportAllocs()
	for b.Loop() {
		if err := p.Do(ctx, op); err != nil {
			b.Fatal(err)
		}
	}
}

// benchDoParallel measures successful calls through p from every P.
func benchDoParallel(b *testing.B, p *retry.Policy) {
	b.Helper()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := p.Do(ctx, succeed); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkDoSuccess(b *testing.B) {
	p := mustNew(b)
	benchDo(b, p, context.Background(), succeed)
}

func BenchmarkDoValueSuccess(b *testing.B) {
	p := mustNew(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := retry.DoValue(ctx, p, succeedValue); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDoOneRetryZeroDelay measures the cost of one failed attempt and
// its retry, with a backoff whose delays are 0 (no sleep).
func BenchmarkDoOneRetryZeroDelay(b *testing.B) {
	p := mustNew(b, retry.WithBackoff(mustBackoff(b, backoff.FullJitter, time.Millisecond, time.Millisecond, 0)))
	benchDo(b, p, context.Background(), failOnce)
}

// BenchmarkDoWithAttemptTimeout shows what WithAttemptTimeout costs: one
// derived context per attempt.
func BenchmarkDoWithAttemptTimeout(b *testing.B) {
	p := mustNew(b, retry.WithAttemptTimeout(time.Minute))
	benchDo(b, p, context.Background(), succeed)
}

// BenchmarkDoParallel runs one shared policy from every P.
func BenchmarkDoParallel(b *testing.B) {
	p := mustNew(b)
	benchDoParallel(b, p)
}

// newGuarded builds a policy with the default budget and breaker attached,
// on the real clock, and opts.
func newGuarded(t testing.TB, opts ...retry.Option) *retry.Policy {
	t.Helper()
	return newGuardedLimit(t, nil, opts...)
}

// newLimited builds a policy with the default budget, breaker and limiter
// attached, on the real clock, and opts.
func newLimited(t testing.TB, opts ...retry.Option) *retry.Policy {
	t.Helper()
	return newGuardedLimit(t, mustLimiter(t, limit.Config{}), opts...)
}

// newGuardedLimit builds a policy with the default budget and breaker and
// lim (nil: none) attached, on the real clock, and opts.
func newGuardedLimit(t testing.TB, lim *limit.Limiter, opts ...retry.Option) *retry.Policy {
	t.Helper()
	bud, err := budget.New(budget.Config{})
	if err != nil {
		t.Fatal(err)
	}
	brk, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return mustNew(t, append([]retry.Option{retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk, Limiter: lim})}, opts...)...)
}

// TestSuccessPathAllocsBudgetBreaker proves a budget and a closed breaker,
// and a limiter with a free slot beside them, add no allocation to the
// success path, with or without a parent deadline (with one, a call could
// wait for an open breaker or a full limit; a closed one and a free slot
// admit at once), and without an observer (WithObserver(nil)) or a name.
func TestSuccessPathAllocsBudgetBreaker(t *testing.T) {
	withDeadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, guards := range []struct {
		name string
		new  func(testing.TB, ...retry.Option) *retry.Policy
	}{
		{"budget and breaker", newGuarded},
		{"budget, breaker and limiter", newLimited},
	} {
		p := guards.new(t)
		named := guards.new(t, retry.WithObserver(nil), retry.WithName("payments"))
		tests := []struct {
			name string
			run  func()
		}{
			{"Do", func() { _ = p.Do(context.Background(), succeed) }},
			{"Do with parent deadline", func() { _ = p.Do(withDeadline, succeed) }},
			{"Do named, nil observer", func() { _ = named.Do(withDeadline, succeed) }},
			{"DoValue", func() { _, _ = retry.DoValue(context.Background(), p, succeedValue) }},
			{"DoValue with parent deadline", func() { _, _ = retry.DoValue(withDeadline, p, succeedValue) }},
		}
		for _, tt := range tests {
			if n := testing.AllocsPerRun(1000, tt.run); n != 0 {
				t.Errorf("%s with %s: %v allocs per successful call, want 0", tt.name, guards.name, n)
			}
		}
	}
}

func BenchmarkDoSuccessBudgetBreaker(b *testing.B) {
	p := newGuarded(b)
	benchDo(b, p, context.Background(), succeed)
}

// BenchmarkDoSuccessBudgetBreakerParallel shares one policy, budget and
// breaker between every P.
func BenchmarkDoSuccessBudgetBreakerParallel(b *testing.B) {
	p := newGuarded(b)
	benchDoParallel(b, p)
}

// BenchmarkDoSuccessDeadlineBudgetBreaker: a parent deadline takes the
// loop's full path (a call could wait for an open breaker); a closed
// breaker admits at once.
func BenchmarkDoSuccessDeadlineBudgetBreaker(b *testing.B) {
	p := newGuarded(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchDo(b, p, ctx, succeed)
}

// The ...Limiter benchmarks are the three above with a limiter (the zero
// limit.Config) beside the budget and the breaker: run them in one go
// (-bench 'BudgetBreaker') to read what the limiter adds to a successful
// call.

func BenchmarkDoSuccessBudgetBreakerLimiter(b *testing.B) {
	p := newLimited(b)
	benchDo(b, p, context.Background(), succeed)
}

func BenchmarkDoSuccessBudgetBreakerLimiterParallel(b *testing.B) {
	p := newLimited(b)
	benchDoParallel(b, p)
}

func BenchmarkDoSuccessDeadlineBudgetBreakerLimiter(b *testing.B) {
	p := newLimited(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchDo(b, p, ctx, succeed)
}

// BenchmarkDoSuccessObserver shows what an observer costs: two events per
// successful call.
func BenchmarkDoSuccessObserver(b *testing.B) {
	p := mustNew(b, retry.WithObserver(observe.Func(func(context.Context, observe.Event) {})))
	benchDo(b, p, context.Background(), succeed)
}

// BenchmarkPlanNext measures one decision step after a failed attempt.
func BenchmarkPlanNext(b *testing.B) {
	p := mustNew(b, retry.WithMaxAttempts(1<<30))
	b.ReportAllocs()
	next := p.Plan()
	for b.Loop() {
		if _, stop := next(err503, time.Hour); stop != 0 {
			b.Fatal(stop)
		}
	}
}
