package retry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Reason says why a retry loop stopped without success. The zero value is
// not a reason any call returns. A Reason is an error, so that errors.Is
// tells why a call stopped: every [*Error] wraps its Reason, and
// errors.Is(err, retry.AttemptsExhausted) holds for a call that exhausted
// its attempts. errors.Is sees every Reason in the chain, an inner loop's
// too (a call that stopped on the *Error of a loop it ran); errors.As and
// [Error].Reason tell this call's alone.
type Reason uint8

const (
	// NotRetryable: the last error was not retryable (the classifier said
	// no, or the operation returned a [Permanent] error).
	NotRetryable Reason = iota + 1
	// AttemptsExhausted: every one of the policy's attempts failed with a
	// retryable error.
	AttemptsExhausted
	// Deadline: the call's deadline (its context's) has passed, or the
	// next sleep would end at or after it (so it was never started), or
	// the server asked for a wait longer than the policy's MaxRetryAfter,
	// or the rate limiter ([WithRateLimit]) refused to let an attempt go.
	// errors.Is(err, context.DeadlineExceeded) holds for such a give-up.
	Deadline
	// Canceled: the parent context was canceled. errors.Is(err,
	// context.Canceled) holds for such a give-up.
	Canceled
	// BudgetExhausted: the retry budget ([WithGuards]) refused the retry.
	// The error's Err is the operation's last error.
	BudgetExhausted
	// CircuitOpen: the circuit breaker ([WithGuards]) rejected the next
	// attempt and the call could not wait for it (no deadline, the next
	// probe round lies beyond the deadline, too many calls waiting), or
	// gave up waiting at the deadline. On the first attempt the error's Err
	// is the [*breaker.OpenError]; later, Err is the operation's last error
	// and the OpenError is reachable with errors.Is and errors.As. Either
	// way [RetryAfter] of the error reads how long until the breaker
	// probes again.
	CircuitOpen
	// Limited: the concurrency limiter ([Guards].Limiter) refused the next
	// attempt: the destination's limit was reached and the call could not
	// wait for a slot (its turn would come after the deadline, too many
	// calls waiting, waiting off), or it waited until its deadline.
	// On the first attempt the error's Err is the limiter's error; later,
	// Err is the operation's last error and the limiter's error is
	// reachable with errors.Is and errors.As. Either way errors.Is(err,
	// limit.ErrLimited) holds.
	Limited

	numReasons
)

// reasonNames are the reasons' labels: the Reason of a GiveUp event
// (package observe), and so of metrics, spans and logs, and the token of
// httpretry's give-up header (wire.GiveUpHeader). One spelling, hyphenated
// like every other label of stormguard's; the error message has the words.
var reasonNames = [numReasons]string{
	NotRetryable:      "not-retryable",
	AttemptsExhausted: "attempts-exhausted",
	Deadline:          "deadline",
	Canceled:          "canceled",
	BudgetExhausted:   "budget-exhausted",
	CircuitOpen:       "circuit-open",
	Limited:           "limited",
}

// reasonWords are the reasons in words, for error messages.
var reasonWords = [numReasons]string{
	NotRetryable:      "not retryable",
	AttemptsExhausted: "attempts exhausted",
	Deadline:          "deadline",
	Canceled:          "canceled",
	BudgetExhausted:   "budget exhausted",
	CircuitOpen:       "circuit open",
	Limited:           "limited",
}

// name returns the reason's label ("attempts-exhausted"), or "Reason(N)"
// for an unknown value.
func (r Reason) name() string {
	if r > 0 && r < numReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Error returns "retry: " and the reason in words: "not retryable",
// "attempts exhausted", "deadline", "canceled", "budget exhausted",
// "circuit open", "limited" ("Reason(N)" for an unknown value). Events,
// metrics, logs and httpretry's give-up header spell the same reasons as
// labels, hyphenated: "not-retryable", "attempts-exhausted",
// "budget-exhausted", "circuit-open" (see package observe).
func (r Reason) Error() string {
	if r > 0 && r < numReasons {
		return "retry: " + reasonWords[r]
	}
	return "retry: " + r.name()
}

// Error is the error [Policy.Do] and [DoValue] return when they give up. It
// says why (Reason), how many attempts ran, and wraps the last error the
// operation returned:
//
//	errors.Is(err, retry.AttemptsExhausted)    // why it stopped
//	errors.Is(err, io.ErrUnexpectedEOF)        // the operation's last error
//	errors.As(err, &statusErr)                 // ditto, by type
//	errors.Is(err, context.Canceled)           // for Reason Canceled
//	errors.Is(err, context.DeadlineExceeded)   // for Reason Deadline
//	retry.RetryAfter(err)                      // when to try again, if known
//
// A non-retryable error is wrapped too, even on the first attempt (Reason
// NotRetryable, Attempts 1), so errors.As still finds it and the caller can
// tell "the server said 404" from "we gave up".
type Error struct {
	// Reason says why the loop stopped.
	Reason Reason
	// Attempts is how many times the operation ran (0 if the context had
	// already ended before the first attempt).
	Attempts int
	// Err is the last error the operation returned, with a [Permanent]
	// marker removed; nil if no attempt ran, except for Reason
	// [CircuitOpen] with Attempts 0, where it is the breaker's
	// [*breaker.OpenError], and Reason [Limited] with Attempts 0, where it
	// is the limiter's refusal.
	Err error

	// delay is, for Reason Deadline when the loop stopped before a sleep,
	// the sleep it refused to start (the larger of the backoff delay and
	// the server's hint); 0 otherwise.
	delay time.Duration
	// maxHint is, for Reason Deadline when the server's hint exceeded
	// the policy's maximum (WithMaxRetryAfter), that maximum; 0 otherwise.
	maxHint time.Duration
	// classified is set for Reason NotRetryable when the default
	// classifier said no to an error that matched none of its rules: the
	// message then names the way to retry it.
	classified bool
	// cause is context.Cause of the parent when it differs from its Err
	// (a cause given to context.WithCancelCause or WithDeadlineCause), or
	// the breaker's rejection of a later attempt (Reason CircuitOpen), or
	// the limiter's refusal of a later attempt (Reason Limited).
	cause error
}

// Error describes the give-up: "retry: attempts exhausted after 3 attempts:
// " followed by the last error. When the default classifier ([IsRetryable],
// the policy's without [WithClassifier]; not one given as
// WithClassifier(IsRetryable)) stopped the loop at an error that matched none of its rules (a plain
// error, such as one made by errors.New or fmt.Errorf, which other Go retry
// libraries retry), the message says how to retry such errors: "retry: not retryable after 1 attempt (the default
// classifier retries only timeouts, broken connections and errors that
// carry a server hint or say they are temporary; to retry others, use
// retry.WithClassifier): " followed by the error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Reason.Error())
	b.WriteString(" after ")
	b.WriteString(strconv.Itoa(e.Attempts))
	if e.Attempts == 1 {
		b.WriteString(" attempt")
	} else {
		b.WriteString(" attempts")
	}
	if e.delay > 0 {
		fmt.Fprintf(&b, " (next sleep %v would end past the deadline)", e.delay)
	}
	if e.maxHint > 0 {
		fmt.Fprintf(&b, " (the server's hint %v is above the policy's maximum %v)", RetryAfter(e.Err), e.maxHint)
	}
	if e.classified && e.Reason == NotRetryable {
		b.WriteString(notRetryableHint)
	}
	if e.cause != nil {
		b.WriteString(" (cause: ")
		b.WriteString(e.cause.Error())
		b.WriteString(")")
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap returns e.Reason; the context error it stands for
// (context.Canceled for Canceled, context.DeadlineExceeded for Deadline);
// the last error; and, if the parent context had a custom cause (or the
// breaker or the limiter refused a later attempt), that cause, so
// errors.Is and errors.As reach all of them.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 4)
	if e.Reason > 0 && e.Reason < numReasons {
		errs = append(errs, e.Reason)
	}
	switch e.Reason {
	case Canceled:
		errs = append(errs, context.Canceled)
	case Deadline:
		errs = append(errs, context.DeadlineExceeded)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// notRetryableHint follows "not retryable after N attempts" when the
// default classifier said no: every Go peer retries a plain error, this one
// does not, and the message says how to change that.
const notRetryableHint = " (the default classifier retries only timeouts, broken connections and errors that carry a server hint or say they are temporary; to retry others, use retry.WithClassifier)"

// retryIn returns how long the caller should wait before calling the
// dependency again, as far as the give-up tells: for Reason CircuitOpen, the
// breaker's time until its next probe round; for a Deadline stop that
// refused a sleep, that sleep; otherwise (a hint above the policy's
// maximum included) the server's hint carried by the last error; 0 if
// nothing tells.
func (e *Error) retryIn() time.Duration {
	if e.Reason == CircuitOpen {
		var oe *breaker.OpenError
		if (errors.As(e.cause, &oe) || errors.As(e.Err, &oe)) && oe.Wait > 0 {
			return oe.Wait
		}
	}
	if e.delay > 0 {
		return e.delay
	}
	return RetryAfter(e.Err)
}

// permanentError marks an error as not to be retried.
type permanentError struct{ err error }

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as not to be retried: whatever the classifier says
// of it, the loop stops with Reason NotRetryable. It does not change how a
// circuit breaker counts the attempt: the classifier judges err, so a
// caller's error (a 404, a validation failure) is an answer of a healthy
// dependency, and a transient failure of the dependency that must not be
// retried (a 503 that carries a don't-retry signal, the second 500 of a
// call that may retry a 500 only once, a failure of a request that is not
// safe to repeat) is still a failure. When op returns the marked error
// itself, the [*Error]'s Err is err (the mark is removed); a mark wrapped
// deeper stays in the chain. errors.Is and errors.As see through the mark
// either way. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// isPermanent reports whether err, or an error it wraps, was marked with
// Permanent.
func isPermanent(err error) bool {
	_, ok := find[*permanentError](err)
	return ok
}

// failed reports whether an attempt that returned err counts as a failure
// of the dependency: the classifier decides (a retryable error is a
// transient failure), asked about the error inside a Permanent mark.
func (p *Policy) failed(err error) bool {
	if err == errAgain {
		return true
	}
	if pe, ok := find[*permanentError](err); ok {
		err = pe.err
	}
	return p.classify(err)
}

// unmarkPermanent removes a Permanent marker at the top of err's chain.
func unmarkPermanent(err error) error {
	if p, ok := err.(*permanentError); ok {
		return p.err
	}
	return err
}
