package retry

import (
	"context"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// Budget is a retry budget: the loop deposits once per call and must
// withdraw before every retry. [*budget.Budget] (a per-client budget over a
// sliding window) satisfies it; a budget shared by a whole fleet can too.
//
// Both methods are called from every goroutine that uses the policy, so
// they must be safe for concurrent use. Deposit sits on the hot path (every
// call) and must neither block nor allocate. Withdraw is called only before
// a retry; it should be quick, but may make one short bounded round trip
// (a budget shared by a fleet leasing more retries). Such a budget should
// also have a method WithdrawWithin(left time.Duration) bool: the loop then
// calls it instead of Withdraw, with the time left before the call's
// deadline (0 when the call has none), and the budget must answer within
// it (refusing if it cannot), so that the round trip never outlasts the
// call.
type Budget interface {
	// Deposit records an original request: the first attempt of a call.
	Deposit()
	// Withdraw reports whether one retry may be sent now, and if so
	// records it.
	Withdraw() bool
}

// budgetWithin is a Budget whose Withdraw may wait (see Budget).
type budgetWithin interface {
	WithdrawWithin(left time.Duration) bool
}

// Guards are what guards the calls to one dependency besides the retry
// loop: a retry budget, a circuit breaker and a concurrency limiter, shared
// by every caller of that dependency. Each may be nil: no budget, no
// breaker, no limiter. Package
// httpretry builds one per destination host and package grpcretry one per
// target, or takes them from a func of the caller's (a fleet's, shared
// across processes). Guards is plain data: copy it freely.
type Guards struct {
	// Budget is the retry budget (a *budget.Budget, or a fleet's): each
	// call deposits once, just before its first attempt runs (a call the
	// breaker rejects or the limiter refuses, or whose context ended
	// before it started, sends nothing and deposits nothing), and the loop withdraws before each
	// retry, after every other check and before sleeping. A refusal ends
	// the call at once with Reason [BudgetExhausted], Attempts the
	// attempts that ran and Err the last error the operation returned (the
	// dependency's real answer, not an error of the budget's own). A
	// withdrawal is spent even if the retry then does not run (the caller
	// cancels during the sleep, or the breaker rejects the attempt after
	// it); the budget is asked first so that a refused call fails fast
	// instead of sleeping. A nil *budget.Budget counts as none. A nil
	// pointer of any other type is a Budget like any other value (no
	// check tells it apart without reflection): its methods are called,
	// by hedges too (packages httpretry and grpcretry). One whose
	// methods read their receiver panics on the call's goroutine, at
	// the call's first deposit, before anything is sent (the breaker's
	// permit and the limiter's slot the attempt held are given back
	// first); a nil of the caller's own type is the caller's to avoid (or
	// to make work).
	Budget Budget
	// Breaker is the circuit breaker: every attempt asks it first (see
	// [WithGuards] for how an open one is waited for and how outcomes are
	// counted).
	Breaker *breaker.Breaker
	// Limiter bounds the attempts in flight to the dependency by the limit
	// it learns (see package limit); nil means none. Every attempt
	// acquires a slot after the breaker admits it and before it runs: at
	// once, or by waiting, earliest deadline first within the call's
	// deadline (a call without a deadline waits behind those with one,
	// until a slot comes or it is canceled). A refusal (the limit is
	// reached and its turn comes too late, too many calls wait, or
	// waiting is off) sends
	// nothing, gives the breaker's permit back with
	// [breaker.Breaker.Cancel], deposits nothing, and ends the call with
	// Reason [Limited]; a call canceled while it waits ends with Reason
	// [Canceled]. If the breaker changed state while the attempt waited
	// for its slot (it opened, even if it closed again; for a probe, its
	// round ended, even if another began), nothing is sent: the slot goes back as a cancelled attempt's (a drop) and the
	// attempt asks the breaker again (it may wait behind it). Every slot is
	// released exactly once, when the attempt
	// ends, panics included: as a drop when the attempt timed out (its own
	// [WithAttemptTimeout] or the call's deadline), the caller went away,
	// the classifier judged the error retryable (a 503, a broken
	// connection: overload) or the operation panicked; as a latency sample
	// otherwise (a success, a 404). A breaker attached beside a limiter
	// still paces the release of its waiting calls at its own ReleaseRate;
	// set that negative to let the limiter alone pace them (the layers of
	// packages httpretry and grpcretry do so for the breakers they build).
	Limiter *limit.Limiter
}

// WithGuards attaches a dependency's retry budget, circuit breaker and
// concurrency limiter to the policy (see [Guards]); the zero Guards, the
// default, means none of them.
//
// Every attempt asks the breaker first. A closed breaker admits it at once.
// An open one makes a call with a deadline wait (see
// [breaker.Breaker.Wait]) when its next probe round comes before the
// deadline: the call sends nothing and spends no attempt and no budget
// while it waits, may be handed a probe, and is released in its turn when
// the breaker closes. A call without a deadline, or whose deadline comes
// first, is rejected at once (fails fast), as is one that waited until its
// deadline: the loop stops with Reason [CircuitOpen]. On the first attempt
// the error's Err is the [*breaker.OpenError], whose RetryAfter (the time
// until the next probe round) [RetryAfter] reads back from the returned
// error; on a later one, Err is the operation's last error and the
// *breaker.OpenError is reachable with errors.Is (breaker.ErrOpen) and
// errors.As. If a failure leaves the breaker open for longer than the
// coming sleep and the call cannot wait for it, the loop gives up at once
// in the same way, without sleeping and without spending the budget on a
// retry that could only be rejected.
//
// Every admitted attempt is reported back to the breaker, exactly once
// (an attempt admitted before the breaker changed state, whose outcome the
// breaker then drops as stale, included); an attempt admitted after a wait
// behind the breaker whose caller went away meanwhile is not sent (its
// permit goes back with [breaker.Breaker.Cancel], Reason [Canceled]):
//   - success (nil error) is a success (unless it took the breaker's
//     SlowCall or longer: see [breaker.Config]; the loop times it from
//     the attempt's start, after any wait for a Limiter's slot);
//   - an error the classifier judges retryable (a timeout, a broken
//     connection, 503, ...: a transient failure of the dependency) is a
//     failure, with its server hint ([RetryAfter]) given to
//     [breaker.Breaker.Fail] so that no probe goes sooner than the
//     dependency asked;
//   - any other error (a 404, a 400) is a success: the dependency
//     answered, and a caller's bad requests must not open the circuit for
//     everyone else; an error marked [Permanent] counts as the classifier
//     judges the error inside the mark;
//   - an attempt that ends after the parent context has ended (canceled,
//     or past its own deadline) is given back with [breaker.Breaker.Cancel]
//     and counts neither way: the caller went away, the dependency said
//     nothing. To have slow or hanging calls count as failures, give the
//     policy a [WithAttemptTimeout]: an attempt cut off by its own timeout
//     returns a context.DeadlineExceeded, which the default classifier
//     judges retryable, so it is a failure;
//   - an operation that panics is a failure, and the panic continues.
//
// While the breaker is closed this costs no lock and no allocation; what a
// limiter adds is its own (package limit).
func WithGuards(g Guards) Option {
	return option(func(p *config) error {
		b := g.Budget // a local: the option is a value, applied by many New calls at once
		if bb, ok := b.(*budget.Budget); ok && bb == nil {
			b = nil
		}
		p.budget, p.breaker, p.limiter = b, g.Breaker, g.Limiter
		return nil
	})
}

// admit asks brk to admit the next attempt, waiting for it if the call has
// a deadline (left before it). waited reports whether the breaker was not
// closed, so time may have passed.
func (p *Policy) admit(ctx context.Context, brk *breaker.Breaker, hasDL bool, left time.Duration) (breaker.Permit, bool, error) {
	permit, err := brk.Allow()
	if err == nil {
		return permit, false, nil
	}
	if !hasDL || left <= 0 {
		return permit, false, err
	}
	var start time.Time
	if p.observer != nil {
		start = time.Now()
	}
	permit, err = brk.Wait(ctx, left)
	if p.observer != nil {
		// A call that could not wait (its deadline comes before the next
		// round, too many calls waiting) is rejected at once: no wait to
		// report.
		if elapsed := time.Since(start); err == nil || elapsed > 0 {
			e := observe.Event{Kind: observe.BreakerWait, Name: p.name, Elapsed: elapsed, Outcome: "admitted", Err: err}
			if err != nil {
				e.Outcome = "rejected"
			}
			p.reportWait(ctx, e, brk, permit)
		}
	}
	return permit, true, err
}

// reportWait reports a wait behind the breaker; an observer that panics
// (or calls runtime.Goexit) while the call holds the permit it was
// admitted with gives the permit back first: a probe never holds its slot
// forever.
func (p *Policy) reportWait(ctx context.Context, e observe.Event, brk *breaker.Breaker, permit breaker.Permit) {
	reported := false
	defer func() {
		if !reported {
			brk.Cancel(permit) // a zero permit (a rejection) is ignored
		}
	}()
	p.observer.Observe(ctx, e)
	reported = true
}
