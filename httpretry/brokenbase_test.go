package httpretry_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/retry"
)

// TestBrokenBaseRoundTripper: a base RoundTripper that breaks its contract
// gets a clear error, never a panic. A nil response with a nil error ends
// the call after one attempt (sending again through a broken transport
// cannot help) with an error that says so; a response sent beside an error
// is closed and the error is what counts, as net/http's Client does.
func TestBrokenBaseRoundTripper(t *testing.T) {
	for _, tt := range []struct {
		name       string
		answer     func(closed *int) (*http.Response, error)
		wantCalls  int
		wantClosed int // responses sent beside an error, each closed
		wantErr    string
	}{
		{
			name:      "nil response, nil error",
			answer:    func(*int) (*http.Response, error) { return nil, nil },
			wantCalls: 1,
			wantErr:   "nil *Response with a nil error",
		},
		{
			name: "response and error",
			answer: func(closed *int) (*http.Response, error) {
				body := &closeFlag{Reader: strings.NewReader("x"), closed: closed}
				return &http.Response{StatusCode: 200, Body: body}, errors.New("base: both")
			},
			wantCalls:  3, // a transport error without a usable response: a GET is retried
			wantClosed: 3,
			wantErr:    "base: both",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			calls, closed := 0, 0
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				calls++
				return tt.answer(&closed)
			})
			tr, _ := newTransport(t, base)
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", "http://payments.test/", nil))
			if resp != nil {
				resp.Body.Close()
				t.Fatalf("got a response (%d), want an error", resp.StatusCode)
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			var re *retry.Error
			if !errors.As(err, &re) {
				t.Fatalf("error %T, want a *retry.Error", err)
			}
			if calls != tt.wantCalls {
				t.Errorf("base called %d times, want %d", calls, tt.wantCalls)
			}
			if closed != tt.wantClosed {
				t.Errorf("%d stray responses closed, want %d", closed, tt.wantClosed)
			}
		})
	}
}

type closeFlag struct {
	io.Reader
	closed *int
}

func (c *closeFlag) Close() error { *c.closed++; return nil }
