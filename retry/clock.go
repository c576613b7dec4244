package retry

import (
	"context"
	"time"
)

// Clock is the loop's source of time: Now for deadline checks and Sleep for
// the waits between attempts. The default is the system clock; inject one to
// test without sleeping for real where testing/synctest cannot help (a test
// against a real network connection, which a synctest bubble does not
// treat as idle).
//
// A Clock shared by a [Policy] is used by every call of that policy, so it
// must be safe for concurrent use.
//
// Attempt contexts end when the time left by this Clock's reckoning runs
// out, but their timers run on the real (or synctest) clock: a fake Clock
// steers the loop's decisions, not context deadlines.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// Sleep waits for d, or until ctx ends, whichever comes first. It
	// returns nil after a full sleep and ctx.Err() if ctx ended first. A d
	// of 0 or less returns at once (ctx.Err() if ctx has already ended).
	// Any other error also stops the loop (Reason Canceled, or Deadline
	// if the error is a deadline), with the error reachable from the
	// returned [*Error].
	Sleep(ctx context.Context, d time.Duration) error
}

// systemClock is the default Clock: time.Now and a timer. Inside a
// testing/synctest bubble it runs on the bubble's fake time.
type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
