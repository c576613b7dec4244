package breaker

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrOpen matches (with errors.Is) every rejection: an [*OpenError]
	// from an open breaker, and from a half-open one whose probes are all
	// taken.
	ErrOpen = errors.New("breaker: open")
	// ErrTooManyProbes matches the rejections of a half-open breaker whose
	// probes are all taken. It wraps [ErrOpen].
	ErrTooManyProbes = fmt.Errorf("%w: half-open, all probes taken", ErrOpen)
)

// OpenError is the error [Breaker.Allow], [Breaker.Execute] and [Do] return
// when they reject a call. It matches [ErrOpen] with errors.Is, and
// [ErrTooManyProbes] too when State is HalfOpen.
type OpenError struct {
	// State is the state that rejected the call: Open, or HalfOpen when
	// all probes were taken.
	State State
	// Wait is how long after the rejection the breaker half-opens; 0 when
	// State is HalfOpen (the next call may be admitted as soon as a probe
	// finishes badly, or the breaker closes).
	Wait time.Duration
}

// Error describes the rejection, e.g. "breaker: open, half-open in 12.5s".
func (e *OpenError) Error() string {
	if e.State == HalfOpen {
		return "breaker: half-open, all probes taken"
	}
	return "breaker: open, half-open in " + e.Wait.String()
}

// RetryAfter returns Wait: how long a caller should wait before trying
// again. It makes an OpenError a server-style hint for retry loops.
func (e *OpenError) RetryAfter() time.Duration { return e.Wait }

// Is reports whether target is [ErrOpen], or [ErrTooManyProbes] for a
// half-open rejection.
func (e *OpenError) Is(target error) bool {
	return target == ErrOpen || (target == ErrTooManyProbes && e.State == HalfOpen)
}

// An *OpenError is a retry hint (the interface package retry looks for).
var _ interface{ RetryAfter() time.Duration } = (*OpenError)(nil)
