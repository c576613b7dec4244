// Package observe is the one seam through which every guard of stormguard
// reports what it does: the retry loop (attempts, retries and give-ups),
// circuit breakers (state changes), idempotency keys, admission control and
// fleet coordination. Metrics, traces and logs are built on it (package
// otelstormguard in its own module adapts it to OpenTelemetry).
//
// Every guard takes an optional [Observer]. Without one it reports nothing
// and pays nothing: no allocation, no call, one nil check. An Observer is
// called on the goroutine doing the work, so it must be quick and safe for
// concurrent use; it must not call back into the guard that called it.
package observe

import (
	"context"
	"time"
)

// Kind is what an [Event] reports, a short name that prints as itself
// ("attempt-end"). The zero Kind, "", is not an event.
type Kind string

// The kinds of events.
const (
	// AttemptStart: attempt Attempt (1 for the first) of a call is about
	// to be sent. An observer that tags attempts (see [Observer]) returns
	// the attempt's context.
	AttemptStart Kind = "attempt-start"
	// AttemptEnd: attempt Attempt ended after Elapsed, with Err (nil on
	// success) and Outcome "success", "failure" (a failure of the
	// dependency: the breaker counts it) or "rejected" (the dependency
	// answered, but no: an error the loop's classifier does not retry,
	// a 404 or a 400 of a retry.Do operation say; not its failure; over
	// httpretry a 404 is the call's answer, passed back: a "success"); a hedge that
	// lost its race ends with "canceled" (see Event.Hedge), and so does an
	// attempt that failed after its call's context ended (the caller's
	// deadline or cancel: the breaker counts it neither way).
	AttemptEnd Kind = "attempt-end"
	// Retry: attempt Attempt failed with Err, and the loop will sleep
	// Delay before the next one. Outcome says why that long: "backoff"
	// (the backoff's delay) or "hint" (the server's hint, which
	// retry.RetryAfter reads from Err, was longer).
	Retry Kind = "retry"
	// GiveUp: the call ended without success after Attempt attempts, for
	// Reason ("not-retryable", "attempts-exhausted", "deadline",
	// "canceled", "budget-exhausted", "circuit-open", "limited" or
	// "panic": the labels httpretry's give-up header uses too), with Err
	// its last error. A budget refusal is a GiveUp with Reason
	// "budget-exhausted". For Reason "deadline" when the loop stopped
	// before a sleep that would have ended past the deadline, Delay is
	// that sleep.
	// An operation that panicked ends its attempt (AttemptEnd, Outcome
	// "failure") and its call (GiveUp, Reason "panic"), Err saying with
	// what, before the panic goes on.
	GiveUp Kind = "give-up"
	// BreakerWait: a call waited Elapsed behind an open circuit breaker;
	// Outcome is "admitted" or "rejected".
	BreakerWait Kind = "breaker-wait"
	// BreakerState: a circuit breaker changed state, From and To
	// ("closed", "open", "half-open"). To is "" (and Reason "forgotten")
	// when a protocol layer dropped the breaker it built for a destination
	// from its bounded table (httpretry.WithMaxHosts): From is the state
	// it was in, and it tells no more changes.
	BreakerState Kind = "breaker-state"
	// Idempotency: the server-side idempotency guard handled a keyed
	// request: Outcome "new", "replay", "in-progress", "mismatch",
	// "invalid" or "store-error"; Elapsed is the time spent in the store.
	Idempotency Kind = "idempotency"
	// Admission: the provider-side admission control decided on a request:
	// Outcome "admitted", "queued", "shed-retry" (a retry beyond the
	// ratio) or "shed-busy" (no room to run or wait). A request that joins
	// the queue reports "queued" first, then its final decision. Reason is
	// the controller's own outcome name ("retry-refused", "queue-full",
	// "queue-timeout", "canceled"), or "deadline" for a request dropped
	// for its caller's deadline (passed, or too close to be met: the
	// controller's outcome is admission.Canceled, the event's Outcome
	// "shed-busy"); Delay is the Retry-After it answered with, if it
	// shed, as drawn (HTTP sends it in whole seconds); Elapsed is
	// the time the request spent queued.
	Admission Kind = "admission"
	// FleetMode: a fleet-shared budget or breaker switched mode, From and
	// To ("fleet", "local"), Err the cause of a switch to local (nil for
	// the switch Close makes).
	FleetMode Kind = "fleet-mode"
)

// Event is one report. Which fields are set depends on Kind (see the
// constants); the others are zero. Strings are fixed labels (never built per
// event), so they are cheap to use as metric attributes.
type Event struct {
	Kind Kind
	// Name is the dependency the event is about: the destination host of
	// an HTTP call, the gRPC target, the name given to a policy or a
	// breaker; "" if none was given.
	Name string
	// Attempt is the attempt number (1 for the first), or for GiveUp the
	// attempts made. The retry loop numbers its own attempts, a hedged
	// race counting as one; a hedge (Hedge set) carries its number on the
	// wire, the next after its race's first copy: a hedge and a retry
	// after its race may then carry the same number (the retry's wire
	// header is the one after the hedges').
	Attempt int
	// Delay is the sleep chosen before a retry, the sleep refused by a
	// GiveUp for the deadline, or the Retry-After of a shed request.
	Delay time.Duration
	// Elapsed is the duration of what ended: an attempt, a wait, a store
	// call.
	Elapsed time.Duration
	// Reason is why a call gave up (for Admission, the controller's
	// outcome name).
	Reason string
	// From and To are the states of a change.
	From, To string
	// Outcome qualifies the event (see the Kind constants).
	Outcome string
	// Err is the error involved, if any.
	Err error
	// Hedge marks the AttemptStart and AttemptEnd of a hedge: a copy of
	// an attempt sent while it is still in flight (httpretry.WithHedging).
	// A hedge that lost the race ends with Outcome "canceled".
	Hedge bool
}

// Observer receives events. Observe is called synchronously, on the
// goroutine of the call it reports on, so it must return quickly; it must be
// safe for concurrent use. ctx is the caller's context (for AttemptStart
// and AttemptEnd, the attempt's: it carries the attempt's own deadline and,
// for a probe, its mark).
//
// An Observer that needs each attempt to run with a context of its own (a
// trace span per attempt) also has a method
//
//	TagAttempt(ctx context.Context, e Event) context.Context
//
// For an AttemptStart event the retry loop then calls TagAttempt instead of
// Observe and runs the attempt with the context it returns; the AttemptEnd
// event gets that context.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// Func adapts a function to an [Observer].
type Func func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f Func) Observe(ctx context.Context, e Event) { f(ctx, e) }
