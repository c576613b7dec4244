package httpretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// failThenOK answers 503 to the first fails requests and 200 "ok" after.
func failThenOK(fails int) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		if n <= fails {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	}
}

func TestPOSTBodyReplayedWithSameKey(t *testing.T) {
	payload := strings.Repeat("0123456789", 1000) + "\x00\xff"
	tests := []struct {
		name    string
		opts    []httpretry.Option
		key     string
		newBody func() io.Reader
	}{
		{"caller's key, GetBody", nil, "caller-key-1", func() io.Reader { return strings.NewReader(payload) }},
		{"auto key, GetBody", []httpretry.Option{httpretry.WithAutoIdempotencyKey()}, "", func() io.Reader { return bytes.NewReader([]byte(payload)) }},
		{"caller's key, buffered body", []httpretry.Option{httpretry.WithBufferBodies(1 << 20)}, "caller-key-2",
			func() io.Reader { return io.NopCloser(strings.NewReader(payload)) }}, // no GetBody
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, failThenOK(2))
			tr, _ := newTransport(t, srv.Client().Transport, tt.opts...)
			req := newRequest(t, context.Background(), "POST", srv.URL, tt.newBody())
			if tt.key != "" {
				req.Header.Set(idempotency.Header, tt.key)
			}
			before := req.Header.Clone()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip(POST) error: %v", err)
			}
			if got := readClose(t, resp); resp.StatusCode != 200 || got != "ok" {
				t.Errorf("RoundTrip(POST) = %d %q, want 200 \"ok\"", resp.StatusCode, got)
			}
			attempts, keys, bodies := obs.snapshot()
			if want := wantAttemptHeaders(3); !slices.Equal(attempts, want) {
				t.Errorf("attempt headers = %q, want %q", attempts, want)
			}
			for i, b := range bodies {
				if b != payload {
					t.Errorf("attempt %d body: %d bytes, not byte-identical to the %d sent", i+1, len(b), len(payload))
				}
			}
			if keys[0] == "" || (tt.key != "" && keys[0] != tt.key) {
				t.Errorf("attempt 1 Idempotency-Key = %q, want %q (or a generated one)", keys[0], tt.key)
			}
			if _, err := idempotency.ParseKey(keys[0]); err != nil {
				t.Errorf("Idempotency-Key %q does not parse: %v", keys[0], err)
			}
			for i, k := range keys {
				if k != keys[0] {
					t.Errorf("attempt %d Idempotency-Key = %q, want the same key %q on every attempt", i+1, k, keys[0])
				}
			}
			if !equalHeader(req.Header, before) {
				t.Errorf("RoundTrip modified the caller's header: %v, was %v", req.Header, before)
			}
		})
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

func TestAutoKeyIsPerCall(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithAutoIdempotencyKey())
	for _, method := range []string{"POST", "POST", "GET"} {
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), method, srv.URL, nil))
		if err != nil {
			t.Fatalf("RoundTrip(%s): %v", method, err)
		}
		readClose(t, resp)
	}
	_, keys, _ := obs.snapshot()
	if keys[0] == "" || keys[1] == "" || keys[0] == keys[1] {
		t.Errorf("keys of two POSTs = %q, %q; want two different keys", keys[0], keys[1])
	}
	if keys[2] != "" {
		t.Errorf("GET got Idempotency-Key %q; want none (GET is idempotent)", keys[2])
	}
}

// closeRecorder is a request body without GetBody that records Close and
// how much was read from it.
type closeRecorder struct {
	r      io.Reader
	read   atomic.Int64
	closed atomic.Int32
}

func (c *closeRecorder) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}
func (c *closeRecorder) Close() error { c.closed.Add(1); return nil }

func TestBodyWithoutGetBody(t *testing.T) {
	payload := strings.Repeat("x", 10_000)
	tests := []struct {
		name        string
		opts        []httpretry.Option
		wantTries   int
		wantMaxRead int64 // bytes read before the first attempt, checked via the server's copy
	}{
		{"sent once", nil, 1, 0},
		{"buffered (fits)", []httpretry.Option{httpretry.WithBufferBodies(20_000)}, 3, 0},
		{"too large for the buffer: sent once, whole", []httpretry.Option{httpretry.WithBufferBodies(4096)}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, failThenOK(5))
			tr, _ := newTransport(t, srv.Client().Transport, tt.opts...)
			body := &closeRecorder{r: strings.NewReader(payload)}
			req := newRequest(t, context.Background(), "PUT", srv.URL, body)
			req.ContentLength = -1 // unknown: chunked, so the buffer limit is found by reading
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip(PUT) error: %v", err)
			}
			readClose(t, resp)
			if resp.StatusCode != 503 {
				t.Errorf("RoundTrip(PUT) status = %d, want the last 503", resp.StatusCode)
			}
			_, _, bodies := obs.snapshot()
			if len(bodies) != tt.wantTries {
				t.Fatalf("server saw %d attempts, want %d", len(bodies), tt.wantTries)
			}
			for i, b := range bodies {
				if b != payload {
					t.Errorf("attempt %d body: %d bytes, want the %d sent", i+1, len(b), len(payload))
				}
			}
			if body.closed.Load() == 0 {
				t.Errorf("request body never closed")
			}
		})
	}
}

func TestBufferReadsBounded(t *testing.T) {
	// An endless body: the transport must not try to read it all.
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithBufferBodies(1024))
	body := &closeRecorder{r: io.LimitReader(zeros{}, 1<<20)}
	req := newRequest(t, context.Background(), "PUT", srv.URL, body)
	req.ContentLength = -1
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	readClose(t, resp)
	_, _, bodies := obs.snapshot()
	if len(bodies) != 1 || len(bodies[0]) != 1<<20 {
		t.Errorf("server got %d attempts, first of %d bytes; want 1 attempt with the whole 1 MiB", len(bodies), len(bodies[0]))
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestRequestBodyClosedOnEveryPath covers the paths where no attempt takes
// the body over.
func TestRequestBodyClosedOnEveryPath(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		url  string
	}{
		{"success", context.Background(), srv.URL},
		{"context already canceled", canceled, srv.URL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, _ := newTransport(t, srv.Client().Transport)
			body := &closeRecorder{r: strings.NewReader("abc")}
			req := newRequest(t, tt.ctx, "PUT", tt.url, body)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				readClose(t, resp)
			}
			if body.closed.Load() == 0 {
				t.Errorf("RoundTrip (%s, err %v) did not close the request body", tt.name, err)
			}
		})
	}
	t.Run("nil URL", func(t *testing.T) {
		tr, _ := newTransport(t, nil)
		body := &closeRecorder{r: strings.NewReader("abc")}
		req := &http.Request{Method: "PUT", Body: body, Header: http.Header{}}
		if _, err := tr.RoundTrip(req); err == nil {
			t.Errorf("RoundTrip(nil URL) error = nil")
		}
		if body.closed.Load() == 0 {
			t.Errorf("RoundTrip(nil URL) did not close the request body")
		}
	})
	t.Run("circuit open", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithRetry(retry.WithMaxAttempts(1)), httpretry.WithBreaker(tripFast()))
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		readClose(t, resp)
		body := &closeRecorder{r: strings.NewReader("abc")}
		_, err = tr.RoundTrip(newRequest(t, context.Background(), "PUT", srv.URL, body))
		if !errors.Is(err, retry.CircuitOpen) {
			t.Errorf("RoundTrip with the circuit open: err = %v, want CircuitOpen", err)
		}
		if body.closed.Load() == 0 {
			t.Errorf("RoundTrip rejected by the breaker did not close the request body")
		}
		if obs.count() != 1 {
			t.Errorf("server saw %d requests, want 1 (the open breaker sends nothing)", obs.count())
		}
	})
}

// tripFast is a breaker that opens after one failure, for exactly an hour
// (its jitter pinned).
func tripFast() *breaker.Config {
	return &breaker.Config{MinCalls: 1, OpenFor: time.Hour, Rand: func() float64 { return 0.5 }}
}

func TestRetryAfterIsAFloor(t *testing.T) {
	forms := []struct {
		name  string
		value func(now time.Time) string
	}{
		{"delay-seconds", func(time.Time) string { return "2" }},
		{"IMF-fixdate", func(now time.Time) string { return now.Add(2 * time.Second).Format(http.TimeFormat) }},
		{"RFC 850", func(now time.Time) string { return now.Add(2 * time.Second).Format("Monday, 02-Jan-06 15:04:05 GMT") }},
		{"asctime", func(now time.Time) string { return now.Add(2 * time.Second).Format(time.ANSIC) }},
	}
	// The sleep is the hint spread above it by up to half of it, drawn
	// from the backoff's Rand: pinned at 0.5 here, so 2s + 0.5·1s; exactly
	// the hint with a Rand pinned at 0. Run on a synctest bubble's clock,
	// which the sleep must take.
	exact, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: 100 * time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	spreads := []struct {
		name string
		opts []httpretry.Option
		want time.Duration
	}{
		{"spread", nil, 2500 * time.Millisecond},
		{"exact", []httpretry.Option{httpretry.WithRetry(retry.WithBackoff(exact))}, 2 * time.Second},
	}
	for _, code := range []int{429, 503} {
		for _, f := range forms {
			for _, sp := range spreads {
				t.Run(f.name+"/"+http.StatusText(code)+"/"+sp.name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						srv, obs := serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) {
							if n == 1 {
								w.Header().Set("Retry-After", f.value(time.Now()))
								w.WriteHeader(code)
							}
						})
						tr, clock := newTransport(t, srv.Client().Transport, sp.opts...)
						start := time.Now()
						resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
						if err != nil {
							t.Fatalf("RoundTrip: %v", err)
						}
						readClose(t, resp)
						if resp.StatusCode != 200 || obs.count() != 2 {
							t.Errorf("RoundTrip = %d after %d attempts, want 200 after 2", resp.StatusCode, obs.count())
						}
						if s := clock.Sleeps(); len(s) != 1 || s[0] != sp.want || time.Since(start) != sp.want {
							t.Errorf("sleeps = %v, RoundTrip took %v; want one of %v (Retry-After 2s is a floor)", s, time.Since(start), sp.want)
						}
					})
				})
			}
		}
	}
	t.Run("spread stays in [hint, 1.5 hint)", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			for _, u := range []float64{0, 0.25, 0.999999} {
				srv, _ := serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) {
					if n == 1 {
						w.Header().Set("Retry-After", "2")
						w.WriteHeader(503)
					}
				})
				b, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: 100 * time.Millisecond, Rand: func() float64 { return u }})
				if err != nil {
					t.Fatal(err)
				}
				tr, clock := newTransport(t, srv.Client().Transport, httpretry.WithRetry(retry.WithBackoff(b)))
				resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
				if err != nil {
					t.Fatal(err)
				}
				readClose(t, resp)
				want := 2*time.Second + time.Duration(u*float64(time.Second))
				if s := clock.Sleeps(); len(s) != 1 || s[0] != want || s[0] < 2*time.Second || s[0] >= 3*time.Second {
					t.Errorf("Rand %v: sleeps = %v, want one of %v, in [2s, 3s)", u, s, want)
				}
			}
		})
	})
}

func TestRetryAfterBeyondDeadline(t *testing.T) {
	tests := []struct {
		name string
		opts []httpretry.Option
		hint string
	}{
		{"past the overall timeout", []httpretry.Option{httpretry.WithTimeout(time.Second)}, "2"},
		{"past the request context's deadline", nil, "3600"},
		{"above MaxRetryAfter", []httpretry.Option{httpretry.WithRetry(retry.WithMaxRetryAfter(time.Second))}, "2"},
		{"484289 hours", nil, "1743440400"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
				w.Header().Set("Retry-After", tt.hint)
				http.Error(w, "come back later", http.StatusServiceUnavailable)
			})
			tr, clock := newTransport(t, srv.Client().Transport, tt.opts...)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			resp, err := tr.RoundTrip(newRequest(t, ctx, "GET", srv.URL, nil))
			if err != nil {
				t.Fatalf("RoundTrip error = %v, want the 503 response", err)
			}
			if got := readClose(t, resp); resp.StatusCode != 503 || got != "come back later\n" {
				t.Errorf("RoundTrip = %d %q, want the 503 and its body", resp.StatusCode, got)
			}
			if obs.count() != 1 || len(clock.Sleeps()) != 0 {
				t.Errorf("%d attempts, sleeps %v; want 1 attempt and no sleep", obs.count(), clock.Sleeps())
			}
		})
	}
}

func TestGaveUpMarker(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})
	tr, _ := newTransport(t, srv.Client().Transport)
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer readClose(t, resp)
	g, ok := gaveUp(resp)
	if want := (wire.GiveUp{Reason: "attempts-exhausted", Attempts: 3}); !ok || g != want {
		t.Errorf("GaveUp = %+v, %v; want %+v, true", g, ok, want)
	}
	if !overloaded(resp, nil) {
		t.Errorf("Overloaded(give-up response) = false, want true")
	}
}

func TestAttemptTimeoutRetried(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-r.Context().Done() // slow: the attempt's deadline fires first
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithAttemptTimeout(50*time.Millisecond), httpretry.WithTimeout(time.Minute))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	// The body is read after RoundTrip returned: the attempt's and the
	// call's contexts must still be alive.
	if got := readClose(t, resp); got != "ok" || obs.count() != 2 {
		t.Errorf("RoundTrip = %q after %d attempts, want \"ok\" after 2", got, obs.count())
	}
}

func TestParentCancelStopsAtOnce(t *testing.T) {
	t.Run("during the sleep", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
		// A backoff of an hour: the cancel, when the loop announces its
		// sleep, must end it at once.
		long, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Hour, Cap: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		tr, err := httpretry.NewTransport(srv.Client().Transport, httpretry.WithRetry(retry.WithBackoff(long)),
			httpretry.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
				if e.Kind == observe.Retry {
					go cancel()
				}
			})))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(newRequest(t, ctx, "GET", srv.URL, nil))
		if resp != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, retry.Canceled) {
			t.Errorf("RoundTrip = %v, %v; want nil, a canceled error", resp, err)
		}
		if obs.count() != 1 {
			t.Errorf("server saw %d attempts, want 1", obs.count())
		}
	})
	t.Run("during an attempt", func(t *testing.T) {
		entered := make(chan struct{})
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
			close(entered)
			<-r.Context().Done()
		})
		tr, _ := newTransport(t, srv.Client().Transport)
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-entered; cancel() }()
		resp, err := tr.RoundTrip(newRequest(t, ctx, "GET", srv.URL, nil))
		if resp != nil || !errors.Is(err, context.Canceled) {
			t.Errorf("RoundTrip = %v, %v; want nil, context.Canceled", resp, err)
		}
		if obs.count() != 1 {
			t.Errorf("server saw %d attempts, want 1", obs.count())
		}
	})
}

func TestConnectionDroppedBeforeResponseRetried(t *testing.T) {
	for _, rst := range []bool{false, true} {
		t.Run(map[bool]string{false: "closed (EOF)", true: "reset (RST)"}[rst], func(t *testing.T) {
			srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
				if n < 3 {
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Errorf("Hijack: %v", err)
						return
					}
					if tc, ok := conn.(*net.TCPConn); ok && rst {
						_ = tc.SetLinger(0)
					}
					_ = conn.Close()
					return
				}
				_, _ = io.WriteString(w, "ok")
			})
			tr, _ := newTransport(t, srv.Client().Transport)
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			if got := readClose(t, resp); got != "ok" || obs.count() != 3 {
				t.Errorf("RoundTrip = %q after %d attempts, want \"ok\" after 3", got, obs.count())
			}
		})
	}
}

func TestConnectionsReused(t *testing.T) {
	tests := []struct {
		size  int
		conns int32
	}{
		{0, 1}, {100, 1}, {32 << 10, 1},
		// Beyond the 64 KiB drained, a body is cut off: its connection is
		// closed, not read to the end.
		{1 << 20, 3},
	}
	for _, tt := range tests {
		size := tt.size
		t.Run(fmt.Sprintf("503 body of %d bytes", size), func(t *testing.T) {
			var conns atomic.Int32
			o := &observed{}
			errorPage := strings.Repeat("e", size)
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if o.record(r) <= 2 {
					w.WriteHeader(503)
					_, _ = io.WriteString(w, errorPage)
					return
				}
				_, _ = io.WriteString(w, "ok")
			}))
			srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()
			tr, _ := newTransport(t, srv.Client().Transport)
			for i := range 2 {
				resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
				if err != nil {
					t.Fatalf("RoundTrip %d: %v", i, err)
				}
				readClose(t, resp)
			}
			if n := conns.Load(); n != tt.conns {
				t.Errorf("server saw %d new connections for %d requests, want %d", n, o.count(), tt.conns)
			}
		})
	}
}

func TestDontRetryFromBelow(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		writeOverloaded(w)
	})
	tr, clock := newTransport(t, srv.Client().Transport)
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	readClose(t, resp)
	if resp.StatusCode != 503 || !wire.DontRetry(resp.Header) {
		t.Errorf("RoundTrip = %d %v, want 503 with the don't-retry signal", resp.StatusCode, resp.Header)
	}
	if obs.count() != 1 || len(clock.Sleeps()) != 0 {
		t.Errorf("%d attempts, sleeps %v; want 1 attempt, no sleep", obs.count(), clock.Sleeps())
	}
	if !overloaded(resp, nil) {
		t.Errorf("Overloaded(response with the don't-retry header) = false")
	}
}

// TestThreeLayerChain: client -> A -> B -> bottom, each hop through a
// Transport with 3 attempts, the bottom always failing. With admission.PushBack in
// the handlers only the layer next to the bottom retries: 3 calls reach the
// bottom, not 27.
func TestThreeLayerChain(t *testing.T) {
	tests := []struct {
		name     string
		pushBack bool
		opts     []httpretry.Option
		want     []int // calls at A, B, bottom
	}{
		{"PushBack", true, nil, []int{1, 1, 3}},
		{"naive, no budget, no breaker", false, []httpretry.Option{httpretry.WithBudget(nil), httpretry.WithBreaker(nil)}, []int{3, 9, 27}},
		// B's budget to the bottom: 9 requests, a floor of 10 retries per
		// window: 9 + 10 = 19.
		{"naive, default budgets", false, nil, []int{3, 9, 19}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bottom, bottomObs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
				http.Error(w, "down", http.StatusServiceUnavailable)
			})
			layer := func(next string) (*httptest.Server, *observed) {
				tr, _ := newTransport(t, nil, tt.opts...)
				client := &http.Client{Transport: tr}
				return serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
					req := newRequest(t, r.Context(), "GET", next, nil)
					resp, err := client.Do(req)
					if tt.pushBack && admission.PushBack(w, resp, err) {
						return
					}
					if err != nil {
						http.Error(w, err.Error(), http.StatusBadGateway)
						return
					}
					defer resp.Body.Close()
					w.WriteHeader(resp.StatusCode)
					_, _ = io.Copy(w, resp.Body)
				})
			}
			b, bObs := layer(bottom.URL)
			a, aObs := layer(b.URL)
			tr, _ := newTransport(t, nil, tt.opts...)
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", a.URL, nil))
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			readClose(t, resp)
			got := []int{aObs.count(), bObs.count(), bottomObs.count()}
			if !slices.Equal(got, tt.want) {
				t.Errorf("calls at A, B, bottom = %v, want %v", got, tt.want)
			}
			if resp.StatusCode != 503 {
				t.Errorf("client got %d, want 503", resp.StatusCode)
			}
		})
	}
}

func TestRefreshOn401(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch {
		case r.Header.Get("Authorization") != "Bearer new":
			w.WriteHeader(401)
		case n == 2:
			w.WriteHeader(503) // the refreshed request fails once more: retried
		default:
			_, _ = io.WriteString(w, "ok")
		}
	})
	var refreshes atomic.Int32
	refresh := func(r *http.Request) (*http.Request, error) {
		refreshes.Add(1)
		r.Header.Set("Authorization", "Bearer new")
		return r, nil
	}
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithRefreshOn401(refresh),
		httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: 0.1, Window: 10 * time.Second, Slices: 10}))
	req := newRequest(t, context.Background(), "PUT", srv.URL, strings.NewReader("body"))
	req.Header.Set("Authorization", "Bearer old")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	if got := readClose(t, resp); got != "ok" {
		t.Errorf("RoundTrip body = %q, want ok", got)
	}
	attempts, _, bodies := obs.snapshot()
	// The resend after the 401 is attempt 1 again (not counted: no attempt
	// header), and the budget's single retry is still there for the 503.
	if want := []string{"", "", "2"}; !slices.Equal(attempts, want) || refreshes.Load() != 1 {
		t.Errorf("attempt headers %q, %d refreshes; want %q, 1", attempts, refreshes.Load(), want)
	}
	for i, b := range bodies {
		if b != "body" {
			t.Errorf("request %d body = %q, want the original", i+1, b)
		}
	}
	if req.Header.Get("Authorization") != "Bearer old" {
		t.Errorf("the caller's request was modified: Authorization %q", req.Header.Get("Authorization"))
	}

	t.Run("hook error", func(t *testing.T) {
		boom := errors.New("token endpoint down")
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithRefreshOn401(func(*http.Request) (*http.Request, error) { return nil, boom }))
		_, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if !errors.Is(err, boom) {
			t.Errorf("RoundTrip error = %v, want it to wrap the hook's error", err)
		}
	})
	t.Run("no hook", func(t *testing.T) {
		srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(401) })
		tr, _ := newTransport(t, srv.Client().Transport)
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if err != nil || resp.StatusCode != 401 || obs.count() != 1 {
			t.Fatalf("RoundTrip = %v, %v after %d attempts; want 401 after 1", resp, err, obs.count())
		}
		readClose(t, resp)
	})
}

func TestPerHostBreaker(t *testing.T) {
	bad, badObs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	good, goodObs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	tr, _ := newTransport(t, nil, httpretry.WithBreaker(tripFast()))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", bad.URL, nil))
	if err != nil {
		t.Fatalf("RoundTrip(bad) error = %v, want the 503", err)
	}
	readClose(t, resp)
	if g, _ := gaveUp(resp); g.Reason != "circuit-open" || badObs.count() != 1 {
		t.Errorf("first call: GaveUp reason %v after %d attempts; want circuit open after 1 (the failure tripped it)", g.Reason, badObs.count())
	}
	_, err = tr.RoundTrip(newRequest(t, context.Background(), "GET", bad.URL, nil))
	if !errors.Is(err, breaker.ErrOpen) || !errors.Is(err, retry.CircuitOpen) || !overloaded(nil, err) {
		t.Errorf("second call to the bad host: err = %v, want the open breaker's error", err)
	}
	if badObs.count() != 1 {
		t.Errorf("bad host saw %d requests, want 1", badObs.count())
	}
	resp, err = tr.RoundTrip(newRequest(t, context.Background(), "GET", good.URL, nil))
	if err != nil || resp.StatusCode != 200 || goodObs.count() != 1 {
		t.Fatalf("RoundTrip(good host) = %v, %v; want 200 (its breaker is its own)", resp, err)
	}
	readClose(t, resp)
}

func TestPerHostBudget(t *testing.T) {
	// One retry per window per host (no ratio, a floor of 0.1/s over 10 s).
	oneRetry := budget.Config{Ratio: -1, MinPerSecond: 0.1, Window: 10 * time.Second, Slices: 10}
	a, aObs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	b, bObs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	tr, _ := newTransport(t, nil, httpretry.WithBudget(&oneRetry))
	get := func(url string) *http.Response {
		t.Helper()
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", url, nil))
		if err != nil {
			t.Fatalf("RoundTrip(%s): %v", url, err)
		}
		readClose(t, resp)
		return resp
	}
	resp := get(a.URL)
	if g, _ := gaveUp(resp); g.Reason != "budget-exhausted" || g.Attempts != 2 {
		t.Errorf("first call: GaveUp = %+v, want budget exhausted after 2", g)
	}
	get(a.URL)
	get(b.URL)
	if aObs.count() != 3 || bObs.count() != 2 {
		t.Errorf("host a saw %d, host b %d attempts; want 3 (2+1) and 2 (own budget)", aObs.count(), bObs.count())
	}
	if !overloaded(resp, nil) {
		t.Errorf("Overloaded(budget give-up) = false")
	}
}

func TestWithoutBudgetAndBreaker(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) })
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(5)))
	for range 5 {
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
	}
	if obs.count() != 25 {
		t.Errorf("server saw %d attempts, want 25 (no budget, no breaker)", obs.count())
	}
}

func TestConcurrentUse(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n%2 == 1 {
			w.WriteHeader(503)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	srv2, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {})
	tr, _ := newTransport(t, nil, httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithMaxAttempts(10)), httpretry.WithMaxHosts(1))
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Go(func() {
			url := srv.URL
			if i%4 == 0 {
				url = srv2.URL // two hosts through a table of one: evictions
			}
			resp, err := client.Get(url)
			if err != nil {
				errs <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				errs <- errors.New(resp.Status)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Get: %v", err)
	}
}

func TestNewTransportInvalid(t *testing.T) {
	tests := []struct {
		name string
		opt  httpretry.Option
	}{
		{"attempts 0", httpretry.WithRetry(retry.WithMaxAttempts(0))},
		{"nil backoff", httpretry.WithRetry(retry.WithBackoff(nil))},
		{"negative timeout", httpretry.WithTimeout(-1)},
		{"negative attempt timeout", httpretry.WithAttemptTimeout(-1)},
		{"zero max retry-after", httpretry.WithRetry(retry.WithMaxRetryAfter(0))},
		{"zero buffer", httpretry.WithBufferBodies(0)},
		{"zero hosts", httpretry.WithMaxHosts(0)},
		{"nil guards", httpretry.WithGuards(nil)},
		{"bad budget", httpretry.WithBudget(&budget.Config{Ratio: 2})},
		{"bad breaker", httpretry.WithBreaker(&breaker.Config{MinCalls: -1})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := httpretry.NewTransport(nil, tt.opt)
			if err == nil || !strings.HasPrefix(err.Error(), "httpretry: ") || tr != nil {
				t.Errorf("NewTransport(%s) = %v, %v; want nil and an httpretry error", tt.name, tr, err)
			}
			if _, err := httpretry.NewClient(tt.opt); err == nil || !strings.HasPrefix(err.Error(), "httpretry: ") {
				t.Errorf("NewClient(%s) error = %v, want an httpretry error", tt.name, err)
			}
		})
	}
	// With supplied guards too, a bad option is reported at once.
	supplied := httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{}, nil })
	if tr, err := httpretry.NewTransport(nil, supplied, httpretry.WithRetry(retry.WithMaxAttempts(0))); err == nil || tr != nil {
		t.Errorf("NewTransport(WithGuards, attempts 0) = %v, %v; want nil and an error", tr, err)
	}
	valid := []struct {
		name string
		opt  httpretry.Option
	}{
		{"nil option", nil},
		{"zero configs (the defaults)", httpretry.WithBudget(&budget.Config{})},
		{"zero breaker config", httpretry.WithBreaker(&breaker.Config{})},
		{"1000 attempts", httpretry.WithRetry(retry.WithMaxAttempts(1000))},
	}
	for _, tt := range valid {
		if _, err := httpretry.NewTransport(nil, tt.opt); err != nil {
			t.Errorf("NewTransport(%s) = %v, want nil error", tt.name, err)
		}
	}
}

func TestOverallTimeout(t *testing.T) {
	srv, obs := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { <-r.Context().Done() })
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithTimeout(50*time.Millisecond))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if resp != nil || !errors.Is(err, retry.Deadline) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("RoundTrip = %v, %v; want nil and a deadline error", resp, err)
	}
	if obs.count() != 1 {
		t.Errorf("server saw %d attempts, want 1 (the deadline passed during it)", obs.count())
	}
}

// TestFinalAnswersTripTheBreaker: a 503 that says "don't retry" and the
// second 500 of a GET stop the loop at once, and still count as failures of
// the host, so its breaker trips.
func TestFinalAnswersTripTheBreaker(t *testing.T) {
	dropConn := func(w http.ResponseWriter, r *http.Request, n int) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}
	tests := []struct {
		name     string
		method   string
		handler  func(w http.ResponseWriter, r *http.Request, n int)
		attempts int // attempts the first call makes
	}{
		{"don't-retry 503", "GET", func(w http.ResponseWriter, r *http.Request, n int) { writeOverloaded(w) }, 1},
		{"500 twice", "GET", func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(500) }, 2},
		{"503 to an unkeyed POST", "POST", func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(503) }, 1},
		{"dropped connection of an unkeyed POST", "POST", dropConn, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, tt.handler)
			c := breaker.Config{MinCalls: 2, FailureRatio: 0.5}
			tr, _ := newTransport(t, nil, httpretry.WithBreaker(&c), httpretry.WithBudget(nil))
			resp, err := tr.RoundTrip(newRequest(t, context.Background(), tt.method, srv.URL, nil))
			if err == nil {
				readClose(t, resp)
			} else if !errors.Is(err, retry.NotRetryable) && !errors.Is(err, retry.CircuitOpen) {
				t.Fatalf("first RoundTrip: %v", err)
			}
			if obs.count() != tt.attempts {
				t.Fatalf("first call made %d attempts, want %d", obs.count(), tt.attempts)
			}
			// Fill the window past MinCalls with failures: the breaker opens and the
			// host stops seeing requests.
			for range 3 {
				resp, err := tr.RoundTrip(newRequest(t, context.Background(), tt.method, srv.URL, nil))
				if err == nil {
					readClose(t, resp)
				}
			}
			_, err = tr.RoundTrip(newRequest(t, context.Background(), tt.method, srv.URL, nil))
			if !errors.Is(err, breaker.ErrOpen) {
				t.Errorf("after repeated %s answers: err = %v, want the open breaker's error", tt.name, err)
			}
		})
	}
}
