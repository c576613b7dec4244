package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/retry"
)

// reasons lists every Reason a call can return.
var reasons = []retry.Reason{retry.NotRetryable, retry.AttemptsExhausted, retry.Deadline,
	retry.Canceled, retry.BudgetExhausted, retry.CircuitOpen, retry.Limited}

func TestReasonText(t *testing.T) {
	tests := []struct {
		r     retry.Reason
		error string
	}{
		{retry.NotRetryable, "retry: not retryable"},
		{retry.AttemptsExhausted, "retry: attempts exhausted"},
		{retry.Deadline, "retry: deadline"},
		{retry.Canceled, "retry: canceled"},
		{retry.BudgetExhausted, "retry: budget exhausted"},
		{retry.CircuitOpen, "retry: circuit open"},
		{retry.Limited, "retry: limited"},
		{0, "retry: Reason(0)"},
		{200, "retry: Reason(200)"},
	}
	for _, tt := range tests {
		if got := tt.r.Error(); got != tt.error {
			t.Errorf("Reason(%d).Error() = %q, want %q", uint8(tt.r), got, tt.error)
		}
	}
	if len(tests)-2 != len(reasons) {
		t.Errorf("%d reasons listed, the table covers %d", len(reasons), len(tests)-2)
	}
}

// TestReasonIs: a Reason is an error that errors.Is matches to itself only;
// an *Error with it matches it and the context error it stands for
// (Canceled: context.Canceled, Deadline: context.DeadlineExceeded).
func TestReasonIs(t *testing.T) {
	for _, r := range reasons {
		wrapped := fmt.Errorf("charge: %w", &retry.Error{Reason: r, Attempts: 2, Err: io.ErrUnexpectedEOF})
		for _, err := range []error{r, wrapped} {
			for _, other := range reasons {
				if got, want := errors.Is(err, other), other == r; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, other, got, want)
				}
			}
			if err == error(r) {
				continue
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
	p := mustNew(t, retry.WithBackoff(mustBackoff(t, backoff.FullJitter, time.Millisecond, time.Millisecond, 0)))
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
		{&retry.Error{Reason: retry.Canceled}, "retry: canceled after 0 attempts"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	// A Deadline stop before a sleep names the sleep it refused: NoJitter
	// 300 ms sleeps 600 ms in the first second, then 1.2 s would not fit.
	synctest.Test(t, func(t *testing.T) {
		p := mustNew(t, retry.WithMaxAttempts(10), retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 300*time.Millisecond, time.Minute, 0)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := p.Do(ctx, func(ctx context.Context, attempt int) error { return err503 })
		if want := "retry: deadline after 2 attempts (next sleep 1.2s would end past the deadline): HTTP 503"; err == nil || err.Error() != want {
			t.Errorf("Error() = %v, want %q", err, want)
		}
	})
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
