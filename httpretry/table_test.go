package httpretry_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

var methods = []string{"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "POST", "PATCH"}

func idempotent(method string) bool {
	return method != "POST" && method != "PATCH"
}

func bodyFor(method string) *strings.Reader {
	switch method {
	case "POST", "PUT", "PATCH":
		return strings.NewReader("payload of " + method)
	}
	return nil
}

// TestStatusTable checks the package documentation's table of what is
// retried, for every status row, method and key: the attempts the server
// saw, their attempt headers, and that the caller gets the last response
// with a nil error.
func TestStatusTable(t *testing.T) {
	rows := []struct {
		code int
		want func(method string, key bool) int // attempts
	}{
		{408, retryTwice}, {429, retryTwice}, {502, retryTwice}, {503, retryTwice}, {504, retryTwice},
		{500, func(m string, key bool) int {
			if idempotent(m) {
				return 2
			}
			return 1
		}},
		{400, once}, {401, once}, {403, once}, {404, once}, {409, once}, {422, once},
		{200, once}, {201, once}, {302, once},
	}
	for _, row := range rows {
		for _, method := range methods {
			for _, key := range []bool{false, true} {
				name := strconv.Itoa(row.code) + "/" + method + "/key=" + strconv.FormatBool(key)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
						if row.code == 302 {
							w.Header().Set("Location", "/elsewhere")
						}
						w.WriteHeader(row.code)
					})
					tr, _ := newTransport(t, srv.Client().Transport)
					var body *strings.Reader
					req := newRequest(t, context.Background(), method, srv.URL, nil)
					if body = bodyFor(method); body != nil {
						req = newRequest(t, context.Background(), method, srv.URL, body)
					}
					if key {
						req.Header.Set("Idempotency-Key", "k-"+name)
					}
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatalf("RoundTrip(%s) error = %v; want the %d response", name, err, row.code)
					}
					readClose(t, resp)
					if resp.StatusCode != row.code {
						t.Errorf("RoundTrip(%s) status = %d, want %d", name, resp.StatusCode, row.code)
					}
					want := row.want(method, key)
					attempts, _, _ := obs.snapshot()
					if !slices.Equal(attempts, wantAttemptHeaders(want)) {
						t.Errorf("RoundTrip(%s): server saw attempt headers %q, want %q", name, attempts, wantAttemptHeaders(want))
					}
				})
			}
		}
	}
}

func retryTwice(method string, key bool) int {
	if idempotent(method) || key {
		return 3
	}
	return 1
}

func once(string, bool) int { return 1 }

// hijackReset answers by writing part of a response and resetting the
// connection (SO_LINGER 0): a connection reset mid-response.
func hijackReset(t *testing.T, w http.ResponseWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		t.Errorf("Hijack: %v", err)
		return
	}
	_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n")
	_ = buf.Flush()
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// TestNetworkTable checks the network rows of the package documentation's
// table, for every method and key: a connection reset mid-response, an
// attempt that hits its deadline on a slow server, and a refused
// connection. The caller gets an error that says why the transport stopped
// and wraps the cause.
func TestNetworkTable(t *testing.T) {
	rows := []string{"reset", "timeout", "refused"}
	for _, row := range rows {
		for _, method := range methods {
			for _, key := range []bool{false, true} {
				name := row + "/" + method + "/key=" + strconv.FormatBool(key)
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					var (
						url   string
						seen  func() int
						base  http.RoundTripper
						extra []httpretry.Option
					)
					switch row {
					case "reset":
						srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { hijackReset(t, w) })
						url, seen, base = srv.URL, obs.count, srv.Client().Transport
					case "timeout":
						// Counted where the transport hands each attempt
						// on: under load, an attempt may time out before
						// the server's handler even runs.
						srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() })
						rec := &recordingRT{base: srv.Client().Transport}
						url, base = srv.URL, rec
						seen = func() int { return len(rec.sent()) }
						extra = append(extra, httpretry.WithAttemptTimeout(20*time.Millisecond))
					case "refused":
						addr, tr, dials := refusedAddr(t)
						url, base = "http://"+addr, tr
						seen = func() int { return int(dials.Load()) }
					}
					tr, _ := newTransport(t, base, extra...)
					req := newRequest(t, context.Background(), method, url, nil)
					if body := bodyFor(method); body != nil {
						req = newRequest(t, context.Background(), method, url, body)
					}
					if key {
						req.Header.Set("Idempotency-Key", "k-"+name)
					}
					resp, err := tr.RoundTrip(req)
					if err == nil {
						readClose(t, resp)
						t.Fatalf("RoundTrip(%s) = %d, nil; want an error", name, resp.StatusCode)
					}
					if resp != nil {
						t.Errorf("RoundTrip(%s) returned a response with error %v", name, err)
					}
					want := retryTwice(method, key)
					if got := seen(); got != want {
						t.Errorf("RoundTrip(%s): %d attempts reached the server, want %d (err %v)", name, got, want, err)
					}
					var re *retry.Error
					if !errors.As(err, &re) {
						t.Fatalf("RoundTrip(%s) error %v (%T) is not a *retry.Error", name, err, err)
					}
					wantReason := retry.AttemptsExhausted
					if want == 1 {
						wantReason = retry.NotRetryable
					}
					if re.Reason != wantReason || re.Attempts != want || re.Err == nil {
						t.Errorf("RoundTrip(%s) error = %v; want reason %v after %d attempts with the cause", name, err, wantReason, want)
					}
				})
			}
		}
	}
}
