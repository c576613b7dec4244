// Package breaker is a circuit breaker: when a dependency keeps failing, stop
// calling it, find out by a few probe calls when it is back, and then let the
// calls that waited through the outage go at a pace it can serve.
//
// A [Breaker] has three states:
//
//   - [Closed]: calls pass. Outcomes are counted in a sliding window of
//     Config.Window cut into Config.Buckets buckets. After a failure, if the
//     window holds at least MinCalls calls and failures >= FailureRatio·calls,
//     or the current bucket alone does, the breaker trips to Open; so it
//     does after ConsecutiveFailures failures in a row, if that is set
//     (off by default). (Defaults: 50% over 10 s in 1 s buckets, at least
//     20 calls.) With Config.SlowCall set, a call that succeeded but took
//     that long or longer counts as a failure (off by default).
//   - [Open]: calls are not made. [Breaker.Allow] rejects them at once with
//     an [*OpenError] that says how long until the next probe round (its
//     RetryAfter method makes that a Retry-After for callers);
//     [Breaker.Wait] lets a caller with time to spare wait instead (below).
//     The open period is OpenFor (default 1 s) jittered by ±20%, at least
//     the Retry-After the dependency sent with the failure that opened it
//     ([Breaker.Fail]); with MaxOpenFor set it doubles on every consecutive
//     failed probe, up to MaxOpenFor.
//   - [HalfOpen]: when the open period ends, a probe round admits Probes
//     calls (default 3) and rejects the rest with an [*OpenError] whose
//     State is HalfOpen. When all of them succeed the breaker closes, with
//     an empty window; the first failed probe opens it again.
//
// # Probes instead of one long open period
//
// The classic breaker opens for a long fixed period (30 s is a common
// example) and then lets a few calls test the dependency. A short outage
// then costs the whole period: the dependency is back after 10 s, and its
// callers still fail for 20 s more. This breaker probes often instead (a
// few calls about every second), so an outage ends for the callers about a
// second after it ends for the dependency, while the dependency sees only
// those few probes as long as it is down. For a dependency that stays down,
// MaxOpenFor makes the probes rarer (set OpenFor: time.Second, MaxOpenFor:
// 30 * time.Second to back off towards the classic period).
//
// # Waiting instead of failing
//
// A call that meets an open breaker and still has time (its deadline lies
// beyond the next probe round) can wait with [Breaker.Wait] rather than fail:
// nothing is sent while it waits. Waiting calls get the next round's probes
// first, those with the most time left first (a probe must live to bring
// back the dependency's answer: a call about to give up would hand it on
// unanswered). When the breaker closes, the waiting calls are released
// earliest deadline first by a pacer, each at a
// jittered point of its slot (at most a second long; above 100 calls a second, a tick of the pacer releases several, each
// at a jittered point of the tick: within one tick they may go in any order), so that a recovering dependency does not meet
// its backlog as one spike: the pace starts at a quarter of ReleaseRate (by
// default the rate of calls the breaker saw before it tripped: the pace the
// dependency served) and doubles every half second up to it, and a failure
// while it releases halves it. If failures reach the trip rule again (while
// it releases, Probes calls in the window are enough in place of MinCalls,
// failures at least FailureRatio of them), the breaker
// opens and the calls not yet released go back to waiting. At most
// MaxWaiters calls wait (default 10,000); a waiting call holds no lock and
// starts no goroutine (the probe rounds and the pacer run on one timer each
// per breaker).
//
// Every state change starts a new generation. A [Permit] remembers the
// generation it was issued in, and [Breaker.Done] drops an outcome whose
// generation is over: a slow call that started before the breaker tripped
// cannot close it, and one that started while it was closed cannot count
// towards a later closed window. Zero [Permit]s are never valid.
//
// # A fleet
//
// A breaker sees only its own process's calls. Config.Shared connects it to
// the breakers of other processes ([Shared]: outcomes, probe permits per
// round, state changes), and [Breaker.Trip] and [Breaker.Reset] let a fleet
// (or an operator) open and close it.
//
// # Two forms
//
// Middleware that cannot wrap a closure uses the two-step form:
// [Breaker.Allow] (or Wait) returns a [Permit] or a rejection, and
// [Breaker.Done] (or Fail) records the outcome. Every permit must be given
// back exactly once, with Done, Fail or [Breaker.Cancel]; a probe that is
// never given back holds its slot forever. Code that can wrap a closure uses
// [Breaker.Execute], which gives the permit back on every path (a closure
// that returns a value sets a variable it captures); a panic in the closure
// is recorded as a failure and continues to unwind (it is never recovered).
//
// # Concurrency
//
// A Breaker is safe for concurrent use. In the closed state, Allow, Wait and
// Done take no lock and allocate nothing: the state and generation live in
// one atomic word, outcomes in per-bucket atomic counters tagged with their
// bucket number, and a success is counted without summing the window. Only
// state changes, probes, waiting calls and the failures reported while the
// calls that waited are released (they slow the release down) take the
// breaker's mutex.
//
// OnStateChange callbacks are never called while the mutex is held, so a
// callback may call any method of the breaker. They are called one at a
// time, in the order of the state changes; the goroutine that made a change
// delivers it before returning unless another goroutine is already
// delivering, in which case that one delivers it.
package breaker
