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

// guarded is what an attempt holds of the guards: the breaker's permit
// (brk nil: no breaker) and the limiter's slot (lim nil: no limiter).
type guarded struct {
	brk    *breaker.Breaker
	permit breaker.Permit
	lim    *limit.Limiter
	slot   limit.Permit
}

// attemptGuarded runs op for one attempt on actx, a context of the call's
// ctx (cancel releases it; nil if there is nothing to release), under the
// guards g; started is when the attempt began, for the observer. If op
// panics or calls runtime.Goexit, it does what the loop would have done
// had op returned, before the panic goes on: the attempt is a failure for
// the breaker (so that a half-open probe never holds its slot forever) and
// a drop for the limiter (which gets its slot back), the observer hears of
// the attempt's end and of the call's (so that the attempt's span ends),
// and actx is released.
// Only with an observer is the panic recovered, to name its value in the
// events, and raised again with that value.
func (p *Policy) attemptGuarded(ctx, actx context.Context, cancel context.CancelFunc, g guarded,
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
		if g.lim != nil {
			g.lim.Release(g.slot, true)
		}
		if g.brk != nil {
			g.brk.Done(g.permit, false)
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
