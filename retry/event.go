package retry

import (
	"context"
	"log/slog"
	"time"
)

// RetryEvent describes a retry about to happen. It is passed to the
// [WithOnRetry] hook before each sleep.
type RetryEvent struct {
	// Attempt is the attempt that just failed (1 for the first).
	Attempt int
	// Delay is how long the loop is about to sleep before attempt
	// Attempt+1: the larger of the backoff delay and RetryAfter.
	Delay time.Duration
	// RetryAfter is the server's hint carried by Err, 0 if none.
	RetryAfter time.Duration
	// Err is the error attempt Attempt failed with.
	Err error
}

// LogValue implements [slog.LogValuer]: the event logs as a group with keys
// attempt, delay, retry_after (only when set) and error.
func (e RetryEvent) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 4)
	attrs = append(attrs, slog.Int("attempt", e.Attempt), slog.Duration("delay", e.Delay))
	if e.RetryAfter > 0 {
		attrs = append(attrs, slog.Duration("retry_after", e.RetryAfter))
	}
	attrs = append(attrs, slog.Any("error", e.Err))
	return slog.GroupValue(attrs...)
}

// LogValue implements [slog.LogValuer]: the error logs as a group with keys
// reason, attempts, delay (only when set) and error.
func (e *Error) LogValue() slog.Value {
	attrs := make([]slog.Attr, 0, 4)
	attrs = append(attrs, slog.String("reason", e.Reason.String()), slog.Int("attempts", e.Attempts))
	if e.Delay > 0 {
		attrs = append(attrs, slog.Duration("delay", e.Delay))
	}
	attrs = append(attrs, slog.Any("error", e.Err))
	return slog.GroupValue(attrs...)
}

// logRetry logs a retry at Info level; requires p.logger != nil.
func (p *Policy) logRetry(ctx context.Context, e RetryEvent) {
	p.logger.LogAttrs(ctx, slog.LevelInfo, "retry: retrying", slog.Any("retry", e))
}

// logGiveUp logs a give-up; requires p.logger != nil. Giving up on a
// non-retryable error or a canceled call is the caller's business, and a
// call an open breaker rejected before any attempt is the breaker doing its
// job (its state change is the event worth a warning; during an outage
// every call would log one): those are logged at Debug. Every other give-up
// (the dependency kept failing) at Warn.
func (p *Policy) logGiveUp(ctx context.Context, e *Error) {
	level := slog.LevelWarn
	if e.Reason == NotRetryable || e.Reason == Canceled || (e.Reason == CircuitOpen && e.Attempts == 0) {
		level = slog.LevelDebug
	}
	p.logger.LogAttrs(ctx, level, "retry: giving up", slog.Any("retry", e))
}
