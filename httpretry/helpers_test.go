package httpretry_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// timeline is an observer that records the sleeps the retry loop chose
// before its retries (the Delay of its Retry events), in order. It passes
// every event on to next, if set. It is safe for concurrent use.
type timeline struct {
	next observe.Observer

	mu     sync.Mutex
	sleeps []time.Duration
}

func (tl *timeline) Observe(ctx context.Context, e observe.Event) {
	if e.Kind == observe.Retry {
		tl.mu.Lock()
		tl.sleeps = append(tl.sleeps, e.Delay)
		tl.mu.Unlock()
	}
	if tl.next != nil {
		tl.next.Observe(ctx, e)
	}
}

// Sleeps returns a copy of the recorded sleeps.
func (tl *timeline) Sleeps() []time.Duration {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.sleeps)
}

// smallBackoff is full jitter with a 1 ms base: every backoff delay is
// below 2 s, so a recorded sleep of 2 s can only come from Retry-After.
func smallBackoff(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 100 * time.Millisecond, Rand: func() float64 { return 0.5 }})
	if err != nil {
		t.Fatalf("backoff.New: %v", err)
	}
	return b
}

// newTransport builds a Transport over base with a small backoff and a
// timeline of its sleeps as its observer (both overridable by opts: a
// test's own observer replaces the timeline).
func newTransport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) (*httpretry.Transport, *timeline) {
	t.Helper()
	tl := &timeline{}
	all := append([]httpretry.Option{httpretry.WithRetry(retry.WithBackoff(smallBackoff(t))), httpretry.WithObserver(tl)}, opts...)
	tr, err := httpretry.NewTransport(base, all...)
	if err != nil {
		t.Fatalf("NewTransport: %v", err)
	}
	return tr, tl
}

// observed is what a test server saw: one entry per request.
type observed struct {
	mu       sync.Mutex
	attempts []string // AttemptHeader values, as attemptValue reads them
	keys     []string // Idempotency-Key values
	bodies   []string
	methods  []string
}

func (o *observed) record(r *http.Request) int {
	b, _ := io.ReadAll(r.Body)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.attempts = append(o.attempts, attemptValue(r.Header))
	o.keys = append(o.keys, r.Header.Get("Idempotency-Key"))
	o.bodies = append(o.bodies, string(b))
	o.methods = append(o.methods, r.Method)
	return len(o.attempts)
}

func (o *observed) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.attempts)
}

func (o *observed) snapshot() (attempts, keys, bodies []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.attempts), slices.Clone(o.keys), slices.Clone(o.bodies)
}

// serve starts a loopback server whose handler gets the request number
// (1 for the first) after the request was recorded.
func serve(t *testing.T, h func(w http.ResponseWriter, r *http.Request, n int)) (*httptest.Server, *observed) {
	t.Helper()
	o := &observed{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, o.record(r))
	}))
	t.Cleanup(srv.Close)
	return srv, o
}

// memServer is a server in memory: its handler runs in the calling
// goroutine, with no socket, so that it can serve a test in a synctest
// bubble (where a socket would keep the bubble from ever idling, and its
// time from moving). Its Client's Transport is the in-memory one.
type memServer struct {
	URL string
	h   http.Handler
}

func (m *memServer) Client() *http.Client { return &http.Client{Transport: memTransport{m.h}} }

// memTransport serves requests with a handler, in memory.
type memTransport struct{ h http.Handler }

func (m memTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		if r.Body != nil {
			_ = r.Body.Close()
		}
		return nil, err
	}
	if r.Body == nil {
		r = r.Clone(r.Context())
		r.Body = http.NoBody
	}
	rec := httptest.NewRecorder()
	m.h.ServeHTTP(rec, r)
	_ = r.Body.Close()
	resp := rec.Result()
	resp.Request = r
	return resp, nil
}

// serveMem is serve with a server in memory (see memServer).
func serveMem(t *testing.T, h func(w http.ResponseWriter, r *http.Request, n int)) (*memServer, *observed) {
	t.Helper()
	o := &observed{}
	return &memServer{URL: "http://dependency.test/", h: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h(w, r, o.record(r))
	})}, o
}

// attemptValue returns the wire.AttemptHeader values of h joined by commas: ""
// if the field is absent, emptyField if it is present with an empty value.
func attemptValue(h http.Header) string {
	vs, ok := h[wire.AttemptHeader]
	switch {
	case !ok:
		return ""
	case len(vs) == 1 && vs[0] == "":
		return emptyField
	}
	return strings.Join(vs, ",")
}

// emptyField is what attemptValue records for a wire.AttemptHeader present with
// an empty value (which no attempt should carry).
const emptyField = "(empty)"

// wantAttemptHeaders returns what attemptValue reads on attempts 1 to n:
// nothing on the first, "2".."n" on the retries.
func wantAttemptHeaders(n int) []string {
	s := make([]string, n)
	for i := 1; i < n; i++ {
		s[i] = strconv.Itoa(i + 1)
	}
	return s
}

func newRequest(t *testing.T, ctx context.Context, method, url string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatalf("NewRequest(%s %s): %v", method, url, err)
	}
	return req
}

// readClose reads and closes resp's body.
func readClose(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Errorf("reading the response body: %v", err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Errorf("closing the response body: %v", err)
	}
	return string(b)
}

// recordingRT is a RoundTripper over base that records every request it
// is handed (one per attempt the Transport sends) and wraps the body of
// every response base returns, to tell whether it was closed. With fail
// set, the n-th request (1 for the first) gets fail's error instead of
// being sent, when fail returns one.
type recordingRT struct {
	base http.RoundTripper
	fail func(n int) error

	mu     sync.Mutex
	reqs   []*http.Request
	bodies []*trackedBody
}

func (rt *recordingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	rt.mu.Lock()
	rt.reqs = append(rt.reqs, r)
	n := len(rt.reqs)
	rt.mu.Unlock()
	if rt.fail != nil {
		if err := rt.fail(n); err != nil {
			if r.Body != nil {
				_ = r.Body.Close()
			}
			return nil, err
		}
	}
	resp, err := rt.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if resp.Body != nil {
		tb := &trackedBody{ReadCloser: resp.Body}
		resp.Body = tb
		rt.mu.Lock()
		rt.bodies = append(rt.bodies, tb)
		rt.mu.Unlock()
	}
	return resp, nil
}

// sent returns the requests handed to the base so far.
func (rt *recordingRT) sent() []*http.Request {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.reqs)
}

// unclosed returns the indexes of the responses whose body is not closed.
func (rt *recordingRT) unclosed() []int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var open []int
	for i, b := range rt.bodies {
		if !b.closed.Load() {
			open = append(open, i)
		}
	}
	return open
}

// trackedBody is a response body that records its Close.
type trackedBody struct {
	io.ReadCloser
	closed atomic.Bool
}

func (b *trackedBody) Close() error {
	b.closed.Store(true)
	return b.ReadCloser.Close()
}

// refusedAddr returns a loopback address nothing listens on any more, and
// a transport that counts its connection attempts there.
func refusedAddr(t *testing.T) (addr string, base *http.Transport, dials *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = ln.Addr().String()
	_ = ln.Close()
	dials = new(atomic.Int64)
	base = &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, a)
	}}
	t.Cleanup(base.CloseIdleConnections)
	return addr, base, dials
}

// getClose sends a GET for url through rt and, if there is a response,
// reads and closes its body.
func getClose(t *testing.T, rt http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	resp, err := rt.RoundTrip(newRequest(t, context.Background(), "GET", url, nil))
	if err == nil {
		readClose(t, resp)
	}
	return resp, err
}

// outage starts a server in memory that answers 503 until end is called,
// and 200 after.
func outage(t *testing.T) (srv *memServer, end func()) {
	var down atomic.Bool
	down.Store(true)
	srv, _ = serveMem(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	return srv, func() { down.Store(false) }
}

// gaveUp reads the give-up mark of resp, if any.
func gaveUp(resp *http.Response) (wire.GiveUp, bool) {
	if resp == nil || len(resp.Header[wire.GiveUpHeader]) == 0 {
		return wire.GiveUp{}, false
	}
	return wire.ParseGiveUp(resp.Header[wire.GiveUpHeader][0])
}

// writeOverloaded answers 503 with the don't-retry signal, as a server
// whose own retries to a dependency stopped does.
func writeOverloaded(w http.ResponseWriter) {
	wire.SetDontRetry(w.Header())
	w.WriteHeader(http.StatusServiceUnavailable)
}

// overloaded reports whether a handler would push resp and err back to its
// own caller (admission.PushBack, on a recorder).
func overloaded(resp *http.Response, err error) bool {
	return admission.PushBack(httptest.NewRecorder(), resp, err)
}

// okAfter answers r 200 with an empty body after d, or fails with r's
// context's error if it ends first: a simulated destination's answer.
func okAfter(r *http.Request, d time.Duration) (*http.Response, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

// getAtOnce sends n GETs of url through rt at once and waits for them all;
// a failed GET fails t.
func getAtOnce(t *testing.T, rt http.RoundTripper, url string, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			resp.Body.Close()
		})
	}
	wg.Wait()
}
