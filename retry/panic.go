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

// attemptLimited is attemptGuarded for an attempt that holds slot of lim:
// if op panics or calls runtime.Goexit, the slot is given back too, as a
// drop, after what attemptGuarded does. A function of its own, so that the
// path without a limiter stays as it was.
func (p *Policy) attemptLimited(ctx, actx context.Context, cancel context.CancelFunc, brk *breaker.Breaker, permit breaker.Permit,
	lim *limit.Limiter, slot limit.Permit, op func(context.Context, int) error, attempt int, started time.Time) error {
	done := false
	defer func() {
		if !done {
			lim.Release(slot, true)
		}
	}()
	err := p.attemptGuarded(ctx, actx, cancel, brk, permit, op, attempt, started)
	done = true
	return err
}

// attemptGuarded runs op for one attempt on actx, a context of the call's
// ctx (cancel releases it; nil if there is nothing to release), under
// brk's permit (brk nil: no breaker); started is when the attempt began,
// for the observer. If op panics or calls runtime.Goexit, it does what the
// loop would have done had op returned, before the panic goes on: the
// attempt is a failure for the breaker (so that a half-open probe never
// holds its slot forever), the observer hears of the attempt's end and of
// the call's (so that the attempt's span ends), and actx is released.
// Only with an observer is the panic recovered, to name its value in the
// events, and raised again with that value.
func (p *Policy) attemptGuarded(ctx, actx context.Context, cancel context.CancelFunc, brk *breaker.Breaker, permit breaker.Permit,
	op func(context.Context, int) error, attempt int, started time.Time) error {
	done := false
	defer func() {
		if done {
			return
		}
		var v any
		if p.observer != nil {
			v = recover()
		}
		if brk != nil {
			brk.Done(permit, false)
		}
		if p.observer != nil {
			e := &panicError{value: v}
			p.attemptEnd(actx, attempt, e, started)
			p.observer.Observe(ctx, observe.Event{Kind: observe.GiveUp, Name: p.name, Attempt: attempt, Reason: "panic", Err: e})
		}
		if cancel != nil {
			cancel()
		}
		if v != nil {
			panic(v)
		}
	}()
	err := op(actx, attempt)
	done = true
	return err
}
