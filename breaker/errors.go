package breaker

import (
	"errors"
	"time"
)

// ErrOpen matches (with errors.Is) every rejection: an [*OpenError] from
// an open breaker, and from a half-open one whose probes are all taken.
var ErrOpen = errors.New("breaker: open")

// OpenError is the error [Breaker.Allow], [Breaker.Wait] and
// [Breaker.Execute] return when they reject a call. It matches [ErrOpen]
// with errors.Is; State says whether the breaker was open or half-open with
// all its probes taken.
type OpenError struct {
	// State is the state that rejected the call: Open, or HalfOpen when
	// all probes were taken; or Closed for a call of Breaker.Wait whose
	// context or maxWait ended while it waited for its turn in the release
	// after the close (Wait 0: the breaker is closed).
	State State
	// Wait is how long after the rejection the breaker half-opens; 0 when
	// State is HalfOpen (the next call may be admitted as soon as a probe
	// finishes badly, or the breaker closes), and 0 when the open period
	// is over and another call is asking the fleet for the probe round
	// (Config.Shared): the breaker may half-open as soon as it answers.
	Wait time.Duration
}

// Error describes the rejection, e.g. "breaker: open, half-open in 12.5s".
func (e *OpenError) Error() string {
	switch e.State {
	case HalfOpen:
		return "breaker: half-open, all probes taken"
	case Closed:
		return "breaker: closed, releasing its waiting calls; this one's turn had not come"
	}
	return "breaker: open, half-open in " + e.Wait.String()
}

// RetryAfter returns Wait: how long a caller should wait before trying
// again. It makes an OpenError a server-style hint for retry loops.
func (e *OpenError) RetryAfter() time.Duration { return e.Wait }

// Is reports whether target is [ErrOpen].
func (e *OpenError) Is(target error) bool { return target == ErrOpen }

// An *OpenError is a retry hint (the interface package retry looks for).
var _ interface{ RetryAfter() time.Duration } = (*OpenError)(nil)
