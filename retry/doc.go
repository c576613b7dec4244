// Package retry runs an operation again when it fails in a way worth
// retrying, and stops before the retries become the load that keeps a
// failing dependency down.
//
// Build a [Policy] once with [New] and share it; run operations with
// [Policy.Do] or, for an operation that returns a value, [DoValue] (or
// [DoValueIf], whose predicate on the value may ask for another attempt):
//
//	p, err := retry.New(retry.WithMaxAttempts(4))
//	...
//	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the call's deadline
//	defer cancel()
//	err = p.Do(ctx, func(ctx context.Context, attempt int) error {
//		return send(ctx, req)
//	})
//
// The rules:
//   - At most MaxAttempts tries, the first included (default 3), besides
//     the probes a circuit breaker hands to a call that waits for it (at
//     most one per probe round while the call's deadline lasts; see
//     [WithGuards]).
//   - One deadline, the context's, covers attempts and sleeps; each
//     attempt's context carries only the time that is left
//     ([WithAttemptTimeout] caps it further).
//   - Only retryable errors are retried; [IsRetryable] is the default
//     classifier (protocol-neutral: timeouts, broken connections, server
//     hints; package httpretry adds HTTP statuses), [Permanent] stops
//     retrying, and errors can declare themselves with a method
//     RetryAfter() time.Duration (a server's hint) or Temporary() bool.
//   - The sleep before retry n is the backoff's n-th delay (package
//     backoff; full jitter by default) or, when the server's hint
//     ([RetryAfter]) is longer, a random time in [hint, 1.5·hint): the hint
//     is a floor, spread so that clients told the same do not return in
//     step.
//   - If the next sleep would end at or after the deadline, the loop gives
//     up now instead of sleeping past it. Canceling the context stops the
//     loop at once, mid-sleep included, and is never retried.
//   - Giving up returns an [*Error] with the [Reason], the number of
//     attempts and the last error, all reachable with errors.Is and
//     errors.As. Success returns nil.
//
// A dependency's [Guards] plug into the loop ([WithGuards]): a retry
// budget (e.g. a *budget.Budget shared by the whole client), a circuit
// breaker and a concurrency limiter (package limit). Each call deposits
// once, each retry must withdraw first (a refusal stops the call with its
// last real error, Reason [BudgetExhausted]), and each attempt must be
// admitted by the breaker and reports back whether the dependency failed.
// A call with a deadline waits behind an open breaker for its next probe
// round instead of failing; one without fails fast (Reason [CircuitOpen]).
// Each admitted attempt then holds one of the limiter's slots, waiting for
// one within the deadline (a refusal stops the call with Reason
// [Limited]). A caller that serves cached
// data when the loop gives up tests the Reason of the returned error.
//
// A client-side rate limit ([WithRateLimit]) makes every attempt wait for
// any limiter with a method Wait(context.Context) error, such as
// golang.org/x/time/rate's.
//
// [Policy.Plan] exposes the loop's decision step for code that runs its own
// loop. An observer ([WithObserver], package observe) watches the loop; it
// is silent by default. Time comes from the system clock, which a
// testing/synctest bubble fakes in tests.
package retry
