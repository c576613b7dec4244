package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// TestTransportErrors: every kind of error net/http's transport returns
// without a response, made for real where a test can make it and
// otherwise spelled as net/http spells it (transport.go, h2_bundle.go), is
// injected into the first attempt of a GET, a keyed POST and an unkeyed
// POST. A request that got no response is retried when it is safe to send
// again, whatever the error's wording, but not when no retry can mend it
// (the caller's cancel, a request net/http refuses to send, a name that
// does not resolve, a certificate or protocol mismatch): then the call
// ends after one attempt. The connection errors whose wording net/http
// does not export (a pooled connection evicted under the request, an HTTP/2
// stream reset, a server that closed an idle connection, GOAWAY) failed
// at once before; so did a garbled response.
func TestTransportErrors(t *testing.T) {
	tests := []struct {
		name  string
		err   func(t *testing.T) error
		retry bool
	}{
		// No response: retried for a request safe to send again.
		{"pooled connection evicted under the request (real)", evictedConnError, true},
		{"HTTP/2 stream reset by the server (real)", h2StreamResetError, true},
		{"server hung up before answering (real)", hangUpError("", false), true},
		{"server reset the connection (real)", hangUpError("", true), true},
		{"response cut in its header (real)", hangUpError("HTTP/1.1 200 OK\r\nContent-Le", false), true},
		{"garbled response (real)", hangUpError("garbage\r\n\r\n", false), true},
		{"connection refused (real)", refusedError, true},
		{"server closed idle connection", spelled("http: server closed idle connection"), true},
		{"connection broken: too many idle for host", broken("http: putIdleConn: too many idle connections for host"), true},
		{"connection broken: bad state", broken("http: putIdleConn: connection is in bad state"), true},
		{"connection broken: CloseIdleConnections", broken("http: CloseIdleConnections called"), true},
		{"connection broken: keep-alives disabled", broken("http: putIdleConn: keep alives disabled"), true},
		{"read loop exiting", spelled("http: persistConn.readLoop exiting"), true},
		{"idle connection timeout", spelled("http: idle connection timeout"), true},
		{"HTTP/2 connection lost", spelled("http2: client connection lost"), true},
		{"HTTP/2 GOAWAY", spelled(`http2: server sent GOAWAY and closed the connection; LastStreamID=1, ErrCode=PROTOCOL_ERROR, debug=""`), true},
		{"HTTP/2 graceful GOAWAY", spelled("http2: Transport received Server's graceful shutdown GOAWAY"), true},
		{"HTTP/2 refused stream", spelled("stream error: stream ID 3; REFUSED_STREAM"), true},
		{"HTTP/2 conn not usable", spelled("http2: client conn not usable"), true},
		{"HTTP/2 no cached connection", spelled("http2: no cached connection was available"), true},
		{"any other *net.OpError", func(*testing.T) error {
			return &net.OpError{Op: "read", Net: "tcp", Err: &net.AddrError{Err: "x"}}
		}, true},
		{"ECONNRESET", func(*testing.T) error { return &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET} }, true},
		{"broken pipe", func(*testing.T) error { return &net.OpError{Op: "write", Net: "tcp", Err: syscall.EPIPE} }, true},
		{"io.ErrUnexpectedEOF", func(*testing.T) error { return io.ErrUnexpectedEOF }, true},
		{"a base transport's own error", spelled("proxy: upstream unreachable"), true},

		// No retry can mend these.
		{"caller's cancel (real)", canceledError, false},
		{"request's Cancel channel (real)", cancelChannelError, false},
		{"nil URL (real)", refusal(func(r *http.Request) { r.URL = nil }), false},
		{"nil Header (real)", refusal(func(r *http.Request) { r.Header = nil }), false},
		{"unsupported scheme (real)", refusal(func(r *http.Request) { r.URL.Scheme = "ftp" }), false},
		{"no Host (real)", refusal(func(r *http.Request) { r.URL.Host = "" }), false},
		{"invalid method (real)", refusal(func(r *http.Request) { r.Method = "BAD METHOD" }), false},
		{"invalid header name (real)", refusal(func(r *http.Request) { r.Header["Bad Name"] = []string{"x"} }), false},
		{"invalid header value (real)", refusal(func(r *http.Request) { r.Header["X"] = []string{"a\x00b"} }), false},
		{"invalid trailer (real)", refusal(func(r *http.Request) { r.Trailer = http.Header{"Bad Name": {"x"}} }), false},
		{"ContentLength with nil Body (real)", refusal(func(r *http.Request) { r.ContentLength = 5 }), false},
		{"ContentLength of another Body (real)", refusal(func(r *http.Request) {
			r.Method, r.ContentLength, r.Body = "PUT", 10, io.NopCloser(strings.NewReader("abc"))
		}), false},
		{"invalid Host header, through a proxy (real)", invalidHostThroughProxyError, false},
		{"control character in the URL (real)", refusal(func(r *http.Request) { r.URL.Opaque = "/\x01" }), false},
		{"redirect limit (real)", redirectLimitError, false},
		{"plain HTTP server to an HTTPS client (real)", schemeMismatchError, false},
		{"DNS no such host", func(*testing.T) error {
			return &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}}
		}, false},
		{"cannot rewind body", spelled("net/http: cannot rewind body after connection loss"), false},
	}
	requests := []struct {
		name string
		safe bool
		req  func(t *testing.T, url string) *http.Request
	}{
		{"GET", true, func(t *testing.T, url string) *http.Request {
			return newRequest(t, context.Background(), "GET", url, nil)
		}},
		{"keyed POST", true, func(t *testing.T, url string) *http.Request {
			r := newRequest(t, context.Background(), "POST", url, strings.NewReader("body"))
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}},
		{"unkeyed POST", false, func(t *testing.T, url string) *http.Request {
			return newRequest(t, context.Background(), "POST", url, strings.NewReader("body"))
		}},
	}
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			injected := tt.err(t)
			if injected == nil {
				t.Fatal("no error made")
			}
			t.Logf("%T: %v", injected, injected)
			// http.Client wraps every round trip's error in a *url.Error:
			// the exported classifier judges that as the transport does.
			if got := httpretry.IsRetryable(&url.Error{Op: "Get", URL: srv.URL, Err: injected}); got != tt.retry {
				t.Errorf("IsRetryable(*url.Error of %q) = %v, want %v", injected, got, tt.retry)
			}
			for _, rq := range requests {
				rec := &recordingRT{base: srv.Client().Transport, fail: func(n int) error {
					if n == 1 {
						return injected
					}
					return nil
				}}
				tr, _ := newTransport(t, rec)
				resp, err := tr.RoundTrip(rq.req(t, srv.URL))
				attempts := len(rec.sent())
				if tt.retry && rq.safe {
					if err != nil {
						t.Errorf("%s after %q: RoundTrip error %v after %d attempts, want the 200 of the second", rq.name, injected, err, attempts)
						continue
					}
					if got := readClose(t, resp); resp.StatusCode != 200 || got != "ok" || attempts != 2 {
						t.Errorf("%s after %q: RoundTrip = %d %q after %d attempts, want 200 \"ok\" after 2", rq.name, injected, resp.StatusCode, got, attempts)
					}
					continue
				}
				if err == nil {
					readClose(t, resp)
					t.Errorf("%s after %q: RoundTrip = %d after %d attempts, want the error of the first", rq.name, injected, resp.StatusCode, attempts)
					continue
				}
				var re *retry.Error
				if !errors.As(err, &re) || re.Reason != retry.NotRetryable || attempts != 1 || !errors.Is(err, injected) {
					t.Errorf("%s after %q: RoundTrip error %v after %d attempts, want it not retryable after 1", rq.name, injected, err, attempts)
				}
			}
		})
	}
}

// spelled returns an error with net/http's wording of one it does not
// export: the transport cannot tell the two apart.
func spelled(msg string) func(*testing.T) error {
	return func(*testing.T) error { return errors.New(msg) }
}

// broken returns net/http's error for a connection that broke under a
// request after it was written, around inner.
func broken(inner string) func(*testing.T) error {
	return func(*testing.T) error {
		return fmt.Errorf("net/http: HTTP/1.x transport connection broken: %w", errors.New(inner))
	}
}

// evictedConnError makes net/http fail a request whose connection a full
// idle pool evicts between putting it back and handing over its
// (bodiless) response: "net/http: HTTP/1.x transport connection broken:
// http: putIdleConn: too many idle connections". Two requests run on two
// connections to a transport that keeps one idle; the first to put its
// connection back is held there (its httptrace PutIdleConn hook, which
// net/http calls in that gap) until both round trips are over, so the
// second's connection evicts it while its answer waits.
//
// Which connection's hook runs first is up to net/http's goroutines: when
// the second connection's hook wins, the held one is the connection that
// stays pooled, and nothing breaks (its round trip would wait for ever, so
// a try that has not ended within 10 s lets it go). The construction is
// tried again until the pool breaks one connection.
func evictedConnError(t *testing.T) error {
	t.Helper()
	for range 20 {
		if err := evictedConnTry(t); err != nil {
			return err
		}
	}
	t.Fatal("20 tries of two round trips over a pool of one: never one connection broken by the pool")
	return nil
}

// evictedConnTry is one try of evictedConnError: the error of the
// connection the pool broke, or nil if the try did not break one.
func evictedConnTry(t *testing.T) error {
	var arrived sync.WaitGroup
	arrived.Add(2)
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		arrived.Done()
		arrived.Wait() // both requests are in, on two connections
		w.WriteHeader(http.StatusNoContent)
	})
	base := &http.Transport{MaxIdleConns: 1, MaxIdleConnsPerHost: 10}
	defer base.CloseIdleConnections()
	release := make(chan struct{})
	var once, closeOnce sync.Once
	trace := &httptrace.ClientTrace{PutIdleConn: func(error) {
		first := false
		once.Do(func() { first = true })
		if first {
			<-release
		}
	}}
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", srv.URL, nil)
			resp, err := base.RoundTrip(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			errs <- err
		}()
	}
	defer closeOnce.Do(func() { close(release) })
	var got []error
	stuck := time.After(10 * time.Second)
	for len(got) < 2 {
		select {
		case err := <-errs:
			got = append(got, err)
		case <-stuck:
			closeOnce.Do(func() { close(release) })
			stuck = nil
		}
	}
	err1, err2 := got[0], got[1]
	err := errors.Join(err1, err2)
	if err == nil || err1 != nil && err2 != nil || !strings.Contains(err.Error(), "too many idle connections") {
		t.Logf("two round trips over a pool of one = %v and %v, not one connection broken by the pool: again", err1, err2)
		return nil
	}
	if err1 != nil {
		return err1
	}
	return err2
}

// h2StreamResetError is the error of an HTTP/2 request whose stream the
// server resets (INTERNAL_ERROR: its handler aborted).
func h2StreamResetError(t *testing.T) error {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("GET of an aborting HTTP/2 handler = %d, want an error", resp.StatusCode)
	}
	var ue *url.Error
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "stream error") {
		t.Fatalf("GET of an aborting HTTP/2 handler: %v, want a stream error", err)
	}
	return ue.Err
}

// hangUpError returns the error of a GET to a server that reads the
// request, writes answer and closes the connection (resetting it, with
// reset).
func hangUpError(answer string, reset bool) func(t *testing.T) error {
	return func(t *testing.T) error {
		t.Helper()
		srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("Hijack: %v", err)
				return
			}
			_, _ = io.WriteString(conn, answer)
			if tc, ok := conn.(*net.TCPConn); ok && reset {
				_ = tc.SetLinger(0)
			}
			_ = conn.Close()
		})
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		return roundTripError(t, base, newRequest(t, context.Background(), "GET", srv.URL, nil))
	}
}

// roundTripError returns the error of rt.RoundTrip(req), failing the test
// if there is none.
func roundTripError(t *testing.T, rt http.RoundTripper, req *http.Request) error {
	t.Helper()
	resp, err := rt.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatalf("RoundTrip = %d, want an error", resp.StatusCode)
	}
	return err
}

func refusedError(t *testing.T) error {
	addr, base, _ := refusedAddr(t)
	return roundTripError(t, base, newRequest(t, context.Background(), "GET", "http://"+addr+"/", nil))
}

func canceledError(t *testing.T) error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return roundTripError(t, &http.Transport{}, newRequest(t, ctx, "GET", "http://127.0.0.1:1/", nil))
}

// cancelChannelError sends to a listener that never answers (a refused
// dial could win the race with the closed channel), so the cancel is the
// only way the round trip can end.
func cancelChannelError(t *testing.T) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	req := newRequest(t, context.Background(), "GET", "http://"+ln.Addr().String()+"/", nil)
	c := make(chan struct{})
	close(c)
	//lint:ignore SA1019 the deprecated channel is what this case is about
	req.Cancel = c
	return roundTripError(t, &http.Transport{}, req)
}

// refusal returns the error of a request to a live server, edited by
// edit, that net/http refuses to send.
//
// A refusal net/http notices only while it writes the request (a body
// shorter than its ContentLength, a control character in the URL) may come
// back instead as the read error of the connection it then closes (a
// different error, a broken connection, rightly retryable), depending on
// which of the transport's loops answers first; so the request is made
// again until the refusal itself is what comes back.
func refusal(edit func(r *http.Request)) func(t *testing.T) error {
	return func(t *testing.T) error {
		t.Helper()
		srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {})
		return untilRefused(t, func(base *http.Transport) error {
			req := newRequest(t, context.Background(), "GET", srv.URL, nil)
			edit(req)
			return roundTripError(t, base, req)
		})
	}
}

// untilRefused returns the error send gets from a new transport, sent
// again while it is the read error of a broken connection (see refusal).
func untilRefused(t *testing.T, send func(base *http.Transport) error) error {
	t.Helper()
	var err error
	for range 50 {
		base := &http.Transport{}
		err = send(base)
		base.CloseIdleConnections()
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "read" {
			return err
		}
	}
	t.Fatalf("50 tries, each a broken connection, never net/http's refusal; last error: %v", err)
	return nil
}

func redirectLimitError(t *testing.T) error {
	t.Helper()
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Redirect(w, r, "/again", http.StatusFound)
	})
	resp, err := srv.Client().Get(srv.URL)
	if err == nil {
		_ = resp.Body.Close()
		t.Fatal("a redirect loop: no error")
	}
	return err
}

func schemeMismatchError(t *testing.T) error {
	t.Helper()
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return roundTripError(t, base, newRequest(t, context.Background(), "GET", "https"+strings.TrimPrefix(srv.URL, "http"), nil))
}

func invalidHostThroughProxyError(t *testing.T) error {
	t.Helper()
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	proxy, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return untilRefused(t, func(base *http.Transport) error {
		base.Proxy = http.ProxyURL(proxy)
		req := newRequest(t, context.Background(), "GET", "http://example.test/", nil)
		req.Host = "a b"
		return roundTripError(t, base, req)
	})
}
