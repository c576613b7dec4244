package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/stormguard/stormguard/retry"
)

// reasons lists every Reason a call can return.
var reasons = []retry.Reason{retry.NotRetryable, retry.AttemptsExhausted, retry.Deadline,
	retry.Canceled, retry.BudgetExhausted, retry.CircuitOpen}

func TestReasonText(t *testing.T) {
	tests := []struct {
		r          retry.Reason
		str, error string
	}{
		{retry.NotRetryable, "not retryable", "retry: not retryable"},
		{retry.AttemptsExhausted, "attempts exhausted", "retry: attempts exhausted"},
		{retry.Deadline, "deadline", "retry: deadline"},
		{retry.Canceled, "canceled", "retry: canceled"},
		{retry.BudgetExhausted, "budget exhausted", "retry: budget exhausted"},
		{retry.CircuitOpen, "circuit open", "retry: circuit open"},
		{0, "Reason(0)", "retry: Reason(0)"},
		{200, "Reason(200)", "retry: Reason(200)"},
	}
	for _, tt := range tests {
		if got := tt.r.String(); got != tt.str {
			t.Errorf("Reason(%d).String() = %q, want %q", uint8(tt.r), got, tt.str)
		}
		if got := tt.r.Error(); got != tt.error {
			t.Errorf("Reason(%d).Error() = %q, want %q", uint8(tt.r), got, tt.error)
		}
	}
	if len(tests)-2 != len(reasons) {
		t.Errorf("%d reasons listed, the table covers %d", len(reasons), len(tests)-2)
	}
}

// TestReasonIs: a Reason is an error that errors.Is matches to itself only,
// and to the context error it stands for (Canceled: context.Canceled,
// Deadline: context.DeadlineExceeded), alone or inside an *Error.
func TestReasonIs(t *testing.T) {
	for _, r := range reasons {
		wrapped := fmt.Errorf("charge: %w", &retry.Error{Reason: r, Attempts: 2, Err: io.ErrUnexpectedEOF})
		for _, err := range []error{r, wrapped} {
			for _, other := range reasons {
				if got, want := errors.Is(err, other), other == r; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, other, got, want)
				}
			}
			if got, want := errors.Is(err, context.Canceled), r == retry.Canceled; got != want {
				t.Errorf("errors.Is(%v, context.Canceled) = %v, want %v", err, got, want)
			}
			if got, want := errors.Is(err, context.DeadlineExceeded), r == retry.Deadline; got != want {
				t.Errorf("errors.Is(%v, context.DeadlineExceeded) = %v, want %v", err, got, want)
			}
		}
		if !errors.Is(wrapped, io.ErrUnexpectedEOF) {
			t.Errorf("errors.Is(Error{%v}, last error) = false", r)
		}
		var got retry.Reason
		if !errors.As(wrapped, &got) || got != r {
			t.Errorf("errors.As(Error{%v}, *Reason) = %v, want %v", r, got, r)
		}
	}
	// The Reason is not an error of its own kind: a last error that is a
	// context error still matches, whatever the reason.
	err := &retry.Error{Reason: retry.NotRetryable, Attempts: 1, Err: context.DeadlineExceeded}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, retry.Deadline) {
		t.Errorf("Error{not retryable, Err DeadlineExceeded}: want DeadlineExceeded (the last error) and not Reason Deadline")
	}
	// An unknown Reason is not unwrapped from an *Error.
	if err := (&retry.Error{Reason: 0, Err: io.EOF}); errors.Is(err, retry.Reason(0)) || !errors.Is(err, io.EOF) {
		t.Errorf("Error{Reason 0}: errors.Is(Reason(0)) = true or the last error lost")
	}
}

// TestReasonFromDo: the Reason of a real give-up matches with errors.Is and
// maps to the context's error for cancels and deadlines.
func TestReasonFromDo(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	p := mustNew(t, retry.WithClock(instantClock{}))
	tests := []struct {
		ctx    context.Context
		errs   []error
		reason retry.Reason
		ctxErr error // also matched, nil: neither context error
	}{
		{context.Background(), []error{err404}, retry.NotRetryable, nil},
		{context.Background(), []error{err503, err503, err503}, retry.AttemptsExhausted, nil},
		{canceled, nil, retry.Canceled, context.Canceled},
		{expired, nil, retry.Deadline, context.DeadlineExceeded},
	}
	for _, tt := range tests {
		calls := 0
		err := p.Do(tt.ctx, script(&calls, tt.errs...))
		checkStop(t, err, tt.reason, len(tt.errs))
		for _, ce := range []error{context.Canceled, context.DeadlineExceeded} {
			if got, want := errors.Is(err, ce), ce == tt.ctxErr; got != want {
				t.Errorf("errors.Is(%v, %v) = %v, want %v", err, ce, got, want)
			}
		}
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		err  *retry.Error
		want string
	}{
		{&retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: &statusErr{Code: 503}},
			"retry: attempts exhausted after 3 attempts: HTTP 503"},
		{&retry.Error{Reason: retry.NotRetryable, Attempts: 1, Err: &statusErr{Code: 404}},
			"retry: not retryable after 1 attempt: HTTP 404"},
		{&retry.Error{Reason: retry.Deadline, Attempts: 2, Delay: 1200 * time.Millisecond, Err: &statusErr{Code: 503, After: time.Second}},
			"retry: deadline after 2 attempts (next sleep 1.2s would end past the deadline): HTTP 503 (retry after 1s)"},
		{&retry.Error{Reason: retry.Canceled}, "retry: canceled after 0 attempts"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestPermanentWrapping(t *testing.T) {
	base := &statusErr{Code: 409}
	err := retry.Permanent(base)
	var se *statusErr
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
		{&retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: io.EOF}, "[reason=attempts exhausted attempts=3 error=EOF]"},
		{&retry.Error{Reason: retry.Deadline, Attempts: 1, Delay: time.Minute, Err: io.EOF}, "[reason=deadline attempts=1 delay=1m0s error=EOF]"},
	}
	for _, tt := range tests {
		if got := tt.v.LogValue().String(); got != tt.want {
			t.Errorf("LogValue() of %+v = %s, want %s", tt.v, got, tt.want)
		}
	}
}
