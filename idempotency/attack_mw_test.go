// Black-box attacks on the HTTP face of package idempotency (the
// middleware of NewMiddleware), each against a documented promise.

package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
)

func mwAtk(t *testing.T, s *idempotency.MemoryStore, h http.Handler, opts ...idempotency.Option) http.Handler {
	t.Helper()
	if s == nil {
		s = &idempotency.MemoryStore{}
	}
	opts = append([]idempotency.Option{idempotency.WithScope(func(r *http.Request) (string, error) {
		if u := r.Header.Get("X-User"); u != "" {
			return u, nil
		}
		return "anon", nil
	})}, opts...)
	mw, err := idempotency.NewMiddleware(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw(h)
}

func mwAtkDo(h http.Handler, method, target string, body io.Reader, hdr ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, body)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Add(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

type mwAtkErrAfter struct {
	data []byte
	err  error
}

func (e *mwAtkErrAfter) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, e.err
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	return n, nil
}

func mwAtkCounting(runs *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n := runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(201)
		fmt.Fprintf(w, "run %d body %q", n, b)
	})
}

// Doc: a body that cannot be read is refused before the store is
// consulted; the key stays free for the retry with the whole body.
func TestAttackMWBodyErrorDoesNotClaim(t *testing.T) {
	var runs atomic.Int32
	h := mwAtk(t, nil, mwAtkCounting(&runs))
	w := mwAtkDo(h, "POST", "/p", &mwAtkErrAfter{data: []byte("par"), err: errors.New("conn reset")}, "Idempotency-Key", "k")
	if w.Code != 400 || runs.Load() != 0 {
		t.Fatalf("broken body: %d, runs %d", w.Code, runs.Load())
	}
	w = mwAtkDo(h, "POST", "/p", strings.NewReader("partial body"), "Idempotency-Key", "k")
	if w.Code != 201 || runs.Load() != 1 {
		t.Fatalf("retry with the whole body: %d %q, runs %d", w.Code, w.Body, runs.Load())
	}
}

// Doc: a body over the cap is answered 413, before the store is consulted.
func TestAttackMWOverCapChunkedDoesNotClaim(t *testing.T) {
	var runs atomic.Int32
	h := mwAtk(t, nil, mwAtkCounting(&runs), idempotency.WithMaxRequestBody(8))
	r := httptest.NewRequest("POST", "/p", io.NopCloser(strings.NewReader("123456789")))
	r.ContentLength = -1
	r.Header.Set("Idempotency-Key", "k")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 413 || runs.Load() != 0 {
		t.Fatalf("over cap: %d runs %d", w.Code, runs.Load())
	}
	w = mwAtkDo(h, "POST", "/p", strings.NewReader("12345678"), "Idempotency-Key", "k")
	if w.Code != 201 {
		t.Fatalf("at cap after 413: %d %q", w.Code, w.Body)
	}
}

// Doc table: same key, different fingerprint: 422, also while the first
// request still runs.
func TestAttackMWConcurrentDifferentBodyIs422(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var runs atomic.Int32
		h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			<-release
			w.WriteHeader(201)
		}))
		done := make(chan int)
		go func() { done <- mwAtkDo(h, "POST", "/p", strings.NewReader("a"), "Idempotency-Key", "k").Code }()
		synctest.Wait()
		w := mwAtkDo(h, "POST", "/p", strings.NewReader("b"), "Idempotency-Key", "k")
		if w.Code != 422 {
			t.Errorf("different body while in progress: %d, want 422", w.Code)
		}
		w = mwAtkDo(h, "POST", "/p", strings.NewReader("a"), "Idempotency-Key", "k")
		if w.Code != 409 || w.Header().Get("Retry-After") == "" {
			t.Errorf("same body while in progress: %d %v", w.Code, w.Header())
		}
		close(release)
		if c := <-done; c != 201 {
			t.Errorf("first: %d", c)
		}
	})
}

// Doc: keys are scoped to the caller.
func TestAttackMWTwoCallersSameKey(t *testing.T) {
	var runs atomic.Int32
	h := mwAtk(t, nil, mwAtkCounting(&runs))
	a := mwAtkDo(h, "POST", "/p", strings.NewReader("A"), "Idempotency-Key", "k", "X-User", "alice")
	b := mwAtkDo(h, "POST", "/p", strings.NewReader("B"), "Idempotency-Key", "k", "X-User", "bob")
	if a.Code != 201 || b.Code != 201 || runs.Load() != 2 {
		t.Fatalf("%d %d runs %d", a.Code, b.Code, runs.Load())
	}
	ra := mwAtkDo(h, "POST", "/p", strings.NewReader("A"), "Idempotency-Key", "k", "X-User", "alice")
	rb := mwAtkDo(h, "POST", "/p", strings.NewReader("B"), "Idempotency-Key", "k", "X-User", "bob")
	if ra.Body.String() != a.Body.String() || rb.Body.String() != b.Body.String() {
		t.Fatalf("replays %q %q, originals %q %q", ra.Body, rb.Body, a.Body, b.Body)
	}
}

// Doc: what is stored is the status, the allow-listed header fields as
// they were when the handler wrote the header, and the body.
func TestAttackMWHeaderSnapshotAtWriteHeader(t *testing.T) {
	h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "/a")
		w.Header().Add("Vary", "X")
		w.Header().Add("Vary", "Y")
		w.WriteHeader(202)
		w.Header().Set("Location", "/b")
		w.Header().Set("Etag", `"late"`)
		io.WriteString(w, "ok")
	}))
	first := mwAtkDo(h, "POST", "/p", nil, "Idempotency-Key", "k")
	w := mwAtkDo(h, "POST", "/p", nil, "Idempotency-Key", "k")
	if w.Code != 202 || w.Header().Get("Location") != "/a" || w.Header().Get("Etag") != "" ||
		strings.Join(w.Header()["Vary"], ",") != "X,Y" || w.Body.String() != "ok" || w.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("replay %d %v %q (first %d %v)", w.Code, w.Header(), w.Body, first.Code, first.Header())
	}
}

// Doc: a handler that writes nothing has an implicit 200, stored.
func TestAttackMWSilentHandlerStored(t *testing.T) {
	var runs atomic.Int32
	h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/x")
	}))
	mwAtkDo(h, "POST", "/p", nil, "Idempotency-Key", "k")
	w := mwAtkDo(h, "POST", "/p", nil, "Idempotency-Key", "k")
	if w.Code != 200 || runs.Load() != 1 || w.Header().Get("Location") != "/x" || w.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("%d runs %d %v", w.Code, runs.Load(), w.Header())
	}
}

// Doc: the handler runs again after it panicked, even with a whole answer.
func TestAttackMWPanicAfterAnswerRunsAgain(t *testing.T) {
	var runs atomic.Int32
	h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			w.WriteHeader(201)
			io.WriteString(w, "done")
			panic(http.ErrAbortHandler)
		}
		w.WriteHeader(201)
	}))
	func() {
		defer func() { recover() }()
		mwAtkDo(h, "POST", "/p", nil, "Idempotency-Key", "k")
	}()
	w := mwAtkDo(h, "POST", "/p", nil, "Idempotency-Key", "k")
	if runs.Load() != 2 || w.Header().Get(idempotency.ReplayHeader) != "" {
		t.Fatalf("runs %d, replay %q", runs.Load(), w.Header().Get(idempotency.ReplayHeader))
	}
}

// Over a real server: 1xx, flush, 204, 304 and hijack.
func TestAttackMWRealServerEdges(t *testing.T) {
	var runs sync.Map
	count := func(path string) int32 {
		v, _ := runs.LoadOrStore(path, new(atomic.Int32))
		return v.(*atomic.Int32).Add(1)
	}
	get := func(path string) int32 {
		v, _ := runs.LoadOrStore(path, new(atomic.Int32))
		return v.(*atomic.Int32).Load()
	}
	h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count(r.URL.Path)
		switch r.URL.Path {
		case "/early":
			w.Header().Set("Link", "</s.css>; rel=preload")
			w.WriteHeader(103)
			w.Header().Set("Content-Type", "text/x-early")
			w.WriteHeader(201)
			io.WriteString(w, "early")
		case "/flush":
			w.Header().Set("Content-Type", "text/x-flush")
			io.WriteString(w, "one ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "two")
		case "/204":
			w.Header().Set("Etag", `"e"`)
			w.WriteHeader(204)
			io.WriteString(w, "ignored")
		case "/304":
			w.Header().Set("Etag", `"e"`)
			w.WriteHeader(304)
		case "/hijack":
			c, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			brw.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi")
			brw.Flush()
			c.Close()
		case "/101":
			w.WriteHeader(101)
		}
	}), idempotency.WithStoreStatus(func(int) bool { return true }))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func(path, key string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader("b"))
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for _, c := range []struct {
		path   string
		status int
		body   string
		ctype  string
	}{
		{"/early", 201, "early", "text/x-early"},
		{"/flush", 200, "one two", "text/x-flush"},
		{"/204", 204, "", ""},
		{"/304", 304, "", ""},
	} {
		r1, b1 := send(c.path, "k"+c.path)
		r2, b2 := send(c.path, "k"+c.path)
		if r1.StatusCode != c.status || r2.StatusCode != c.status || b1 != c.body || b2 != c.body ||
			r2.Header.Get(idempotency.ReplayHeader) != "true" || get(c.path) != 1 || r2.Header.Get("Content-Type") != r1.Header.Get("Content-Type") {
			t.Errorf("%s: first %d %q %v, replay %d %q %v, runs %d", c.path, r1.StatusCode, b1, r1.Header, r2.StatusCode, b2, r2.Header, get(c.path))
		}
	}
	send("/hijack", "kh")
	for i := 0; i < 100 && get("/hijack") == 1; i++ { // the handler may still be returning: 409 meanwhile
		if r, _ := send("/hijack", "kh"); r.StatusCode != 409 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if get("/hijack") != 2 {
		t.Errorf("hijack: runs %d, want 2", get("/hijack"))
	}
}

// Doc (WithReplayHeaders): the hop-by-hop fields are never stored:
// listing one is an error.
func TestAttackMWReplayHeadersHopByHop(t *testing.T) {
	for _, name := range []string{"Connection", "Keep-Alive", "TE", "Trailer", "Upgrade", "Transfer-Encoding", "Proxy-Connection"} {
		_, err := idempotency.NewMiddleware(&idempotency.MemoryStore{}, idempotency.WithScope(func(*http.Request) (string, error) { return "s", nil }),
			idempotency.WithReplayHeaders("Content-Type", name))
		if err == nil {
			t.Errorf("WithReplayHeaders(%q) accepted; hop-by-hop fields are never stored", name)
		}
	}
}

// inproc is a RoundTripper that serves requests with h in process. Attempts
// listed in lose reach the handler, but their answer is lost: the
// RoundTrip fails after lag while the handler goes on.
type mwAtkInproc struct {
	h     http.Handler
	lose  map[int]bool
	lag   time.Duration
	mu    sync.Mutex
	n     int
	keys  []string
	codes []int // the answers that reached the client, in order
	wg    sync.WaitGroup
}

func (p *mwAtkInproc) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	p.n++
	n := p.n
	p.keys = append(p.keys, fmt.Sprintf("%q/%q", req.Header.Values("Idempotency-Key"), req.Header.Values("X-Idempotency-Key")))
	p.mu.Unlock()
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	sreq := httptest.NewRequest(req.Method, req.URL.String(), strings.NewReader(string(body)))
	sreq.Header = req.Header.Clone()
	done := make(chan *http.Response, 1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		w := httptest.NewRecorder()
		p.h.ServeHTTP(w, sreq)
		resp := w.Result()
		resp.Request = req
		done <- resp
	}()
	if p.lose[n] {
		time.Sleep(p.lag)
		return nil, fmt.Errorf("attempt %d: connection reset", n)
	}
	resp := <-done
	p.mu.Lock()
	p.codes = append(p.codes, resp.StatusCode)
	p.mu.Unlock()
	return resp, nil
}

// Doc (httpretry.WithAutoIdempotencyKey, package doc): one key per call,
// made before the first attempt and sent unchanged on every attempt; the
// middleware answers a retry while the first runs 409 + Retry-After, which
// the transport retries, then replays.
func TestAttackMWClientSameKeyEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			time.Sleep(800 * time.Millisecond)
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(201)
			io.WriteString(w, "paid")
		}))
		base := &mwAtkInproc{h: h, lose: map[int]bool{1: true}, lag: 100 * time.Millisecond}
		tr, err := httpretry.NewTransport(base, httpretry.WithAutoIdempotencyKey(), httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithLimit(nil))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "http://pay.example/charges", strings.NewReader("amount=5"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		base.wg.Wait()
		if resp.StatusCode != 201 || string(b) != "paid" || runs.Load() != 1 || resp.Header.Get(idempotency.ReplayHeader) != "true" {
			t.Errorf("got %d %q replay %q, runs %d", resp.StatusCode, b, resp.Header.Get(idempotency.ReplayHeader), runs.Load())
		}
		if fmt.Sprint(base.codes) != "[409 201]" {
			t.Errorf("answers received %v, want [409 201] (the in-progress path)", base.codes)
		}
		for _, k := range base.keys {
			if k != base.keys[0] || strings.HasPrefix(k, "[]") {
				t.Errorf("keys per attempt %q", base.keys)
				break
			}
		}
		t.Logf("attempts %d keys %q", len(base.keys), base.keys)
	})
}

// httpretry: "an empty or blank value is not a key", so the transport adds
// its own; the middleware: "an empty key" is 400. A caller that leaves an
// empty X-Idempotency-Key gets 400, never the key it was given.
func TestAttackMWClientBlankLegacyKeyPlusAutoKey(t *testing.T) {
	var runs atomic.Int32
	h := mwAtk(t, nil, mwAtkCounting(&runs))
	base := &mwAtkInproc{h: h}
	tr, err := httpretry.NewTransport(base, httpretry.WithAutoIdempotencyKey(), httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithLimit(nil))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://pay.example/charges", strings.NewReader("amount=5"))
	req.Header.Set("X-Idempotency-Key", "")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Errorf("status %d, runs %d, sent %q, key %q", resp.StatusCode, runs.Load(), base.keys, httpretry.IdempotencyKey(resp, nil))
	}
}

// Doc (package): "a key's handler runs at most once, whatever happens to
// the response on its way to the client ... even when the client went
// away mid-response or a net/http.TimeoutHandler in front gave up"; the
// handler runs again only after a panic, an unstored status, a hijack or a
// lost lock. A handler whose answer is the implicit 200 (it does its work
// and returns without writing, as net/http allows) and which finishes
// after the TimeoutHandler in front gave up (or the client left) is taken
// for one that "returned without a word because its request was
// canceled": its key is released and the retry runs it a second time. The
// doc now says so, and that a handler doing its work whatever the cancel
// must call WriteHeader: this checks both sides.
func TestAttackMWSilentHandlerFinishedAfterTimeoutRunsTwice(t *testing.T) {
	for _, c := range []struct{ explicit, clientGone bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		explicit, clientGone := c.explicit, c.clientGone
		t.Run(fmt.Sprintf("explicit200=%v,clientGone=%v", explicit, clientGone), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var runs atomic.Int32
				inner := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						time.Sleep(2 * time.Second) // the charge: not canceled, it completes
					}
					w.Header().Set("Location", "/charges/1")
					if explicit {
						w.WriteHeader(200)
					}
				}))
				outer := http.TimeoutHandler(inner, time.Second, "timeout")
				if clientGone {
					// No TimeoutHandler: the client gives up after 1 s.
					ctx, cancel := context.WithCancel(context.Background())
					time.AfterFunc(time.Second, cancel)
					r := httptest.NewRequestWithContext(ctx, "POST", "/charges", strings.NewReader("amount=5"))
					r.Header.Set("Idempotency-Key", "k")
					inner.ServeHTTP(httptest.NewRecorder(), r)
					outer = inner
				} else if w := mwAtkDo(outer, "POST", "/charges", strings.NewReader("amount=5"), "Idempotency-Key", "k"); w.Code != 503 {
					t.Fatalf("first: %d", w.Code)
				}
				time.Sleep(5 * time.Second) // the handler finished long ago
				synctest.Wait()
				w := mwAtkDo(outer, "POST", "/charges", strings.NewReader("amount=5"), "Idempotency-Key", "k")
				// Documented (doc.go): a handler that returns without a word
				// after its request was canceled is taken to have produced
				// nothing; one that calls WriteHeader is stored.
				want := int32(1)
				if !explicit {
					want = 2
				}
				if runs.Load() != want {
					t.Errorf("handler ran %d times for one key, want %d; retry got %d replayed=%q", runs.Load(), want, w.Code, w.Header().Get(idempotency.ReplayHeader))
				}
			})
		})
	}
}

// Doc (httpretry package): "A request is safe to repeat when its method is
// idempotent ... or it carries a non-empty Idempotency-Key"; WithRefreshOn401
// lets the hook "return a new request to the same host", which "later
// retries, if any, send ... too". The transport re-adds its own key
// (WithAutoIdempotencyKey) to a refreshed request, but not the caller's:
// a POST whose key the caller set, refreshed with a new request, is
// retried without any key, and the middleware runs it again.
func TestAttackMWClientRefreshDropsCallersKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer new" {
				w.WriteHeader(401)
				return
			}
			runs.Add(1)
			w.WriteHeader(201)
			io.WriteString(w, "charged")
		}))
		base := &mwAtkInproc{h: h, lose: map[int]bool{2: true}, lag: 10 * time.Millisecond}
		tr, err := httpretry.NewTransport(base, httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithLimit(nil),
			httpretry.WithRefreshOn401(func(old *http.Request) (*http.Request, error) {
				nr, err := http.NewRequest(old.Method, old.URL.String(), nil)
				if err != nil {
					return nil, err
				}
				nr.Header.Set("Authorization", "Bearer new")
				return nr, nil
			}))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "http://pay.example/charges", strings.NewReader("amount=5"))
		req.Header.Set("Authorization", "Bearer old")
		req.Header.Set(idempotency.Header, idempotency.NewKey())
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		base.wg.Wait()
		if runs.Load() != 1 {
			t.Errorf("charged %d times; keys sent per request (Idempotency-Key/X-Idempotency-Key): %q", runs.Load(), base.keys)
		}
	})
}

// Design probe (passes or fails by policy, see report): httpretry retries
// 408 ("408, 429, 502, 503, 504: yes"), while the middleware stores 408 by
// default (WithStoreStatus: everything but 5xx, 401 and 429 "release the
// key so that a retry runs the handler again"). A handler's 408 is then
// replayed to every retry of the call: the retries cannot succeed.
func TestAttackMWClientRetries408ThatIsReplayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		h := mwAtk(t, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if runs.Add(1) == 1 {
				w.WriteHeader(408)
				return
			}
			w.WriteHeader(201)
		}))
		base := &mwAtkInproc{h: h}
		tr, err := httpretry.NewTransport(base, httpretry.WithAutoIdempotencyKey(), httpretry.WithBudget(nil), httpretry.WithBreaker(nil), httpretry.WithLimit(nil))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "http://pay.example/charges", strings.NewReader("amount=5"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 201 {
			t.Errorf("status %d after %d attempts (handler ran %d time(s), replayed=%q): every retry of the 408 was a replay",
				resp.StatusCode, len(base.keys), runs.Load(), resp.Header.Get(idempotency.ReplayHeader))
		}
	})
}
