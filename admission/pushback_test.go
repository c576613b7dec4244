package admission_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

func TestPushBack(t *testing.T) {
	giveUp := func(r retry.Reason) error { return &retry.Error{Reason: r, Attempts: 3, Err: errors.New("x")} }
	header := func(k, v string) *http.Response {
		return &http.Response{StatusCode: 503, Header: http.Header{k: {v}}, Body: io.NopCloser(strings.NewReader("down"))}
	}
	tests := []struct {
		name string
		resp *http.Response
		err  error
		want bool
	}{
		{"nothing", nil, nil, false},
		{"attempts exhausted", nil, giveUp(retry.AttemptsExhausted), true},
		{"budget", nil, giveUp(retry.BudgetExhausted), true},
		{"circuit", nil, giveUp(retry.CircuitOpen), true},
		{"bare breaker error", nil, fmt.Errorf("wrapped: %w", &breaker.OpenError{State: breaker.Open, Wait: time.Second}), true},
		{"canceled", nil, giveUp(retry.Canceled), false},
		{"not retryable", nil, giveUp(retry.NotRetryable), false},
		{"deadline", nil, giveUp(retry.Deadline), false},
		{"other error", nil, io.ErrUnexpectedEOF, false},
		{"don't-retry signal from below", header("Stormguard-Retry", " NO "), nil, true},
		{"unknown signal value", header("Stormguard-Retry", "later"), nil, false},
		{"given up: attempts", header(wire.GiveUpHeader, "attempts-exhausted;attempts=3"), nil, true},
		{"given up: budget", header(wire.GiveUpHeader, "budget-exhausted;attempts=1"), nil, true},
		{"given up: circuit", header(wire.GiveUpHeader, "circuit-open;attempts=2;retry-after=3"), nil, true},
		{"given up: deadline", header(wire.GiveUpHeader, "deadline;attempts=1"), nil, false},
		{"given up: not retryable", header(wire.GiveUpHeader, "not-retryable;attempts=1"), nil, false},
		{"given up: garbage", header(wire.GiveUpHeader, "soon"), nil, false},
		{"plain 503 not from a retrying client", &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody}, nil, false},
		{"404", &http.Response{StatusCode: 404, Header: http.Header{}, Body: http.NoBody}, nil, false},
	}
	for _, tt := range tests {
		w := httptest.NewRecorder()
		got := admission.PushBack(w, tt.resp, tt.err)
		if got != tt.want {
			t.Errorf("PushBack(%s) = %v, want %v", tt.name, got, tt.want)
			continue
		}
		switch {
		case got && (w.Code != 503 || !wire.DontRetry(w.Header())):
			t.Errorf("PushBack(%s) wrote %d %v; want 503 with the don't-retry signal", tt.name, w.Code, w.Header())
		case !got && (w.Code != 200 || len(w.Header()) != 0 || w.Body.Len() != 0):
			t.Errorf("PushBack(%s) wrote %d %v %q; want nothing", tt.name, w.Code, w.Header(), w.Body)
		}
	}
}

// TestPushBackAnswer: the answer PushBack writes, whole.
func TestPushBackAnswer(t *testing.T) {
	w := httptest.NewRecorder()
	admission.PushBack(w, nil, &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: errors.New("x")})
	if w.Code != 503 || !wire.DontRetry(w.Header()) || w.Header().Get("Content-Type") != "text/plain; charset=utf-8" || w.Body.String() != "overloaded; don't retry\n" {
		t.Errorf("PushBack wrote %d %v %q", w.Code, w.Header(), w.Body)
	}
}

// TestPushBackClosesBody: a response pushed back has its body drained and
// closed, one that is not is left to the handler.
func TestPushBackClosesBody(t *testing.T) {
	for _, pushed := range []bool{true, false} {
		b := &closeRecorder{Reader: strings.NewReader("down")}
		resp := &http.Response{StatusCode: 503, Header: http.Header{}, Body: b}
		if pushed {
			wire.SetDontRetry(resp.Header)
		}
		if got := admission.PushBack(httptest.NewRecorder(), resp, nil); got != pushed || b.closed != pushed {
			t.Errorf("PushBack = %v, body closed %v; want %v, %v", got, b.closed, pushed, pushed)
		}
	}
}

type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error {
	c.closed = true
	return nil
}
