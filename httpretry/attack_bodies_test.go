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
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// bodNet is an in-memory network of net.Pipe connections for use inside a
// synctest bubble: an http.Server serves its listener, an http.Transport
// dials through it. It counts the client's dials and the client
// connections still open. Any goroutine left blocked on it when the bubble
// ends makes synctest.Test fail: a leak detector.
type bodNet struct {
	conns    chan net.Conn
	done     chan struct{}
	once     sync.Once
	dials    atomic.Int64
	open     atomic.Int64
	srv      *http.Server
	tr       *http.Transport
	srvDone  chan struct{}
	handlerN atomic.Int64
}

type bodAddr struct{}

func (bodAddr) Network() string { return "pipe" }
func (bodAddr) String() string  { return "pipe" }

func (n *bodNet) Accept() (net.Conn, error) {
	select {
	case c := <-n.conns:
		return c, nil
	case <-n.done:
		return nil, net.ErrClosed
	}
}

func (n *bodNet) Close() error {
	n.once.Do(func() { close(n.done) })
	return nil
}

func (n *bodNet) Addr() net.Addr { return bodAddr{} }

type bodConn struct {
	net.Conn
	open   *atomic.Int64
	closed atomic.Bool
}

func (c *bodConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.open.Add(-1)
	}
	return c.Conn.Close()
}

func (n *bodNet) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c1, c2 := net.Pipe()
	select {
	case n.conns <- c2:
	case <-ctx.Done():
		c1.Close()
		c2.Close()
		return nil, ctx.Err()
	case <-n.done:
		return nil, net.ErrClosed
	}
	n.dials.Add(1)
	n.open.Add(1)
	return &bodConn{Conn: c1, open: &n.open}, nil
}

// bodStart starts h on an in-memory network, inside the current bubble.
// The returned base transport dials it. Call stop before the bubble ends.
func bodStart(t *testing.T, h http.HandlerFunc) *bodNet {
	n := &bodNet{conns: make(chan net.Conn), done: make(chan struct{}), srvDone: make(chan struct{})}
	n.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.handlerN.Add(1)
		h(w, r)
	})}
	n.tr = &http.Transport{DialContext: n.dial, MaxIdleConnsPerHost: 10, DisableCompression: true}
	go func() {
		_ = n.srv.Serve(n)
		close(n.srvDone)
	}()
	return n
}

// stop closes the client's idle connections and the server, and waits
// for both to end.
func (n *bodNet) stop() {
	n.tr.CloseIdleConnections()
	_ = n.srv.Close()
	<-n.srvDone
	synctest.Wait()
}

func bodGet(t *testing.T, rt http.RoundTripper, ctx context.Context, method string, body io.Reader) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, "http://example.test/x", body)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

func bodNoSleep() httpretry.Option {
	return httpretry.WithRetry(retry.WithMaxAttempts(3))
}

// TestAttackBodiesDiscarded401ChunkedBodyOf64KiBReusesConnection: the 401 that
// WithRefreshOn401 discards before the resend is drained "up to 64 KiB"
// so that its connection is reused (package doc: "Bodies of discarded
// responses are drained (up to 64 KiB, for at most 50 ms) and closed so
// their connections are reused"). A chunked body of exactly 64 KiB is
// within the bound.
func TestAttackBodiesDiscarded401ChunkedBodyOf64KiBReusesConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
	}{
		{"chunked 64KiB", 64 << 10, true},
		{"chunked 1000", 1000, true},
		{"length 64KiB", 64 << 10, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int64
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					if calls.Add(1) == 1 {
						if !tc.chunked {
							w.Header().Set("Content-Length", fmt.Sprint(tc.size))
						}
						w.WriteHeader(http.StatusUnauthorized)
						w.Write(bytes.Repeat([]byte("u"), tc.size))
						return
					}
					io.WriteString(w, "ok")
				})
				tr, err := httpretry.NewTransport(n.tr, bodNoSleep(),
					httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
						r.Header.Set("Authorization", "Bearer new")
						return r, nil
					}))
				if err != nil {
					t.Fatal(err)
				}
				resp, err := bodGet(t, tr, context.Background(), http.MethodGet, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(b) != "ok" {
					t.Fatalf("got %d %q", resp.StatusCode, b)
				}
				if d := n.dials.Load(); d != 1 {
					t.Errorf("dials = %d, want 1: the discarded 401 of %d bytes was not drained to its end, its connection closed", d, tc.size)
				}
				n.stop()
			})
		})
	}
}

type bodGranter struct{}

func (bodGranter) Deposit()       {}
func (bodGranter) Withdraw() bool { return true }

// bodStalled503 answers 503 with its headers flushed at once and its body
// ("busy") only once release is closed, or not at all if the request
// ends first.
func bodStalled503(release <-chan struct{}) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.(http.Flusher).Flush()
		select {
		case <-release:
			io.WriteString(w, "busy")
		case <-r.Context().Done():
		}
	}
}

// TestAttackBodiesStalledFailureBodiesNoLeak: failed attempts whose bodies stall
// after their headers, on every path by which the transport ends a call:
// given back (read whole, read after the caller's cancel, closed unread),
// replaced by the stale cache's copy or by the fallback's response. In a
// bubble over an in-memory network: a goroutine or a connection left
// behind fails synctest.Test, and the discarded bodies' connections are
// closed (none open once the client closed its idle ones).
func TestAttackBodiesStalledFailureBodiesNoLeak(t *testing.T) {
	for _, tc := range []string{"read whole", "cancel mid-body", "closed unread", "stale", "fallback", "timeout while reading"} {
		t.Run(tc, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var good atomic.Bool
				good.Store(tc == "stale")
				stalled := bodStalled503(release)
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					if good.Load() {
						w.Header().Set("Cache-Control", "max-age=60")
						io.WriteString(w, "kept")
						return
					}
					stalled(w, r)
				})
				opts := []httpretry.Option{bodNoSleep()}
				switch tc {
				case "stale":
					opts = append(opts, httpretry.WithStaleCache(1<<20, time.Hour, false))
				case "fallback":
					opts = append(opts, httpretry.WithFallback(func(*http.Request, *retry.Error) (*http.Response, error) {
						return &http.Response{StatusCode: 299, Body: io.NopCloser(strings.NewReader("fb")), Header: http.Header{}}, nil
					}))
				case "timeout while reading":
					opts = append(opts, httpretry.WithTimeout(time.Minute))
				}
				tr, err := httpretry.NewTransport(n.tr, opts...)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc == "stale" {
					resp, err := bodGet(t, tr, ctx, http.MethodGet, nil)
					if err != nil {
						t.Fatal(err)
					}
					io.ReadAll(resp.Body)
					resp.Body.Close()
					good.Store(false)
				}
				resp, err := bodGet(t, tr, ctx, http.MethodGet, nil)
				if err != nil {
					t.Fatal(err)
				}
				var got []byte
				switch tc {
				case "read whole":
					close(release)
					got, err = io.ReadAll(resp.Body)
					if string(got) != "busy" || err != nil {
						t.Errorf("given-back body %q, %v; want busy", got, err)
					}
				case "cancel mid-body":
					cancel()
					got, err = io.ReadAll(resp.Body)
					if err == nil {
						t.Errorf("read %q after the cancel without an error", got)
					}
				case "closed unread":
				case "stale":
					got, _ = io.ReadAll(resp.Body)
					if string(got) != "kept" {
						t.Errorf("stale body %q", got)
					}
				case "fallback":
					got, _ = io.ReadAll(resp.Body)
					if string(got) != "fb" {
						t.Errorf("fallback body %q", got)
					}
				case "timeout while reading":
					got, err = io.ReadAll(resp.Body) // the stall outlasts the overall timeout
					if err == nil {
						t.Errorf("read %q past the timeout without an error", got)
					}
				}
				resp.Body.Close()
				select {
				case <-release:
				default:
					close(release)
				}
				synctest.Wait()
				n.tr.CloseIdleConnections()
				synctest.Wait()
				if o := n.open.Load(); o != 0 {
					t.Errorf("%d client connections still open after the call and CloseIdleConnections", o)
				}
				t.Logf("%s: %d dials, %d handler calls", tc, n.dials.Load(), n.handlerN.Load())
				n.stop()
			})
		})
	}
}

// TestAttackBodiesHedgeLegsNoLeak: races whose copies answer in every order, with
// bodies that stall, fail or succeed: the loser is canceled and its body
// closed, the winner's body reaches the caller whole, and nothing is left
// behind (goroutines, connections) once the caller closed the body.
func TestAttackBodiesHedgeLegsNoLeak(t *testing.T) {
	type behave func(w http.ResponseWriter, r *http.Request, release <-chan struct{})
	hang := func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) { <-r.Context().Done() }
	okLate := func(body string) behave {
		return func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
			select {
			case <-release:
				io.WriteString(w, body)
			case <-r.Context().Done():
			}
		}
	}
	okStalledBody := func(body string) behave {
		return func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			select {
			case <-release:
				io.WriteString(w, body)
			case <-r.Context().Done():
			}
		}
	}
	fail := func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "bad")
	}
	for _, tc := range []struct {
		name         string
		first, hedge behave
		want         string
	}{
		{"hedge wins, first hangs", hang, okStalledBody("hedge"), "hedge"},
		{"first wins late, hedge hangs", okLate("first"), hang, "first"},
		{"first fails late, hedge wins stalled", okLateFail(), okStalledBody("hedge"), "hedge"},
		{"hedge fails, first wins", okLate("first"), fail, "first"},
		{"first stalled body wins, hedge hangs", okStalledBodyAfterDelay("first"), hang, "first"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				release := make(chan struct{})
				var hedgeSeen atomic.Bool
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					if r.Header.Get("Stormguard-Attempt") == "" {
						tc.first(w, r, release)
						return
					}
					hedgeSeen.Store(true)
					tc.hedge(w, r, release)
				})
				tr, err := httpretry.NewTransport(n.tr, bodNoSleep(), httpretry.WithHedging(10*time.Millisecond, 0, 1),
					httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: bodGranter{}}, nil }))
				if err != nil {
					t.Fatal(err)
				}
				go func() {
					time.Sleep(20 * time.Millisecond) // after the hedge went
					close(release)
				}()
				resp, err := bodGet(t, tr, context.Background(), http.MethodGet, nil)
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(got) != tc.want || err != nil {
					t.Errorf("body %q, %v; want %q", got, err, tc.want)
				}
				if !hedgeSeen.Load() {
					t.Errorf("no hedge went")
				}
				synctest.Wait()
				n.tr.CloseIdleConnections()
				synctest.Wait()
				if o := n.open.Load(); o != 0 {
					t.Errorf("%d client connections still open", o)
				}
				t.Logf("%d dials, %d handler calls", n.dials.Load(), n.handlerN.Load())
				n.stop()
			})
		})
	}
}

func okLateFail() func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
	return func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		select {
		case <-release:
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "busy")
		case <-r.Context().Done():
		}
	}
}

// okStalledBodyAfterDelay answers 200 after 15 ms (after the hedge went)
// and its body once released.
func okStalledBodyAfterDelay(body string) func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
	return func(w http.ResponseWriter, r *http.Request, release <-chan struct{}) {
		select {
		case <-time.After(15 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-release:
			io.WriteString(w, body)
		case <-r.Context().Done():
		}
	}
}

// bodBodies hands out tracked request bodies and counts the open ones.
type bodBodies struct {
	mu     sync.Mutex
	opened int
	closed int
}

type bodTracked struct {
	io.Reader
	b      *bodBodies
	once   sync.Once
	failAt int // fail the read after this many bytes; -1: never
	read   int
}

func (t *bodTracked) Read(p []byte) (int, error) {
	if t.failAt >= 0 && t.read >= t.failAt {
		return 0, errors.New("bod: body read failed")
	}
	if t.failAt >= 0 && len(p) > t.failAt-t.read {
		p = p[:t.failAt-t.read]
	}
	n, err := t.Reader.Read(p)
	t.read += n
	return n, err
}

func (t *bodTracked) Close() error {
	t.once.Do(func() {
		t.b.mu.Lock()
		t.b.closed++
		t.b.mu.Unlock()
	})
	return nil
}

func (b *bodBodies) make(s string, failAt int) *bodTracked {
	b.mu.Lock()
	b.opened++
	b.mu.Unlock()
	return &bodTracked{Reader: strings.NewReader(s), b: b, failAt: failAt}
}

func (b *bodBodies) unclosed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.opened - b.closed
}

type bodSeen struct {
	body string
	cl   int64
	te   []string
	err  error
}

// TestAttackBodiesRequestBodyReplay: what the server receives on every attempt of a
// replayed body, with and without GetBody, buffered or not, empty, at the
// bound and past it, failing mid-read: the same bytes each time, framed
// the same way, and every body the transport took or got from GetBody
// closed.
func TestAttackBodiesRequestBodyReplay(t *testing.T) {
	const limit = 16
	payload := "0123456789abcdef" // limit bytes
	for _, tc := range []struct {
		name      string
		build     func(b *bodBodies) *http.Request
		opts      []httpretry.Option
		wantSends int
		wantBody  string
		wantErr   bool
	}{
		{"PUT GetBody", func(b *bodBodies) *http.Request {
			r := bodReq(http.MethodPut, b.make(payload, -1), int64(len(payload)))
			r.GetBody = func() (io.ReadCloser, error) { return b.make(payload, -1), nil }
			return r
		}, nil, 3, payload, false},
		{"PUT GetBody first body fails mid-read", func(b *bodBodies) *http.Request {
			r := bodReq(http.MethodPut, b.make(payload, 5), int64(len(payload)))
			r.GetBody = func() (io.ReadCloser, error) { return b.make(payload, -1), nil }
			return r
		}, nil, 3, payload, false}, // the failed send and two more
		{"PUT NoBody", func(b *bodBodies) *http.Request {
			r := bodReq(http.MethodPut, http.NoBody, 0)
			return r
		}, nil, 3, "", false},
		{"PUT buffered known length", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make(payload, -1), int64(len(payload)))
		}, []httpretry.Option{httpretry.WithBufferBodies(limit)}, 3, payload, false},
		{"PUT buffered unknown length", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make(payload, -1), 0)
		}, []httpretry.Option{httpretry.WithBufferBodies(limit)}, 3, payload, false},
		{"PUT buffered empty", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make("", -1), 0)
		}, []httpretry.Option{httpretry.WithBufferBodies(limit)}, 3, "", false},
		{"PUT buffered past bound, unknown length", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make(payload+"X", -1), 0)
		}, []httpretry.Option{httpretry.WithBufferBodies(limit)}, 1, payload + "X", false},
		{"PUT buffered past bound, known length", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make(payload+"X", -1), int64(len(payload)+1))
		}, []httpretry.Option{httpretry.WithBufferBodies(limit)}, 1, payload + "X", false},
		{"PUT no GetBody not buffered", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make(payload, -1), int64(len(payload)))
		}, nil, 1, payload, false},
		{"PUT buffered fails mid-read", func(b *bodBodies) *http.Request {
			return bodReq(http.MethodPut, b.make(payload, 5), int64(len(payload)))
		}, []httpretry.Option{httpretry.WithBufferBodies(limit)}, 0, "", true},
		{"POST keyed GetBody", func(b *bodBodies) *http.Request {
			r := bodReq(http.MethodPost, b.make(payload, -1), int64(len(payload)))
			r.GetBody = func() (io.ReadCloser, error) { return b.make(payload, -1), nil }
			r.Header.Set("Idempotency-Key", "k1")
			return r
		}, nil, 3, payload, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var seen []bodSeen
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					b, err := io.ReadAll(r.Body)
					mu.Lock()
					seen = append(seen, bodSeen{string(b), r.ContentLength, r.TransferEncoding, err})
					mu.Unlock()
					if err != nil {
						return
					}
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(http.StatusServiceUnavailable)
				})
				bodies := &bodBodies{}
				tr, err := httpretry.NewTransport(n.tr, append([]httpretry.Option{bodNoSleep()}, tc.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := tr.RoundTrip(tc.build(bodies))
				if tc.wantErr != (err != nil) {
					t.Fatalf("err = %v, want error %v", err, tc.wantErr)
				}
				if resp != nil {
					io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				good := seen[:0:0]
				for _, s := range seen {
					if s.err == nil {
						good = append(good, s)
					}
				}
				want := tc.wantSends
				if strings.Contains(tc.name, "GetBody first body fails") {
					want = 2 // the first send broke off: 3 attempts, 2 complete
				}
				if len(good) != want {
					t.Errorf("server got %d complete requests, want %d: %+v", len(good), tc.wantSends, seen)
				}
				for i, s := range good {
					if s.body != tc.wantBody {
						t.Errorf("send %d: body %q, want %q", i+1, s.body, tc.wantBody)
					}
					if s.cl != good[0].cl || len(s.te) != len(good[0].te) {
						t.Errorf("send %d framed as CL=%d TE=%v, the first as CL=%d TE=%v", i+1, s.cl, s.te, good[0].cl, good[0].te)
					}
				}
				if u := bodies.unclosed(); u != 0 {
					t.Errorf("%d request bodies (of %d) never closed", u, bodies.opened)
				}
				t.Logf("seen: %+v", seen)
				n.stop()
			})
		})
	}
}

func bodReq(method string, body io.ReadCloser, cl int64) *http.Request {
	r, err := http.NewRequest(method, "http://example.test/x", nil)
	if err != nil {
		panic(err)
	}
	r.Body = body
	r.ContentLength = cl
	return r
}

// TestAttackBodiesDiscardedFailuresReuseConnection counts the connections of calls
// whose failed answers are discarded (retried, replaced by the stale
// cache's copy or by the fallback's answer) or handed back and read by
// the caller: bodies within 64 KiB are drained so that their connection is
// reused; every call here fits one connection.
func TestAttackBodiesDiscardedFailuresReuseConnection(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		chunked bool
		mode    string
	}{
		{"retried small", 100, false, "retry"},
		{"retried chunked small", 100, true, "retry"},
		{"retried 64KiB", 64 << 10, false, "retry"},
		{"retried chunked 64KiB", 64 << 10, true, "retry"},
		{"given back chunked 64KiB", 64 << 10, true, "giveback"},
		{"stale chunked 64KiB", 64 << 10, true, "stale"},
		{"fallback chunked 64KiB", 64 << 10, true, "fallback"},
		{"given back 200KiB read by the caller", 200 << 10, false, "giveback"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int64
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					c := calls.Add(1)
					switch {
					case tc.mode == "stale" && c == 1:
						w.Header().Set("Cache-Control", "max-age=60")
						io.WriteString(w, "kept")
						return
					case tc.mode == "retry" && c == 3:
						io.WriteString(w, "ok")
						return
					}
					if !tc.chunked {
						w.Header().Set("Content-Length", fmt.Sprint(tc.size))
					}
					w.WriteHeader(http.StatusServiceUnavailable)
					w.Write(bytes.Repeat([]byte("b"), tc.size))
				})
				opts := []httpretry.Option{bodNoSleep()}
				switch tc.mode {
				case "stale":
					opts = append(opts, httpretry.WithStaleCache(1<<20, time.Hour, false))
				case "fallback":
					opts = append(opts, httpretry.WithFallback(func(*http.Request, *retry.Error) (*http.Response, error) {
						return &http.Response{StatusCode: 299, Body: http.NoBody, Header: http.Header{}}, nil
					}))
				}
				tr, err := httpretry.NewTransport(n.tr, opts...)
				if err != nil {
					t.Fatal(err)
				}
				rounds := 1
				if tc.mode == "stale" {
					rounds = 2
				}
				for range rounds {
					resp, err := bodGet(t, tr, context.Background(), http.MethodGet, nil)
					if err != nil {
						t.Fatal(err)
					}
					io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				// One more call: the connection is back in the pool.
				resp, err := bodGet(t, tr, context.Background(), http.MethodGet, nil)
				if err == nil {
					io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				want := int64(1)
				if tc.size > 64<<10 {
					// The two failures past the bound of each call are cut
					// off (their connections closed); the third, read whole
					// by the caller, goes back to the pool: 2 + 1 + 2 dials.
					want = 5
				}
				if d := n.dials.Load(); d != want {
					t.Errorf("dials = %d for %d requests, want %d", d, calls.Load(), want)
				}
				n.stop()
			})
		})
	}
}

// TestAttackBodiesRefreshResendFraming: WithRefreshOn401's hook may "return a new
// request to the same host"; the transport "sends the returned request
// once more, with the original body replayed". The body the server gets
// is the original, framed as the original was (Content-Length 16).
func TestAttackBodiesRefreshResendFraming(t *testing.T) {
	for _, tc := range []struct {
		name string
		hook func(r *http.Request) (*http.Request, error)
	}{
		{"copy modified", func(r *http.Request) (*http.Request, error) {
			r.Header.Set("Authorization", "Bearer new")
			return r, nil
		}},
		{"new request", func(r *http.Request) (*http.Request, error) {
			nr, err := http.NewRequestWithContext(r.Context(), r.Method, r.URL.String(), nil)
			if err != nil {
				return nil, err
			}
			nr.Header = r.Header.Clone()
			nr.Header.Set("Authorization", "Bearer new")
			return nr, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var seen []bodSeen
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					b, err := io.ReadAll(r.Body)
					mu.Lock()
					seen = append(seen, bodSeen{string(b), r.ContentLength, r.TransferEncoding, err})
					mu.Unlock()
					if r.Header.Get("Authorization") != "Bearer new" {
						w.WriteHeader(http.StatusUnauthorized)
					}
				})
				tr, err := httpretry.NewTransport(n.tr, bodNoSleep(), httpretry.WithRefreshOn401(tc.hook))
				if err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequest(http.MethodPut, "http://example.test/x", strings.NewReader("0123456789abcdef"))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				mu.Lock()
				if len(seen) != 2 || seen[1].body != seen[0].body || seen[1].cl != seen[0].cl || len(seen[1].te) != 0 {
					t.Errorf("sends %+v: the resend is not the original body framed as the original", seen)
				}
				mu.Unlock()
				n.stop()
			})
		})
	}
}

// TestAttackBodiesStaleBodies: what the stale cache keeps and serves as the caller
// reads a body: to its end (kept), closed early or canceled mid-body (the
// kept one stands), a HEAD (kept at once, served with its Content-Length
// and no body), a body read twice (the second read is EOF, the kept copy
// whole), a body past the bound (passed through whole, not kept, and the
// kept one dropped), a 204, and a 304 (not a replacement).
func TestAttackBodiesStaleBodies(t *testing.T) {
	const bound = 4 << 10
	big := strings.Repeat("B", 2*bound)
	type step struct {
		method string
		status int
		body   string
		cl     bool
		read   string // "all", "half-close", "cancel", "twice", "close-then-read"
	}
	for _, tc := range []struct {
		name      string
		steps     []step
		method    string
		wantServe bool
		wantBody  string
		wantCL    int64
	}{
		{"read to end", []step{{"GET", 200, "v1", true, "all"}}, "GET", true, "v1", 2},
		{"chunked read to end", []step{{"GET", 200, "v1", false, "all"}}, "GET", true, "v1", 2},
		{"closed early keeps old", []step{{"GET", 200, "v1", true, "all"}, {"GET", 200, "v2-longer", true, "half-close"}}, "GET", true, "v1", 2},
		{"canceled mid-body keeps old", []step{{"GET", 200, "v1", true, "all"}, {"GET", 200, "v2-longer", false, "cancel"}}, "GET", true, "v1", 2},
		{"read twice", []step{{"GET", 200, "v1", true, "twice"}}, "GET", true, "v1", 2},
		{"read after close", []step{{"GET", 200, "v1", true, "close-then-read"}}, "GET", false, "", 0},
		{"HEAD", []step{{"HEAD", 200, "0123456789", true, "all"}}, "HEAD", true, "", 10},
		{"past the bound drops", []step{{"GET", 200, "v1", true, "all"}, {"GET", 200, big, false, "all"}}, "GET", false, "", 0},
		{"past the bound by Content-Length drops", []step{{"GET", 200, "v1", true, "all"}, {"GET", 200, big, true, "all"}}, "GET", false, "", 0},
		{"204", []step{{"GET", 204, "", false, "all"}}, "GET", true, "", 0},
		{"304 keeps old", []step{{"GET", 200, "v1", true, "all"}, {"GET", 304, "", false, "all"}}, "GET", true, "v1", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var cur atomic.Pointer[step]
				n := bodStart(t, func(w http.ResponseWriter, r *http.Request) {
					s := cur.Load()
					if s == nil {
						w.WriteHeader(http.StatusServiceUnavailable)
						return
					}
					w.Header().Set("Cache-Control", "max-age=60")
					if s.cl {
						w.Header().Set("Content-Length", fmt.Sprint(len(s.body)))
					}
					w.WriteHeader(s.status)
					if s.read == "cancel" || s.read == "half-close" {
						io.WriteString(w, s.body[:len(s.body)/2])
						w.(http.Flusher).Flush()
						<-r.Context().Done()
						return
					}
					io.WriteString(w, s.body)
				})
				tr, err := httpretry.NewTransport(n.tr, bodNoSleep(), httpretry.WithStaleCache(bound, time.Hour, false))
				if err != nil {
					t.Fatal(err)
				}
				for i := range tc.steps {
					s := tc.steps[i]
					cur.Store(&s)
					ctx, cancel := context.WithCancel(context.Background())
					resp, err := bodGet(t, tr, ctx, s.method, nil)
					if err != nil {
						t.Fatal(err)
					}
					switch s.read {
					case "all":
						b, _ := io.ReadAll(resp.Body)
						if s.method == "GET" && string(b) != s.body {
							t.Errorf("step %d: read %d bytes, want %d", i, len(b), len(s.body))
						}
					case "twice":
						io.ReadAll(resp.Body)
						if b, err := io.ReadAll(resp.Body); len(b) != 0 || err != nil {
							t.Errorf("second read %q, %v", b, err)
						}
					case "half-close":
						buf := make([]byte, 1)
						resp.Body.Read(buf)
					case "cancel":
						buf := make([]byte, 1)
						resp.Body.Read(buf)
						cancel()
						io.ReadAll(resp.Body)
					case "close-then-read":
						resp.Body.Close()
						io.ReadAll(resp.Body)
					}
					resp.Body.Close()
					cancel()
				}
				cur.Store(nil)
				resp, err := bodGet(t, tr, context.Background(), tc.method, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				served := resp.Header.Get("Stormguard-Stale") != ""
				if served != tc.wantServe {
					t.Fatalf("served from the cache: %v, want %v (status %d)", served, tc.wantServe, resp.StatusCode)
				}
				if served && (string(b) != tc.wantBody || resp.ContentLength != tc.wantCL) {
					t.Errorf("served body %q (ContentLength %d), want %q (%d)", b, resp.ContentLength, tc.wantBody, tc.wantCL)
				}
				n.stop()
			})
		})
	}
}
