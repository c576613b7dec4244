package retry_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stormguard/stormguard/retry"
)

func TestReasonString(t *testing.T) {
	tests := []struct {
		r    retry.Reason
		want string
		err  error
	}{
		{retry.NotRetryable, "not retryable", retry.ErrNotRetryable},
		{retry.AttemptsExhausted, "attempts exhausted", retry.ErrAttemptsExhausted},
		{retry.Deadline, "deadline", retry.ErrDeadline},
		{retry.Canceled, "canceled", retry.ErrCanceled},
		{retry.BudgetExhausted, "budget exhausted", retry.ErrBudgetExhausted},
		{retry.CircuitOpen, "circuit open", retry.ErrCircuitOpen},
		{0, "Reason(0)", nil},
		{200, "Reason(200)", nil},
	}
	for _, tt := range tests {
		if got := tt.r.String(); got != tt.want {
			t.Errorf("Reason(%d).String() = %q, want %q", uint8(tt.r), got, tt.want)
		}
		if got := tt.r.Err(); got != tt.err {
			t.Errorf("Reason(%d).Err() = %v, want %v", uint8(tt.r), got, tt.err)
		}
	}
}

func TestErrorUnwrap(t *testing.T) {
	sentinels := []error{retry.ErrNotRetryable, retry.ErrAttemptsExhausted, retry.ErrDeadline,
		retry.ErrCanceled, retry.ErrBudgetExhausted, retry.ErrCircuitOpen}
	for r := retry.NotRetryable; r <= retry.CircuitOpen; r++ {
		err := error(&retry.Error{Reason: r, Attempts: 2, Err: io.ErrUnexpectedEOF})
		for _, s := range sentinels {
			if got, want := errors.Is(err, s), s == r.Err(); got != want {
				t.Errorf("errors.Is(Error{%v}, %v) = %v, want %v", r, s, got, want)
			}
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("errors.Is(Error{%v}, last error) = false", r)
		}
		if got, want := errors.Is(err, context.Canceled), r == retry.Canceled; got != want {
			t.Errorf("errors.Is(Error{%v}, context.Canceled) = %v, want %v", r, got, want)
		}
		if got, want := errors.Is(err, context.DeadlineExceeded), r == retry.Deadline; got != want {
			t.Errorf("errors.Is(Error{%v}, context.DeadlineExceeded) = %v, want %v", r, got, want)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		err  *retry.Error
		want string
	}{
		{&retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: &retry.StatusError{Code: 503}},
			"retry: attempts exhausted after 3 attempts: HTTP 503"},
		{&retry.Error{Reason: retry.NotRetryable, Attempts: 1, Err: &retry.StatusError{Code: 404}},
			"retry: not retryable after 1 attempt: HTTP 404"},
		{&retry.Error{Reason: retry.Deadline, Attempts: 2, Delay: 1200 * time.Millisecond, Err: &retry.StatusError{Code: 503, After: time.Second}},
			"retry: deadline after 2 attempts (next sleep 1.2s would end past the deadline): HTTP 503 (retry after 1s)"},
		{&retry.Error{Reason: retry.Canceled}, "retry: canceled after 0 attempts"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestSentinelMessages(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{retry.ErrNotRetryable, "retry: not retryable"},
		{retry.ErrAttemptsExhausted, "retry: attempts exhausted"},
		{retry.ErrDeadline, "retry: deadline"},
		{retry.ErrCanceled, "retry: canceled"},
		{retry.ErrBudgetExhausted, "retry: budget exhausted"},
		{retry.ErrCircuitOpen, "retry: circuit open"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%v.Error() = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestPermanentWrapping(t *testing.T) {
	base := &retry.StatusError{Code: 409}
	err := retry.Permanent(base)
	var se *retry.StatusError
	if !errors.Is(err, base) || !errors.As(err, &se) || se != base {
		t.Errorf("Permanent(%v): errors.Is/As do not reach the wrapped error", base)
	}
	if err.Error() != base.Error() {
		t.Errorf("Permanent(%v).Error() = %q, want %q", base, err.Error(), base.Error())
	}
}

func TestLogValues(t *testing.T) {
	tests := []struct {
		v    interface{ LogValue() slog.Value }
		want string
	}{
		{retry.RetryEvent{Attempt: 2, Delay: time.Second, Err: io.EOF}, "[attempt=2 delay=1s error=EOF]"},
		{retry.RetryEvent{Attempt: 1, Delay: 2 * time.Second, RetryAfter: 2 * time.Second, Err: io.EOF},
			"[attempt=1 delay=2s retry_after=2s error=EOF]"},
		{&retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: io.EOF}, "[reason=attempts exhausted attempts=3 error=EOF]"},
		{&retry.Error{Reason: retry.Deadline, Attempts: 1, Delay: time.Minute, Err: io.EOF}, "[reason=deadline attempts=1 delay=1m0s error=EOF]"},
	}
	for _, tt := range tests {
		if got := tt.v.LogValue().String(); got != tt.want {
			t.Errorf("LogValue() of %+v = %s, want %s", tt.v, got, tt.want)
		}
	}
}
