package httpretry_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// TestRetryableStatuses: of the status codes, IsRetryable retries 408,
// 429, 502, 503 and 504 only.
func TestRetryableStatuses(t *testing.T) {
	for code := 100; code < 600; code++ {
		want := code == 408 || code == 429 || code == 502 || code == 503 || code == 504
		if got := httpretry.IsRetryable(&httpretry.StatusError{Code: code}); got != want {
			t.Errorf("IsRetryable(StatusError %d) = %v, want %v", code, got, want)
		}
	}
	for _, code := range []int{99, 600, 1503} {
		if httpretry.IsRetryable(&httpretry.StatusError{Code: code}) {
			t.Errorf("IsRetryable(StatusError %d) = true", code)
		}
	}
}

func TestStatusErrorText(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{&httpretry.StatusError{Code: 503}, "HTTP 503"},
		{&httpretry.StatusError{Code: 429, After: 1500 * time.Millisecond}, "HTTP 429 (retry after 1.5s)"},
		{&httpretry.StatusError{}, "HTTP 0"},
		{&retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: &httpretry.StatusError{Code: 503}},
			"retry: attempts exhausted after 3 attempts: HTTP 503"},
		{&retry.Error{Reason: retry.NotRetryable, Attempts: 1, Err: &httpretry.StatusError{Code: 404}},
			"retry: not retryable after 1 attempt: HTTP 404"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
	se := &httpretry.StatusError{Code: 503, After: 2 * time.Second}
	if se.StatusCode() != 503 || se.RetryAfter() != 2*time.Second || retry.RetryAfter(fmt.Errorf("x: %w", se)) != 2*time.Second {
		t.Errorf("StatusError{503, 2s}: StatusCode %d, RetryAfter %v", se.StatusCode(), se.RetryAfter())
	}
	var got *httpretry.StatusError
	if err := retry.Permanent(se); !errors.As(err, &got) || got != se || err.Error() != se.Error() {
		t.Errorf("Permanent(%v): errors.As does not reach the status, or the text changed", se)
	}
}

// codeError carries a status code the way another client library might.
type codeError int

func (c codeError) Error() string   { return fmt.Sprintf("status %d", int(c)) }
func (c codeError) StatusCode() int { return int(c) }

func TestIsRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"503", &httpretry.StatusError{Code: 503}, true},
		{"429 wrapped", fmt.Errorf("call: %w", &httpretry.StatusError{Code: 429}), true},
		{"404", &httpretry.StatusError{Code: 404}, false},
		{"404 with a hint", &httpretry.StatusError{Code: 404, After: time.Second}, false},
		{"500", &httpretry.StatusError{Code: 500}, false},
		{"another library's 502", codeError(502), true},
		{"another library's 400", codeError(400), false},
		{"status 0 is no status", &httpretry.StatusError{}, false},
		{"status 0 with a hint", &httpretry.StatusError{After: time.Second}, true},
		// A nested loop that gave up already retried: retry at one layer.
		{"inner retry loop gave up", fmt.Errorf("inner: %w", &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: &httpretry.StatusError{Code: 503}}), false},
		{"inner retry loop gave up on a network error", &url.Error{Op: "Get", URL: "http://x",
			Err: &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}}, false},
		{"inner retry loop gave up on EOF", &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: io.EOF}, false},

		{"io.EOF before a response", io.EOF, true},
		{"io.EOF in *url.Error", &url.Error{Op: "Get", URL: "http://x", Err: io.EOF}, true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"net.ErrClosed", fmt.Errorf("read: %w", net.ErrClosed), true},
		{"any *net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("network is unreachable")}, true},
		{"attempt timeout", context.DeadlineExceeded, true},
		{"canceled", context.Canceled, false},
		{"plain error", errors.New("boom"), false},
		{"DNS no such host", &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}}, false},
		{"DNS timeout", &net.OpError{Op: "dial", Err: &net.DNSError{Err: "timeout", Name: "x", IsTimeout: true}}, true},
		{"DNS temporary", &net.DNSError{Err: "server misbehaving", Name: "x", IsTemporary: true}, true},
		{"unknown authority", &url.Error{Op: "Get", URL: "https://x", Err: &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}}, false},
		{"bare unknown authority", x509.UnknownAuthorityError{}, false},
		{"hostname mismatch", x509.HostnameError{Host: "x"}, false},
		{"expired certificate", x509.CertificateInvalidError{Reason: x509.Expired}, false},
		{"bad escape", &url.Error{Op: "parse", URL: "%zz", Err: url.EscapeError("%zz")}, false},
		{"bad host", url.InvalidHostError(" "), false},
	}
	for _, tt := range tests {
		if got := httpretry.IsRetryable(tt.err); got != tt.want {
			t.Errorf("IsRetryable(%s: %v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// TestStatusThroughTheLoop runs the retry loop with the HTTP classifier,
// as code that calls HTTP without the Transport does: a 404 is never
// retried, not even with a Retry-After; 408, 429, 502, 503, 504 are.
func TestStatusThroughTheLoop(t *testing.T) {
	tests := []struct {
		err   error
		calls int
	}{
		{&httpretry.StatusError{Code: 400}, 1}, {&httpretry.StatusError{Code: 401}, 1},
		{&httpretry.StatusError{Code: 404}, 1}, {&httpretry.StatusError{Code: 404, After: time.Second}, 1},
		{&httpretry.StatusError{Code: 409}, 1}, {&httpretry.StatusError{Code: 422}, 1},
		{&httpretry.StatusError{Code: 500}, 1}, {&httpretry.StatusError{Code: 501}, 1},
		{&httpretry.StatusError{Code: 408}, 3}, {&httpretry.StatusError{Code: 429}, 3},
		{&httpretry.StatusError{Code: 502}, 3}, {&httpretry.StatusError{Code: 503}, 3},
		{&httpretry.StatusError{Code: 504}, 3}, {&httpretry.StatusError{Code: 503, After: time.Second}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.err.Error(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := &timeline{}
				p, err := retry.New(retry.WithClassifier(httpretry.IsRetryable), retry.WithObserver(clock))
				if err != nil {
					t.Fatal(err)
				}
				calls := 0
				err = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
					calls++
					return fmt.Errorf("call: %w", tt.err)
				})
				if calls != tt.calls {
					t.Errorf("%v: %d calls, want %d", tt.err, calls, tt.calls)
				}
				var se *httpretry.StatusError
				if !errors.As(err, &se) || se != tt.err {
					t.Errorf("%v: errors.As(%v) does not find the status", tt.err, err)
				}
				if want := retry.NotRetryable; tt.calls == 1 && !errors.Is(err, want) {
					t.Errorf("%v: %v, want %v", tt.err, err, want)
				}
				if tt.calls == 1 && len(clock.Sleeps()) != 0 {
					t.Errorf("%v: slept %v before giving up", tt.err, clock.Sleeps())
				}
			})
		})
	}
}

// Test404WithRetryAfterNotRetried: through the Transport, a 404 is
// returned at once, whatever its Retry-After says, for every method.
func Test404WithRetryAfterNotRetried(t *testing.T) {
	for _, method := range methods {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Retry-After", "1")
			http.NotFound(w, r)
		})
		tr, clock := newTransport(t, srv.Client().Transport)
		req := newRequest(t, context.Background(), method, srv.URL, nil)
		req.Header.Set("Idempotency-Key", "k-1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		readClose(t, resp)
		if resp.StatusCode != 404 || obs.count() != 1 || len(clock.Sleeps()) != 0 {
			t.Errorf("%s: %d after %d attempts, sleeps %v; want the 404 at once", method, resp.StatusCode, obs.count(), clock.Sleeps())
		}
		if _, ok := gaveUp(resp); ok {
			t.Errorf("%s: a 404 is marked as a give-up", method)
		}
	}
}

// TestNestedTransportsRetryAtOneLayer: a Transport over another Transport
// (a library's client inside the caller's) does not retry what the inner
// one gave up on: the attempts multiply otherwise.
func TestNestedTransportsRetryAtOneLayer(t *testing.T) {
	t.Run("connection refused", func(t *testing.T) {
		addr, base, dials := refusedAddr(t)
		inner, _ := newTransport(t, base)
		outer, _ := newTransport(t, inner)
		_, err := getClose(t, outer, "http://"+addr)
		if err == nil {
			t.Fatal("RoundTrip to a closed port succeeded")
		}
		if n := dials.Load(); n != 3 {
			t.Errorf("%d connection attempts, want 3 (the inner transport's; the outer must not retry its give-up): %v", n, err)
		}
	})
}

// A transport over another one does not retry the inner one's give-up on a
// retryable status either: the response carries the inner give-up
// (Stormguard-Gave-Up), and the server sees the inner transport's 3
// attempts, not 3 x 3.
func TestNestedTransportsGiveUpOnStatus(t *testing.T) {
	srv, seen := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	inner, _ := newTransport(t, http.DefaultTransport)
	outer, _ := newTransport(t, inner)
	resp, err := getClose(t, outer, srv.URL)
	if err != nil {
		t.Fatalf("RoundTrip = %v, want the 503", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", resp.StatusCode)
	}
	if n := seen.count(); n != 3 {
		t.Errorf("server saw %d requests, want 3 (the inner transport's)", n)
	}
	g, ok := gaveUp(resp)
	if !ok || g.Attempts != 1 || g.Reason != "not-retryable" {
		t.Errorf("outer give-up = %+v, %v; want not-retryable after its 1 attempt", g, ok)
	}
}
