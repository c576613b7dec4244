package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// panicError is the Err of the events that report an attempt whose
// operation panicked, or called runtime.Goexit, and the call it ended.
type panicError struct {
	value any // what the operation panicked with; nil for runtime.Goexit
}

func (e *panicError) Error() string {
	if e.value == nil {
		return "retry: operation exited without returning (runtime.Goexit)"
	}
	return fmt.Sprintf("retry: operation panicked: %v", e.value)
}

// Unwrap returns the panic's value if it is an error (such as
// http.ErrAbortHandler), so that errors.Is finds it.
func (e *panicError) Unwrap() error {
	err, _ := e.value.(error)
	return err
}

// isPanic reports whether err is the report of a panicking operation.
func isPanic(err error) bool {
	_, ok := err.(*panicError)
	return ok
}

// attempt is what the loop knows of the attempt in flight: enough for the
// function run defers to end it if op never returns. The loop fills in
// each field as it learns it (a field the policy has no use for stays
// zero: permit without a breaker, slot without a limiter, cancel without
// an attempt timeout, actx, n and started without an observer).
type attempt struct {
	p       *Policy
	ctx     context.Context    // the call's
	actx    context.Context    // the attempt's
	cancel  context.CancelFunc // releases actx; nil if there is nothing to release
	permit  breaker.Permit     // the breaker's, if the policy has one
	slot    limit.Permit       // the limiter's, if the policy has one
	n       int                // the attempt's number
	started time.Time          // when it began, for the observer
	running bool               // the attempt runs: set before the observer hears of its start, cleared once its outcome is reported
	held    bool               // permit and slot are held for an attempt not yet sent, while the budget's Deposit runs
	ended   bool               // the observer was told of the attempt's end (it may have panicked doing so)
	// deciding: the loop runs the caller's code between attempts, the
	// attempt's outcome reported (the classifier deciding whether to
	// retry, a rate limiter's Wait): a panic there ends the call.
	deciding bool
}

// undecided ends a call whose classifier or rate limiter panicked with v
// (nil: it called runtime.Goexit, or no observer recovered the panic)
// between attempts, after the last attempt's outcome was reported: the
// observer hears of the call's end (a GiveUp with Reason "panic", so that
// its span ends), and the panic goes on with v.
func (a *attempt) undecided(v any) {
	p := a.p
	if p.observer != nil {
		p.observer.Observe(a.ctx, observe.Event{Kind: observe.GiveUp, Name: p.name, Attempt: a.n, Reason: "panic", Err: &panicError{value: v}})
	}
	if v != nil {
		panic(v)
	}
}

// unsent gives back the permit and the slot of an attempt that was never
// sent: the budget's Deposit panicked (or called runtime.Goexit) before
// it. The panic goes on unrecovered.
func (a *attempt) unsent() {
	if a.p.breaker != nil {
		a.p.breaker.Cancel(a.permit)
	}
	if a.p.limiter != nil {
		a.p.limiter.Release(a.slot, true) // as a slot the breaker took back (see loop)
	}
}

// panicked ends an attempt whose op panicked with v (nil: it called
// runtime.Goexit, or no observer recovered the panic), or whose observer
// or classifier did before its outcome was reported: the attempt is a
// failure for the breaker (so that a half-open probe never holds its slot
// forever), the observer hears of the attempt's end (unless it panicked
// hearing of it: an attempt ends once) and of the call's (so that the
// attempt's span ends), the attempt's context is released, and,
// after all that, the limiter's slot is given back as a drop. Then the
// panic goes on with v.
func (a *attempt) panicked(v any) {
	p := a.p
	if p.limiter != nil {
		defer p.limiter.Release(a.slot, true)
	}
	if p.breaker != nil {
		p.breaker.Done(a.permit, false)
	}
	if p.observer != nil {
		e := &panicError{value: v}
		started := a.started
		if started.IsZero() { // AttemptStart panicked
			started = time.Now()
		}
		if !a.ended {
			p.attemptEnd(a.actx, a.n, e, started, false)
		}
		p.observer.Observe(a.ctx, observe.Event{Kind: observe.GiveUp, Name: p.name, Attempt: a.n, Reason: "panic", Err: e})
	}
	if a.cancel != nil {
		a.cancel()
	}
	if v != nil {
		panic(v)
	}
}
