package retry

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// retryAfterer is implemented by errors that carry a server's hint of how
// long to wait before the next attempt (see RetryAfter).
type retryAfterer interface {
	RetryAfter() time.Duration
}

// temporary is implemented by errors that say whether they are transient,
// like the (deprecated) Temporary method of net.Error.
type temporary interface {
	Temporary() bool
}

// timeouter is the Timeout half of net.Error, also implemented by
// os.ErrDeadlineExceeded, *url.Error and syscall.Errno.
type timeouter interface {
	Timeout() bool
}

// IsRetryable is the default classifier: it reports whether err is worth
// another attempt. The loop consults its classifier only while the call
// still has time and the parent context is live, so a context error it
// sees there belongs to an attempt (its own timeout), not to the caller.
// The first rule that matches decides:
//
//  1. nil, an error marked with [Permanent], and an [*Error] or a [Reason]
//     (a nested retry loop that already gave up: retry at one layer only)
//     are not retryable; neither is context.Canceled.
//  2. An error with a server hint, a method RetryAfter() time.Duration
//     returning a positive value (see [RetryAfter]): retryable.
//  3. Timeouts: context.DeadlineExceeded (an attempt's own timeout),
//     os.ErrDeadlineExceeded, and any error whose Timeout() reports true
//     (net.Error, *url.Error): retryable.
//  4. A connection that broke: reset, refused, aborted (ECONNRESET,
//     ECONNREFUSED, ECONNABORTED and their Windows twins), broken pipe
//     (EPIPE), a use of a closed network connection (net.ErrClosed), and
//     io.ErrUnexpectedEOF, which is what a reader sees when the connection
//     drops mid-message: retryable.
//  5. An error with a method Temporary() bool (like the deprecated one of
//     net.Error): its answer.
//  6. Anything else: not retryable.
//
// The loop is protocol-neutral: it knows no status codes. Package
// httpretry classifies HTTP statuses (408, 429, 502, 503, 504, and 500 at
// most once) and gRPC interceptors classify codes, each on top of these
// rules.
//
// Errors are searched along their whole Unwrap chain (single and multiple
// unwraps, like errors.Is), without reflection. To extend it, wrap it:
//
//	retry.WithClassifier(func(err error) bool {
//		return errors.Is(err, errMyTransient) || retry.IsRetryable(err)
//	})
//
// IsRetryable is safe for concurrent use and uses no reflection.
func IsRetryable(err error) bool {
	if err == nil || isPermanent(err) {
		return false
	}
	if _, ok := find[*Error](err); ok {
		return false
	}
	if _, ok := find[Reason](err); ok {
		return false // a give-up, even a bare one
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if RetryAfter(err) > 0 {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	if timedOut(err) {
		return true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
		return true
	}
	for _, e := range connErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	if t, ok := find[temporary](err); ok {
		return t.Temporary()
	}
	return false
}

// unclassified reports whether IsRetryable said no to err only by its last
// rule: err matched none of the others (it is not marked Permanent, not a
// give-up, not a cancel, and says nothing of itself with a Temporary
// method). That is a plain error, which every Go peer would retry.
func unclassified(err error) bool {
	if err == nil || isPermanent(err) || errors.Is(err, context.Canceled) {
		return false
	}
	if _, ok := find[*Error](err); ok {
		return false
	}
	if _, ok := find[Reason](err); ok {
		return false
	}
	_, ok := find[temporary](err)
	return !ok && !IsRetryable(err)
}

// RetryAfter returns how long to wait before calling again, as far as err
// tells: the server's hint carried by err, that of the first error along its
// Unwrap chain (depth first) with a method RetryAfter() time.Duration that
// returns a positive value (an HTTP Retry-After, a gRPC pushback: declare
// one on an error type of your own to have the loop honour it as a floor
// on the next sleep), or 0 if there is none. For a give-up ([*Error]) it is
// what the give-up tells: for Reason [CircuitOpen], the breaker's time
// until its next probe round; for a [Deadline] stop that refused a sleep,
// that sleep; otherwise the hint of its last error. It makes a give-up a
// hint for a caller's own retry loop, which by the default classifier still
// does not retry it (one layer retries).
func RetryAfter(err error) time.Duration {
	for err != nil {
		if e, ok := err.(*Error); ok {
			return e.retryIn()
		}
		if ra, ok := err.(retryAfterer); ok {
			if d := ra.RetryAfter(); d > 0 {
				return d
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if d := RetryAfter(e); d > 0 {
					return d
				}
			}
			return 0
		default:
			return 0
		}
	}
	return 0
}

// find returns the first error along err's Unwrap chain (depth first, as
// errors.As walks it) that is a T. Unlike errors.As it uses no reflection
// and allocates nothing; As methods are not consulted.
func find[T any](err error) (T, bool) {
	for err != nil {
		if t, ok := err.(T); ok {
			return t, true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if t, ok := find[T](e); ok {
					return t, true
				}
			}
			err = nil
		default:
			err = nil
		}
	}
	var zero T
	return zero, false
}

// timedOut reports whether any error along err's Unwrap chain has a
// Timeout method that reports true: a *url.Error asks only its direct Err,
// so a timeout wrapped once more below it says false there and true
// further down.
func timedOut(err error) bool {
	for err != nil {
		if t, ok := err.(timeouter); ok && t.Timeout() {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if timedOut(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
