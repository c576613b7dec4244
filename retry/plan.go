package retry

import (
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
)

// Plan returns the decision step of a new call through p: the decision the
// loop makes after each failed attempt, for code that runs its own loop (a
// job scheduler that re-queues work, a simulation). [Policy.Do] makes
// exactly these decisions.
//
// next is told that the call's next attempt failed with err, left before
// the call's deadline (0 or less: the call has none; a loop whose deadline
// has passed stops with Deadline itself, as Do does, before it asks). A
// budget withdrawal that waits (a fleet's, WithdrawWithin) counts against
// left: a sleep that no longer fits after it stops with Deadline, the
// retry withdrawn unused, as in Do. It returns how long
// to sleep before the following attempt, with stop 0, or the [Reason] to
// stop for, with sleep the sleep it refused for a [Deadline] stop (the
// server's hint, for a hint above [WithMaxRetryAfter]). In
// order, it stops when err is not retryable (NotRetryable), the attempts
// are used up (AttemptsExhausted), the server's hint exceeds the policy's
// maximum or the sleep would end at or after the deadline (Deadline), the
// policy's breaker is open for longer than the sleep and the call cannot
// wait for it (CircuitOpen), or the policy's budget refuses the retry
// (BudgetExhausted; a retry it admits is withdrawn). The caller must not
// call next after a stop, and reports the attempt's outcome to the breaker
// itself. next holds the call's state (its attempts, its backoff
// sequence): one per call, not safe for concurrent use.
func (p *Policy) Plan() (next func(err error, left time.Duration) (sleep time.Duration, stop Reason)) {
	if p == nil {
		p = defaultPolicy
	}
	pl := &plan{p: p, seq: p.backoff.Sequence()}
	return func(err error, left time.Duration) (time.Duration, Reason) {
		var start time.Time
		if p.within != nil && left > 0 {
			start = time.Now()
		}
		sleep, stop, _ := pl.next(err, left)
		if stop == 0 && !start.IsZero() && time.Since(start)+sleep >= left {
			return sleep, Deadline // the withdrawal waited: Do's check after it
		}
		return sleep, stop
	}
}

// plan is one call's retry schedule.
type plan struct {
	p        *Policy
	seq      backoff.Sequence
	attempts int
	byHint   bool // the last sleep was set by the server's hint, not the backoff
	hintOver bool // the last stop was for a hint above the policy's maximum
}

// next is the decision step, with the breaker's rejection for a
// CircuitOpen stop.
func (pl *plan) next(err error, left time.Duration) (time.Duration, Reason, error) {
	p := pl.p
	pl.attempts++
	if isPermanent(err) || (err != errAgain && !p.classify(err)) {
		return 0, NotRetryable, nil
	}
	if pl.attempts >= p.maxAttempts {
		return 0, AttemptsExhausted, nil
	}
	sleep := pl.seq.Next()
	hint := RetryAfter(err)
	if hint > p.maxRetryAfter {
		pl.hintOver = true
		return hint, Deadline, nil
	}
	pl.byHint = hint > sleep
	if pl.byHint {
		spread := hint / 2
		if left > 0 {
			spread = min(spread, left-hint-1)
		}
		sleep = p.backoff.Jitter(hint, spread)
	}
	if left > 0 && sleep >= left {
		return sleep, Deadline, nil
	}
	if b := p.breaker; b != nil {
		if oerr := openBeyond(b, sleep, left); oerr != nil {
			return 0, CircuitOpen, oerr
		}
	}
	if p.budget != nil && !p.withdraw(left) {
		return 0, BudgetExhausted, nil
	}
	return sleep, 0, nil
}

// openBeyond returns the breaker's rejection if b is open for longer than
// sleep and a call with left before its deadline cannot wait for its next
// probe round (waiting is off, or every place to wait is taken); nil
// otherwise.
func openBeyond(b *breaker.Breaker, sleep, left time.Duration) error {
	if b.State() != breaker.Open {
		return nil
	}
	s := b.Snapshot()
	if s.State != breaker.Open || s.HalfOpenIn <= sleep {
		return nil
	}
	if mw := b.Config().MaxWaiters; left > 0 && s.HalfOpenIn < left && mw > 0 && s.Waiters < mw {
		return nil // the next attempt waits for the round (if no other call takes the last place first)
	}
	return &breaker.OpenError{State: breaker.Open, Wait: s.HalfOpenIn}
}

// withdraw asks the budget for one retry, within left of the call's
// deadline if the budget may wait.
func (p *Policy) withdraw(left time.Duration) bool {
	if p.within != nil {
		return p.within.WithdrawWithin(max(left, 0))
	}
	return p.budget.Withdraw()
}
