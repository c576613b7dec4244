package retry

import (
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"time"
)

// StatusCoder is implemented by errors that carry an HTTP-style status code.
// [IsRetryable] retries 408, 429, 502, 503 and 504 and nothing else (a code
// of 0 or below counts as "no status" and is skipped). 500 is not retried by
// the generic loop: whether a 500 may be retried once depends on the
// request's idempotency, which package httpretry decides.
type StatusCoder interface {
	StatusCode() int
}

// RetryAfterer is implemented by errors that carry a server's hint of how
// long to wait before the next attempt (an HTTP Retry-After, a gRPC
// pushback). A positive hint makes [IsRetryable] report true (unless a
// status code says otherwise) and is a floor on the next sleep: the loop
// never retries sooner, jitter never undercuts it. 0 or a negative value
// means "no hint".
type RetryAfterer interface {
	RetryAfter() time.Duration
}

// TemporaryReporter is implemented by errors that say whether they are
// transient, like the (deprecated) Temporary method of [net.Error].
// [IsRetryable] consults it last, after status codes, hints, timeouts and
// broken connections.
type TemporaryReporter interface {
	Temporary() bool
}

// timeouter is the Timeout half of net.Error, also implemented by
// os.ErrDeadlineExceeded, *url.Error and syscall.Errno.
type timeouter interface {
	Timeout() bool
}

// IsRetryableStatus reports whether an HTTP status code is worth retrying in
// the generic loop: 408 Request Timeout, 429 Too Many Requests, 502 Bad
// Gateway, 503 Service Unavailable and 504 Gateway Timeout.
func IsRetryableStatus(code int) bool {
	switch code {
	case 408, 429, 502, 503, 504:
		return true
	}
	return false
}

// IsRetryable is the default classifier: it reports whether err is worth
// another attempt. The loop consults its classifier only while the call
// still has time and the parent context is live, so a context error it
// sees there belongs to an attempt (its own timeout), not to the caller.
// The first rule that matches decides:
//
//  1. nil, an error marked with [Permanent], and an [*Error] (a nested
//     retry loop that already gave up: retry at one layer only) are not
//     retryable; neither is context.Canceled.
//  2. A [StatusCoder] with a code above 0: retryable if
//     [IsRetryableStatus] (408, 429, 502, 503, 504), else not (a 404 is
//     never retried, even with a hint).
//  3. A [RetryAfterer] with a positive hint: retryable.
//  4. Timeouts: context.DeadlineExceeded (an attempt's own timeout),
//     os.ErrDeadlineExceeded, and any error whose Timeout() reports true
//     (net.Error, *url.Error): retryable.
//  5. A connection that broke: reset, refused, aborted (ECONNRESET,
//     ECONNREFUSED, ECONNABORTED and their Windows twins), broken pipe
//     (EPIPE), and io.ErrUnexpectedEOF, which is what a reader sees when the
//     connection drops mid-message: retryable.
//  6. A [TemporaryReporter]: its answer.
//  7. Anything else: not retryable.
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
	if err == nil || IsPermanent(err) {
		return false
	}
	if _, ok := find[*Error](err); ok {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	if sc, ok := find[StatusCoder](err); ok {
		if code := sc.StatusCode(); code > 0 {
			return IsRetryableStatus(code)
		}
	}
	if RetryAfter(err) > 0 {
		return true
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	if t, ok := find[timeouter](err); ok && t.Timeout() {
		return true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	for _, e := range connErrnos {
		if errors.Is(err, e) {
			return true
		}
	}
	if t, ok := find[TemporaryReporter](err); ok {
		return t.Temporary()
	}
	return false
}

// RetryAfter returns the server's hint carried by err (the first
// [RetryAfterer] along its Unwrap chain), or 0 if there is none or it is
// not positive.
func RetryAfter(err error) time.Duration {
	if ra, ok := find[RetryAfterer](err); ok {
		return max(ra.RetryAfter(), 0)
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

// StatusError is a ready-made error carrying an HTTP-style status code and
// an optional server hint, for operations that are not built on package
// httpretry (and for tests). It implements [StatusCoder] and
// [RetryAfterer]. The zero value is a status-less error that is not
// retryable.
type StatusError struct {
	// Code is the status code, e.g. 503.
	Code int
	// After is the server's Retry-After hint; 0 means none.
	After time.Duration
}

// Error returns "HTTP 503", with " (retry after 1.5s)" when After is set.
func (e *StatusError) Error() string {
	s := "HTTP " + strconv.Itoa(e.Code)
	if e.After > 0 {
		s += " (retry after " + e.After.String() + ")"
	}
	return s
}

// StatusCode returns e.Code.
func (e *StatusError) StatusCode() int { return e.Code }

// RetryAfter returns e.After.
func (e *StatusError) RetryAfter() time.Duration { return e.After }
