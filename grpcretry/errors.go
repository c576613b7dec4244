package grpcretry

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// attemptError is a failed attempt as the retry loop sees it: what gRPC
// returned, and what the server said about retrying. The op returns it
// unmarked only when the attempt may be retried.
type attemptError struct {
	err    error // what the invoker or stream returned
	code   codes.Code
	after  time.Duration // the server's floor on the next sleep
	stop   bool          // the server said: do not retry
	answer bool          // the target answered (a success for its breaker); set with a Permanent mark
}

func (e *attemptError) Error() string { return e.err.Error() }
func (e *attemptError) Unwrap() error { return e.err }

// RetryAfter returns the server's floor: a pushback or a RetryInfo delay.
func (e *attemptError) RetryAfter() time.Duration { return e.after }

// Error is what the client interceptors return when a call ends without
// success: it wraps the [*retry.Error] that says why the retrying stopped
// (the reason, the attempts made and the last error, reachable with
// errors.Is and errors.As: errors.Is(err, retry.AttemptsExhausted)), and
// reads as a gRPC status: status.Code(err) and status.FromError(err) give
// the status of the last attempt as the server sent it (code, message and
// details), or, when no attempt ran, UNAVAILABLE for an open circuit or a
// full concurrency limit and CANCELED or DEADLINE_EXCEEDED for a context
// that ended.
type Error struct {
	// IdempotencyKey is the idempotency key the client made for the call
	// ([WithAutoIdempotencyKey]), "" if it made none.
	IdempotencyKey string

	retry *retry.Error // never nil
	st    *status.Status
}

// newError wraps a give-up of the retry loop.
func newError(re *retry.Error, key string) *Error {
	e := &Error{IdempotencyKey: key, retry: re}
	var ae *attemptError
	switch {
	case errors.As(re.Err, &ae):
		e.st = statusOf(ae.err)
	case re.Attempts > 0 && re.Err != nil:
		e.st = statusOf(re.Err)
	case re.Reason == retry.Canceled:
		e.st = status.New(codes.Canceled, re.Error())
	case re.Reason == retry.Deadline:
		e.st = status.New(codes.DeadlineExceeded, re.Error())
	default:
		e.st = status.New(codes.Unavailable, re.Error())
	}
	return e
}

// Error describes the give-up, e.g. "retry: attempts exhausted after 3
// attempts: rpc error: code = Unavailable desc = down".
func (e *Error) Error() string { return e.retry.Error() }

// Unwrap returns the [*retry.Error].
func (e *Error) Unwrap() error { return e.retry }

// GRPCStatus returns the status the error stands for (see [Error]).
func (e *Error) GRPCStatus() *status.Status { return e.st }

// overloaded reports whether err, as returned by a call through this package's client's
// interceptors, shows that the retrying for this dependency is done and
// the caller's own caller should be told not to retry (see PushBack).
func overloaded(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, retry.AttemptsExhausted) || errors.Is(err, retry.BudgetExhausted) ||
		errors.Is(err, retry.CircuitOpen) || errors.Is(err, breaker.ErrOpen) || errors.Is(err, retry.Limited) {
		return true
	}
	var ae *attemptError
	return errors.As(err, &ae) && ae.stop
}

// PushBack is the one-line helper for a server handler whose own call to a
// dependency, through this package's client ([DialOptions]), failed: if the retrying for that
// dependency is done, it sets the trailer "grpc-retry-pushback-ms: -1" on
// the handler's call (the don't-retry signal, which this package's client
// and grpc-go's own retry honour) and returns an UNAVAILABLE status error
// that says so, for the handler to return; otherwise it returns err
// unchanged (nil for nil).
//
//	resp, err := payments.Charge(ctx, req)
//	if err != nil {
//		return nil, grpcretry.PushBack(ctx, err)
//	}
//
// The retrying is done when it stopped because the attempts were exhausted
// (retry.AttemptsExhausted), the retry budget refused one
// (retry.BudgetExhausted), a circuit breaker was open (retry.CircuitOpen,
// breaker.ErrOpen) or the concurrency limit had no slot in time
// (retry.Limited), or when the layer below said so (a negative or
// malformed pushback). A plain failure that was not retried (NOT_FOUND, a
// non-idempotent call without a key) and a canceled call are passed on.
// ctx is the handler's context (unary or streaming). If the trailer cannot
// be set (ctx is not a server call's), the status error is returned all the
// same.
func PushBack(ctx context.Context, err error) error {
	if !overloaded(err) {
		return err
	}
	_ = grpc.SetTrailer(ctx, pushbackMD(-1))
	return status.Error(codes.Unavailable, "overloaded; don't retry: "+err.Error())
}

// pushbackMD returns the trailer of a pushback of d (negative: don't retry).
func pushbackMD(d time.Duration) metadata.MD {
	if d < 0 {
		return metadata.Pairs(wire.PushbackMetadata, "-1")
	}
	ms := d / time.Millisecond // rounded up, without overflow near the largest Duration
	if d%time.Millisecond != 0 {
		ms++
	}
	return metadata.Pairs(wire.PushbackMetadata, strconv.FormatInt(int64(ms), 10))
}
