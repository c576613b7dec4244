package httpretry_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// failingReader returns some bytes, then err.
type failingReader struct {
	data   string
	err    error
	closed atomic.Bool
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.data == "" {
		return 0, f.err
	}
	n := copy(p, f.data)
	f.data = f.data[n:]
	return n, nil
}

func (f *failingReader) Close() error { f.closed.Store(true); return nil }

func TestBufferBodiesEdges(t *testing.T) {
	t.Run("known length over the limit: sent once", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithBufferBodies(10))
		body := &closeRecorder{r: strings.NewReader(strings.Repeat("b", 100))}
		req := newRequest(t, context.Background(), "PUT", srv.URL, body)
		req.ContentLength = 100
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
		_, _, bodies := obs.snapshot()
		if len(bodies) != 1 || bodies[0] != strings.Repeat("b", 100) {
			t.Errorf("server got %d attempts, want 1 with the whole body", len(bodies))
		}
		if g, _ := gaveUp(resp); g.Reason != "not-retryable" {
			t.Errorf("GaveUp = %+v, want not retryable", g)
		}
	})
	t.Run("read error", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithBufferBodies(1024))
		boom := errors.New("disk gone")
		body := &failingReader{data: "part", err: boom}
		req := newRequest(t, context.Background(), "PUT", srv.URL, body)
		resp, err := tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, boom) {
			t.Errorf("RoundTrip = %v, %v; want nil and the body's read error", resp, err)
		}
		if !body.closed.Load() || obs.count() != 0 {
			t.Errorf("body closed %v, %d requests sent; want closed, none", body.closed.Load(), obs.count())
		}
	})
	t.Run("empty body", func(t *testing.T) {
		srv, obs := serve(t, failThenOK(2))
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithBufferBodies(1024))
		req := newRequest(t, context.Background(), "PUT", srv.URL, io.NopCloser(strings.NewReader("")))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
		if _, _, bodies := obs.snapshot(); resp.StatusCode != 200 || len(bodies) != 3 {
			t.Errorf("RoundTrip = %d after %d attempts, want 200 after 3", resp.StatusCode, len(bodies))
		}
	})
	t.Run("GetBody fails on a retry", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
		tr, _ := newTransport(t, srv.Client().Transport)
		req := newRequest(t, context.Background(), "PUT", srv.URL, strings.NewReader("x"))
		boom := errors.New("cannot rewind")
		req.GetBody = func() (io.ReadCloser, error) { return nil, boom }
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 503 || !strings.HasPrefix(resp.Header.Get(wire.GiveUpHeader), "not-retryable;") || obs.count() != 1 {
			t.Errorf("RoundTrip = %v, %v after %d attempts; want the 503, given up as not retryable, after 1", resp, err, obs.count())
		} else {
			resp.Body.Close()
		}
		_ = boom
	})
}

func TestRefreshOn401Edges(t *testing.T) {
	t.Run("hook returns nil: the 401 as is", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(401) })
		var seenKey string
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithAutoIdempotencyKey(),
			httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
				seenKey = r.Header.Get(idempotency.Header)
				if r.Body != nil || r.GetBody != nil {
					t.Errorf("the hook's copy has a body")
				}
				return nil, nil
			}))
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "POST", srv.URL, strings.NewReader("x")))
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
		_, keys, _ := obs.snapshot()
		if resp.StatusCode != 401 || obs.count() != 1 {
			t.Errorf("RoundTrip = %d after %d attempts, want the 401 after 1", resp.StatusCode, obs.count())
		}
		if seenKey == "" || seenKey != keys[0] {
			t.Errorf("the hook saw key %q, the server %q; want the generated key in both", seenKey, keys[0])
		}
	})
	t.Run("body that cannot be replayed: no refresh", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(401) })
		var calls atomic.Int32
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			calls.Add(1)
			return r, nil
		}))
		req := newRequest(t, context.Background(), "PUT", srv.URL, io.NopCloser(strings.NewReader("once")))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
		if resp.StatusCode != 401 || obs.count() != 1 || calls.Load() != 0 {
			t.Errorf("RoundTrip = %d after %d attempts, %d refreshes; want the 401, 1, 0", resp.StatusCode, obs.count(), calls.Load())
		}
	})
}

// TestGiveUpMarksResponseWithoutHeader: a base that returns a response
// with a nil Header still gets the give-up mark.
func TestGiveUpMarksResponseWithoutHeader(t *testing.T) {
	var calls atomic.Int32
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return &http.Response{StatusCode: 503, Body: http.NoBody, Request: r}, nil
	})
	tr, _ := newTransport(t, base)
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", "http://example.test/", nil))
	if err != nil {
		t.Fatal(err)
	}
	if g, ok := gaveUp(resp); !ok || g.Reason != "attempts-exhausted" || calls.Load() != 3 {
		t.Errorf("GaveUp = %+v, %v after %d calls; want attempts exhausted after 3", g, ok, calls.Load())
	}
}

func TestRoundTripNilRequest(t *testing.T) {
	tr, _ := newTransport(t, nil)
	if resp, err := tr.RoundTrip(nil); resp != nil || err == nil {
		t.Errorf("RoundTrip(nil) = %v, %v; want an error", resp, err)
	}
}

// TestSwitchingProtocols: a 101's body is the connection; the transport
// leaves it usable as an io.ReadWriteCloser, also with a timeout.
func TestSwitchingProtocols(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("Hijack: %v", err)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		_ = buf.Flush()
		line, _ := buf.ReadString('\n')
		_, _ = buf.WriteString("echo: " + line)
		_ = buf.Flush()
	})
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithTimeout(time.Minute))
	req := newRequest(t, context.Background(), "GET", srv.URL, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		t.Fatalf("RoundTrip = %d with body %T; want 101 with an io.ReadWriteCloser", resp.StatusCode, resp.Body)
	}
	if _, err := io.WriteString(rw, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(rw).ReadString('\n'); err != nil || line != "echo: hello\n" {
		t.Errorf("read %q, %v; want the echo", line, err)
	}
}

// TestTimeoutsCoverTheBody: the overall and the per-attempt timeouts keep
// running while the caller reads the returned response's body, like
// http.Client's Timeout: a body that stalls ends in an error instead of
// blocking the reader.
func TestTimeoutsCoverTheBody(t *testing.T) {
	for _, opt := range []struct {
		name string
		opt  httpretry.Option
	}{
		{"WithTimeout", httpretry.WithTimeout(500 * time.Millisecond)},
		{"WithAttemptTimeout", httpretry.WithAttemptTimeout(500 * time.Millisecond)},
	} {
		t.Run(opt.name, func(t *testing.T) {
			release := make(chan struct{})
			srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header().Set("Content-Length", "1000")
				_, _ = io.WriteString(w, "the start")
				_ = http.NewResponseController(w).Flush()
				select {
				case <-r.Context().Done():
				case <-release:
				}
			})
			t.Cleanup(func() { close(release) })
			tr, _ := newTransport(t, srv.Client().Transport, opt.opt)
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil || !strings.HasPrefix(string(b), "the start") {
				t.Errorf("reading the stalled body = %q, %v; want its start and an error", b, err)
			}
		})
	}
}

// A failed attempt's body is read and its connection handed back to the
// pool before the sleep, not after it: with one connection per host, a
// request made during the sleep gets through. The last response's body
// stays readable.
func TestFailedBodyReleasedBeforeSleep(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Side") != "" {
			return // the request made during the sleep
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "busy, come back later")
	})
	base := &http.Transport{MaxConnsPerHost: 1}
	defer base.CloseIdleConnections()
	sleeps := 0
	check := func() {
		sleeps++
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req := newRequest(t, ctx, "GET", srv.URL, nil)
		req.Header.Set("Side", "1")
		resp, err := base.RoundTrip(req)
		if err != nil {
			t.Errorf("sleep %d: a request during the sleep = %v: the failed attempt still holds the connection", sleeps, err)
			return
		}
		readClose(t, resp)
	}
	// The observer hears of each retry just before its sleep.
	tr, err := httpretry.NewTransport(base, httpretry.WithRetry(retry.WithBackoff(smallBackoff(t))),
		httpretry.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.Retry {
				check()
			}
		})))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if string(b) != "busy, come back later" || sleeps != 2 {
		t.Errorf("last body %q after %d sleeps, want the server's after 2", b, sleeps)
	}
}

// stalledBase answers 503 with a body that comes after its headers, late
// (after the drain's 50 ms).
type stalledBase struct{ after time.Duration }

func (b stalledBase) RoundTrip(r *http.Request) (*http.Response, error) {
	pr, pw := io.Pipe()
	go func() {
		time.Sleep(b.after)
		_, _ = io.WriteString(pw, "overloaded: try region B")
		_ = pw.Close()
	}()
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{}, Body: pr, Request: r}, nil
}

// TestStalledFailureBodyHandedBackWhole: the last attempt's failure
// response is the caller's with its whole body, even when that body comes
// after the 50 ms a discarded one is read for (it was closed then, and the
// caller read nothing).
func TestStalledFailureBodyHandedBackWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := httpretry.NewTransport(stalledBase{after: 120 * time.Millisecond}, httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodGet, "http://h.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr != nil || string(b) != "overloaded: try region B" {
			t.Errorf("status %d: body %q, read error %v; want the whole body", resp.StatusCode, b, rerr)
		}
	})
}

// panicReader panics on Read.
type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("request body broke") }

// TestBufferedBodyPanicCloses: a request body whose Read panics while
// WithBufferBodies buffers it panics in the caller, as the body's own
// panic, and is closed all the same ("always closes its body").
func TestBufferedBodyPanicCloses(t *testing.T) {
	tr, err := httpretry.NewTransport(answerFunc(func(*http.Request) (int, []string) { return http.StatusOK, nil }),
		httpretry.WithBufferBodies(1<<10))
	if err != nil {
		t.Fatal(err)
	}
	body := &closeRecorder{r: panicReader{}}
	req, _ := http.NewRequest(http.MethodPut, "http://h.example/", body)
	func() {
		defer func() {
			if p := recover(); p != "request body broke" {
				t.Errorf("recovered %v, want the body's panic", p)
			}
		}()
		_, _ = tr.RoundTrip(req)
	}()
	if n := body.closed.Load(); n != 1 {
		t.Errorf("body closed %d times, want 1", n)
	}
}
