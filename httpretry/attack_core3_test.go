package httpretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// hc3Body is a response body that records its Close.
type hc3Body struct {
	r      *strings.Reader
	closed atomic.Bool
	read   atomic.Int64
}

func (b *hc3Body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read.Add(int64(n))
	return n, err
}
func (b *hc3Body) Close() error { b.closed.Store(true); return nil }

// hc3Sent is what the in-memory base saw of one request.
type hc3Sent struct {
	method      string
	header      http.Header
	body        string
	bodyErr     error
	cl          int64
	hasGetBody  bool
	ctxDeadline time.Time
	hasDeadline bool
}

// hc3RT is an in-memory base RoundTripper answering from a script.
type hc3RT struct {
	mu     sync.Mutex
	sent   []hc3Sent
	bodies []*hc3Body
	answer func(n int, r *http.Request) (*http.Response, error) // n from 1
}

func (z *hc3RT) RoundTrip(r *http.Request) (*http.Response, error) {
	s := hc3Sent{method: r.Method, header: r.Header.Clone(), cl: r.ContentLength, hasGetBody: r.GetBody != nil}
	s.ctxDeadline, s.hasDeadline = r.Context().Deadline()
	if r.Body != nil {
		b, err := io.ReadAll(r.Body)
		s.body, s.bodyErr = string(b), err
		r.Body.Close()
	}
	z.mu.Lock()
	z.sent = append(z.sent, s)
	n := len(z.sent)
	z.mu.Unlock()
	if s.bodyErr != nil {
		return nil, s.bodyErr
	}
	resp, err := z.answer(n, r)
	if resp != nil {
		if zb, ok := resp.Body.(*hc3Body); ok {
			z.mu.Lock()
			z.bodies = append(z.bodies, zb)
			z.mu.Unlock()
		}
		resp.Request = r
	}
	return resp, err
}

func (z *hc3RT) n() int { z.mu.Lock(); defer z.mu.Unlock(); return len(z.sent) }

func hc3Resp(code int, body string, kv ...string) *http.Response {
	h := make(http.Header)
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), Header: h,
		Body: &hc3Body{r: strings.NewReader(body)}, ContentLength: int64(len(body)), ProtoMajor: 1, ProtoMinor: 1}
}

func hc3Codes(codes ...int) func(n int, r *http.Request) (*http.Response, error) {
	return func(n int, r *http.Request) (*http.Response, error) {
		c := codes[len(codes)-1]
		if n <= len(codes) {
			c = codes[n-1]
		}
		return hc3Resp(c, fmt.Sprintf("body-%d", n)), nil
	}
}

func hc3Transport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	opts = append([]httpretry.Option{httpretry.WithBudget(nil), httpretry.WithBreaker(nil)}, opts...)
	tr, err := httpretry.NewTransport(base, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// closeTrack is a request body without GetBody that records Close.
type closeTrack struct {
	io.Reader
	closed atomic.Int32
}

func (c *closeTrack) Close() error { c.closed.Add(1); return nil }

func TestAttackCore3StatusErrorZeroNotRetryable(t *testing.T) {
	if httpretry.IsRetryable(&httpretry.StatusError{}) {
		t.Errorf("IsRetryable(&StatusError{}) = true; the zero value is documented not retryable")
	}
	if httpretry.IsRetryable(&httpretry.StatusError{Code: 500}) {
		t.Errorf("IsRetryable(500) = true")
	}
	if !httpretry.IsRetryable(fmt.Errorf("w: %w", &httpretry.StatusError{Code: 503, After: time.Second})) {
		t.Errorf("IsRetryable(wrapped 503) = false")
	}
	if httpretry.IsRetryable(&httpretry.StatusError{Code: 404, After: time.Second}) {
		t.Errorf("IsRetryable(404 with hint) = true")
	}
	if got := (&httpretry.StatusError{Code: 503, After: 1500 * time.Millisecond}).Error(); got != "HTTP 503 (retry after 1.5s)" {
		t.Errorf("Error() = %q", got)
	}
	if got := (&httpretry.StatusError{Code: 503}).Error(); got != "HTTP 503" {
		t.Errorf("Error() = %q", got)
	}
}

func TestAttackCore3MethodsAndStatuses(t *testing.T) {
	type tc struct {
		method string
		key    string // header name for a key, "" none
		auto   bool
		codes  []int
		want   int // attempts
	}
	cases := []tc{
		{"GET", "", false, []int{503, 503, 503}, 3},
		{"HEAD", "", false, []int{502, 504, 200}, 3},
		{"OPTIONS", "", false, []int{408, 200}, 2},
		{"TRACE", "", false, []int{429, 200}, 2},
		{"PUT", "", false, []int{503, 200}, 2},
		{"DELETE", "", false, []int{503, 200}, 2},
		{"POST", "", false, []int{503, 200}, 1},
		{"PATCH", "", false, []int{503, 200}, 1},
		{"POST", "Idempotency-Key", false, []int{503, 200}, 2},
		{"PATCH", "X-Idempotency-Key", false, []int{503, 200}, 2},
		{"POST", "", true, []int{503, 503, 200}, 3},
		{"PATCH", "", true, []int{502, 200}, 2},
		{"GET", "", false, []int{500, 500, 200}, 2},
		{"PUT", "", false, []int{500, 503, 200}, 3},
		{"POST", "Idempotency-Key", false, []int{500, 200}, 1},
		{"GET", "", false, []int{404, 200}, 1},
		{"GET", "", false, []int{401, 200}, 1},
		{"GET", "", false, []int{501, 200}, 1},
		{"GET", "", false, []int{505, 200}, 1},
		{"GET", "", false, []int{302, 200}, 1},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s-%s-%v-%v", c.method, c.key, c.auto, c.codes)
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &hc3RT{answer: hc3Codes(c.codes...)}
				var opts []httpretry.Option
				if c.auto {
					opts = append(opts, httpretry.WithAutoIdempotencyKey())
				}
				tr := hc3Transport(t, base, opts...)
				req, _ := http.NewRequest(c.method, "http://h.example/x", strings.NewReader("payload"))
				if c.key != "" {
					req.Header.Set(c.key, "k-1")
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if got := base.n(); got != c.want {
					t.Errorf("attempts = %d, want %d", got, c.want)
				}
				var keys []string
				for i, s := range base.sent {
					if s.body != "payload" {
						t.Errorf("attempt %d body %q", i+1, s.body)
					}
					if i > 0 {
						if v := s.header.Get(wire.AttemptHeader); v != fmt.Sprint(i+1) {
							t.Errorf("attempt %d header %q", i+1, v)
						}
					} else if _, ok := s.header[wire.AttemptHeader]; ok {
						t.Errorf("first attempt carries %s", wire.AttemptHeader)
					}
					k := s.header.Get("Idempotency-Key")
					if k == "" {
						k = s.header.Get("X-Idempotency-Key")
					}
					keys = append(keys, k)
				}
				if c.auto || c.key != "" {
					for _, k := range keys {
						if k == "" || k != keys[0] {
							t.Errorf("keys %q", keys)
						}
					}
					if ik := httpretry.IdempotencyKey(resp, nil); ik == "" || ik != keys[0] {
						t.Errorf("IdempotencyKey = %q, sent %q", ik, keys)
					}
				}
			})
		})
	}
}

func TestAttackCore3GiveUpHeaderAndBodies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(503, 502, 504)}
		tr := hc3Transport(t, base)
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 504 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		v := resp.Header.Get(wire.GiveUpHeader)
		if v != "attempts-exhausted;attempts=3" {
			t.Errorf("give-up %q", v)
		}
		g, ok := wire.ParseGiveUp(v)
		if !ok || g.Attempts != 3 {
			t.Errorf("ParseGiveUp %+v %v", g, ok)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "body-3" {
			t.Errorf("body %q", b)
		}
		resp.Body.Close()
		for i, zb := range base.bodies {
			if !zb.closed.Load() {
				t.Errorf("body %d not closed", i+1)
			}
			if i < 2 && zb.read.Load() != int64(len("body-1")) {
				t.Errorf("body %d drained %d", i+1, zb.read.Load())
			}
		}
	})
}

// The body of the failure handed back and those discarded before: all closed
// by the time the caller closes its own.
func TestAttackCore3DiscardedBodiesClosedBeforeRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var base *hc3RT
		base = &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
			base.mu.Lock()
			for i, b := range base.bodies {
				if !b.closed.Load() {
					t.Errorf("attempt %d sent while body %d open", n, i+1)
				}
			}
			base.mu.Unlock()
			if n < 3 {
				return hc3Resp(503, strings.Repeat("x", 100)), nil
			}
			return hc3Resp(200, "ok"), nil
		}}
		tr := hc3Transport(t, base)
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	})
}

func TestAttackCore3BufferBodiesBound(t *testing.T) {
	const bound = 10
	for _, tc := range []struct {
		name string
		body string
		cl   int64
		want int
	}{
		{"under-chunked", "123456789", -1, 3},
		{"at-chunked", "1234567890", -1, 3},
		{"over-chunked", "12345678901", -1, 1},
		{"at-cl", "1234567890", 10, 3},
		{"over-cl", "12345678901", 11, 1},
		{"empty-cl0", "", 0, 3},
		{"under-cl0-unknown", "abc", 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &hc3RT{answer: hc3Codes(503, 503, 503)}
				tr := hc3Transport(t, base, httpretry.WithBufferBodies(bound))
				rb := &closeTrack{Reader: strings.NewReader(tc.body)}
				req, _ := http.NewRequest("PUT", "http://h.example/x", nil)
				req.Body = rb
				req.ContentLength = tc.cl
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if base.n() != tc.want {
					t.Errorf("attempts %d want %d", base.n(), tc.want)
				}
				for i, s := range base.sent {
					if s.body != tc.body {
						t.Errorf("attempt %d body %q want %q", i+1, s.body, tc.body)
					}
				}
				if rb.closed.Load() == 0 {
					t.Errorf("caller's body not closed")
				}
				if tc.want == 1 {
					if g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); g.Reason != "not-retryable" {
						t.Errorf("give-up %q", resp.Header.Get(wire.GiveUpHeader))
					}
				}
			})
		})
	}
}

type errAfter struct {
	data   []byte
	err    error
	closed atomic.Int32
}

func (e *errAfter) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, e.err
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	return n, nil
}
func (e *errAfter) Close() error { e.closed.Add(1); return nil }

func TestAttackCore3BufferBodyErrorsMidRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(200)}
		tr := hc3Transport(t, base, httpretry.WithBufferBodies(100))
		boom := errors.New("boom")
		rb := &errAfter{data: []byte("abc"), err: boom}
		req, _ := http.NewRequest("PUT", "http://h.example/x", nil)
		req.Body = rb
		req.ContentLength = -1
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
			t.Fatalf("got a response %d", resp.StatusCode)
		}
		if !errors.Is(err, boom) {
			t.Errorf("err = %v, want wrapping boom", err)
		}
		if rb.closed.Load() == 0 {
			t.Errorf("body not closed")
		}
		if base.n() != 0 {
			t.Errorf("sends %d", base.n())
		}
	})
}

// A body without GetBody, not buffered: sent once; a GET with such a body
// gets one attempt.
func TestAttackCore3NoGetBodySentOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(503, 200)}
		tr := hc3Transport(t, base)
		rb := &closeTrack{Reader: strings.NewReader("abc")}
		req, _ := http.NewRequest("PUT", "http://h.example/x", nil)
		req.Body = rb
		req.ContentLength = 3
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.n() != 1 || resp.StatusCode != 503 {
			t.Errorf("attempts %d status %d", base.n(), resp.StatusCode)
		}
		if rb.closed.Load() == 0 {
			t.Errorf("body not closed")
		}
		// http.NoBody: replayable
		base2 := &hc3RT{answer: hc3Codes(503, 200)}
		tr2 := hc3Transport(t, base2)
		req2, _ := http.NewRequest("PUT", "http://h.example/x", http.NoBody)
		resp2, err := tr2.RoundTrip(req2)
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if base2.n() != 2 || resp2.StatusCode != 200 {
			t.Errorf("NoBody: attempts %d status %d", base2.n(), resp2.StatusCode)
		}
	})
}

func TestAttackCore3RefreshOn401(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
			if r.Header.Get("Authorization") != "Bearer new" {
				return hc3Resp(401, "no"), nil
			}
			if n < 4 {
				return hc3Resp(503, "later"), nil
			}
			return hc3Resp(200, "ok"), nil
		}}
		var calls atomic.Int32
		tr := hc3Transport(t, base, httpretry.WithRetry(retry.WithMaxAttempts(3)), httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			calls.Add(1)
			if r.Body != nil && r.Body != http.NoBody {
				t.Errorf("hook request has a body")
			}
			r.Header.Set("Authorization", "Bearer new")
			return r, nil
		}))
		req, _ := http.NewRequest("PUT", "http://h.example/x", strings.NewReader("payload"))
		req.Header.Set("Authorization", "Bearer old")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("status %d", resp.StatusCode)
		}
		if calls.Load() != 1 {
			t.Errorf("refresh calls %d", calls.Load())
		}
		if req.Header.Get("Authorization") != "Bearer old" {
			t.Errorf("caller's request modified")
		}
		wantAttempt := []string{"", "", "2", "3"}
		for i, s := range base.sent {
			if s.body != "payload" {
				t.Errorf("send %d body %q", i+1, s.body)
			}
			if got := s.header.Get(wire.AttemptHeader); i < len(wantAttempt) && got != wantAttempt[i] {
				t.Errorf("send %d attempt header %q want %q", i+1, got, wantAttempt[i])
			}
		}
		if base.n() != 4 {
			t.Errorf("sends %d", base.n())
		}
		for i, zb := range base.bodies {
			if !zb.closed.Load() {
				t.Errorf("body %d open", i+1)
			}
		}
	})
}

// 401 twice: the refresh is once per RoundTrip; the second 401 is returned.
func TestAttackCore3RefreshOnceThen401(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(401, 401, 200)}
		var calls atomic.Int32
		tr := hc3Transport(t, base, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			calls.Add(1)
			return r, nil
		}))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || string(b) != "body-2" || calls.Load() != 1 || base.n() != 2 {
			t.Errorf("status %d body %q calls %d sends %d", resp.StatusCode, b, calls.Load(), base.n())
		}
		if resp.Header.Get(wire.GiveUpHeader) != "" {
			t.Errorf("give-up on a 401: %q", resp.Header.Get(wire.GiveUpHeader))
		}
	})
}

func TestAttackCore3MaxHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(200)}
		tr, err := httpretry.NewTransport(base, httpretry.WithMaxHosts(2))
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
		if len(hs) != 2 {
			t.Errorf("hosts %d: %v", len(hs), keysOf(hs))
		}
		if _, ok := hs["a.example"]; ok {
			t.Errorf("a.example (first in) kept: %v", keysOf(hs))
		}
		if _, ok := hs["c.example"]; !ok {
			t.Errorf("c.example missing: %v", keysOf(hs))
		}
		// the map is the caller's
		delete(hs, "c.example")
		if _, ok := tr.Hosts()["c.example"]; !ok {
			t.Errorf("Hosts map shared")
		}
		for _, n := range []int{0, -1} {
			if _, err := httpretry.NewTransport(base, httpretry.WithMaxHosts(n)); err == nil {
				t.Errorf("WithMaxHosts(%d) accepted", n)
			}
		}
	})
}

func keysOf(m map[string]retry.Guards) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// The timeout field: the earlier of attempt timeout and deadline.
func TestAttackCore3TimeoutsField(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(503, 503, 200)}
		tr := hc3Transport(t, base, httpretry.WithTimeout(10*time.Second), httpretry.WithAttemptTimeout(2*time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for i, s := range base.sent {
			v := s.header.Get(wire.TimeoutHeader)
			if v != "2000" && v != "1999" {
				t.Errorf("send %d timeout %q", i+1, v)
			}
		}
	})
}

// The request's context deadline earlier than WithTimeout and the attempt
// timeout: the field says the context's time left.
func TestAttackCore3TimeoutsFieldCtxEarliest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: hc3Codes(200)}
		tr := hc3Transport(t, base, httpretry.WithTimeout(10*time.Second), httpretry.WithAttemptTimeout(2*time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if v := base.sent[0].header.Get(wire.TimeoutHeader); v != "500" && v != "499" {
			t.Errorf("timeout %q", v)
		}
	})
}

// Attempt timeout: a hung attempt is retried; WithTimeout ends the call.
func TestAttackCore3AttemptTimeoutRetriedThenDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}}
		tr := hc3Transport(t, base, httpretry.WithTimeout(3500*time.Millisecond), httpretry.WithAttemptTimeout(time.Second),
			httpretry.WithRetry(retry.WithMaxAttempts(10)))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			t.Fatal("response")
		}
		el := time.Since(start)
		var re *retry.Error
		if !errors.As(err, &re) {
			t.Fatalf("err %v", err)
		}
		if el > 3500*time.Millisecond {
			t.Errorf("elapsed %v past WithTimeout", el)
		}
		if base.n() < 3 {
			t.Errorf("attempts %d", base.n())
		}
		t.Logf("err %v attempts %d elapsed %v reason %v", err, base.n(), el, re.Reason)
	})
}

// The don't-retry signal on every retryable status.
func TestAttackCore3DontRetrySignal(t *testing.T) {
	for _, code := range []int{408, 429, 500, 502, 503, 504} {
		for _, val := range []string{"no", " NO\t", "No"} {
			synctest.Test(t, func(t *testing.T) {
				base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
					return hc3Resp(code, "x", "Stormguard-Retry", val), nil
				}}
				tr := hc3Transport(t, base)
				req, _ := http.NewRequest("GET", "http://h.example/x", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if base.n() != 1 {
					t.Errorf("code %d value %q: attempts %d", code, val, base.n())
				}
			})
		}
	}
}

// Concurrency: many goroutines over one transport, mixed outcomes, -race.
func TestAttackCore3Concurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cnt atomic.Int64
		base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
			switch cnt.Add(1) % 4 {
			case 0:
				return nil, errors.New("connection reset by peer")
			case 1:
				return hc3Resp(503, "x"), nil
			}
			return hc3Resp(200, "ok"), nil
		}}
		tr, err := httpretry.NewTransport(base, httpretry.WithBufferBodies(64), httpretry.WithAutoIdempotencyKey(),
			httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) { return r, nil }))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				host := fmt.Sprintf("h%d.example", i%3)
				req, _ := http.NewRequest("POST", "http://"+host+"/", nil)
				req.Body = io.NopCloser(bytes.NewReader([]byte("abc")))
				resp, err := tr.RoundTrip(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				_ = tr.Hosts()
			})
		}
		wg.Wait()
	})
}

// DOC (WithRefreshOn401): "refresh is called once per RoundTrip with a copy
// of the request that got it (headers deep-copied, no body, its context the
// attempt's: bounded by WithTimeout and the attempt timeout". With
// WithAttemptTimeout(1s) alone, the hook's context has no deadline at all.
func TestAttackCore3RefreshHookCtxHasAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		base := &hc3RT{answer: hc3Codes(401, 200)}
		var hookDeadline time.Time
		var hookHas bool
		tr := hc3Transport(t, base, httpretry.WithAttemptTimeout(time.Second),
			httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
				hookDeadline, hookHas = r.Context().Deadline()
				r.Header.Set("Authorization", "new")
				return r, nil
			}))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !hookHas || hookDeadline.Sub(start) > time.Second {
			t.Errorf("WithAttemptTimeout(1s): hook context has deadline %v, at %v from start; want one within the attempt's 1s", hookHas, hookDeadline.Sub(start))
		}
	})
}

// A hook that hangs (a token endpoint that does not answer) under
// WithAttemptTimeout(1s) only: bounded by the attempt timeout, per the doc,
// the call should end after about 1 s; it hangs until the hook gives up.
func TestAttackCore3RefreshHookHangsPastAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		base := &hc3RT{answer: hc3Codes(401, 200)}
		tr := hc3Transport(t, base, httpretry.WithAttemptTimeout(time.Second),
			httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
				select {
				case <-r.Context().Done():
					return nil, r.Context().Err()
				case <-time.After(time.Hour):
					r.Header.Set("Authorization", "late")
					return r, nil
				}
			}))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			resp.Body.Close()
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("WithAttemptTimeout(1s): RoundTrip with a hanging refresh hook took %v (err %v), want about 1s", el, err)
		}
	})
}

// DOC (WithRefreshOn401): "The transport then sends the returned request
// once more ... as part of the same attempt"; WithAttemptTimeout: "caps each
// attempt at d". The 401 comes at 0.9 s; the resend gets a fresh 1 s (and
// tells the server Stormguard-Timeout-Ms: 1000), so the attempt runs 1.9 s.
func TestAttackCore3RefreshResendWithinAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
			if n == 1 {
				time.Sleep(900 * time.Millisecond)
				return hc3Resp(401, "no"), nil
			}
			select {
			case <-r.Context().Done():
				return nil, r.Context().Err()
			case <-time.After(5 * time.Second):
				return hc3Resp(200, "ok"), nil
			}
		}}
		tr := hc3Transport(t, base, httpretry.WithAttemptTimeout(time.Second),
			httpretry.WithRetry(retry.WithMaxAttempts(1)),
			httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
				r.Header.Set("Authorization", "new")
				return r, nil
			}))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		el := time.Since(start)
		if resp != nil {
			resp.Body.Close()
		}
		if el > time.Second {
			var ts []string
			for _, s := range base.sent {
				ts = append(ts, s.header.Get(wire.TimeoutHeader)+"@"+s.ctxDeadline.Sub(start).String())
			}
			t.Errorf("one attempt with WithAttemptTimeout(1s) ran %v (err %v); sends' timeout field@deadline: %q", el, err, ts)
		}
	})
}

func TestAttackCore3NetworkErrors(t *testing.T) {
	for _, tc := range []struct {
		method, key string
		want        int
	}{
		{"GET", "", 3}, {"DELETE", "", 3}, {"POST", "", 1}, {"POST", "k", 3}, {"PATCH", "", 1},
	} {
		synctest.Test(t, func(t *testing.T) {
			reset := errors.New("read tcp: connection reset by peer")
			base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) { return nil, reset }}
			tr := hc3Transport(t, base)
			req, _ := http.NewRequest(tc.method, "http://h.example/x", strings.NewReader("b"))
			if tc.key != "" {
				req.Header.Set("Idempotency-Key", tc.key)
			}
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				t.Fatal("response")
			}
			var re *retry.Error
			if !errors.As(err, &re) || !errors.Is(err, reset) {
				t.Errorf("%s: err %v", tc.method, err)
			}
			if base.n() != tc.want {
				t.Errorf("%s key %q: attempts %d want %d (err %v)", tc.method, tc.key, base.n(), tc.want, err)
			}
			for i, s := range base.sent {
				if i > 0 && s.header.Get(wire.AttemptHeader) != fmt.Sprint(i+1) {
					t.Errorf("attempt header %q", s.header.Get(wire.AttemptHeader))
				}
				if s.body != "b" {
					t.Errorf("body %q", s.body)
				}
			}
		})
	}
}

func TestAttackCore3CallerCancelNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		base := &hc3RT{answer: func(n int, r *http.Request) (*http.Response, error) {
			cancel()
			return nil, r.Context().Err()
		}}
		tr := hc3Transport(t, base)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, context.Canceled) || base.n() != 1 {
			t.Errorf("resp %v err %v attempts %d", resp, err, base.n())
		}
	})
}
