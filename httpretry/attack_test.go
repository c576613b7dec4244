// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package httpretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
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
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// atkBody counts closes.
type atkBody struct {
	r      io.Reader
	closed atomic.Int32
}

func (b *atkBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *atkBody) Close() error               { b.closed.Add(1); return nil }

// atkBase answers with statuses in turn, recording bodies and requests.
type atkBase struct {
	mu     sync.Mutex
	codes  []int
	hdrs   []http.Header
	bodies []*atkBody
	reqs   []*http.Request
	sent   [][]byte
}

func (b *atkBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var sent []byte
	if r.Body != nil {
		sent, _ = io.ReadAll(r.Body)
		r.Body.Close()
	}
	b.sent = append(b.sent, sent)
	i := len(b.reqs)
	b.reqs = append(b.reqs, r)
	code := b.codes[min(i, len(b.codes)-1)]
	h := http.Header{}
	if i < len(b.hdrs) && b.hdrs[i] != nil {
		h = b.hdrs[i].Clone()
	}
	bd := &atkBody{r: strings.NewReader(fmt.Sprintf("body %d", i))}
	b.bodies = append(b.bodies, bd)
	return &http.Response{StatusCode: code, Header: h, Body: bd, Request: r, ContentLength: -1}, nil
}

func zeroBackoff(t *testing.T) httpretry.Option {
	b, err := backoff.New(backoff.Config{Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return httpretry.WithRetry(retry.WithBackoff(b))
}

func TestAttackStatusTable(t *testing.T) {
	cases := []struct {
		method string
		key    bool
		code   int
		hdr    http.Header
		want   int
	}{
		{"GET", false, 408, nil, 3},
		{"GET", false, 429, nil, 3},
		{"GET", false, 502, nil, 3},
		{"GET", false, 503, nil, 3},
		{"GET", false, 504, nil, 3},
		{"GET", false, 500, nil, 2},
		{"PUT", false, 500, nil, 2},
		{"DELETE", false, 503, nil, 3},
		{"OPTIONS", false, 503, nil, 3},
		{"TRACE", false, 503, nil, 3},
		{"HEAD", false, 503, nil, 3},
		{"POST", false, 503, nil, 1},
		{"PATCH", false, 503, nil, 1},
		{"POST", true, 503, nil, 3},
		{"POST", true, 500, nil, 1},
		{"POST", true, 409, http.Header{"Retry-After": {"1"}}, 3},
		{"POST", false, 409, http.Header{"Retry-After": {"1"}}, 1},
		{"GET", true, 409, http.Header{"Retry-After": {"1"}}, 3},
		{"POST", true, 409, nil, 1},
		{"GET", false, 401, nil, 1},
		{"GET", false, 404, nil, 1},
		{"GET", false, 501, nil, 1},
		{"GET", false, 503, http.Header{"Stormguard-Retry": {"no"}}, 1},
		{"GET", false, 200, nil, 1},
		{"GET", false, 302, nil, 1},
		{"GET", false, 103, nil, 1},
	}
	for _, tc := range cases {
		name := fmt.Sprintf("%s-key%v-%d-%v", tc.method, tc.key, tc.code, tc.hdr)
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hs := make([]http.Header, 5)
				for i := range hs {
					hs[i] = tc.hdr
				}
				base := &atkBase{codes: []int{tc.code}, hdrs: hs}
				tr, err := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithBudget(nil), httpretry.WithBreaker(nil))
				if err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequest(tc.method, "http://h.example/x", strings.NewReader("payload"))
				if tc.key {
					req.Header.Set("Idempotency-Key", "k1")
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("err %v", err)
				}
				if len(base.reqs) != tc.want {
					t.Errorf("attempts %d, want %d", len(base.reqs), tc.want)
				}
				if resp.StatusCode != tc.code {
					t.Errorf("status %d", resp.StatusCode)
				}
				b, _ := io.ReadAll(resp.Body)
				if want := fmt.Sprintf("body %d", len(base.reqs)-1); string(b) != want {
					t.Errorf("body %q want %q", b, want)
				}
				resp.Body.Close()
				for i, bd := range base.bodies {
					if bd.closed.Load() == 0 {
						t.Errorf("body %d not closed", i)
					}
				}
				for i, s := range base.sent {
					if tc.method != "GET" && string(s) != "payload" {
						_ = i
					}
					if string(s) != "payload" {
						t.Errorf("attempt %d sent %q", i, s)
					}
				}
				if tc.want == 3 {
					g := resp.Header.Get(wire.GiveUpHeader)
					if !strings.HasPrefix(g, "attempts-exhausted;attempts=3") {
						t.Errorf("give-up header %q", g)
					}
				}
			})
		})
	}
}

var (
	_ = bytes.NewReader
	_ = context.Background
	_ = errors.Is
	_ = httptest.NewServer
	_ = time.Second
	_ = limit.New
)

// atkTimedBase records when each request arrives.
type atkTimedBase struct {
	atkBase
	at []time.Time
}

func (b *atkTimedBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.at = append(b.at, time.Now())
	b.mu.Unlock()
	return b.atkBase.RoundTrip(r)
}

func TestAttackRetryAfterFloor(t *testing.T) {
	now0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	_ = now0
	cases := []struct {
		name    string
		code    int
		ra      func(time.Time) string
		timeout time.Duration
		want    int           // attempts
		gap     time.Duration // between first and second attempt
	}{
		{"503-2s", 503, func(time.Time) string { return "2" }, 0, 3, 2 * time.Second},
		{"429-3s", 429, func(time.Time) string { return "3" }, 0, 3, 3 * time.Second},
		{"503-date", 503, func(n time.Time) string { return n.Add(5 * time.Second).UTC().Format(http.TimeFormat) }, 0, 3, 5 * time.Second},
		{"503-past-deadline", 503, func(time.Time) string { return "5" }, time.Second, 1, 0},
		{"503-over-max", 503, func(time.Time) string { return "61" }, 0, 1, 0},
		{"503-at-max", 503, func(time.Time) string { return "60" }, 0, 3, 60 * time.Second},
		{"503-huge", 503, func(time.Time) string { return "99999999999999999999999" }, 0, 1, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkTimedBase{}
				base.codes = []int{tc.code}
				for i := 0; i < 5; i++ {
					base.hdrs = append(base.hdrs, http.Header{"Retry-After": {tc.ra(time.Now())}})
				}
				opts := []httpretry.Option{zeroBackoff(t), httpretry.WithBudget(nil), httpretry.WithBreaker(nil)}
				if tc.timeout > 0 {
					opts = append(opts, httpretry.WithTimeout(tc.timeout))
				}
				tr, _ := httpretry.NewTransport(base, opts...)
				req, _ := http.NewRequest("GET", "http://h.example/x", nil)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if len(base.at) != tc.want {
					t.Fatalf("attempts %d want %d (give-up %q)", len(base.at), tc.want, resp.Header.Get(wire.GiveUpHeader))
				}
				if tc.want > 1 {
					if g := base.at[1].Sub(base.at[0]); g != tc.gap {
						t.Errorf("gap %v want %v", g, tc.gap)
					}
				} else if el := time.Since(start); el != 0 {
					t.Errorf("gave up after %v, want at once", el)
				}
				if tc.want == 1 && resp.Header.Get(wire.GiveUpHeader) == "" {
					t.Errorf("no give-up header")
				}
				t.Logf("give-up: %q", resp.Header.Get(wire.GiveUpHeader))
			})
		})
	}
}

// atkStallBase answers 200 with headers at once, and a body whose Read blocks
// until the request's context ends.
type atkStallBase struct {
	mu    sync.Mutex
	reqs  []*http.Request
	code  int
	after time.Duration // if >0 the body delivers data after this long instead
}

type atkCtxBody struct {
	ctx   context.Context
	after time.Duration
	done  bool
}

func (b *atkCtxBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	var tc <-chan time.Time
	if b.after > 0 {
		tc = time.After(b.after)
	}
	select {
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	case <-tc:
		b.done = true
		return copy(p, "ok"), nil
	}
}
func (b *atkCtxBody) Close() error { return nil }

func (b *atkStallBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.reqs = append(b.reqs, r)
	b.mu.Unlock()
	code := b.code
	if code == 0 {
		code = 200
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: &atkCtxBody{ctx: r.Context(), after: b.after}, Request: r}, nil
}

func TestAttackAttemptTimeoutCoversBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkStallBase{}
		tr, _ := httpretry.NewTransport(base, httpretry.WithAttemptTimeout(2*time.Second))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(resp.Body)
		if el := time.Since(start); el != 2*time.Second || err == nil {
			t.Errorf("body read ended after %v with %v, want 2s and an error", el, err)
		}
		resp.Body.Close()
		if v := base.reqs[0].Header.Get(wire.TimeoutHeader); v != "2000" {
			t.Errorf("timeout header %q", v)
		}
	})
}

func TestAttackTimeoutCoversBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkStallBase{}
		tr, _ := httpretry.NewTransport(base, httpretry.WithTimeout(3*time.Second))
		req, _ := http.NewRequest("GET", "http://h.example/x", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(resp.Body)
		if el := time.Since(start); el != 3*time.Second || err == nil {
			t.Errorf("body read ended after %v with %v, want 3s and an error", el, err)
		}
		resp.Body.Close()
		if v := base.reqs[0].Header.Get(wire.TimeoutHeader); v != "3000" {
			t.Errorf("timeout header %q", v)
		}
	})
}

func TestAttackTimeoutHeaderEarlier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkStallBase{after: time.Millisecond}
		tr, _ := httpretry.NewTransport(base, httpretry.WithAttemptTimeout(5*time.Second), httpretry.WithTimeout(10*time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if v := base.reqs[0].Header.Get(wire.TimeoutHeader); v != "1500" {
			t.Errorf("timeout header %q want 1500", v)
		}
		if req.Header.Get(wire.TimeoutHeader) != "" {
			t.Errorf("caller's request modified")
		}
	})
}

// atkGateBase blocks each request until released through gate (or its
// context ends); it records arrival order by the X-N header.
type atkGateBase struct {
	mu             sync.Mutex
	order          []string
	gate           chan struct{}
	code           int
	inFlight, peak atomic.Int32
}

func (b *atkGateBase) RoundTrip(r *http.Request) (*http.Response, error) {
	n := b.inFlight.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	defer b.inFlight.Add(-1)
	if r.Body != nil {
		io.ReadAll(r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	b.order = append(b.order, r.Header.Get("X-N"))
	b.mu.Unlock()
	if b.gate != nil {
		select {
		case <-b.gate:
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	code := b.code
	if code == 0 {
		code = 200
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
}

func TestAttackLimitNoWaitingRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkGateBase{gate: make(chan struct{})}
		var fb atomic.Int32
		tr, err := httpretry.NewTransport(base, httpretry.WithLimit(&limit.Config{Max: 1, Waiting: -1}),
			httpretry.WithFallback(func(r *http.Request, re *retry.Error) (*http.Response, error) {
				fb.Add(1)
				return nil, re
			}))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			req, _ := http.NewRequest("GET", "http://h.example/1", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		bd := &atkBody{r: strings.NewReader("x")}
		req, _ := http.NewRequest("PUT", "http://h.example/2", nil)
		req.Body = bd
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("x")), nil }
		_, err = tr.RoundTrip(req)
		if !errors.Is(err, retry.Limited) || !errors.Is(err, limit.ErrLimited) {
			t.Errorf("err %v, want Limited", err)
		}
		if bd.closed.Load() == 0 {
			t.Errorf("request body not closed")
		}
		if fb.Load() != 1 {
			t.Errorf("fallback called %d times", fb.Load())
		}
		base.mu.Lock()
		if len(base.order) != 1 {
			t.Errorf("sent %d", len(base.order))
		}
		base.mu.Unlock()
		close(base.gate)
	})
}

func TestAttackLimitSlotUntilHeaders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkStallBase{} // headers at once, body stalls
		tr, _ := httpretry.NewTransport(base, httpretry.WithLimit(&limit.Config{Max: 1, Waiting: -1}))
		req, _ := http.NewRequest("GET", "http://h.example/1", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		// body still unread: the slot should be free
		req2, _ := http.NewRequest("GET", "http://h.example/2", nil)
		resp2, err := tr.RoundTrip(req2)
		if err != nil {
			t.Fatalf("second request refused while first's body unread: %v", err)
		}
		resp2.Body.Close()
		resp.Body.Close()
	})
}

func TestAttackLimitEDFThroughTransport(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkGateBase{gate: make(chan struct{})}
		tr, _ := httpretry.NewTransport(base, httpretry.WithLimit(&limit.Config{Max: 1}), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
		var wg sync.WaitGroup
		do := func(n string, d time.Duration) {
			defer wg.Done()
			ctx := context.Background()
			if d > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, d)
				defer cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/"+n, nil)
			req.Header.Set("X-N", n)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("%s: %v", n, err)
				return
			}
			resp.Body.Close()
		}
		wg.Add(1)
		go do("first", 0)
		synctest.Wait()
		for _, c := range []struct {
			n string
			d time.Duration
		}{{"open1", 0}, {"d30", 30 * time.Second}, {"d10", 10 * time.Second}, {"open2", 0}, {"d20", 20 * time.Second}} {
			wg.Add(1)
			go do(c.n, c.d)
			synctest.Wait()
		}
		for i := 0; i < 6; i++ {
			base.gate <- struct{}{}
			synctest.Wait()
		}
		wg.Wait()
		want := "first,d10,d20,d30,open1,open2"
		if got := strings.Join(base.order, ","); got != want {
			t.Errorf("order %s want %s", got, want)
		}
	})
}

// A request that carries its own key under a non-canonical spelling (sent
// as written by net/http, read as Idempotency-Key by the server) must not
// get a second key of the transport's.
func TestAttackAutoKeyNonCanonicalOwnKey(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(fmt.Sprint(r.Header.Values("Idempotency-Key")))
		w.WriteHeader(201)
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(nil, httpretry.WithAutoIdempotencyKey())
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
	req.Header["idempotency-key"] = []string{"mine"}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := got.Load().(string); g != "[mine]" {
		t.Errorf("server saw Idempotency-Key %s, want [mine]; IdempotencyKey()=%q", g, httpretry.IdempotencyKey(resp, nil))
	}
}

// A keyed POST under a non-canonical spelling is safe to repeat: the
// server reads the key.
func TestAttackNonCanonicalKeyRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkBase{codes: []int{503, 503, 200}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t))
		req, _ := http.NewRequest("POST", "http://h.example/", strings.NewReader("x"))
		req.Header["idempotency-key"] = []string{"mine"}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.reqs) != 3 {
			t.Errorf("attempts %d, want 3 (a keyed POST)", len(base.reqs))
		}
	})
}

func TestAttackAutoKeySameEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkBase{codes: []int{503, 503, 201}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithAutoIdempotencyKey())
		req, _ := http.NewRequest("POST", "http://h.example/", strings.NewReader("x"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.reqs) != 3 {
			t.Fatalf("attempts %d", len(base.reqs))
		}
		k := base.reqs[0].Header.Get("Idempotency-Key")
		for i, r := range base.reqs {
			if r.Header.Get("Idempotency-Key") != k || k == "" || len(r.Header.Values("Idempotency-Key")) != 1 {
				t.Errorf("attempt %d key %v", i, r.Header.Values("Idempotency-Key"))
			}
		}
		if httpretry.IdempotencyKey(resp, nil) != k {
			t.Errorf("IdempotencyKey %q want %q", httpretry.IdempotencyKey(resp, nil), k)
		}
		if req.Header.Get("Idempotency-Key") != "" {
			t.Errorf("caller's request modified")
		}
		// error path
		base2 := &atkBase{codes: []int{200}}
		tr2, _ := httpretry.NewTransport(atkErrBase{}, zeroBackoff(t), httpretry.WithAutoIdempotencyKey())
		_ = base2
		req2, _ := http.NewRequest("POST", "http://h.example/", strings.NewReader("x"))
		_, err = tr2.RoundTrip(req2)
		if err == nil || httpretry.IdempotencyKey(nil, err) == "" {
			t.Errorf("no key from error %v", err)
		}
	})
}

type atkErrBase struct{}

func (atkErrBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body.Close()
	}
	return nil, io.ErrUnexpectedEOF
}

// atkCountListener counts accepted connections.
type atkConnCounter struct{ n atomic.Int32 }

func TestAttackDiscardedBodiesReuseConnection(t *testing.T) {
	var conns atkConnCounter
	var calls atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%3 != 0 {
			w.WriteHeader(503)
			w.Write(bytes.Repeat([]byte("e"), 10000))
			return
		}
		w.Write([]byte("ok"))
	}))
	srv.Config.ConnState = func(c netConn, s http.ConnState) {
		if s == http.StateNew {
			conns.n.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithBudget(nil))
	for i := 0; i < 5; i++ {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if n := conns.n.Load(); n != 1 {
		t.Errorf("%d connections for 15 requests, want 1", n)
	}
}

type netConn = net.Conn

// A caller's (proxy-forwarded) attempt number or probe mark, under any
// spelling, is not sent: the first attempt carries none.
func TestAttackCallerMarksNonCanonical(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(fmt.Sprint(r.Header.Values(wire.AttemptHeader), r.Header.Values(wire.ProbeHeader)))
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(nil)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header["stormguard-attempt"] = []string{"3"}
	req.Header["stormguard-probe"] = []string{"1"}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := got.Load().(string); g != "[] []" {
		t.Errorf("server saw attempt/probe %s, want none", g)
	}
}

func TestAttackCallerMarksCanonical(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(fmt.Sprint(r.Header.Values(wire.AttemptHeader), r.Header.Values(wire.ProbeHeader)))
	}))
	defer srv.Close()
	tr, _ := httpretry.NewTransport(nil)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set(wire.AttemptHeader, "3")
	req.Header.Set(wire.ProbeHeader, "1")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if g := got.Load().(string); g != "[] []" {
		t.Errorf("server saw attempt/probe %s, want none", g)
	}
	if req.Header.Get(wire.AttemptHeader) != "3" {
		t.Errorf("caller's request modified")
	}
}

func TestAttackMaxHostsFIFO(t *testing.T) {
	base := &atkBase{codes: []int{200}}
	tr, _ := httpretry.NewTransport(base, httpretry.WithMaxHosts(2))
	get := func(h string) {
		req, _ := http.NewRequest("GET", "http://"+h+"/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	get("A.example")
	get("b.example")
	get("a.example")
	get("c.example")
	hs := tr.Hosts()
	if _, ok := hs["a.example"]; ok || len(hs) != 2 {
		t.Errorf("hosts %v: want a.example (first in) forgotten", keys(hs))
	}
	if _, ok := hs["c.example"]; !ok {
		t.Errorf("hosts %v", keys(hs))
	}
	if _, err := httpretry.NewTransport(nil, httpretry.WithMaxHosts(0)); err == nil {
		t.Errorf("WithMaxHosts(0) accepted")
	}
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func TestAttackZeroTransport(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hi")) }))
	defer srv.Close()
	var tr httpretry.Transport
	c := &http.Client{Transport: &tr}
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "hi" || len(tr.Hosts()) != 1 {
		t.Errorf("body %q hosts %v", b, keys(tr.Hosts()))
	}
	g := tr.Hosts()[strings.TrimPrefix(srv.URL, "http://")]
	if g.Limiter == nil || g.Breaker == nil || g.Budget == nil {
		t.Errorf("zero transport guards %+v", g)
	}
}

func TestAttackRefresh401(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkBase{codes: []int{401, 503, 200}}
		var calls atomic.Int32
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithMaxHosts(4), httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			calls.Add(1)
			if r.Body != nil {
				t.Errorf("refresh got a body")
			}
			r.Header.Set("Authorization", "new")
			return r, nil
		}))
		req, _ := http.NewRequest("PUT", "http://h.example/", strings.NewReader("payload"))
		req.Header.Set("Authorization", "old")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || len(base.reqs) != 3 || calls.Load() != 1 {
			t.Fatalf("status %d sends %d refresh %d", resp.StatusCode, len(base.reqs), calls.Load())
		}
		for i, r := range base.reqs {
			want := "new"
			if i == 0 {
				want = "old"
			}
			if r.Header.Get("Authorization") != want || string(base.sent[i]) != "payload" {
				t.Errorf("send %d auth %q body %q", i, r.Header.Get("Authorization"), base.sent[i])
			}
		}
		// the resend after the 401 is the same attempt: the 503's retry is attempt 2
		if v := base.reqs[1].Header.Get(wire.AttemptHeader); v != "" {
			t.Errorf("resend after 401 carries attempt %q, want none (same attempt)", v)
		}
		if v := base.reqs[2].Header.Get(wire.AttemptHeader); v != "2" {
			t.Errorf("retry carries attempt %q, want 2", v)
		}
		if req.Header.Get("Authorization") != "old" {
			t.Errorf("caller's request modified")
		}
		for i, bd := range base.bodies {
			if bd.closed.Load() == 0 {
				t.Errorf("body %d not closed", i)
			}
		}
	})
}

type atkWaiter struct {
	n   atomic.Int32
	err error
}

func (w *atkWaiter) Wait(ctx context.Context) error { w.n.Add(1); return w.err }

func TestAttackRateLimitHook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkBase{codes: []int{503, 503, 200}}
		w := &atkWaiter{}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithRetry(retry.WithRateLimit(w)))
		for _, h := range []string{"a.example", "b.example"} {
			base.reqs = nil
			req, _ := http.NewRequest("GET", "http://"+h+"/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		if w.n.Load() != 6 { // 3 attempts per host
			t.Errorf("Wait called %d times", w.n.Load())
		}
		w2 := &atkWaiter{err: errors.New("no tokens")}
		base2 := &atkBase{codes: []int{200}}
		tr2, _ := httpretry.NewTransport(base2, httpretry.WithRetry(retry.WithRateLimit(w2)))
		bd := &atkBody{r: strings.NewReader("x")}
		req, _ := http.NewRequest("PUT", "http://a.example/", nil)
		req.Body = bd
		_, err := tr2.RoundTrip(req)
		if !errors.Is(err, retry.Deadline) || !errors.Is(err, w2.err) {
			t.Errorf("err %v", err)
		}
		if bd.closed.Load() == 0 || len(base2.reqs) != 0 {
			t.Errorf("body closed %d sends %d", bd.closed.Load(), len(base2.reqs))
		}
	})
}

// atkMixBase: per request, by its X-Kind header: "ok", "503", "err", "hang"
// (until the context ends), "slow" (1 s then 200).
type atkMixBase struct{ sends atomic.Int32 }

func (b *atkMixBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.sends.Add(1)
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	resp := func(code int) *http.Response {
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("b")), Request: r}
	}
	switch r.Header.Get("X-Kind") {
	case "503":
		return resp(503), nil
	case "err":
		return nil, io.ErrUnexpectedEOF
	case "hang":
		<-r.Context().Done()
		return nil, r.Context().Err()
	case "slow":
		select {
		case <-time.After(time.Second):
			return resp(200), nil
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	return resp(200), nil
}

func TestAttackSharedTransportSlotsBalance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkMixBase{}
		tr, _ := httpretry.NewTransport(base, httpretry.WithLimit(&limit.Config{Max: 3}),
			httpretry.WithAttemptTimeout(1500*time.Millisecond), httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
			httpretry.WithAutoIdempotencyKey())
		kinds := []string{"ok", "503", "err", "hang", "slow"}
		var wg sync.WaitGroup
		for i := 0; i < 200; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				var cancel context.CancelFunc = func() {}
				switch i % 4 {
				case 1:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(i)*50*time.Millisecond)
				case 2:
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(time.Duration(i)*7*time.Millisecond, cancel)
				}
				defer cancel()
				method := "GET"
				if i%3 == 0 {
					method = "POST"
				}
				req, _ := http.NewRequestWithContext(ctx, method, "http://h.example/", strings.NewReader("body"))
				req.Header.Set("X-Kind", kinds[i%len(kinds)])
				time.Sleep(time.Duration(i) * 3 * time.Millisecond)
				resp, err := tr.RoundTrip(req)
				if err == nil {
					io.ReadAll(resp.Body)
					resp.Body.Close()
				} else if resp != nil {
					t.Errorf("response with error")
				}
			}()
		}
		wg.Wait()
		synctest.Wait()
		lim := tr.Hosts()["h.example"].Limiter
		in, waiting := lim.SetCap(-1)
		if in != 0 || waiting != 0 {
			t.Errorf("after all requests: %d in flight, %d waiting", in, waiting)
		}
		t.Logf("sends %d limit %d", base.sends.Load(), lim.Limit())
	})
}

// atkSeqBase answers from a function of the send index, recording requests.
type atkSeqBase struct {
	mu   sync.Mutex
	reqs []*http.Request
	at   []time.Time
	f    func(i int, r *http.Request) (*http.Response, error)
}

func (b *atkSeqBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	i := len(b.reqs)
	b.reqs = append(b.reqs, r)
	b.at = append(b.at, time.Now())
	b.mu.Unlock()
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return b.f(i, r)
}

func atkResp(r *http.Request, code int) *http.Response {
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("b")), Request: r}
}

func TestAttackProbeHeaderAfterOpenBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := true
		base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
			if down {
				return atkResp(r, 503), nil
			}
			return atkResp(r, 200), nil
		}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithBudget(nil),
			httpretry.WithBreaker(&breakerConfig{ConsecutiveFailures: 3, OpenFor: time.Second}),
			httpretry.WithRetry(retry.WithMaxAttempts(1)))
		for i := 0; i < 3; i++ {
			req, _ := http.NewRequest("GET", "http://h.example/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		// open now: a request with a deadline waits for the probe round
		down = false
		n0 := len(base.reqs)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.reqs) != n0+1 {
			t.Fatalf("sends %d", len(base.reqs)-n0)
		}
		r := base.reqs[n0]
		if r.Header.Get(wire.ProbeHeader) != "1" {
			t.Errorf("released/probe request without %s (waited %v)", wire.ProbeHeader, time.Since(start))
		}
		if r.Header.Get(wire.TimeoutHeader) == "" {
			t.Errorf("no timeout header")
		}
		if req.Header.Get(wire.ProbeHeader) != "" {
			t.Errorf("caller's request modified")
		}
		// without a deadline: fail fast with CircuitOpen
	})
}

func TestAttackPlainFirstAttemptUnchanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
			if i == 0 {
				return atkResp(r, 503), nil
			}
			return atkResp(r, 200), nil
		}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t))
		req, _ := http.NewRequest("GET", "http://h.example/", nil)
		req.Header.Set("X-A", "1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.reqs[0] != req {
			t.Errorf("first attempt of a plain request is a copy")
		}
		if base.reqs[1] == req || base.reqs[1].Header.Get(wire.AttemptHeader) != "2" || base.reqs[1].Header.Get("X-A") != "1" {
			t.Errorf("retry %v", base.reqs[1].Header)
		}
		if len(req.Header) != 1 {
			t.Errorf("caller's header modified: %v", req.Header)
		}
		// with an attempt timeout every attempt carries the field
		base.reqs = nil
		tr2, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithAttemptTimeout(time.Second))
		req2, _ := http.NewRequest("GET", "http://h.example/", nil)
		resp, err = tr2.RoundTrip(req2)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		for i, r := range base.reqs {
			if r.Header.Get(wire.TimeoutHeader) != "1000" {
				t.Errorf("attempt %d timeout %q", i, r.Header.Get(wire.TimeoutHeader))
			}
		}
	})
}

func TestAttackAttemptTimeoutRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithAttemptTimeout(time.Second), httpretry.WithBudget(nil))
		req, _ := http.NewRequest("GET", "http://h.example/", nil)
		start := time.Now()
		_, err := tr.RoundTrip(req)
		if len(base.reqs) != 3 || !errors.Is(err, retry.AttemptsExhausted) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("sends %d err %v", len(base.reqs), err)
		}
		if el := time.Since(start); el != 3*time.Second {
			t.Errorf("took %v", el)
		}
	})
}

func TestAttackBufferBodiesBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, size := range []int{0, 1, 9, 10, 11, 100} {
			base := &atkBase{codes: []int{503, 503, 200}}
			tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithBufferBodies(10))
			payload := strings.Repeat("p", size)
			cr := &atkCountReader{r: strings.NewReader(payload)}
			req, _ := http.NewRequest("PUT", "http://h.example/", nil)
			req.Body = cr
			req.ContentLength = -1
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			want := 3
			if size > 10 {
				want = 1
			}
			if len(base.reqs) != want {
				t.Errorf("size %d: sends %d want %d", size, len(base.reqs), want)
			}
			for i, s := range base.sent {
				if string(s) != payload {
					t.Errorf("size %d: send %d body %q", size, i, s)
				}
			}
			if cr.closed == 0 {
				t.Errorf("size %d: body not closed", size)
			}
			if cr.maxAhead > 11 {
				t.Errorf("size %d: read %d ahead", size, cr.maxAhead)
			}
		}
	})
}

type atkCountReader struct {
	r        io.Reader
	n        int
	maxAhead int
	closed   int
}

func (c *atkCountReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
func (c *atkCountReader) Close() error { c.closed++; return nil }

type breakerConfig = breaker.Config

func TestAttackLimitRefusalNoDepositNoOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkGateBase{gate: make(chan struct{})}
		var fb atomic.Int32
		tr, _ := httpretry.NewTransport(base, httpretry.WithLimit(&limit.Config{Max: 1, Waiting: 1}),
			httpretry.WithFallback(func(r *http.Request, re *retry.Error) (*http.Response, error) {
				fb.Add(1)
				return nil, re
			}))
		go func() {
			req, _ := http.NewRequest("GET", "http://h.example/1", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		g := tr.Hosts()["h.example"]
		bs0 := g.Budget.(interface{ Stats() budgetStats }).Stats()
		ss0 := g.Breaker.Snapshot()
		// one waits (canceled), one is refused (waiting full)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/2", nil)
			_, err := tr.RoundTrip(req)
			errc <- err
		}()
		synctest.Wait()
		req, _ := http.NewRequest("GET", "http://h.example/3", nil)
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, retry.Limited) {
			t.Errorf("3: %v", err)
		}
		cancel()
		err2 := <-errc
		if !errors.Is(err2, retry.Canceled) {
			t.Errorf("canceled waiter: %v", err2)
		}
		if fb.Load() != 1 {
			t.Errorf("fallback calls %d, want 1 (the refusal, not the cancel)", fb.Load())
		}
		bs1 := g.Budget.(interface{ Stats() budgetStats }).Stats()
		ss1 := g.Breaker.Snapshot()
		if bs1.Requests != bs0.Requests {
			t.Errorf("budget deposits %d -> %d", bs0.Requests, bs1.Requests)
		}
		if ss1.Calls != ss0.Calls || ss1.Failures != ss0.Failures {
			t.Errorf("breaker %+v -> %+v", ss0, ss1)
		}
		base.gate <- struct{}{}
	})
}

type budgetStats = budget.Stats

func TestAttackIsRetryableDNS(t *testing.T) {
	wrap := func(e error) error {
		return &url.Error{Op: "Get", URL: "http://svc.internal/", Err: &net.OpError{Op: "dial", Net: "tcp", Err: e}}
	}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"no such host", wrap(&net.DNSError{Err: "no such host", Name: "svc.internal", IsNotFound: true}), false},
		{"dns timeout", wrap(&net.DNSError{Err: "i/o timeout", Name: "svc.internal", IsTimeout: true}), true},
		{"dns server misbehaving (SERVFAIL)", wrap(&net.DNSError{Err: "server misbehaving", Name: "svc.internal"}), true},
		{"dns no answer", wrap(&net.DNSError{Err: "no answer from DNS server", Name: "svc.internal"}), true},
		{"reset", wrap(syscallErr("connection reset by peer")), true},
		{"eof", &url.Error{Op: "Get", URL: "http://x/", Err: io.EOF}, true},
		{"canceled", &url.Error{Op: "Get", URL: "http://x/", Err: context.Canceled}, false},
		{"zero status", &httpretry.StatusError{}, false},
		{"404 with hint", &httpretry.StatusError{Code: 404, After: time.Second}, false},
		{"503", &httpretry.StatusError{Code: 503}, true},
		{"plain", errors.New("decode"), false},
		{"gave up", &retry.Error{Reason: retry.AttemptsExhausted, Err: io.EOF}, false},
	}
	for _, c := range cases {
		if got := httpretry.IsRetryable(c.err); got != c.want {
			t.Errorf("%s: IsRetryable(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

type syscallErr string

func (s syscallErr) Error() string { return string(s) }

// The transport retries a GET whose send failed with a DNS error other than
// "no such host" (the table: "any other error without a response ... yes").
func TestAttackTransportRetriesDNSServFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
			if i == 0 {
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "server misbehaving", Name: "h.example"}}
			}
			return atkResp(r, 200), nil
		}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t))
		req, _ := http.NewRequest("GET", "http://h.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("sends %d, err %v", len(base.reqs), err)
		}
		resp.Body.Close()
	})
}

// A zero cfg.Timeout takes WithAttemptTimeout: attempts answered after half
// of it count as drops, so the limit falls instead of growing.
func TestAttackLimitCeilingFromAttemptTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []httpretry.Option
		grow bool
	}{
		{"default limiter, attempt timeout 1s", []httpretry.Option{httpretry.WithAttemptTimeout(time.Second)}, false},
		{"own limiter, attempt timeout 1s", []httpretry.Option{httpretry.WithAttemptTimeout(time.Second), httpretry.WithLimit(&limit.Config{Max: 1000})}, false},
		{"own limiter timeout 10s", []httpretry.Option{httpretry.WithAttemptTimeout(time.Second), httpretry.WithLimit(&limit.Config{Max: 1000, Timeout: 10 * time.Second})}, true},
		{"no attempt timeout", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
					time.Sleep(600 * time.Millisecond)
					return atkResp(r, 200), nil
				}}
				opts := append([]httpretry.Option{httpretry.WithBreaker(nil), httpretry.WithBudget(nil)}, tc.opts...)
				tr, _ := httpretry.NewTransport(base, opts...)
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				for i := 0; i < 100; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for ctx.Err() == nil {
							req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/", nil)
							resp, err := tr.RoundTrip(req)
							if err == nil {
								io.ReadAll(resp.Body)
								resp.Body.Close()
							}
						}
					}()
				}
				time.Sleep(20 * time.Second)
				lim := tr.Hosts()["h.example"].Limiter.Limit()
				cancel()
				wg.Wait()
				t.Logf("limit after 20 s: %d", lim)
				if tc.grow && lim <= 10 || !tc.grow && lim > 10 {
					t.Errorf("limit %d, grow=%v", lim, tc.grow)
				}
			})
		})
	}
}

func TestAttackRetryAfterSpreadFromRand(t *testing.T) {
	for _, r := range []float64{0.5, 0.999} {
		synctest.Test(t, func(t *testing.T) {
			b, _ := backoff.New(backoff.Config{Rand: func() float64 { return r }})
			base := &atkTimedBase{}
			base.codes = []int{503, 200}
			base.hdrs = []http.Header{{"Retry-After": {"2"}}}
			tr, _ := httpretry.NewTransport(base, httpretry.WithRetry(retry.WithBackoff(b)))
			req, _ := http.NewRequest("GET", "http://h.example/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			g := base.at[1].Sub(base.at[0])
			want := 2*time.Second + time.Duration(r*float64(time.Second))
			if g < want-time.Millisecond || g > want+time.Millisecond || g >= 3*time.Second {
				t.Errorf("rand %v: gap %v want ~%v", r, g, want)
			}
		})
	}
}

func TestAttackBreakerCounts(t *testing.T) {
	cases := []struct {
		method   string
		key      bool
		code     int
		hdr      http.Header
		err      bool
		calls    int
		failures int
	}{
		{"POST", false, 503, nil, false, 1, 1},
		{"POST", false, 0, nil, true, 1, 1},
		{"GET", false, 404, nil, false, 1, 0},
		{"GET", false, 401, nil, false, 1, 0},
		{"GET", false, 500, nil, false, 2, 2},
		{"POST", false, 500, nil, false, 1, 1},
		{"POST", true, 409, http.Header{"Retry-After": {"0"}}, false, 3, 3},
		{"POST", false, 409, http.Header{"Retry-After": {"0"}}, false, 1, 0},
		{"GET", false, 503, http.Header{"Stormguard-Retry": {"no"}}, false, 1, 1},
		{"GET", false, 408, nil, false, 3, 3},
		{"GET", false, 501, nil, false, 1, 0},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s-%v-%d-%v-%v", tc.method, tc.key, tc.code, tc.hdr, tc.err), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
					if tc.err {
						return nil, io.ErrUnexpectedEOF
					}
					resp := atkResp(r, tc.code)
					for k, v := range tc.hdr {
						resp.Header[k] = v
					}
					return resp, nil
				}}
				tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithBudget(nil))
				req, _ := http.NewRequest(tc.method, "http://h.example/", strings.NewReader("x"))
				if tc.key {
					req.Header.Set("Idempotency-Key", "k")
				}
				resp, err := tr.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				}
				s := tr.Hosts()["h.example"].Breaker.Snapshot()
				if s.Calls != tc.calls || s.Failures != tc.failures {
					t.Errorf("breaker calls %d failures %d, want %d %d (sends %d)", s.Calls, s.Failures, tc.calls, tc.failures, len(base.reqs))
				}
			})
		})
	}
}

func TestAttackParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	cases := []struct {
		v  string
		d  time.Duration
		ok bool
	}{
		{"", 0, false},
		{"   ", 0, false},
		{" 5 ", 5 * time.Second, true},
		{"\t7\r\n", 7 * time.Second, true},
		{"0", 0, true},
		{"007", 7 * time.Second, true},
		{"+5", 0, false},
		{"-5", 0, false},
		{"5.5", 0, false},
		{"1e3", 0, false},
		{"５", 0, false},
		{"9223372036854775807", time.Duration(1<<63 - 1), true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", time.Duration(1<<63 - 1), true},
		{"9223372035", 9223372035 * time.Second, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-90 * time.Second).Format(http.TimeFormat), 0, true},
		{now.Format(http.TimeFormat), 0, true},
		{now.Add(30 * time.Second).Format(time.RFC850), 30 * time.Second, true},
		{now.Add(30 * time.Second).Format(time.ANSIC), 30 * time.Second, true},
		{"Wed, 02 Dec 2026 12:00:30 +0000", 0, false},
		{"Fri, 31 Dec 9999 23:59:59 GMT", time.Duration(1<<63 - 1), true},
		{"Mon, 01 Jan 0001 00:00:00 GMT", 0, true},
	}
	for _, c := range cases {
		d, ok := httpretry.ParseRetryAfter(c.v, now)
		if d != c.d || ok != c.ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", c.v, d, ok, c.d, c.ok)
		}
		if d < 0 {
			t.Errorf("negative")
		}
	}
}

func TestAttackEvictionUnderLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkMixBase{}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithMaxHosts(3), httpretry.WithLimit(&limit.Config{Max: 2}))
		var wg sync.WaitGroup
		for i := 0; i < 60; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; j < 20; j++ {
					req, _ := http.NewRequest("GET", fmt.Sprintf("http://h%d.example/", (i+j)%10), nil)
					req.Header.Set("X-Kind", []string{"ok", "503", "slow"}[(i*j)%3])
					resp, err := tr.RoundTrip(req)
					if err == nil {
						resp.Body.Close()
					}
					_ = tr.Hosts()
				}
			}()
		}
		wg.Wait()
		if n := len(tr.Hosts()); n > 3 {
			t.Errorf("%d hosts kept, max 3", n)
		}
		for h, g := range tr.Hosts() {
			if in, w := g.Limiter.SetCap(-1); in != 0 || w != 0 {
				t.Errorf("%s: in %d waiting %d", h, in, w)
			}
		}
	})
}

func TestAttackBadOptions(t *testing.T) {
	nan := func() float64 { var z float64; return z / z }()
	cases := []struct {
		name string
		opt  httpretry.Option
		want string
	}{
		{"limit max", httpretry.WithLimit(&limit.Config{Max: -1}), "Max"},
		{"limit max big", httpretry.WithLimit(&limit.Config{Max: 1<<30 + 1}), "Max"},
		{"limit timeout", httpretry.WithLimit(&limit.Config{Timeout: -1}), "Timeout"},
		{"limit throttle", httpretry.WithLimit(&limit.Config{Throttle: nan}), "Throttle"},
		{"limit throttle half", httpretry.WithLimit(&limit.Config{Throttle: 0.5}), "Throttle"},
		{"breaker ratio", httpretry.WithBreaker(&breaker.Config{FailureRatio: 2}), "FailureRatio"},
		{"budget", httpretry.WithBudget(&budget.Config{Ratio: 2}), "atio"},
		{"attempts 0", httpretry.WithRetry(retry.WithMaxAttempts(0)), "ttempt"},
		{"attempts -1", httpretry.WithRetry(retry.WithMaxAttempts(-1)), "ttempt"},
		{"backoff nil", httpretry.WithRetry(retry.WithBackoff(nil)), "ackoff"},
		{"max retry-after", httpretry.WithRetry(retry.WithMaxRetryAfter(-1)), "etry"},
		{"timeout", httpretry.WithTimeout(-1), "timeout"},
		{"attempt timeout", httpretry.WithAttemptTimeout(-1), "attempt timeout"},
		{"buffer", httpretry.WithBufferBodies(0), "buffer"},
		{"hosts", httpretry.WithMaxHosts(-5), "hosts"},
		{"guards", httpretry.WithGuards(nil), "guards"},
		{"stale", httpretry.WithStaleCache(0, 0, false), ""},
		{"hedge", httpretry.WithHedging(-1, 0, 0), ""},
		{"hedge q", httpretry.WithHedging(0, 1, 0), ""},
		{"hedge q nan", httpretry.WithHedging(0, nan, 0), ""},
		{"hedge max", httpretry.WithHedging(time.Millisecond, 0, 9), ""},
		{"hedge max neg", httpretry.WithHedging(time.Millisecond, 0, -1), ""},
	}
	for _, c := range cases {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s: panic %v", c.name, r)
				}
			}()
			tr, err := httpretry.NewTransport(nil, c.opt)
			if err == nil || tr != nil {
				t.Errorf("%s: NewTransport = %v, %v; want an error", c.name, tr, err)
				return
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: error %q does not say %q", c.name, err, c.want)
			}
		}()
	}
	// nil ScheduleOption inside WithRetry
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("WithRetry(nil): panic %v", r)
			}
		}()
		_, err := httpretry.NewTransport(nil, httpretry.WithRetry(nil))
		t.Logf("WithRetry(nil): %v", err)
	}()
}

// atkHugeBody is an endless body counting what is read; stall makes every
// Read block until Close.
type atkHugeBody struct {
	mu     sync.Mutex
	read   int64
	stall  bool
	closed chan struct{}
	once   sync.Once
}

func (b *atkHugeBody) Read(p []byte) (int, error) {
	if b.stall {
		<-b.closed
		return 0, errors.New("closed")
	}
	select {
	case <-b.closed:
		return 0, errors.New("closed")
	default:
	}
	b.mu.Lock()
	b.read += int64(len(p))
	b.mu.Unlock()
	return len(p), nil
}
func (b *atkHugeBody) Close() error { b.once.Do(func() { close(b.closed) }); return nil }

// "Bodies of discarded responses are drained (up to 64 KiB, for at most 50
// ms) and closed".
func TestAttackDiscardDrainBounds(t *testing.T) {
	for _, stall := range []bool{false, true} {
		t.Run(fmt.Sprint("stall=", stall), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var first *atkHugeBody
				base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
					if i == 0 {
						first = &atkHugeBody{stall: stall, closed: make(chan struct{})}
						return &http.Response{StatusCode: 503, Header: http.Header{}, Body: first, Request: r, ContentLength: -1}, nil
					}
					return atkResp(r, 200), nil
				}}
				tr, _ := httpretry.NewTransport(base, zeroBackoff(t))
				req, _ := http.NewRequest("GET", "http://h.example/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				gap := base.at[1].Sub(base.at[0])
				first.mu.Lock()
				read := first.read
				first.mu.Unlock()
				t.Logf("discarded body: %d bytes read, retry sent %v after the first attempt", read, gap)
				if read > 64<<10+1 {
					t.Errorf("drained %d bytes of the discarded body, doc says up to 64 KiB", read)
				}
				if gap > 50*time.Millisecond {
					t.Errorf("the discarded body held the retry %v, doc says drained for at most 50 ms", gap)
				}
				select {
				case <-first.closed:
				default:
					t.Errorf("discarded body not closed")
				}
			})
		})
	}
}

// "An attempt holds its slot until its response headers arrive; one
// answered with a failure (a 503, a 429) until its body is read into memory
// too (up to 64 KiB, for at most 50 ms)" (WithLimit). A black-box attack
// found the second part, which the doc did not say: a failed answer whose
// body stalls holds the slot for those 50 ms, and no longer.
func TestAttackLimitSlotHeldWhileFailedBodyRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var first *atkHugeBody
		base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
			if i == 0 {
				first = &atkHugeBody{stall: true, closed: make(chan struct{})}
				return &http.Response{StatusCode: 503, Header: http.Header{}, Body: first, Request: r, ContentLength: -1}, nil
			}
			return atkResp(r, 200), nil
		}}
		tr, _ := httpretry.NewTransport(base, httpretry.WithLimit(&limit.Config{Max: 1}),
			httpretry.WithRetry(retry.WithMaxAttempts(1)), httpretry.WithBreaker(nil), httpretry.WithBudget(nil))
		start := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			req, _ := http.NewRequest("GET", "http://h.example/1", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
		time.Sleep(10 * time.Millisecond) // the 503's headers came at 0
		req, _ := http.NewRequest("GET", "http://h.example/2", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		<-done
		if d := base.at[1].Sub(start); d != 50*time.Millisecond {
			t.Errorf("second request sent at %v, want 50ms: the first attempt's headers arrived at 0 and its stalled body was read for 50 ms", d)
		}
	})
}

// A body that cannot be rewound ends the call with the answer of the
// attempt that failed (GetBody is called as soon as it fails): the breaker
// counts that answer, and the limiter takes no latency sample of 0 s.
func TestAttackGetBodyFailureNotAnAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
			time.Sleep(100 * time.Millisecond)
			return atkResp(r, 503), nil
		}}
		tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithLimit(&limit.Config{Max: 2}), httpretry.WithBudget(nil))
		req, _ := http.NewRequest("PUT", "http://h.example/", strings.NewReader("x"))
		req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("cannot rewind") }
		resp, err := tr.RoundTrip(req)
		if err != nil || resp.StatusCode != 503 || resp.Header.Get(wire.GiveUpHeader) == "" || len(base.reqs) != 1 {
			t.Fatalf("RoundTrip = %v, %v after %d sends; want the 503, given up, after 1 (the package doc: the call ends with that attempt's answer)", resp, err, len(base.reqs))
		}
		resp.Body.Close()
		g := tr.Hosts()["h.example"]
		s := g.Breaker.Snapshot()
		_, _, _, lat, fastest, samples := g.Limiter.SetRate(math.NaN(), 0)
		t.Logf("err %v; breaker calls %d failures %d; limiter samples %d fastest %v sum %v", err, s.Calls, s.Failures, samples, fastest, lat)
		if s.Calls != 1 {
			t.Errorf("breaker counted %d calls for 1 send (the rewind failure counted as the host's answer)", s.Calls)
		}
		if samples != 0 {
			t.Errorf("limiter took %d latency samples (fastest %v) from a call whose only answer was a 503 (a drop) and whose rewind failed before sending", samples, fastest)
		}
	})
}

// The consequence: one rewind failure gives the host's limiter a 0 s
// "fastest answer", and a healthy 10 ms host under load is held far below
// what it takes.
func TestAttackGetBodyFailurePoisonsBaseline(t *testing.T) {
	for _, poison := range []bool{false, true} {
		t.Run(fmt.Sprint("rewind-failure=", poison), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &atkSeqBase{f: func(i int, r *http.Request) (*http.Response, error) {
					time.Sleep(10 * time.Millisecond)
					if r.Method == "PUT" {
						return atkResp(r, 503), nil
					}
					return atkResp(r, 200), nil
				}}
				tr, _ := httpretry.NewTransport(base, zeroBackoff(t), httpretry.WithLimit(&limit.Config{}), httpretry.WithBudget(nil), httpretry.WithBreaker(nil))
				if poison {
					req, _ := http.NewRequest("PUT", "http://h.example/", strings.NewReader("x"))
					req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("cannot rewind") }
					tr.RoundTrip(req)
				}
				ctx, cancel := context.WithCancel(context.Background())
				var wg sync.WaitGroup
				var served atomic.Int64
				for i := 0; i < 400; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for ctx.Err() == nil {
							req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.example/", nil)
							resp, err := tr.RoundTrip(req)
							if err == nil {
								resp.Body.Close()
								served.Add(1)
							}
						}
					}()
				}
				time.Sleep(5 * time.Second)
				lim := tr.Hosts()["h.example"].Limiter.Limit()
				cancel()
				wg.Wait()
				t.Logf("limit after 5 s of 400 callers to a 10 ms host: %d; served %d", lim, served.Load())
				if lim < 200 {
					t.Errorf("limit %d: the host (no queue, 10 ms each) takes the 400 callers", lim)
				}
			})
		})
	}
}
