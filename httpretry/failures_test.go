package httpretry_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// TestStalled503BodyDoesNotBlock: a 503 whose body stalls after the
// headers is discarded without waiting for its body; the retry goes on and
// succeeds. The test's own timeout is the bound: no timed assertion.
func TestStalled503BodyDoesNotBlock(t *testing.T) {
	release := make(chan struct{})
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Content-Length", "100000")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "the first bytes of a long error page")
			_ = http.NewResponseController(w).Flush()
			select { // stall until the client goes away
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	t.Cleanup(func() { close(release) }) // before srv.Close, which waits for handlers
	rec := &recordingRT{base: srv.Client().Transport}
	tr, _ := newTransport(t, rec)
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	if got := readClose(t, resp); resp.StatusCode != 200 || got != "ok" || obs.count() != 2 {
		t.Errorf("RoundTrip = %d %q after %d attempts, want 200 \"ok\" after 2", resp.StatusCode, got, obs.count())
	}
	if open := rec.unclosed(); len(open) != 0 {
		t.Errorf("responses %v left open", open)
	}
}

// closeWhileReadingBody is a handler that, for the first fails requests,
// reads a little of the request body and closes the connection: the
// client fails while it is still sending.
func closeWhileReadingBody(t *testing.T, fails int) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		if n > fails {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = io.WriteString(w, "ok")
			return
		}
		_, _ = io.ReadFull(r.Body, make([]byte, 1024))
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		_ = conn.Close()
	}
}

// countingServer is serve without reading the body first (the handler does).
func countingServer(t *testing.T, h func(w http.ResponseWriter, r *http.Request, n int)) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, int(n.Add(1)))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// quietTLSServer is a TLS loopback server that does not log the handshake
// failures the tests provoke.
func quietTLSServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// TestTransportErrorBeforeResponse: a transport failure before any
// response is retried for a request that is safe to repeat (a GET, a keyed
// POST) and not for one that is not (an unkeyed POST), which gets the
// error, wrapped, after one attempt.
func TestTransportErrorBeforeResponse(t *testing.T) {
	requests := []struct {
		name  string
		build func(t *testing.T, url string, body io.Reader) *http.Request
		safe  bool
	}{
		{"GET", func(t *testing.T, url string, body io.Reader) *http.Request {
			return newRequest(t, context.Background(), "GET", url, body)
		}, true},
		{"keyed POST", func(t *testing.T, url string, body io.Reader) *http.Request {
			r := newRequest(t, context.Background(), "POST", url, body)
			r.Header.Set("Idempotency-Key", "k-1")
			return r
		}, true},
		{"unkeyed POST", func(t *testing.T, url string, body io.Reader) *http.Request {
			return newRequest(t, context.Background(), "POST", url, body)
		}, false},
	}
	check := func(t *testing.T, safe bool, rec *recordingRT, resp *http.Response, err error) {
		t.Helper()
		attempts := len(rec.sent())
		if safe {
			if err != nil {
				t.Fatalf("RoundTrip error = %v after %d attempts, want the 200 of the third", err, attempts)
			}
			if got := readClose(t, resp); resp.StatusCode != 200 || got != "ok" || attempts != 3 {
				t.Errorf("RoundTrip = %d %q after %d attempts, want 200 \"ok\" after 3", resp.StatusCode, got, attempts)
			}
			return
		}
		if err == nil {
			readClose(t, resp)
			t.Fatalf("RoundTrip = %d after %d attempts, want the error of the first", resp.StatusCode, attempts)
		}
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 1 || attempts != 1 {
			t.Errorf("RoundTrip error = %v after %d attempts; want not retryable after 1", err, attempts)
		}
		if re != nil && !httpretry.IsRetryable(re.Err) {
			t.Errorf("the cause %v (%T) is not a retryable transport failure", re.Err, re.Err)
		}
	}

	t.Run("server closes while reading the body", func(t *testing.T) {
		payload := strings.Repeat("p", 4<<20) // far more than the socket buffers
		for _, rq := range requests {
			t.Run(rq.name, func(t *testing.T) {
				srv := countingServer(t, closeWhileReadingBody(t, 2))
				rec := &recordingRT{base: srv.Client().Transport}
				tr, _ := newTransport(t, rec)
				resp, err := tr.RoundTrip(rq.build(t, srv.URL, strings.NewReader(payload)))
				check(t, rq.safe, rec, resp, err)
			})
		}
	})

	injected := []struct {
		name string
		err  error
	}{
		{"net.ErrClosed in *net.OpError", &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}},
		{"net.ErrClosed in *url.Error", &url.Error{Op: "Get", URL: "http://x", Err: net.ErrClosed}},
		{"*net.OpError in *url.Error", &url.Error{Op: "Post", URL: "http://x", Err: &net.OpError{Op: "write", Net: "tcp", Err: net.ErrClosed}}},
		{"io.EOF", io.EOF},
		{"io.EOF in *url.Error", &url.Error{Op: "Get", URL: "http://x", Err: io.EOF}},
		{"other *net.OpError", &net.OpError{Op: "write", Net: "tcp", Err: errors.New("some socket failure")}},
	}
	for _, in := range injected {
		t.Run("injected "+in.name, func(t *testing.T) {
			for _, rq := range requests {
				t.Run(rq.name, func(t *testing.T) {
					srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, n int) {
						_, _ = io.Copy(io.Discard, r.Body)
						_, _ = io.WriteString(w, "ok")
					})
					rec := &recordingRT{base: srv.Client().Transport, fail: func(n int) error {
						if n <= 2 {
							return in.err
						}
						return nil
					}}
					tr, _ := newTransport(t, rec)
					resp, err := tr.RoundTrip(rq.build(t, srv.URL, strings.NewReader("body")))
					check(t, rq.safe, rec, resp, err)
					if err != nil && !errors.Is(err, in.err) {
						t.Errorf("RoundTrip error %v does not wrap the transport's %v", err, in.err)
					}
				})
			}
		})
	}
}

// TestTransportErrorNotRetried: failures that no retry can mend end at the
// first attempt, for a GET too: a DNS name that does not exist, a
// certificate the client does not trust, a malformed URL.
func TestTransportErrorNotRetried(t *testing.T) {
	type setup struct {
		base http.RoundTripper
		url  string
	}
	tests := []struct {
		name  string
		setup func(t *testing.T) setup
		is    func(err error) bool
	}{
		{"DNS no such host", func(t *testing.T) setup {
			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			return setup{base, "http://stormguard-test.invalid/"}
		}, func(err error) bool {
			var dns *net.DNSError
			return errors.As(err, &dns) && dns.IsNotFound
		}},
		{"untrusted certificate", func(t *testing.T) setup {
			srv := quietTLSServer(t)
			base := &http.Transport{} // the system roots: the test certificate is unknown
			t.Cleanup(base.CloseIdleConnections)
			return setup{base, srv.URL}
		}, func(err error) bool {
			var cert *tls.CertificateVerificationError
			var ua x509.UnknownAuthorityError
			return errors.As(err, &cert) || errors.As(err, &ua)
		}},
		{"certificate for another host", func(t *testing.T) setup {
			srv := quietTLSServer(t)
			base := srv.Client().Transport.(*http.Transport).Clone()
			base.TLSClientConfig.ServerName = "not-the-test-host.example"
			t.Cleanup(base.CloseIdleConnections)
			return setup{base, srv.URL}
		}, func(err error) bool {
			var h x509.HostnameError
			return errors.As(err, &h)
		}},
		{"malformed URL (bad escape)", func(t *testing.T) setup {
			return setup{roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				// What url.Parse says of "http://x/%zz".
				return nil, &url.Error{Op: "parse", URL: "http://x/%zz", Err: url.EscapeError("%zz")}
			}), "http://example.test/"}
		}, func(err error) bool {
			var e url.EscapeError
			return errors.As(err, &e)
		}},
		{"malformed URL (bad host)", func(t *testing.T) setup {
			return setup{roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				// What url.Parse says of "http://a b/".
				return nil, &url.Error{Op: "parse", URL: "http://a b/", Err: url.InvalidHostError(" ")}
			}), "http://example.test/"}
		}, func(err error) bool {
			var e url.InvalidHostError
			return errors.As(err, &e)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.setup(t)
			rec := &recordingRT{base: s.base}
			tr, _ := newTransport(t, rec)
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", s.url, nil))
			if err == nil {
				readClose(t, resp)
				t.Fatalf("RoundTrip = %d, want an error", resp.StatusCode)
			}
			if !tt.is(err) {
				if tt.name == "DNS no such host" {
					t.Skipf("this machine's resolver does not answer \"no such host\" for a .invalid name: %v", err)
				}
				t.Fatalf("RoundTrip error %v (%T) is not the expected kind", err, err)
			}
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 1 || len(rec.sent()) != 1 {
				t.Errorf("RoundTrip error = %v after %d attempts; want not retryable after 1", err, len(rec.sent()))
			}
		})
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
