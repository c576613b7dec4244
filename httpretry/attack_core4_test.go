// Black-box attacks on httpretry (area http2026): the failed answer's body
// read within the attempt, the fallback's inputs and when it is called, and
// the stale-if-error cache's interplay with the fallback. Time is a
// testing/synctest bubble's over a base RoundTripper of the test's own;
// the loopback tests count connections only, never time.

package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// h26Answer is one answer of the fake host.
type h26Answer struct {
	code  int
	hdr   http.Header
	body  string
	stall bool // after body, the body blocks until the request's context ends
	delay time.Duration
	err   error
}

// h26Base is a base RoundTripper; noRequest leaves resp.Request nil, as a
// base of the caller's may (IdempotencyKey's doc allows for it).
type h26Base struct {
	mu        sync.Mutex
	n         int
	reqs      []*http.Request
	noRequest bool
	answer    func(n int, r *http.Request) h26Answer
}

// h26Stall blocks until the request's context ends or the body is closed,
// as a net/http body does.
type h26Stall struct {
	ctx    context.Context
	closed chan struct{}
}

func (s h26Stall) Read([]byte) (int, error) {
	select {
	case <-s.ctx.Done():
		return 0, s.ctx.Err()
	case <-s.closed:
		return 0, errors.New("read on closed body")
	}
}

type h26Body struct {
	io.Reader
	once   sync.Once
	closed chan struct{}
}

func (b *h26Body) Close() error { b.once.Do(func() { close(b.closed) }); return nil }

func (b *h26Base) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		_ = r.Body.Close()
	}
	b.mu.Lock()
	b.n++
	n := b.n
	b.reqs = append(b.reqs, r)
	b.mu.Unlock()
	a := b.answer(n, r)
	if a.delay > 0 {
		select {
		case <-time.After(a.delay):
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	if a.err != nil {
		return nil, a.err
	}
	closed := make(chan struct{})
	var rd io.Reader = strings.NewReader(a.body)
	if a.stall {
		rd = io.MultiReader(rd, h26Stall{r.Context(), closed})
	}
	h := a.hdr.Clone()
	if h == nil {
		h = http.Header{}
	}
	resp := &http.Response{StatusCode: a.code, Status: fmt.Sprintf("%d %s", a.code, http.StatusText(a.code)),
		Header: h, Body: &h26Body{Reader: rd, closed: closed}, ContentLength: -1, ProtoMajor: 1, ProtoMinor: 1, Proto: "HTTP/1.1"}
	if !b.noRequest {
		resp.Request = r
	}
	return resp, nil
}

func (b *h26Base) sends() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

func h26Transport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	bo, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := httpretry.NewTransport(base, append([]httpretry.Option{httpretry.WithRetry(retry.WithBackoff(bo))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

type h26Fallback struct {
	mu    sync.Mutex
	calls int
	req   *http.Request
	err   *retry.Error
	resp  func(r *http.Request) (*http.Response, error)
}

func (f *h26Fallback) fn(r *http.Request, e *retry.Error) (*http.Response, error) {
	f.mu.Lock()
	f.calls++
	f.req, f.err = r, e
	f.mu.Unlock()
	if f.resp != nil {
		return f.resp(r)
	}
	return &http.Response{StatusCode: 200, Status: "200 OK", Header: http.Header{"X-From": {"fallback"}}, Body: http.NoBody}, nil
}

// unkeyedPostStalled503 sends a POST without a key that gets a 503 at 10
// ms whose body streams on past the 40 ms deadline, and checks what the
// docs promise: no fallback, the host's 503 with a not-retryable give-up,
// one failure for the breaker.
func h26UnkeyedPostStalled503(t *testing.T, noRequest bool) {
	synctest.Test(t, func(t *testing.T) {
		b := &h26Base{noRequest: noRequest, answer: func(int, *http.Request) h26Answer {
			return h26Answer{code: 503, body: "overloaded", stall: true, delay: 10 * time.Millisecond}
		}}
		fb := &h26Fallback{}
		tr := h26Transport(t, b, httpretry.WithTimeout(40*time.Millisecond), httpretry.WithFallback(fb.fn))
		req, _ := http.NewRequest(http.MethodPost, "http://h.example/pay", strings.NewReader("charge 10"))
		resp, err := tr.RoundTrip(req)
		if fb.calls != 0 {
			t.Errorf("fallback called %d times for a POST without a key (reason %v, attempts %d); WithFallback: a POST without a key gets no fallback",
				fb.calls, fb.err.Reason, fb.err.Attempts)
		}
		if err != nil {
			t.Fatalf("RoundTrip error %v, want the host's 503", err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status %d, want the host's 503", resp.StatusCode)
		}
		if g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); g.Reason != "not-retryable" {
			t.Errorf("give-up %q, want not-retryable", resp.Header.Get(wire.GiveUpHeader))
		}
		if s := tr.Hosts()["h.example"].Breaker.Snapshot(); s.Calls != 1 || s.Failures != 1 {
			t.Errorf("breaker saw %d calls, %d failures; Transport: the breaker counts the 503s of requests that may not be retried", s.Calls, s.Failures)
		}
	})
}

// The base sets resp.Request, as net/http's does.
func TestAttackHttp4UnkeyedPostStalled503(t *testing.T) {
	h26UnkeyedPostStalled503(t, false)
}

// FINDING 1: the same with a base that leaves resp.Request nil.
func TestAttackHttpNilResponseRequestStalled503(t *testing.T) {
	h26UnkeyedPostStalled503(t, true)
}

// FINDING 2: a request with a nil Header (a hand-built request, which
// the transport otherwise sends: every attempt gets a header of its own),
// an auto key, and a give-up that calls the fallback.
func TestAttackHttpFallbackNilHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &h26Base{answer: func(int, *http.Request) h26Answer { return h26Answer{code: 503, body: "busy"} }}
		fb := &h26Fallback{}
		tr := h26Transport(t, b, httpretry.WithAutoIdempotencyKey(), httpretry.WithFallback(fb.fn))
		u, _ := url.Parse("http://h.example/orders")
		req := &http.Request{Method: http.MethodPost, URL: u, Host: u.Host} // Header nil
		var resp *http.Response
		var err error
		var pv any
		func() {
			defer func() { pv = recover() }()
			resp, err = tr.RoundTrip(req)
		}()
		if pv != nil {
			t.Fatalf("RoundTrip panicked: %v (after %d sends); WithFallback: a request the transport made a key for reaches fallback with that key in its Idempotency-Key header", pv, b.sends())
		}
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if b.sends() != 3 || fb.calls != 1 {
			t.Errorf("sends %d, fallback calls %d", b.sends(), fb.calls)
		}
		if k := httpretry.IdempotencyKey(resp, nil); k == "" || k != b.reqs[0].Header.Get("Idempotency-Key") {
			t.Errorf("IdempotencyKey %q, sent %q", k, b.reqs[0].Header.Get("Idempotency-Key"))
		}
	})
}

// A tiny, a past and no deadline: the read of a stalled failed body never
// turns an answer that came in time into a deadline give-up.
func TestAttackHttp4StalledBodyDeadlines(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration // WithTimeout; 0: none
		delay   time.Duration // when the 503 comes
	}{
		{"tiny", 2 * time.Millisecond, time.Millisecond},
		{"just-in-time", 10 * time.Millisecond, 10*time.Millisecond - time.Microsecond},
		{"none", 0, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &h26Base{answer: func(int, *http.Request) h26Answer {
					return h26Answer{code: 503, body: "overloaded", stall: true, delay: tc.delay}
				}}
				fb := &h26Fallback{}
				opts := []httpretry.Option{httpretry.WithFallback(fb.fn)}
				if tc.timeout > 0 {
					opts = append(opts, httpretry.WithTimeout(tc.timeout))
				}
				tr := h26Transport(t, b, opts...)
				req, _ := http.NewRequest(http.MethodPost, "http://h.example/pay", strings.NewReader("x"))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if fb.calls != 0 {
					t.Errorf("fallback called (%v)", fb.err)
				}
				if g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); g.Reason != "not-retryable" {
					t.Errorf("give-up %q", resp.Header.Get(wire.GiveUpHeader))
				}
				resp.Body.Close()
				synctest.Wait() // nothing left behind blocks the bubble's end
			})
		})
	}
	// A context whose deadline already passed: nothing is sent; a deadline
	// give-up, which WithFallback serves.
	t.Run("past", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &h26Base{answer: func(int, *http.Request) h26Answer { return h26Answer{code: 200} }}
			fb := &h26Fallback{}
			tr := h26Transport(t, b, httpretry.WithFallback(fb.fn))
			ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://h.example/", nil)
			resp, err := tr.RoundTrip(req)
			if b.sends() != 0 {
				t.Errorf("sent %d", b.sends())
			}
			if err == nil {
				if fb.calls != 1 || fb.err.Reason != retry.Deadline {
					t.Errorf("fallback calls %d (%v)", fb.calls, fb.err)
				}
				resp.Body.Close()
			} else if !errors.Is(err, retry.Deadline) {
				t.Errorf("err %v", err)
			}
		})
	})
}

// A retryable GET whose 503 bodies stall: each retry comes, the call ends
// in time, the breaker counts every 503, the stalled bodies are closed.
func TestAttackHttp4StalledBodiesRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &h26Base{answer: func(int, *http.Request) h26Answer {
			return h26Answer{code: 503, body: "overloaded", stall: true, delay: time.Millisecond}
		}}
		tr := h26Transport(t, b, httpretry.WithTimeout(time.Second), httpretry.WithBudget(nil))
		req, _ := http.NewRequest(http.MethodGet, "http://h.example/", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if b.sends() != 3 {
			t.Errorf("sends %d", b.sends())
		}
		if g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); g.Reason != "attempts-exhausted" || g.Attempts != 3 {
			t.Errorf("give-up %q", resp.Header.Get(wire.GiveUpHeader))
		}
		if el := time.Since(start); el > 200*time.Millisecond {
			t.Errorf("took %v: each stalled body held at most 50 ms", el)
		}
		resp.Body.Close()
		if s := tr.Hosts()["h.example"].Breaker.Snapshot(); s.Failures != 3 {
			t.Errorf("breaker failures %d, want 3", s.Failures)
		}
		synctest.Wait()
	})
}

// The fallback's inputs: the keyed clone, the caller's request untouched,
// a response naming no request or the caller's carries the keyed one, one
// naming another is left alone; (nil, nil) is an error wrapping err that
// carries the key; a response with an error is closed.
func TestAttackHttp4FallbackInputs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &h26Base{answer: func(int, *http.Request) h26Answer { return h26Answer{code: 503, body: "busy"} }}
		var mode atomic.Int32
		other, _ := http.NewRequest(http.MethodGet, "http://other.example/", nil)
		var closed atomic.Bool
		var caller *http.Request
		fb := &h26Fallback{resp: func(r *http.Request) (*http.Response, error) {
			switch mode.Load() {
			case 0:
				return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
			case 1:
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: caller}, nil
			case 2:
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: other}, nil
			case 3:
				return nil, nil
			default:
				return &http.Response{StatusCode: 200, Body: h26CloseFlag{&closed}}, errors.New("fallback failed")
			}
		}}
		tr := h26Transport(t, b, httpretry.WithAutoIdempotencyKey(), httpretry.WithFallback(fb.fn), httpretry.WithBudget(nil), httpretry.WithBreaker(nil))
		for m := int32(0); m <= 4; m++ {
			mode.Store(m)
			b.mu.Lock()
			b.reqs = nil
			b.mu.Unlock()
			req, _ := http.NewRequest(http.MethodPost, "http://h.example/orders", strings.NewReader("o"))
			req.Header.Set("X-Mine", "1")
			caller = req
			resp, err := tr.RoundTrip(req)
			sent := b.reqs[0].Header.Get("Idempotency-Key")
			if sent == "" {
				t.Fatalf("mode %d: no key sent", m)
			}
			if req.Header.Get("Idempotency-Key") != "" || len(req.Header) != 1 {
				t.Errorf("mode %d: caller's request modified: %v", m, req.Header)
			}
			if fb.req == req || fb.req.Header.Get("Idempotency-Key") != sent || fb.req.Header.Get("X-Mine") != "1" {
				t.Errorf("mode %d: fallback got %p (caller %p) header %v, sent key %q", m, fb.req, req, fb.req.Header, sent)
			}
			if fb.err.Reason != retry.AttemptsExhausted || fb.err.Attempts != 3 {
				t.Errorf("mode %d: fallback err %v", m, fb.err)
			}
			switch m {
			case 0, 1:
				if err != nil || resp.Request != fb.req || httpretry.IdempotencyKey(resp, err) != sent {
					t.Errorf("mode %d: resp.Request %p, fallback's %p, err %v", m, resp.Request, fb.req, err)
				}
			case 2:
				if err != nil || resp.Request != other {
					t.Errorf("mode %d: a response naming another request changed: %p", m, resp.Request)
				}
			case 3:
				var re *retry.Error
				if resp != nil || !errors.As(err, &re) || !errors.Is(err, retry.AttemptsExhausted) || httpretry.IdempotencyKey(nil, err) != sent {
					t.Errorf("mode 3: resp %v err %v", resp, err)
				}
			case 4:
				if resp != nil || err == nil || !closed.Load() || httpretry.IdempotencyKey(nil, err) != sent {
					t.Errorf("mode 4: resp %v err %v closed %v", resp, err, closed.Load())
				}
			}
		}
	})
}

type h26CloseFlag struct{ c *atomic.Bool }

func (h26CloseFlag) Read([]byte) (int, error) { return 0, io.EOF }
func (b h26CloseFlag) Close() error           { b.c.Store(true); return nil }

// When the fallback is (not) called: not-retryable answers, a canceled
// caller, an open breaker without a deadline (no wait: at once), the
// budget's refusal, the limiter's refusal.
func TestAttackHttp4FallbackWhen(t *testing.T) {
	t.Run("not-retryable", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			for _, tc := range []struct {
				method string
				code   int
			}{{"GET", 404}, {"POST", 503}, {"POST", 500}, {"GET", 400}} {
				b := &h26Base{answer: func(int, *http.Request) h26Answer { return h26Answer{code: tc.code} }}
				fb := &h26Fallback{}
				tr := h26Transport(t, b, httpretry.WithFallback(fb.fn))
				req, _ := http.NewRequest(tc.method, "http://h.example/", strings.NewReader("b"))
				resp, err := tr.RoundTrip(req)
				if err != nil || resp.StatusCode != tc.code || fb.calls != 0 {
					t.Errorf("%s %d: err %v, fallback calls %d", tc.method, tc.code, err, fb.calls)
				}
				if resp != nil {
					resp.Body.Close()
				}
			}
		})
	})
	t.Run("canceled", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			b := &h26Base{answer: func(int, *http.Request) h26Answer {
				cancel()
				return h26Answer{err: errors.New("connection reset")}
			}}
			fb := &h26Fallback{}
			tr := h26Transport(t, b, httpretry.WithFallback(fb.fn))
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/", nil)
			_, err := tr.RoundTrip(req)
			if fb.calls != 0 || !errors.Is(err, retry.Canceled) {
				t.Errorf("fallback calls %d, err %v", fb.calls, err)
			}
		})
	})
	t.Run("budget", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &h26Base{answer: func(int, *http.Request) h26Answer { return h26Answer{code: 503, body: "x"} }}
			fb := &h26Fallback{}
			tr := h26Transport(t, b, httpretry.WithFallback(fb.fn), httpretry.WithBreaker(nil),
				httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: -1}))
			req, _ := http.NewRequest("GET", "http://h.example/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil || b.sends() != 1 || fb.calls != 1 || fb.err.Reason != retry.BudgetExhausted || fb.err.Attempts != 1 {
				t.Errorf("err %v, sends %d, fallback calls %d (%v)", err, b.sends(), fb.calls, fb.err)
			}
			var se *httpretry.StatusError
			if fb.err != nil && (!errors.As(fb.err, &se) || se.Code != 503) {
				t.Errorf("fallback's err %v does not carry the last failure", fb.err)
			}
			if resp != nil {
				resp.Body.Close()
			}
		})
	})
	t.Run("breaker-open", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := &h26Base{answer: func(int, *http.Request) h26Answer { return h26Answer{code: 503} }}
			fb := &h26Fallback{}
			tr := h26Transport(t, b, httpretry.WithFallback(fb.fn), httpretry.WithBudget(nil),
				httpretry.WithBreaker(&breaker.Config{MinCalls: 1, FailureRatio: 0.5}), httpretry.WithRetry(retry.WithMaxAttempts(1)))
			req, _ := http.NewRequest("GET", "http://h.example/", nil)
			resp, _ := tr.RoundTrip(req) // trips it
			resp.Body.Close()
			if tr.Hosts()["h.example"].Breaker.State() != breaker.Open {
				t.Fatal("breaker did not trip: MinCalls 1 and a 503 must trip it")
			}
			fb.calls = 0
			n := b.sends()
			req, _ = http.NewRequest("GET", "http://h.example/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil || fb.calls != 1 || fb.err.Reason != retry.CircuitOpen || fb.err.Attempts != 0 || b.sends() != n {
				t.Errorf("err %v, fallback calls %d (%v), sends %d->%d", err, fb.calls, fb.err, n, b.sends())
			}
			if retry.RetryAfter(fb.err) <= 0 {
				t.Errorf("no breaker wait in %v", fb.err)
			}
			resp.Body.Close()
		})
	})
}

// The stale cache wins over the fallback for a request it can answer; the
// fallback gets the others (an expired entry, a HEAD when a GET was kept);
// a 500 twice to a GET (not-retryable) is served stale and the fallback is
// not called.
func TestAttackHttp4StaleVersusFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var fail atomic.Int32 // 0: 200; else that status
		b := &h26Base{answer: func(int, *http.Request) h26Answer {
			if c := fail.Load(); c != 0 {
				return h26Answer{code: int(c), body: "down"}
			}
			return h26Answer{code: 200, body: "good", hdr: http.Header{"Cache-Control": {"max-age=1, stale-if-error=10"}}}
		}}
		fb := &h26Fallback{}
		tr := h26Transport(t, b, httpretry.WithFallback(fb.fn), httpretry.WithStaleCache(1<<20, 0, false), httpretry.WithBudget(nil), httpretry.WithBreaker(nil))
		get := func(method string) (*http.Response, string) {
			req, _ := http.NewRequest(method, "http://h.example/a", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return resp, string(body)
		}
		if _, body := get("GET"); body != "good" {
			t.Fatalf("first GET %q", body)
		}
		for _, code := range []int32{503, 500} {
			fail.Store(code)
			fb.calls = 0
			resp, body := get("GET")
			if body != "good" || fb.calls != 0 || resp.Header.Get("Stormguard-Stale") == "" {
				t.Errorf("%d: body %q, fallback calls %d, stale %q", code, body, fb.calls, resp.Header.Get("Stormguard-Stale"))
			}
			// HEAD was never kept: the fallback answers a 503's give-up.
			fb.calls = 0
			resp, _ = get("HEAD")
			if code == 503 && (fb.calls != 1 || resp.Header.Get("X-From") != "fallback") {
				t.Errorf("HEAD %d: fallback calls %d, status %d", code, fb.calls, resp.StatusCode)
			}
		}
		fail.Store(503)
		time.Sleep(12 * time.Second) // past max-age + stale-if-error (fake clock)
		fb.calls = 0
		resp, _ := get("GET")
		if fb.calls != 1 || resp.Header.Get("X-From") != "fallback" {
			t.Errorf("expired: fallback calls %d, header %v", fb.calls, resp.Header)
		}
	})
}

// Loopback: failed answers' bodies within the bound are read, so retries
// reuse one connection; a deadline close by keeps it so.
func TestAttackHttp4ConnReuseLoopback(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 != 0 {
			w.WriteHeader(503)
			_, _ = w.Write([]byte(strings.Repeat("e", 4000)))
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	var conns atomic.Int32
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 4}
	defer base.CloseIdleConnections()
	tr := h26Transport(t, base, httpretry.WithTimeout(5*time.Second), httpretry.WithBudget(nil))
	for i := range 5 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "ok" {
			t.Errorf("call %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if c := conns.Load(); c != 1 {
		t.Errorf("%d connections for 15 sequential attempts, want 1 (failed bodies drained)", c)
	}
}
