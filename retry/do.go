package retry

import (
	"context"
	"errors"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// Do runs op until it succeeds or the policy gives up, and returns nil on
// success or an [*Error] saying why it stopped.
//
// op receives the attempt's context and the attempt number (1 for the
// first). The call's deadline is ctx's; it covers every attempt, sleep and
// wait behind an open breaker. The attempt's context is ctx itself, or,
// with [WithAttemptTimeout], one that ends at the earlier of the attempt's
// cap and the call's deadline.
//
// With a circuit breaker ([WithGuards]), every attempt must be admitted by
// it first. A call that meets an open breaker waits for it when the
// breaker's next probe round comes before the call's deadline (it may be
// handed a probe, or be released when the breaker closes; nothing is sent
// and no attempt or budget is spent while it waits, and a probe it was
// handed that fails sends it back to waiting without costing it an attempt
// or budget); otherwise, or if the wait ends at the deadline, the loop
// stops with Reason [CircuitOpen]. With a concurrency limiter
// ([WithGuards]), every admitted attempt then takes one of its slots, at
// once or waiting within the call's deadline, and gives it back when it
// ends; a refusal stops the loop with Reason [Limited]. With a retry budget
// ([WithGuards]), the first attempt deposits into it. With a rate limit
// ([WithRateLimit]), every attempt first waits for the rate limiter, before
// the breaker is asked.
//
// After a failed attempt the loop stops, in this order, when:
//   - ctx has ended: Reason [Canceled] (or [Deadline] if ctx's deadline
//     passed). A canceled call is never retried, and a cancel during a sleep
//     ends the sleep at once.
//   - the deadline has passed: Reason [Deadline].
//   - the error is not retryable (the classifier, or [Permanent]): Reason
//     [NotRetryable].
//   - it was the last allowed attempt: Reason [AttemptsExhausted].
//   - the next sleep would end at or after the deadline, or the server's
//     hint exceeds [WithMaxRetryAfter]: Reason [Deadline], without
//     sleeping. The loop never sleeps past the deadline.
//   - the breaker is open for longer than the next sleep and the call
//     cannot wait for it: Reason [CircuitOpen], without sleeping.
//   - the retry budget refuses the retry: Reason [BudgetExhausted], with
//     the last error, without sleeping.
//
// Otherwise it sleeps and tries again. The sleep is the backoff's delay or,
// when the error carries a longer server hint ([RetryAfter]), a random time
// in [hint, 1.5·hint) that never passes the deadline, drawn from the
// backoff's random source: the hint is a floor that jitter never undercuts,
// and clients told the same by one server do not come back in the same
// instant. [Policy.Plan] exposes this decision step.
//
// If op panics (or calls runtime.Goexit), the loop reports what its return
// would have before the panic goes on with its value: the attempt is a
// failure for the breaker, and the observer hears of the attempt's end
// (Outcome "failure", Err saying what op panicked with) and of the call's
// (GiveUp with Reason "panic"), so that a span started for the attempt
// ends.
//
// If ctx has already ended, op is not called and Do returns an *Error with
// Attempts 0. A nil op makes Do return an error. Do is safe for concurrent
// use; the loop's time is the system clock (which a testing/synctest bubble
// fakes).
func (p *Policy) Do(ctx context.Context, op func(ctx context.Context, attempt int) error) error {
	return p.run(ctx, op)
}

// DoValue is [Policy.Do] for an operation that returns a value. On success
// it returns the value of the successful attempt and a nil error. When it
// gives up it returns the [*Error] together with the value the last
// attempt returned (often the zero value; for an HTTP call, the last
// response, so the caller can still read what the server said), or the
// zero value if no attempt ran. To serve a value of the caller's own when
// the loop gives up (cached data while the circuit is open), test the
// error's Reason:
//
//	v, err := retry.DoValue(ctx, p, fetch)
//	if re := (*retry.Error)(nil); errors.As(err, &re) && re.Reason == retry.CircuitOpen {
//		v, err = cached()
//	}
func DoValue[T any](ctx context.Context, p *Policy, op func(ctx context.Context, attempt int) (T, error)) (T, error) {
	var v T
	if op == nil {
		return v, errNilOperation
	}
	err := p.run(ctx, func(ctx context.Context, attempt int) error {
		var err error
		v, err = op(ctx, attempt)
		return err
	})
	return v, err
}

// errNilOperation is what Do and DoValue return for a nil operation.
var errNilOperation = errors.New("retry: nil operation")

// run is the retry loop shared by Do and DoValue. op must not escape: the
// success path allocates nothing without an attempt timeout.
func (p *Policy) run(ctx context.Context, op func(context.Context, int) error) error {
	if op == nil {
		return errNilOperation
	}
	if p == nil {
		p = defaultPolicy
	}
	var first error
	if p.path == pathBare {
		// The first attempt runs here, in a small frame, and the loop
		// takes over only if it fails. It runs on ctx itself. A passed
		// deadline shows in ctx.Err() only once its timer has run.
		if ctx.Err() != nil {
			return p.stop(ctx, ctxReason(ctx), 0, nil, 0)
		}
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return p.stop(ctx, Deadline, 0, nil, 0)
		}
		if p.budget != nil {
			p.budget.Deposit()
		}
		if first = op(ctx, 1); first == nil {
			return nil
		}
	}
	if p.path != pathGuarded {
		return p.loop(ctx, op, first, nil)
	}
	// A breaker, a limiter, an observer or an attempt timeout: if op (or
	// the observer or the classifier, from the attempt's start to the
	// report of its outcome) panics or calls runtime.Goexit, the deferred
	// function ends the attempt as the loop would have had op returned,
	// before the panic goes on (see attempt). The loop itself has too many returns for a
	// defer of its own to be cheap; here it costs a guarded call one
	// deferred call that tests a flag.
	a := attempt{p: p, ctx: ctx}
	defer func() {
		if a.running {
			// recover must be called by the deferred function itself.
			// Only with an observer is the panic recovered, to name its
			// value in the events; panicked raises it again.
			var v any
			if p.observer != nil {
				v = recover()
			}
			a.panicked(v)
		} else if a.deciding {
			var v any
			if p.observer != nil {
				v = recover()
			}
			a.undecided(v)
		} else if a.held {
			a.unsent()
		}
	}()
	return p.loop(ctx, op, first, &a)
}

// loop is the retry loop proper. first is the error of attempt 1 if run
// made it, else nil. Attempts run on ctx unless each gets its own context.
// g, if not nil, is told of each attempt before op runs (see loopGuarded),
// each field where the loop learns it; nil when the policy has nothing to
// end for an attempt whose op panics (pathLoop), so that the blocks of the
// breaker, the limiter, the attempt timeout and the observer, which only a
// guarded policy runs, write to it without a test.
//
// It is one function of about 150 lines on purpose: the attempt, the
// breaker's admission and report, the deadline checks and the sleep share
// a handful of locals (the time now, the deadline, the permit) that a split
// would pass back and forth on the hot path.
//
//stormguard:long the attempt, the breaker and the sleep share the locals of the hot path
func (p *Policy) loop(ctx context.Context, op func(context.Context, int) error, first error, g *attempt) error {
	deadline, hasDL := ctx.Deadline()
	needNow := hasDL || p.attemptTimeout > 0 // the loop must read the clock
	var now time.Time
	if needNow {
		now = time.Now()
	}
	brk, lim := p.breaker, p.limiter
	pl := plan{p: p, seq: p.backoff.Sequence()}
	var lastErr error
	for attempt := 1; ; attempt++ {
		var err error
		var permit breaker.Permit
		var waited bool // the breaker made this attempt wait: a release
		var slot limit.Permit
		attemptExpired, overallOnly, late := false, true, false
		if attempt == 1 && first != nil {
			err = first // run made the first attempt (no deadline, no breaker)
			late = ctx.Err() != nil
		} else {
			// Before each attempt: is the caller still there, is there time?
			if ctx.Err() != nil {
				return p.stop(ctx, ctxReason(ctx), attempt-1, lastErr, 0)
			}
			if needNow && attempt > 1 {
				now = time.Now()
			}
			if hasDL && !now.Before(deadline) {
				return p.stop(ctx, Deadline, attempt-1, lastErr, 0)
			}
			if p.rateLimit != nil {
				if g != nil {
					g.deciding = true // a limiter whose Wait panics ends the call
				}
				gerr := p.waitRate(ctx, attempt, lastErr)
				if g != nil {
					g.deciding = false
				}
				if gerr != nil {
					return gerr
				}
				if ctx.Err() != nil { // a limiter may admit a wait its caller ended
					return p.stop(ctx, ctxReason(ctx), attempt-1, lastErr, 0)
				}
				if needNow {
					now = time.Now()
				}
				if hasDL && !now.Before(deadline) {
					return p.stop(ctx, Deadline, attempt-1, lastErr, 0)
				}
			}
			// The breaker, then a slot of the limiter; again if the breaker
			// opened while the attempt waited for its slot.
			for {
				if brk != nil {
					var oerr error
					var left time.Duration // read only with a deadline: Sub of zero Times is slow
					if hasDL {
						left = deadline.Sub(now)
					}
					if permit, waited, oerr = p.admit(ctx, brk, hasDL, left); oerr != nil {
						// A call that waited for the breaker until its deadline
						// stops for the breaker; one canceled meanwhile, for
						// its caller.
						if ctx.Err() != nil && ctxReason(ctx) == Canceled {
							return p.stop(ctx, Canceled, attempt-1, lastErr, 0)
						}
						if attempt == 1 {
							return p.stop(ctx, CircuitOpen, 0, oerr, 0)
						}
						return p.giveUp(ctx, &Error{Reason: CircuitOpen, Attempts: attempt - 1, Err: lastErr, cause: oerr})
					}
					if waited && ctx.Err() != nil {
						// Released as its caller went away: send nothing.
						brk.Cancel(permit)
						return p.stop(ctx, ctxReason(ctx), attempt-1, lastErr, 0)
					}
					if waited && needNow {
						now = time.Now()
					}
					if hasDL && !now.Before(deadline) {
						// Admitted just as the time ran out: send nothing.
						brk.Cancel(permit)
						return p.stop(ctx, Deadline, attempt-1, lastErr, 0)
					}
					g.permit = permit // a breaker makes the policy guarded: g is not nil
				}
				if lim != nil {
					var lerr error
					if slot, lerr = lim.Acquire(ctx); lerr != nil {
						if brk != nil {
							brk.Cancel(permit) // nothing was sent
						}
						return p.limited(ctx, attempt, lastErr, lerr)
					}
					g.slot = slot // as g.permit
					if brk != nil && !p.current(brk, permit) {
						// The breaker opened while the attempt waited for its
						// slot (or, for a probe, its round ended): nothing goes
						// to a dependency it has judged down. The slot goes
						// back as a cancelled attempt's, and the attempt asks
						// the breaker again.
						brk.Cancel(permit)
						lim.Release(slot, true)
						g.permit, g.slot = breaker.Permit{}, limit.Permit{}
						if needNow {
							now = time.Now()
						}
						continue
					}
					if needNow {
						now = time.Now() // the attempt starts after any wait for a slot
					}
					if p.restamp != nil { // set only with a breaker (see New)
						permit = p.restamp(brk, permit) // SlowCall times the attempt, not the wait
						g.permit = permit
					}
				}
				break
			}
			if attempt == 1 && p.budget != nil {
				if g != nil {
					g.held = true // a Deposit that panics gives the permit and the slot back
				}
				if p.oneClock != nil && needNow {
					p.depositAt(p.oneClock, now) // the reading the loop made: no second one
				} else {
					p.budget.Deposit()
				}
				if g != nil {
					g.held = false
				}
			}

			// The attempt, on a context carrying only the time that is left.
			actx := ctx
			var cancel context.CancelFunc
			if p.attemptTimeout > 0 {
				adl := now.Add(p.attemptTimeout) // now: read after any wait for a slot
				if hasDL && !adl.Before(deadline) {
					adl = deadline
				} else {
					overallOnly = false
				}
				actx, cancel = context.WithDeadline(ctx, adl)
				g.cancel = cancel // as g.permit
			}
			if permit.Probe() || waited {
				actx = markProbe(actx) // see IsProbe
			}
			var started time.Time
			if g != nil {
				// Until the attempt's outcome is reported, a panic (or a
				// runtime.Goexit) of op, of the observer or of the
				// classifier ends the attempt as op's would (see run).
				g.running, g.ended = true, false
			}
			if p.observer != nil {
				g.actx, g.n = actx, attempt // as g.permit; for an AttemptStart that panics
				actx, started = p.attemptStart(actx, attempt)
				g.actx, g.started = actx, started
			}
			err = op(actx, attempt)
			attemptExpired = cancel != nil && actx.Err() != nil
			// Late: the caller went away or the call's deadline passed
			// while the attempt ran, its context's timer run or not yet.
			late = ctx.Err() != nil
			if err != nil && !late && hasDL {
				now = time.Now()
				late = !now.Before(deadline)
			}
			if p.observer != nil {
				e := p.attemptEndEvent(attempt, err, started, late) // asks the classifier, which may panic: not ended yet
				g.ended = true                                      // an observer that panics hearing of the end is not told it again
				p.observer.Observe(actx, e)
			}
			if lim != nil {
				lim.Release(slot, err != nil && p.dropped(ctx, err, attemptExpired || late))
				g.slot = limit.Permit{} // given back: not again if the classifier panics below
			}
			if cancel != nil {
				cancel()
			}
			if err == nil {
				if g != nil {
					g.running = false
				}
				if brk != nil {
					brk.Done(permit, true) // at its end: a long attempt's success counts where it ended
				}
				return nil
			}
		}
		lastErr = err

		// The caller's end and the deadline come before the classifier:
		// they are never retried, whatever the error says.
		if late {
			if g != nil {
				g.running = false
			}
			if brk != nil {
				brk.Cancel(permit) // the caller went away: no outcome
			}
			r := Deadline // the deadline passed, its timer not run yet
			if ctx.Err() != nil {
				r = ctxReason(ctx)
			}
			return p.stop(ctx, r, attempt, err, 0)
		}
		if needNow {
			now = time.Now()
		}
		if brk != nil {
			if p.failed(err) {
				brk.Fail(permit, RetryAfter(err))
			} else {
				brk.Done(permit, true)
			}
		}
		if g != nil {
			g.running = false // the attempt's outcome is reported
		}
		if (attemptExpired && overallOnly) || (hasDL && !now.Before(deadline)) {
			return p.stop(ctx, Deadline, attempt, err, 0)
		}
		if permit.Probe() && hasDL && !isPermanent(err) && (err == errAgain || p.classifyFor(g, err)) {
			// A probe the breaker handed to this call failed: the
			// breaker is open again and the call goes back to waiting
			// for it. Probes are the breaker's, a few per round however
			// many calls wait: the call spends no attempt and no budget.
			continue
		}
		var left time.Duration
		if hasDL {
			left = deadline.Sub(now)
		}
		if g != nil {
			g.deciding = true // the classifier is asked again: a panic ends the call
		}
		sleep, reason, oerr := pl.next(err, left)
		if g != nil {
			g.deciding = false
		}
		switch reason {
		case 0:
		case NotRetryable:
			if p.defaultClass && unclassified(err) {
				return p.giveUp(ctx, &Error{Reason: NotRetryable, Attempts: attempt, Err: err, classified: true})
			}
			return p.stop(ctx, NotRetryable, attempt, err, 0)
		case CircuitOpen:
			return p.giveUp(ctx, &Error{Reason: CircuitOpen, Attempts: attempt, Err: err, cause: oerr})
		case Deadline:
			if pl.hintOver {
				return p.stopHint(ctx, attempt, err)
			}
			return p.stop(ctx, Deadline, attempt, err, sleep)
		default:
			return p.stop(ctx, reason, attempt, err, 0)
		}
		if hasDL && p.within != nil && !time.Now().Add(sleep).Before(deadline) {
			// The budget's withdrawal waited (a fleet's round trip) and
			// the sleep no longer fits: give up now, not past the
			// deadline (the retry withdrawn goes unused).
			return p.stop(ctx, Deadline, attempt, err, sleep)
		}
		if p.observer != nil {
			p.retrying(ctx, attempt, sleep, pl.byHint, err)
		}
		if !sleepFor(ctx, sleep) {
			return p.stop(ctx, ctxReason(ctx), attempt, err, 0)
		}
	}
}

// classifyFor is p.classify for the loop's decision after an attempt
// whose outcome is reported, with g (if any) told that it decides: a panic
// of the classifier then ends the call (see attempt.undecided).
func (p *Policy) classifyFor(g *attempt, err error) bool {
	if g == nil {
		return p.classify(err)
	}
	g.deciding = true
	r := p.classify(err)
	g.deciding = false
	return r
}

// dropped reports whether an attempt that ended with err (expired: cut
// off by its own timeout) is a drop for the limiter rather than a latency
// sample: it timed out, the caller went away (ctx ended), or the
// dependency failed (the classifier judges err retryable: overload, a
// broken connection). A success or an answer (a 404) is a sample.
func (p *Policy) dropped(ctx context.Context, err error, expired bool) bool {
	return err != nil && (expired || ctx.Err() != nil || p.failed(err))
}

// limited ends the call whose next attempt the limiter refused with lerr:
// for its caller if it was canceled meanwhile, else with Reason Limited.
func (p *Policy) limited(ctx context.Context, attempt int, lastErr, lerr error) error {
	if ctx.Err() != nil && ctxReason(ctx) == Canceled {
		return p.stop(ctx, Canceled, attempt-1, lastErr, 0)
	}
	if attempt == 1 {
		return p.stop(ctx, Limited, 0, lerr, 0)
	}
	return p.giveUp(ctx, &Error{Reason: Limited, Attempts: attempt - 1, Err: lastErr, cause: lerr})
}

// sleepFor waits for d, or until ctx ends; it reports whether it slept the
// whole d. A d of 0 or less returns at once.
// maxSleep is the longest sleep the loop trusts a runtime timer with: one
// that ends past the runtime's clock, which saturates 292 years after the
// process starts, fires early. A sleep this long or longer lasts until the
// context ends. (Hints, at most maxHintWait and jittered by half again,
// stay below it.)
const maxSleep = 250 * 365 * 24 * time.Hour

func sleepFor(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	if d >= maxSleep {
		<-ctx.Done()
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// attemptStart reports the start of an attempt and returns its context
// (tagged by the observer, if it tags) and its start time.
func (p *Policy) attemptStart(ctx context.Context, attempt int) (context.Context, time.Time) {
	e := observe.Event{Kind: observe.AttemptStart, Name: p.name, Attempt: attempt}
	if p.tagger != nil {
		ctx = p.tagger.TagAttempt(ctx, e)
	} else {
		p.observer.Observe(ctx, e)
	}
	return ctx, time.Now()
}

// attemptEnd reports the end of an attempt (see attemptEndEvent).
func (p *Policy) attemptEnd(ctx context.Context, attempt int, err error, started time.Time, late bool) {
	p.observer.Observe(ctx, p.attemptEndEvent(attempt, err, started, late))
}

// attemptEndEvent returns the event of an attempt's end; late: the call's
// context had ended when it returned (the breaker gives its permit back,
// and the classifier is not asked).
func (p *Policy) attemptEndEvent(attempt int, err error, started time.Time, late bool) observe.Event {
	e := observe.Event{Kind: observe.AttemptEnd, Name: p.name, Attempt: attempt, Elapsed: time.Since(started), Err: err, Outcome: "success"}
	switch {
	case err == nil:
	case isPanic(err):
		e.Outcome = "failure" // as the breaker counts it
	case late:
		e.Outcome = "canceled" // counted neither way
	case p.failed(err):
		e.Outcome = "failure"
	default:
		e.Outcome = "rejected"
	}
	return e
}

// retrying reports a retry about to happen after attempt failed with err;
// requires p.observer != nil.
func (p *Policy) retrying(ctx context.Context, attempt int, sleep time.Duration, byHint bool, err error) {
	why := "backoff"
	if byHint {
		why = "hint"
	}
	p.observer.Observe(ctx, observe.Event{Kind: observe.Retry, Name: p.name, Attempt: attempt, Delay: sleep, Outcome: why, Err: err})
}

// ctxReason maps the end of ctx to a Reason: Deadline for a deadline,
// Canceled otherwise.
func ctxReason(ctx context.Context) Reason {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return Deadline
	}
	return Canceled
}

// stop builds the give-up error, with the parent's cancel cause if it has
// one, and gives up with it.
func (p *Policy) stop(ctx context.Context, r Reason, attempts int, last error, delay time.Duration) error {
	e := &Error{Reason: r, Attempts: attempts, Err: unmarkPermanent(last), delay: delay}
	if ce := ctx.Err(); ce != nil {
		if cause := context.Cause(ctx); cause != nil && cause != ce {
			e.cause = cause
		}
	}
	return p.giveUp(ctx, e)
}

// stopHint gives up with Reason Deadline for a server hint above the
// policy's maximum (see WithMaxRetryAfter): the give-up's RetryAfter is
// the hint, read from last.
func (p *Policy) stopHint(ctx context.Context, attempts int, last error) error {
	return p.giveUp(ctx, &Error{Reason: Deadline, Attempts: attempts, Err: unmarkPermanent(last), maxHint: p.maxRetryAfter})
}

// giveUp reports e and returns it.
func (p *Policy) giveUp(ctx context.Context, e *Error) error {
	if p.observer != nil {
		delay := e.delay
		if e.maxHint > 0 {
			delay = RetryAfter(e.Err) // the refused sleep: the server's hint
		}
		p.observer.Observe(ctx, observe.Event{Kind: observe.GiveUp, Name: p.name, Attempt: e.Attempts, Reason: e.Reason.name(), Delay: delay, Err: e.Err})
	}
	return e
}
