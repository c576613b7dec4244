package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// netErr is a net.Error with settable answers.
type netErr struct{ timeout, temporary bool }

func (e netErr) Error() string   { return "net error" }
func (e netErr) Timeout() bool   { return e.timeout }
func (e netErr) Temporary() bool { return e.temporary }

// tempErr declares itself via Temporary only.
type tempErr bool

func (e tempErr) Error() string   { return "temp" }
func (e tempErr) Temporary() bool { return bool(e) }

// hintErr carries only a Retry-After hint.
type hintErr time.Duration

func (e hintErr) Error() string             { return "slow down" }
func (e hintErr) RetryAfter() time.Duration { return time.Duration(e) }

func opErr(err error) error {
	return &url.Error{Op: "Get", URL: "http://example.test", Err: &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", err)}}
}

func TestIsRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain error", errors.New("boom"), false},
		{"io.EOF", io.EOF, false},

		{"unexpected EOF from a dropped connection", &url.Error{Op: "Get", URL: "http://x", Err: io.ErrUnexpectedEOF}, true},

		{"os.ErrDeadlineExceeded", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), true},
		{"net.Error timeout", netErr{timeout: true}, true},
		{"net.Error neither", netErr{}, false},
		{"net.Error temporary", netErr{temporary: true}, true},
		{"attempt's context deadline", fmt.Errorf("query: %w", context.DeadlineExceeded), true},
		{"context canceled", fmt.Errorf("query: %w", context.Canceled), false},

		{"Temporary true", tempErr(true), true},
		{"Temporary false", tempErr(false), false},
		{"hint only", hintErr(time.Second), true},
		{"zero hint is no hint", hintErr(0), false},
		{"negative hint is no hint", hintErr(-time.Second), false},

		// A hint makes an error retryable whatever else it says (it comes
		// before Temporary); a caller's error and a cancel do not.
		{"hint beats Temporary false", &statusErr{Code: 404, After: time.Second}, true},
		{"Temporary true without a hint", &statusErr{Code: 503}, true},
		{"Temporary false without a hint", &statusErr{Code: 404}, false},
		{"canceled beats a hint", errors.Join(context.Canceled, hintErr(time.Second)), false},
		{"timeout beats Temporary false", errors.Join(tempErr(false), os.ErrDeadlineExceeded), true},
		{"broken connection beats Temporary false", errors.Join(tempErr(false), io.ErrUnexpectedEOF), true},
		{"closed network connection", fmt.Errorf("write: %w", net.ErrClosed), true},
		{"bare unexpected EOF", io.ErrUnexpectedEOF, true},

		{"Permanent deep in chain", fmt.Errorf("x: %w", retry.Permanent(io.ErrUnexpectedEOF)), false},
		{"joined with a timeout", errors.Join(errors.New("a"), os.ErrDeadlineExceeded), true},
		{"Permanent wins over a hint", retry.Permanent(hintErr(time.Second)), false},
		{"Permanent wins over a timeout", retry.Permanent(os.ErrDeadlineExceeded), false},
		{"inner retry loop gave up", fmt.Errorf("inner: %w", &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: &statusErr{Code: 503}}), false},
		{"inner give-up with a hint", &retry.Error{Reason: retry.Deadline, Attempts: 1, Err: hintErr(time.Second)}, false},
		{"a bare Reason", retry.AttemptsExhausted, false},
	}
	for _, tt := range tests {
		if got := retry.IsRetryable(tt.err); got != tt.want {
			t.Errorf("IsRetryable(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestIsRetryableRealErrors classifies errors made by the standard library,
// not built by hand.
func TestIsRetryableRealErrors(t *testing.T) {
	// Connection refused: dial a port nobody listens on any more.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		t.Log("dial to a closed port succeeded; skipping the refused case")
	} else if !retry.IsRetryable(err) {
		t.Errorf("IsRetryable(dial closed port: %v) = false", err)
	}

	// A read deadline that has passed: os.ErrDeadlineExceeded, a timeout.
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	if err := c1.SetReadDeadline(time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	_, err = c1.Read(make([]byte, 1))
	if !retry.IsRetryable(err) {
		t.Errorf("IsRetryable(pipe read past deadline: %v) = false", err)
	}

	// A context that timed out.
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	if !retry.IsRetryable(ctx.Err()) {
		t.Errorf("IsRetryable(%v) = false", ctx.Err())
	}
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		err  error
		want time.Duration
	}{
		{nil, 0},
		{errors.New("x"), 0},
		{&statusErr{Code: 503, After: 2 * time.Second}, 2 * time.Second},
		{&statusErr{Code: 503}, 0},
		{errors.Join(errors.New("x"), hintErr(time.Second)), time.Second},
		{retry.Permanent(hintErr(time.Second)), time.Second}, // read, though not retried
		{&breaker.OpenError{State: breaker.Open, Wait: 3 * time.Second}, 3 * time.Second},
		{fmt.Errorf("wrapped: %w", hintErr(time.Minute)), time.Minute},
		{hintErr(-time.Second), 0},
	}
	for _, tt := range tests {
		if got := retry.RetryAfter(tt.err); got != tt.want {
			t.Errorf("RetryAfter(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
