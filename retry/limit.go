package retry

import (
	"context"
	"fmt"
)

// WithRateLimit makes every attempt, the first included, wait for l before
// it is sent: a client-side rate limit on the calls to the dependency.
// Anything with a method Wait(context.Context) error fits, such as a
// *rate.Limiter of golang.org/x/time/rate, which this module does not
// import. nil means no limit, the default; a typed nil (a nil
// *rate.Limiter in the interface) is not nil, and its Wait is called.
//
// The wait comes before the breaker is asked (no probe is held while the
// limiter waits) and on the call's context: it counts against the call's
// deadline, and the caller's cancel ends it. If Wait returns an error and
// the call's context has ended, the loop stops for the context (Reason
// [Canceled] or [Deadline]); any other error (x/time/rate refuses a wait
// that would end past the context's deadline) stops it with Reason
// [Deadline], the limiter's error reachable with errors.Is and errors.As
// and Err the last error of the operation, nil if none ran. A retry the
// budget granted before the limiter refused it stays spent (see [Guards]).
//
// l is shared by every call of the policy, so it must be safe for
// concurrent use; its Wait is called on every attempt, so the policy's
// success path allocates whatever Wait allocates. It is a [ScheduleOption]:
// package httpretry's and grpcretry's WithRetry take it, and then one
// limiter paces the attempts to every host or target of the client. A
// Wait that panics (or calls runtime.Goexit) ends the call as a
// classifier's panic does: the observer ([WithObserver]) hears a GiveUp
// with Reason "panic", and the panic goes on.
func WithRateLimit(l interface{ Wait(context.Context) error }) ScheduleOption {
	return scheduleOption(func(p *config) error {
		p.rateLimit = l
		return nil
	})
}

// waitRate waits for the policy's rate limiter before attempt; it returns nil, or
// the give-up of a call whose limiter refused the attempt (lastErr the
// last error of the operation).
func (p *Policy) waitRate(ctx context.Context, attempt int, lastErr error) error {
	lerr := p.rateLimit.Wait(ctx)
	if lerr == nil {
		return nil
	}
	if ctx.Err() != nil {
		return p.stop(ctx, ctxReason(ctx), attempt-1, lastErr, 0)
	}
	return p.giveUp(ctx, &Error{Reason: Deadline, Attempts: attempt - 1, Err: lastErr, cause: fmt.Errorf("retry: rate limit: %w", lerr)})
}
