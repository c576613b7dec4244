// Package breaker is a circuit breaker: when a dependency keeps failing, stop
// calling it for a while, then let a few probe calls test whether it has
// recovered.
//
// A [Breaker] has three states:
//
//   - [Closed]: calls pass. Outcomes are counted in a sliding window of
//     Config.Window cut into Config.Buckets buckets. After every recorded
//     outcome, if the window holds at least MinCalls calls and
//     failures >= FailureRatio·calls, the breaker trips to Open. (Defaults:
//     50% over 10 s, at least 20 calls.)
//   - [Open]: every call is rejected at once, without being made, with an
//     [*OpenError] that says how long until the breaker half-opens (its
//     RetryAfter method makes that a Retry-After for callers). The open
//     period is OpenFor (default 30 s); with MaxOpenFor set it doubles on
//     every consecutive trip, up to MaxOpenFor.
//   - [HalfOpen]: once the open period has passed, the next call (or [Breaker.State])
//     moves the breaker to HalfOpen, which admits exactly Probes calls
//     (default 5) and rejects the rest with an [*OpenError] matching
//     [ErrTooManyProbes]. When all Probes probes succeed the breaker closes,
//     with an empty window; the first failed probe reopens it, for a longer
//     period if MaxOpenFor allows.
//
// Every state change starts a new generation. A [Permit] remembers the
// generation it was issued in, and [Breaker.Done] drops an outcome whose
// generation is over: a slow call that started before the breaker tripped
// cannot close it, and one that started while it was closed cannot count
// towards a later closed window. Zero [Permit]s are never valid.
//
// # Two forms
//
// Middleware that cannot wrap a closure uses the two-step form: [Breaker.Allow]
// returns a [Permit] or a rejection, and [Breaker.Done] records the outcome.
// Every permit must be given back exactly once, with Done or [Breaker.Cancel];
// a half-open probe that is never given back holds its slot forever. Code
// that can wrap a closure uses [Breaker.Execute] or the generic [Do], which
// give the permit back on every path; a panic in the closure is recorded as a
// failure and continues to unwind (it is never recovered).
//
// # Concurrency
//
// A Breaker is safe for concurrent use. In the closed state, Allow and a
// successful or failed Done take no lock and allocate nothing: the state and
// generation live in one atomic word, outcomes in per-bucket atomic counters
// tagged with their bucket number. Only state changes and half-open probes
// take the breaker's mutex.
//
// OnStateChange callbacks are never called while the mutex is held, so a
// callback may call any method of the breaker. They are called one at a
// time, in the order of the state changes; the goroutine that made a change
// delivers it before returning unless another goroutine is already
// delivering, in which case that one delivers it.
package breaker
