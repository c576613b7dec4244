package retry

import (
	"context"
	"errors"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
)

// Do runs op until it succeeds or the policy gives up, and returns nil on
// success or an [*Error] saying why it stopped.
//
// op receives the attempt's context and the attempt number (1 for the
// first). The attempt's context carries only the time left of the overall
// deadline (the earlier of the parent's deadline and [WithTimeout] from the
// start of the call), capped by [WithAttemptTimeout]; without either option
// it is ctx itself.
//
// With a circuit breaker ([WithBreaker]), every attempt must be admitted
// by it first; a rejection stops the loop with Reason [CircuitOpen]. With a
// retry budget ([WithBudget]), the first attempt deposits into it.
//
// After a failed attempt the loop stops, in this order, when:
//   - ctx has ended: Reason [Canceled] (or [Deadline] if ctx's deadline
//     passed). A canceled call is never retried, and a cancel during a sleep
//     ends the sleep at once.
//   - the overall deadline has passed: Reason [Deadline].
//   - the error is not retryable (the classifier, or [Permanent]): Reason
//     [NotRetryable].
//   - it was the last allowed attempt: Reason [AttemptsExhausted].
//   - the next sleep would end at or after the overall deadline, or the
//     server's hint exceeds [WithMaxRetryAfter]: Reason [Deadline], without
//     sleeping. The loop never sleeps past the deadline.
//   - the breaker is open and stays open longer than the next sleep:
//     Reason [CircuitOpen], without sleeping.
//   - the retry budget refuses the retry: Reason [BudgetExhausted], with
//     the last error, without sleeping.
//
// Otherwise it sleeps max(backoff delay, server hint), where the hint is
// [RetryAfter] of the error (a floor that jitter never undercuts; the
// backoff's own sequence, decorrelated's "previous delay" included, is not
// changed by the hint), and tries again.
//
// If ctx has already ended, op is not called and Do returns an *Error with
// Attempts 0. A nil op makes Do return [ErrNilOperation]. Do is safe for
// concurrent use.
func (p *Policy) Do(ctx context.Context, op func(ctx context.Context, attempt int) error) error {
	return p.run(ctx, op)
}

// DoValue is [Policy.Do] for an operation that returns a value. On success
// it returns the value of the successful attempt and a nil error. When it
// gives up it returns the [*Error] together with the value the last
// attempt returned (often the zero value; for an HTTP call, the last
// response, so the caller can still read what the server said), or the
// zero value if no attempt ran.
func DoValue[T any](ctx context.Context, p *Policy, op func(ctx context.Context, attempt int) (T, error)) (T, error) {
	var v T
	if op == nil {
		return v, ErrNilOperation
	}
	err := p.run(ctx, func(ctx context.Context, attempt int) error {
		var err error
		v, err = op(ctx, attempt)
		return err
	})
	return v, err
}

// run is the retry loop shared by Do and DoValue. op must not escape: the
// success path allocates nothing when no timeout option is set.
func (p *Policy) run(ctx context.Context, op func(context.Context, int) error) error {
	if op == nil {
		return ErrNilOperation
	}
	if p == nil {
		p = defaultPolicy
	}
	var first error
	if p.realClock && p.timeout == 0 && p.attemptTimeout == 0 && p.breaker == nil {
		// The first attempt runs here, in a small frame, and the loop
		// takes over only if it fails. Without a timeout option it runs on
		// ctx itself and needs no deadline: on the system clock, a parent
		// deadline that has passed shows in ctx.Err().
		if ctx.Err() != nil {
			return p.stop(ctx, ctxReason(ctx, nil), 0, nil, 0)
		}
		if p.budget != nil {
			p.budget.Deposit()
		}
		if first = op(ctx, 1); first == nil {
			return nil
		}
	}
	return p.runTimed(ctx, op, first)
}

// runTimed works out the overall deadline on p.clock's timeline and runs
// the loop. first is the error of attempt 1 if run made it, else nil.
func (p *Policy) runTimed(ctx context.Context, op func(context.Context, int) error, first error) error {
	parentDL, hasDL := ctx.Deadline()
	if !hasDL && p.timeout == 0 && p.attemptTimeout == 0 {
		return p.loop(ctx, ctx, op, &times{first: first})
	}
	t := times{needNow: true, first: first}
	t.now = p.clock.Now()
	if hasDL {
		t.deadline, t.hasDL = parentDL, true
		if !p.realClock {
			t.deadline = t.now.Add(time.Until(parentDL))
		}
	}
	if p.timeout > 0 {
		if d := t.now.Add(p.timeout); !t.hasDL || d.Before(t.deadline) {
			t.deadline, t.hasDL = d, true
		}
	}

	// Without a per-attempt cap, one context per call carries the policy's
	// own timeout to every attempt; otherwise attempts run on ctx itself.
	if p.timeout > 0 && p.attemptTimeout == 0 {
		return p.loopWithCallContext(ctx, op, &t)
	}
	return p.loop(ctx, ctx, op, &t)
}

// times is a call's view of time: the overall deadline and the latest
// reading of the clock, on the policy clock's timeline.
type times struct {
	now, deadline time.Time
	hasDL         bool  // there is an overall deadline
	needNow       bool  // the loop must read the clock (hasDL or a timeout option)
	callCtx       bool  // attempts run on a context derived for the call
	first         error // not nil: run made attempt 1 itself and it failed so
}

// loopWithCallContext runs the loop with attempts on one context that ends
// at the overall deadline. It is apart from run so that run has no defer:
// with as many returns as the loop has, a defer there would not be
// open-coded and would cost every call, the success path included.
func (p *Policy) loopWithCallContext(ctx context.Context, op func(context.Context, int) error, t *times) error {
	callCtx, cancel := p.withDeadline(ctx, t.deadline, t.now)
	defer cancel()
	t.callCtx = true
	return p.loop(ctx, callCtx, op, t)
}

// loop is the retry loop proper. Attempts run on callCtx (ctx itself, or one
// context per call carrying the policy's timeout) unless each attempt gets
// its own context; ctx is the caller's.
func (p *Policy) loop(ctx, callCtx context.Context, op func(context.Context, int) error, t *times) error {
	hasDL, needNow, now, deadline := t.hasDL, t.needNow, t.now, t.deadline
	brk := p.breaker
	var seq backoff.Sequence // set up at the first retry
	var lastErr error
	for attempt := 1; ; attempt++ {
		var err error
		var permit breaker.Permit
		attemptExpired, overallOnly := false, true
		if attempt == 1 && t.first != nil {
			err = t.first // run made the first attempt (no deadline, no breaker)
		} else {
			// Before each attempt: is the caller still there, is there time?
			if ctx.Err() != nil {
				return p.stop(ctx, ctxReason(ctx, nil), attempt-1, lastErr, 0)
			}
			if needNow && attempt > 1 {
				now = p.clock.Now()
			}
			if hasDL && !now.Before(deadline) {
				return p.stop(ctx, Deadline, attempt-1, lastErr, 0)
			}
			if brk != nil {
				var oerr error
				if permit, oerr = brk.Allow(); oerr != nil {
					if attempt == 1 {
						return p.stop(ctx, CircuitOpen, 0, oerr, 0)
					}
					return p.giveUp(ctx, &Error{Reason: CircuitOpen, Attempts: attempt - 1, Err: lastErr, cause: oerr})
				}
			}
			if attempt == 1 && p.budget != nil {
				p.budget.Deposit()
			}

			// The attempt, on a context carrying only the time that is left.
			actx := callCtx
			var cancel context.CancelFunc
			if p.attemptTimeout > 0 {
				adl := now.Add(p.attemptTimeout)
				if hasDL && !adl.Before(deadline) {
					adl = deadline
				} else {
					overallOnly = false
				}
				actx, cancel = p.withDeadline(ctx, adl, now)
			}
			if brk != nil {
				err = attemptGuarded(brk, permit, op, actx, attempt)
			} else {
				err = op(actx, attempt)
			}
			attemptExpired = (t.callCtx || cancel != nil) && actx.Err() != nil
			if cancel != nil {
				cancel()
			}
			if err == nil {
				if brk != nil {
					brk.Done(permit, true)
				}
				return nil
			}
		}
		lastErr = err

		// The caller's end and the overall deadline come before the
		// classifier: they are never retried, whatever the error says.
		if ctx.Err() != nil {
			if brk != nil {
				brk.Cancel(permit) // the caller went away: no outcome
			}
			return p.stop(ctx, ctxReason(ctx, nil), attempt, err, 0)
		}
		if needNow {
			now = p.clock.Now()
		}
		if (attemptExpired && overallOnly) || (hasDL && !now.Before(deadline)) {
			if brk != nil {
				brk.Done(permit, !p.failed(err))
			}
			return p.stop(ctx, Deadline, attempt, err, 0)
		}
		retryable := !IsPermanent(err) && p.classify(err)
		if brk != nil {
			brk.Done(permit, !p.failed(err))
		}
		if !retryable {
			return p.stop(ctx, NotRetryable, attempt, unmarkPermanent(err), 0)
		}
		if attempt >= p.maxAttempts {
			return p.stop(ctx, AttemptsExhausted, attempt, err, 0)
		}

		// The sleep: the backoff delay, raised to the server's hint.
		hint := RetryAfter(err)
		if attempt == 1 {
			seq = p.backoff.Sequence()
		}
		sleep := max(seq.Next(), hint)
		if hint > p.maxRetryAfter {
			return p.stop(ctx, Deadline, attempt, err, sleep)
		}
		if hasDL && sleep >= deadline.Sub(now) {
			return p.stop(ctx, Deadline, attempt, err, sleep)
		}
		if brk != nil {
			if oerr := openLongerThan(brk, sleep); oerr != nil {
				return p.giveUp(ctx, &Error{Reason: CircuitOpen, Attempts: attempt, Err: err, cause: oerr})
			}
		}
		if p.budget != nil && !p.budget.Withdraw() {
			return p.stop(ctx, BudgetExhausted, attempt, err, 0)
		}
		if p.onRetry != nil || p.logger != nil {
			e := RetryEvent{Attempt: attempt, Delay: sleep, RetryAfter: hint, Err: err}
			if p.onRetry != nil {
				p.onRetry(ctx, e)
			}
			if p.logger != nil {
				p.logRetry(ctx, e)
			}
		}
		if serr := p.clock.Sleep(ctx, sleep); serr != nil {
			if ctx.Err() == nil { // a Clock that failed on its own: keep its error
				return p.giveUp(ctx, &Error{Reason: ctxReason(ctx, serr), Attempts: attempt, Err: err, cause: serr})
			}
			return p.stop(ctx, ctxReason(ctx, nil), attempt, err, 0)
		}
	}
}

// withDeadline derives a context that ends at dl on p.clock's timeline:
// exactly dl for the system clock, the same time left otherwise.
func (p *Policy) withDeadline(ctx context.Context, dl, now time.Time) (context.Context, context.CancelFunc) {
	if p.realClock {
		return context.WithDeadline(ctx, dl)
	}
	return context.WithTimeout(ctx, dl.Sub(now))
}

// ctxReason maps the end of ctx (or, if ctx has not ended, the error a
// Clock's Sleep returned) to a Reason: Deadline for a deadline, Canceled
// otherwise.
func ctxReason(ctx context.Context, sleepErr error) Reason {
	err := ctx.Err()
	if err == nil {
		err = sleepErr
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return Deadline
	}
	return Canceled
}

// stop builds the give-up error, with the parent's cancel cause if it has
// one, and gives up with it.
func (p *Policy) stop(ctx context.Context, r Reason, attempts int, last error, delay time.Duration) error {
	e := &Error{Reason: r, Attempts: attempts, Err: last, Delay: delay}
	if ce := ctx.Err(); ce != nil {
		if cause := context.Cause(ctx); cause != nil && cause != ce {
			e.cause = cause
		}
	}
	return p.giveUp(ctx, e)
}

// giveUp runs the give-up hook, logs e and returns it.
func (p *Policy) giveUp(ctx context.Context, e *Error) error {
	if p.onGiveUp != nil {
		p.onGiveUp(ctx, e)
	}
	if p.logger != nil {
		p.logGiveUp(ctx, e)
	}
	return e
}
