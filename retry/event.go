package retry

import (
	"context"
	"log/slog"
	"time"
)

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

// logRetry logs a retry at Debug level; requires p.logger != nil.
func (p *Policy) logRetry(ctx context.Context, attempt int, sleep, hint time.Duration, err error) {
	attrs := make([]any, 0, 4)
	attrs = append(attrs, slog.Int("attempt", attempt), slog.Duration("delay", sleep))
	if hint > 0 {
		attrs = append(attrs, slog.Duration("retry_after", hint))
	}
	attrs = append(attrs, slog.Any("error", err))
	p.log(ctx, "retry: retrying", slog.Group("retry", attrs...))
}

// logGiveUp logs a give-up at Debug level; requires p.logger != nil. A
// give-up is one call's business: during an outage every call gives up, and
// a record per call at Warn would be a log storm.
func (p *Policy) logGiveUp(ctx context.Context, e *Error) {
	p.log(ctx, "retry: giving up", slog.Any("retry", e))
}

// log writes one Debug record with attr, and the policy's name (if any) at
// the top level.
func (p *Policy) log(ctx context.Context, msg string, attr slog.Attr) {
	if p.name != "" {
		p.logger.LogAttrs(ctx, slog.LevelDebug, msg, slog.String("name", p.name), attr)
		return
	}
	p.logger.LogAttrs(ctx, slog.LevelDebug, msg, attr)
}
