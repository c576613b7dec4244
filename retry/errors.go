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
// not a reason any call returns; [Reason.String] prints it as "Reason(0)".
type Reason uint8

const (
	// NotRetryable: the last error was not retryable (the classifier said
	// no, or the operation returned a [Permanent] error).
	NotRetryable Reason = iota + 1
	// AttemptsExhausted: every one of the policy's attempts failed with a
	// retryable error.
	AttemptsExhausted
	// Deadline: the overall deadline (the policy's timeout or the parent
	// context's deadline) has passed, or the next sleep would end at or
	// after it (so it was never started), or the server asked for a wait
	// longer than the policy's MaxRetryAfter.
	Deadline
	// Canceled: the parent context was canceled.
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

	numReasons
)

var reasonNames = [numReasons]string{
	NotRetryable:      "not retryable",
	AttemptsExhausted: "attempts exhausted",
	Deadline:          "deadline",
	Canceled:          "canceled",
	BudgetExhausted:   "budget exhausted",
	CircuitOpen:       "circuit open",
}

// String returns the reason in words ("not retryable", "attempts exhausted",
// "deadline", "canceled", "budget exhausted", "circuit open"), or
// "Reason(N)" for an unknown value.
func (r Reason) String() string {
	if r > 0 && r < numReasons {
		return reasonNames[r]
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Error returns "retry: " and the reason in words. A Reason is an error so
// that errors.Is tells why a call stopped: every [*Error] wraps its Reason,
// and errors.Is(err, retry.AttemptsExhausted) holds for a call that
// exhausted its attempts.
func (r Reason) Error() string { return "retry: " + r.String() }

// Is reports whether target is r, or the context error r stands for:
// context.Canceled for Canceled, context.DeadlineExceeded for Deadline. So
// errors.Is(err, context.Canceled) holds for every error with Reason
// Canceled.
func (r Reason) Is(target error) bool {
	switch target {
	case context.Canceled:
		return r == Canceled
	case context.DeadlineExceeded:
		return r == Deadline
	}
	t, ok := target.(Reason)
	return ok && t == r
}

// ErrInvalidOption is wrapped by every error [New] returns.
var ErrInvalidOption = errors.New("retry: invalid option")

// ErrNilOperation is returned by [Policy.Do] and [DoValue] when the
// operation is nil.
var ErrNilOperation = errors.New("retry: nil operation")

// Error is the error [Policy.Do] and [DoValue] return when they give up. It
// says why (Reason), how many attempts ran, and wraps the last error the
// operation returned:
//
//	errors.Is(err, retry.AttemptsExhausted)    // why it stopped
//	errors.Is(err, io.ErrUnexpectedEOF)        // the operation's last error
//	errors.As(err, &statusErr)                 // ditto, by type
//	errors.Is(err, context.Canceled)           // for Reason Canceled
//	errors.Is(err, context.DeadlineExceeded)   // for Reason Deadline
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
	// [*breaker.OpenError].
	Err error
	// Delay is, for Reason Deadline when the loop stopped before a sleep,
	// the sleep it refused to start (the larger of the backoff delay and
	// the server's hint); 0 otherwise.
	Delay time.Duration

	// cause is context.Cause of the parent when it differs from its Err
	// (a cause given to context.WithCancelCause or WithDeadlineCause), the
	// error a Clock's Sleep failed with, or the breaker's rejection of a
	// later attempt (Reason CircuitOpen).
	cause error
}

// Error describes the give-up: "retry: attempts exhausted after 3 attempts:
// " followed by the last error.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("retry: ")
	b.WriteString(e.Reason.String())
	b.WriteString(" after ")
	b.WriteString(strconv.Itoa(e.Attempts))
	if e.Attempts == 1 {
		b.WriteString(" attempt")
	} else {
		b.WriteString(" attempts")
	}
	if e.Delay > 0 {
		fmt.Fprintf(&b, " (next sleep %v would end past the deadline)", e.Delay)
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

// RetryAfter returns how long the caller should wait before calling the
// dependency again, as far as the give-up tells: for Reason [CircuitOpen],
// the breaker's time until its next probe round; for a Deadline stop that
// refused a sleep, that sleep (Delay); otherwise the server's hint carried
// by the last error ([RetryAfter] of Err); 0 if nothing tells. It makes a
// give-up a hint for a caller's own retry loop, which by the default
// classifier still does not retry it (one layer retries).
func (e *Error) RetryAfter() time.Duration {
	if e.Reason == CircuitOpen {
		var oe *breaker.OpenError
		if (errors.As(e.cause, &oe) || errors.As(e.Err, &oe)) && oe.Wait > 0 {
			return oe.Wait
		}
	}
	if e.Delay > 0 {
		return e.Delay
	}
	return RetryAfter(e.Err)
}

// Unwrap returns e.Reason, the last error and, if the parent context had a
// custom cause (or the Clock's Sleep failed, or the breaker rejected a later
// attempt), that cause, so errors.Is and errors.As reach all of them.
func (e *Error) Unwrap() []error {
	errs := make([]error, 0, 3)
	if e.Reason > 0 && e.Reason < numReasons {
		errs = append(errs, e.Reason)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	if e.cause != nil {
		errs = append(errs, e.cause)
	}
	return errs
}

// permanentError marks an error as not to be retried. failure says the
// attempt still counts as a failure of the dependency ([PermanentFailure]).
type permanentError struct {
	err     error
	failure bool
}

func (p *permanentError) Error() string { return p.err.Error() }
func (p *permanentError) Unwrap() error { return p.err }

// Permanent marks err as not retryable, and as an answer of a healthy
// dependency: whatever the classifier says, the loop stops with Reason
// NotRetryable, and a circuit breaker counts the attempt as a success (the
// dependency answered; the request was wrong). Use it for a caller's
// errors: a 404, a validation failure. When op returns the marked error
// itself, the [*Error]'s Err is err (the marker is removed); a marker
// wrapped deeper stays in the chain. errors.Is and errors.As see through
// the marker either way. Permanent(nil) returns nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// PermanentFailure marks err as not retryable, and as a failure of the
// dependency: like [Permanent], the loop stops at once with Reason
// NotRetryable and the marker is removed from the returned [*Error]'s Err;
// unlike it, a circuit breaker counts the attempt as a failure. Use it for
// "the dependency failed and retrying would not help or is not allowed": a
// 503 that carries a don't-retry signal, the second 500 of a call that may
// retry a 500 only once, a failure of a request that is not safe to repeat.
// PermanentFailure(nil) returns nil.
func PermanentFailure(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err, failure: true}
}

// IsPermanent reports whether err, or an error it wraps, was marked with
// [Permanent] or [PermanentFailure].
func IsPermanent(err error) bool {
	_, ok := find[*permanentError](err)
	return ok
}

// failed reports whether an attempt that returned err counts as a failure of
// the dependency: a [PermanentFailure] mark says yes, a [Permanent] one no; otherwise
// the classifier decides (a retryable error is a transient failure).
func (p *Policy) failed(err error) bool {
	if pe, ok := find[*permanentError](err); ok {
		return pe.failure
	}
	return p.classify(err)
}

// unmarkPermanent removes a Permanent or PermanentFailure marker at the top of err's
// chain.
func unmarkPermanent(err error) error {
	if p, ok := err.(*permanentError); ok {
		return p.err
	}
	return err
}
