// Attacks on httpretry's core retry behaviour, black-box,
// against its documentation. Every test runs in a synctest bubble over a
// RoundTripper of its own as base.

package httpretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// zzhBody is a response body that counts opens and closes.
type zzhBody struct {
	r      io.Reader
	closed atomic.Bool
	open   *atomic.Int64
}

func (b *zzhBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *zzhBody) Close() error {
	if !b.closed.Swap(true) {
		b.open.Add(-1)
	}
	return nil
}

// zzhAnswer is what the fake host answers to one send.
type zzhAnswer struct {
	code int
	hdr  http.Header
	body string
	err  error // a send error instead of a response
	// bodyReader, if not nil, is the response body (wrapped to count).
	bodyReader func(r *http.Request) io.Reader
	// delay before the answer
	delay time.Duration
}

// zzhSent is one request the base saw.
type zzhSent struct {
	at      time.Time
	method  string
	header  http.Header
	body    string
	bodyErr error
	req     *http.Request
}

type zzhBase struct {
	mu     sync.Mutex
	answer func(n int, r *http.Request) zzhAnswer
	sent   []zzhSent
	open   atomic.Int64
}

func (b *zzhBase) RoundTrip(r *http.Request) (*http.Response, error) {
	var body []byte
	var berr error
	if r.Body != nil {
		body, berr = io.ReadAll(r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	b.sent = append(b.sent, zzhSent{at: time.Now(), method: r.Method, header: r.Header.Clone(), body: string(body), bodyErr: berr, req: r})
	n := len(b.sent)
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
	var rd io.Reader = strings.NewReader(a.body)
	if a.bodyReader != nil {
		rd = a.bodyReader(r)
	}
	hdr := a.hdr.Clone()
	if hdr == nil {
		hdr = http.Header{}
	}
	b.open.Add(1)
	return &http.Response{StatusCode: a.code, Status: fmt.Sprintf("%d x", a.code), Header: hdr, Request: r,
		Body: &zzhBody{r: rd, open: &b.open}, ProtoMajor: 1, ProtoMinor: 1}, nil
}

func (b *zzhBase) sends() []zzhSent {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]zzhSent(nil), b.sent...)
}

// zzhZeroBackoff: full jitter whose random source returns 0: backoff
// sleeps 0, and a Retry-After is slept exactly.
func zzhZeroBackoff(t *testing.T) httpretry.Option {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return httpretry.WithRetry(retry.WithBackoff(b))
}

func zzhTransport(t *testing.T, b *zzhBase, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	all := append([]httpretry.Option{zzhZeroBackoff(t), httpretry.WithBudget(nil), httpretry.WithBreaker(nil)}, opts...)
	tr, err := httpretry.NewTransport(b, all...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func zzhAlways(code int, hdr http.Header) func(int, *http.Request) zzhAnswer {
	return func(int, *http.Request) zzhAnswer { return zzhAnswer{code: code, hdr: hdr, body: "busy"} }
}

// stalledBody blocks until the request's context ends, then fails as a
// net/http body does when its request's context ends.
type zzhStalled struct{ ctx context.Context }

func (s zzhStalled) Read([]byte) (int, error) {
	<-s.ctx.Done()
	return 0, s.ctx.Err()
}

// FINDING candidate: WithFallback: "A request that was not retryable (a
// 404, a POST without a key) ... gets no fallback." A POST without a key
// whose 503 arrives before the deadline, its body still being read when
// the deadline passes.
func TestAttackCore2UnkeyedPostNoFallbackNearDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
			return zzhAnswer{code: 503, delay: 990 * time.Millisecond, bodyReader: func(r *http.Request) io.Reader {
				return io.MultiReader(strings.NewReader("overloaded"), zzhStalled{r.Context()})
			}}
		}}
		var fbCalls int
		var fbErr *retry.Error
		tr := zzhTransport(t, b, httpretry.WithTimeout(time.Second), httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			fbCalls++
			fbErr = e
			return &http.Response{StatusCode: 200, Header: http.Header{"X-From": {"fallback"}}, Body: http.NoBody, Request: r}, nil
		}))
		req, _ := http.NewRequest(http.MethodPost, "http://h.example/pay", strings.NewReader("charge 10"))
		resp, err := tr.RoundTrip(req)
		if n := len(b.sends()); n != 1 {
			t.Errorf("POST without key sent %d times", n)
		}
		if fbCalls != 0 {
			t.Errorf("fallback called %d times for a POST without a key (reason %v, attempts %d); doc: a POST without a key gets no fallback",
				fbCalls, fbErr.Reason, fbErr.Attempts)
		}
		if err == nil {
			if resp.StatusCode != 503 {
				t.Errorf("caller got %d (%v), want the host's 503", resp.StatusCode, resp.Header)
			}
			if g := resp.Header.Get(wire.GiveUpHeader); g != "" && !strings.HasPrefix(g, "not-retryable") {
				t.Errorf("give-up %q, want not-retryable", g)
			}
			resp.Body.Close()
		} else {
			t.Errorf("RoundTrip error %v", err)
		}
	})
}

// Same without a fallback: the give-up reason on a POST without a key.
func TestAttackCore2UnkeyedPostGiveUpReasonNearDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
			return zzhAnswer{code: 503, delay: 990 * time.Millisecond, bodyReader: func(r *http.Request) io.Reader {
				return io.MultiReader(strings.NewReader("overloaded"), zzhStalled{r.Context()})
			}}
		}}
		tr := zzhTransport(t, b, httpretry.WithTimeout(time.Second))
		req, _ := http.NewRequest(http.MethodPost, "http://h.example/pay", strings.NewReader("charge 10"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("RoundTrip error %v", err)
		}
		defer resp.Body.Close()
		g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
		t.Logf("give-up header %q (%+v)", resp.Header.Get(wire.GiveUpHeader), g)
	})
}

// FINDING candidate: IdempotencyKey "returns the idempotency key a
// request was sent with, from what its RoundTrip returned". A keyed write
// (WithAutoIdempotencyKey) sent 3 times that ends in the fallback's
// response.
func TestAttackCore2AutoKeyLostBehindFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: zzhAlways(503, nil)}
		tr := zzhTransport(t, b, httpretry.WithAutoIdempotencyKey(), httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			return &http.Response{StatusCode: 503, Header: http.Header{"X-From": {"fallback"}}, Body: http.NoBody, Request: r}, nil
		}))
		req, _ := http.NewRequest(http.MethodPost, "http://h.example/orders", strings.NewReader("order"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s := b.sends()
		if len(s) != 3 {
			t.Fatalf("sends %d", len(s))
		}
		sent := s[0].header.Get("Idempotency-Key")
		for i, x := range s {
			if x.header.Get("Idempotency-Key") != sent || sent == "" {
				t.Errorf("attempt %d key %q, first %q", i+1, x.header.Get("Idempotency-Key"), sent)
			}
		}
		if got := httpretry.IdempotencyKey(resp, err); got != sent {
			t.Errorf("IdempotencyKey(resp, nil) = %q after the fallback's response; the write went 3 times with key %q", got, sent)
		}
	})
}

// Which methods and statuses are retried, how many times, with the same
// key, attempt numbers, bodies replayed byte for byte, failed bodies closed.
func TestAttackCore2RetryMatrix(t *testing.T) {
	payload := "\x00\xffbinary\r\n payload \x00"
	type tc struct {
		method string
		key    string
		code   int
		want   int
	}
	var cases []tc
	for _, code := range []int{408, 429, 502, 503, 504} {
		cases = append(cases, tc{"GET", "", code, 4}, tc{"PUT", "", code, 4}, tc{"DELETE", "", code, 4}, tc{"POST", "", code, 1},
			tc{"PATCH", "", code, 1}, tc{"POST", "k-1", code, 4}, tc{"PATCH", "k-2", code, 4})
	}
	for _, code := range []int{400, 401, 403, 404, 405, 409, 410, 412, 418, 422, 425, 451, 501, 505, 507, 511, 599, 200, 204, 301, 304} {
		cases = append(cases, tc{"GET", "", code, 1}, tc{"POST", "k", code, 1})
	}
	cases = append(cases, tc{"GET", "", 500, 2}, tc{"POST", "k", 500, 1}, tc{"POST", "", 500, 1}, tc{"OPTIONS", "", 503, 4}, tc{"TRACE", "", 503, 4}, tc{"HEAD", "", 503, 4})
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s-%q-%d", c.method, c.key, c.code), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &zzhBase{answer: zzhAlways(c.code, nil)}
				tr := zzhTransport(t, b, httpretry.WithRetry(retry.WithMaxAttempts(4)))
				req, _ := http.NewRequest(c.method, "http://h.example/x", strings.NewReader(payload))
				if c.key != "" {
					req.Header.Set("Idempotency-Key", c.key)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				io.ReadAll(resp.Body)
				resp.Body.Close()
				s := b.sends()
				if len(s) != c.want {
					t.Errorf("sends %d want %d", len(s), c.want)
				}
				for i, x := range s {
					if x.body != payload {
						t.Errorf("attempt %d body %q", i+1, x.body)
					}
					wantA := ""
					if i > 0 {
						wantA = fmt.Sprint(i + 1)
					}
					if got := x.header.Get(wire.AttemptHeader); got != wantA {
						t.Errorf("attempt %d header %q want %q", i+1, got, wantA)
					}
					if got := x.header.Get("Idempotency-Key"); got != c.key {
						t.Errorf("attempt %d key %q", i+1, got)
					}
				}
				if n := b.open.Load(); n != 0 {
					t.Errorf("%d response bodies left open", n)
				}
				if c.want == 4 {
					if g := resp.Header.Get(wire.GiveUpHeader); g != "attempts-exhausted;attempts=4" {
						t.Errorf("give-up %q", g)
					}
				}
				if c.want == 1 && (c.code == 200 || c.code == 404) && resp.Header.Get(wire.GiveUpHeader) != "" {
					t.Errorf("give-up on a %d", c.code)
				}
			})
		})
	}
}

// Retry-After: a floor (seconds, the three HTTP-date forms), slept exactly
// with a random source of 0; garbage is ignored.
func TestAttackCore2RetryAfterFloor(t *testing.T) {
	for i, form := range []string{http.TimeFormat, "Monday, 02-Jan-06 15:04:05 GMT", time.ANSIC, "secs", "secs-space"} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
					if n == 1 {
						var v string
						switch form {
						case "secs":
							v = "3"
						case "secs-space":
							v = "  3\t"
						default:
							v = time.Now().Add(3 * time.Second).UTC().Format(form)
						}
						return zzhAnswer{code: 503, hdr: http.Header{"Retry-After": {v}}}
					}
					return zzhAnswer{code: 200}
				}}
				tr := zzhTransport(t, b)
				resp, err := tr.RoundTrip(mustReq(t, "GET"))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				s := b.sends()
				if len(s) != 2 {
					t.Fatalf("sends %d", len(s))
				}
				if gap := s[1].at.Sub(s[0].at); gap != 3*time.Second {
					t.Errorf("form %q: slept %v, want exactly 3s", form, gap)
				}
			})
		})
	}
	for _, v := range []string{"soon", "-3", "+3", "3.5", "3s", "1e3", "Mon, 99 Foo 2000 00:00:00 GMT", "3, 4", ""} {
		t.Run("garbage "+v, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
					return zzhAnswer{code: 503, hdr: http.Header{"Retry-After": {v}}}
				}}
				tr := zzhTransport(t, b)
				start := time.Now()
				resp, err := tr.RoundTrip(mustReq(t, "GET"))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if n := len(b.sends()); n != 3 {
					t.Errorf("sends %d", n)
				}
				if el := time.Since(start); el > time.Second {
					t.Errorf("garbage %q made it sleep %v", v, el)
				}
				if g := resp.Header.Get(wire.GiveUpHeader); g != "attempts-exhausted;attempts=3" {
					t.Errorf("give-up %q", g)
				}
			})
		})
	}
}

func mustReq(t *testing.T, method string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, "http://h.example/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// Retry-After never slept past the deadline: WithTimeout or the
// request's context; gives up at once with that response.
func TestAttackCore2RetryAfterPastDeadline(t *testing.T) {
	for _, viaCtx := range []bool{false, true} {
		for _, ra := range []string{"5", "2"} {
			t.Run(fmt.Sprint(viaCtx, ra), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
						return zzhAnswer{code: 503, hdr: http.Header{"Retry-After": {ra}}, delay: 500 * time.Millisecond, body: "b"}
					}}
					var opts []httpretry.Option
					req := mustReq(t, "GET")
					if viaCtx {
						ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
						defer cancel()
						req = req.WithContext(ctx)
					} else {
						opts = append(opts, httpretry.WithTimeout(2*time.Second))
					}
					tr := zzhTransport(t, b, opts...)
					start := time.Now()
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					el := time.Since(start)
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if n := len(b.sends()); n != 1 {
						t.Errorf("sends %d", n)
					}
					if el != 500*time.Millisecond {
						t.Errorf("returned after %v, want 500ms (at once)", el)
					}
					if resp.StatusCode != 503 || string(body) != "b" {
						t.Errorf("got %d %q", resp.StatusCode, body)
					}
					if g := resp.Header.Get(wire.GiveUpHeader); !strings.HasPrefix(g, "deadline;attempts=1") {
						t.Errorf("give-up %q", g)
					}
				})
			})
		}
	}
}

// Retry-After with a spread: never past the deadline, never under the hint.
func TestAttackCore2RetryAfterSpreadDeadline(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999999} {
		t.Run(fmt.Sprint(r), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				bo, _ := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond, Rand: func() float64 { return r }})
				b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
					return zzhAnswer{code: 503, hdr: http.Header{"Retry-After": {"2"}}}
				}}
				tr, err := httpretry.NewTransport(b, httpretry.WithRetry(retry.WithBackoff(bo)), httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
					httpretry.WithTimeout(2500*time.Millisecond))
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				resp, err := tr.RoundTrip(mustReq(t, "GET"))
				if err == nil {
					resp.Body.Close()
				}
				s := b.sends()
				for i := 1; i < len(s); i++ {
					gap := s[i].at.Sub(s[i-1].at)
					if gap < 2*time.Second {
						t.Errorf("gap %v under the hint", gap)
					}
					if s[i].at.Sub(start) >= 2500*time.Millisecond {
						t.Errorf("attempt %d at %v, past the deadline", i+1, s[i].at.Sub(start))
					}
				}
				if el := time.Since(start); el > 2500*time.Millisecond {
					t.Errorf("returned after %v", el)
				}
				t.Logf("r=%v sends %d err %v", r, len(s), err)
			})
		})
	}
}

// Bodies: buffered bodies up to the limit, replayed byte for byte; past
// the limit sent once; never more than max+1 read ahead.
type zzhCountingReader struct {
	r      io.Reader
	read   atomic.Int64
	closed atomic.Bool
}

func (c *zzhCountingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}
func (c *zzhCountingReader) Close() error { c.closed.Store(true); return nil }

func TestAttackCore2BufferBodies(t *testing.T) {
	const max = 100
	for _, size := range []int{0, 1, 99, 100, 101, 1000} {
		for _, cl := range []string{"known", "unknown"} {
			t.Run(fmt.Sprint(size, cl), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					data := bytes.Repeat([]byte{'a', 0, '\n', 0xff}, (size+3)/4)[:size]
					var readAtFirstSend int64 = -1
					cr := &zzhCountingReader{r: bytes.NewReader(data)}
					b := &zzhBase{}
					b.answer = func(n int, r *http.Request) zzhAnswer {
						return zzhAnswer{code: 503}
					}
					// the first send's view of how far the transport read ahead
					wrapped := zzhRTFunc(func(r *http.Request) (*http.Response, error) {
						if readAtFirstSend < 0 {
							readAtFirstSend = cr.read.Load()
						}
						return b.RoundTrip(r)
					})
					tr, err := httpretry.NewTransport(wrapped, zzhZeroBackoff(t), httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithBufferBodies(max))
					if err != nil {
						t.Fatal(err)
					}
					req, _ := http.NewRequest("PUT", "http://h.example/x", nil)
					req.Body = cr
					if cl == "known" {
						req.ContentLength = int64(size)
					} else {
						req.ContentLength = -1
					}
					if size == 0 && cl == "known" {
						req.ContentLength = 0
					}
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
					s := b.sends()
					want := 3
					if size > max {
						want = 1
					}
					if len(s) != want {
						t.Errorf("sends %d want %d", len(s), want)
					}
					for i, x := range s {
						if x.body != string(data) {
							t.Errorf("attempt %d body %d bytes, want %d", i+1, len(x.body), len(data))
						}
					}
					if readAtFirstSend > max+1 {
						t.Errorf("read %d bytes ahead", readAtFirstSend)
					}
					if cl == "known" && size > max && readAtFirstSend != 0 {
						t.Errorf("ContentLength %d > max: read %d ahead", size, readAtFirstSend)
					}
					if !cr.closed.Load() {
						t.Errorf("request body not closed")
					}
					if n := b.open.Load(); n != 0 {
						t.Errorf("%d response bodies open", n)
					}
				})
			})
		}
	}
}

type zzhRTFunc func(*http.Request) (*http.Response, error)

func (f zzhRTFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// GetBody replay and a body without GetBody (no buffering): sent once.
func TestAttackCore2GetBodyAndUnreplayable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: zzhAlways(503, nil)}
		tr := zzhTransport(t, b)
		var gets atomic.Int32
		req, _ := http.NewRequest("PUT", "http://h.example/x", nil)
		req.Body = io.NopCloser(strings.NewReader("hello"))
		req.ContentLength = 5
		req.GetBody = func() (io.ReadCloser, error) {
			gets.Add(1)
			return io.NopCloser(strings.NewReader("hello")), nil
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		s := b.sends()
		if len(s) != 3 {
			t.Fatalf("sends %d", len(s))
		}
		for i, x := range s {
			if x.body != "hello" {
				t.Errorf("attempt %d body %q", i+1, x.body)
			}
		}
		// Unreplayable body, GET: one send.
		b2 := &zzhBase{answer: zzhAlways(503, nil)}
		tr2 := zzhTransport(t, b2)
		req2, _ := http.NewRequest("GET", "http://h.example/x", nil)
		cr := &zzhCountingReader{r: strings.NewReader("once")}
		req2.Body = cr
		resp2, err := tr2.RoundTrip(req2)
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if n := len(b2.sends()); n != 1 {
			t.Errorf("unreplayable body sent %d times", n)
		}
		if g := resp2.Header.Get(wire.GiveUpHeader); !strings.HasPrefix(g, "not-retryable") {
			t.Errorf("give-up %q", g)
		}
	})
}

// 401: refresh once per RoundTrip, resend with the body replayed, not an
// attempt; later retries send the refreshed request.
func TestAttackCore2Refresh401(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
			if r.Header.Get("Authorization") != "new" {
				return zzhAnswer{code: 401}
			}
			if n < 4 {
				return zzhAnswer{code: 503}
			}
			return zzhAnswer{code: 200, body: "ok"}
		}}
		var calls int
		tr := zzhTransport(t, b, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			calls++
			if r.Body != nil {
				t.Errorf("hook got a body")
			}
			r.Header.Set("Authorization", "new")
			return r, nil
		}))
		req, _ := http.NewRequest("PUT", "http://h.example/x", strings.NewReader("data"))
		req.Header.Set("Authorization", "old")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		s := b.sends()
		if calls != 1 {
			t.Errorf("refresh called %d times", calls)
		}
		if len(s) != 4 || string(body) != "ok" {
			t.Errorf("sends %d, body %q", len(s), body)
		}
		for i, x := range s {
			if x.body != "data" {
				t.Errorf("send %d body %q", i+1, x.body)
			}
			t.Logf("send %d auth %q attempt %q", i+1, x.header.Get("Authorization"), x.header.Get(wire.AttemptHeader))
		}
		if req.Header.Get("Authorization") != "old" {
			t.Errorf("caller's request modified")
		}
		if n := b.open.Load(); n != 0 {
			t.Errorf("%d bodies open", n)
		}
		// A second 401 after the refresh goes back as is, no second refresh.
		b2 := &zzhBase{answer: zzhAlways(401, nil)}
		calls = 0
		tr2 := zzhTransport(t, b2, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			calls++
			return r, nil
		}))
		resp2, err := tr2.RoundTrip(mustReq(t, "GET"))
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if calls != 1 || len(b2.sends()) != 2 || resp2.StatusCode != 401 {
			t.Errorf("calls %d sends %d status %d", calls, len(b2.sends()), resp2.StatusCode)
		}
	})
}

// Give-up on a network error: a *retry.Error, errors.Is with the reason,
// wraps the cause; POST without key never twice.
func TestAttackCore2GiveUpErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cause := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
		b := &zzhBase{answer: func(int, *http.Request) zzhAnswer { return zzhAnswer{err: cause} }}
		tr := zzhTransport(t, b)
		_, err := tr.RoundTrip(mustReq(t, "GET"))
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 3 {
			t.Fatalf("err %v", err)
		}
		if !errors.Is(err, retry.AttemptsExhausted) || !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("errors.Is fails on %v", err)
		}
		if len(b.sends()) != 3 {
			t.Errorf("sends %d", len(b.sends()))
		}
		b2 := &zzhBase{answer: func(int, *http.Request) zzhAnswer { return zzhAnswer{err: cause} }}
		tr2 := zzhTransport(t, b2)
		req, _ := http.NewRequest("POST", "http://h.example/x", strings.NewReader("x"))
		_, err = tr2.RoundTrip(req)
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || len(b2.sends()) != 1 {
			t.Errorf("POST: err %v sends %d", err, len(b2.sends()))
		}
		// Auto key: error carries the key, sent on every attempt.
		b3 := &zzhBase{answer: func(int, *http.Request) zzhAnswer { return zzhAnswer{err: cause} }}
		tr3 := zzhTransport(t, b3, httpretry.WithAutoIdempotencyKey())
		req3, _ := http.NewRequest("POST", "http://h.example/x", strings.NewReader("x"))
		_, err = tr3.RoundTrip(req3)
		s := b3.sends()
		if len(s) != 3 {
			t.Fatalf("sends %d", len(s))
		}
		k := httpretry.IdempotencyKey(nil, err)
		for i, x := range s {
			if x.header.Get("Idempotency-Key") != k || k == "" {
				t.Errorf("attempt %d key %q, IdempotencyKey %q", i+1, x.header.Get("Idempotency-Key"), k)
			}
		}
		if !errors.As(err, &re) || !errors.Is(err, retry.AttemptsExhausted) {
			t.Errorf("keyed err %v", err)
		}
		if req3.Header.Get("Idempotency-Key") != "" {
			t.Errorf("caller's request modified")
		}
	})
}

// Fallback: called only when giving up, with the reason, after the last
// response was closed; the server's hint reachable.
func TestAttackCore2FallbackError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: zzhAlways(503, http.Header{"Retry-After": {"1"}})}
		var got *retry.Error
		var openAtFallback int64
		tr := zzhTransport(t, b, httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			got = e
			openAtFallback = b.open.Load()
			return nil, errors.New("mine")
		}))
		_, err := tr.RoundTrip(mustReq(t, "GET"))
		if err == nil || err.Error() != "mine" {
			t.Errorf("err %v", err)
		}
		if got == nil || got.Reason != retry.AttemptsExhausted || got.Attempts != 3 || retry.RetryAfter(got) != time.Second {
			t.Errorf("fallback got %v (RetryAfter %v)", got, retry.RetryAfter(got))
		}
		var se *httpretry.StatusError
		if !errors.As(got, &se) || se.Code != 503 {
			t.Errorf("no StatusError in %v", got)
		}
		if openAtFallback != 0 {
			t.Errorf("%d bodies open when the fallback ran", openAtFallback)
		}
		// 200 after failures: no fallback.
		got = nil
		b2 := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
			if n < 3 {
				return zzhAnswer{code: 502}
			}
			return zzhAnswer{code: 200}
		}}
		tr2 := zzhTransport(t, b2, httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			got = e
			return nil, e
		}))
		resp, err := tr2.RoundTrip(mustReq(t, "GET"))
		if err != nil || resp.StatusCode != 200 || got != nil {
			t.Errorf("resp %v err %v fallback %v", resp, err, got)
		}
	})
}

// FINDING candidate: a GET answered 500 twice: the host is failing and
// the transport gives up (500 retried once), yet the fallback is not called.
func TestAttackCore2FallbackOn500(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: zzhAlways(500, nil)}
		var got *retry.Error
		tr := zzhTransport(t, b, httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			got = e
			return nil, e
		}))
		resp, err := tr.RoundTrip(mustReq(t, "GET"))
		if err == nil {
			t.Logf("caller got %d, give-up %q; fallback %v", resp.StatusCode, resp.Header.Get(wire.GiveUpHeader), got)
			resp.Body.Close()
		}
	})
}

// IsRetryable and ParseRetryAfter against their docs.
func TestAttackCore2IsRetryableParse(t *testing.T) {
	for code, want := range map[int]bool{408: true, 429: true, 502: true, 503: true, 504: true, 500: false, 404: false, 409: false, 501: false, 200: false} {
		if got := httpretry.IsRetryable(&httpretry.StatusError{Code: code, After: time.Second}); got != want {
			t.Errorf("IsRetryable(%d) = %v", code, got)
		}
	}
	if httpretry.IsRetryable(&httpretry.StatusError{}) {
		t.Errorf("zero StatusError retryable")
	}
	if httpretry.IsRetryable(&retry.Error{Reason: retry.AttemptsExhausted, Err: &httpretry.StatusError{Code: 503}}) {
		t.Errorf("give-up retryable")
	}
	if !httpretry.IsRetryable(fmt.Errorf("x: %w", io.EOF)) || httpretry.IsRetryable(errors.New("decode")) {
		t.Errorf("EOF / decode")
	}
	if httpretry.IsRetryable(context.Canceled) {
		t.Errorf("cancel retryable")
	}
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"0": 0, "120": 120 * time.Second, " 7 ": 7 * time.Second,
		now.Add(10 * time.Second).Format(http.TimeFormat):  10 * time.Second,
		now.Add(-10 * time.Second).Format(http.TimeFormat): 0,
		"99999999999999999999999":                          1<<63 - 1,
	} {
		d, ok := httpretry.ParseRetryAfter(v, now)
		if !ok || d != want {
			t.Errorf("ParseRetryAfter(%q) = %v %v want %v", v, d, ok, want)
		}
	}
	for _, v := range []string{"", " ", "-1", "1.5", "abc", "1 2", "+1"} {
		if d, ok := httpretry.ParseRetryAfter(v, now); ok || d != 0 {
			t.Errorf("ParseRetryAfter(%q) = %v %v", v, d, ok)
		}
	}
	se := &httpretry.StatusError{Code: 503, After: 1500 * time.Millisecond}
	if se.Error() != "HTTP 503 (retry after 1.5s)" || (&httpretry.StatusError{Code: 503}).Error() != "HTTP 503" {
		t.Errorf("Error %q", se.Error())
	}
}

// Attempt timeout: a hung attempt is retried; never past WithTimeout.
func TestAttackCore2AttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
			if n < 3 {
				return zzhAnswer{code: 200, delay: time.Hour}
			}
			return zzhAnswer{code: 200, body: "ok"}
		}}
		tr := zzhTransport(t, b, httpretry.WithAttemptTimeout(100*time.Millisecond), httpretry.WithTimeout(time.Second))
		start := time.Now()
		resp, err := tr.RoundTrip(mustReq(t, "GET"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "ok" || time.Since(start) != 200*time.Millisecond {
			t.Errorf("body %q after %v", body, time.Since(start))
		}
		for i, x := range b.sends() {
			t.Logf("send %d timeout-ms %q attempt %q", i+1, x.header.Get(wire.TimeoutHeader), x.header.Get(wire.AttemptHeader))
		}
		// All hang: reason, time.
		b2 := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer { return zzhAnswer{code: 200, delay: time.Hour} }}
		tr2 := zzhTransport(t, b2, httpretry.WithAttemptTimeout(400*time.Millisecond), httpretry.WithTimeout(time.Second))
		start = time.Now()
		_, err = tr2.RoundTrip(mustReq(t, "GET"))
		var re *retry.Error
		if !errors.As(err, &re) || time.Since(start) > time.Second {
			t.Errorf("err %v after %v", err, time.Since(start))
		}
		t.Logf("all hang: %v reason %v after %v sends %d", err, re.Reason, time.Since(start), len(b2.sends()))
	})
}

// Hosts: lower-cased keys, WithMaxHosts evicts the host that entered first.
func TestAttackCore2Hosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &zzhBase{answer: zzhAlways(200, nil)}
		tr, err := httpretry.NewTransport(b, httpretry.WithMaxHosts(2))
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range []string{"A.example", "b.example", "a.example", "c.example"} {
			req, _ := http.NewRequest("GET", "http://"+h+"/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		hs := tr.Hosts()
		if len(hs) != 2 || hs["b.example"].Breaker == nil || hs["c.example"].Budget == nil {
			t.Errorf("hosts %v", hs)
		}
		var zero httpretry.Transport
		if len(zero.Hosts()) != 0 {
			t.Errorf("zero transport hosts")
		}
		for _, o := range []httpretry.Option{httpretry.WithTimeout(-1), httpretry.WithAttemptTimeout(-1), httpretry.WithMaxHosts(0),
			httpretry.WithBufferBodies(0), httpretry.WithGuards(nil), httpretry.WithRetry(retry.WithMaxAttempts(0)), httpretry.WithRetry(retry.WithMaxAttempts(-5)),
			httpretry.WithRetry(retry.WithMaxRetryAfter(-1)), httpretry.WithRetry(retry.WithBackoff(nil))} {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Errorf("NewTransport panicked: %v", p)
					}
				}()
				if _, err := httpretry.NewTransport(nil, o); err == nil {
					t.Logf("option accepted: %T", o)
				}
			}()
		}
	})
}

// FINDING candidate: Transport: "The breaker counts as failures the
// network errors and retryable statuses (408, 429, 500, 502, 503, 504,
// ...), those of requests that may not be retried included". A 503 to a
// POST without a key, answered before the deadline, its body read across it.
func TestAttackCore2BreakerCountsLate503(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, late := range []bool{false, true} {
			b := &zzhBase{answer: func(n int, r *http.Request) zzhAnswer {
				a := zzhAnswer{code: 503, delay: 990 * time.Millisecond, body: "overloaded"}
				if late {
					a.bodyReader = func(r *http.Request) io.Reader {
						return io.MultiReader(strings.NewReader("overloaded"), zzhStalled{r.Context()})
					}
				}
				return a
			}}
			tr, err := httpretry.NewTransport(b, zzhZeroBackoff(t), httpretry.WithTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPost, "http://h.example/pay", strings.NewReader("charge 10"))
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			s := tr.Hosts()["h.example"].Breaker.Snapshot()
			if s.Calls != 1 || s.Failures != 1 {
				t.Errorf("late body %v: breaker saw %d calls, %d failures; want the host's 503 counted as 1 failure", late, s.Calls, s.Failures)
			}
		}
	})
}
