package idempotency_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// payload returns n bytes of a recognisable pattern.
func payload(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = "0123456789abcdefghijklmnopqrstuvwxyz"[i%36]
	}
	return b
}

// chunkWriter is a payment handler that writes body in chunks of 1 KiB,
// pausing between them, and stops at the first write error, as handlers
// that stream (io.Copy, json.Encoder) do.
type chunkWriter struct {
	runs  atomic.Int64
	body  []byte
	pause time.Duration
}

func (h *chunkWriter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.runs.Add(1)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Location", "/charges/1")
	w.WriteHeader(http.StatusCreated)
	for b := h.body; len(b) > 0; {
		n := min(len(b), 1<<10)
		if _, err := w.Write(b[:n]); err != nil {
			return
		}
		b = b[n:]
		time.Sleep(h.pause)
	}
}

// failingWriter accepts ok bytes, then fails every write, as a writer to a
// client that went away does.
type failingWriter struct {
	*httptest.ResponseRecorder
	ok int
}

func (w *failingWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.ok)
	w.ok -= n
	w.ResponseRecorder.Write(p[:n])
	if n < len(p) {
		return n, errors.New("write tcp: broken pipe")
	}
	return n, nil
}

// TestResponseStoredWholeWhateverTheClientGot: when the response cannot
// reach the client whole (a writer that fails, a TimeoutHandler in front),
// the stored record is still what the handler produced, whole.
func TestResponseStoredWholeWhateverTheClientGot(t *testing.T) {
	const size = 10 << 10
	tests := []struct {
		name string
		wrap func(http.Handler) http.Handler
		w    func() http.ResponseWriter
	}{
		{"writer fails after 2 KiB", nil, func() http.ResponseWriter { return &failingWriter{httptest.NewRecorder(), 2 << 10} }},
		{"writer fails at once", nil, func() http.ResponseWriter { return &failingWriter{httptest.NewRecorder(), 0} }},
		{"TimeoutHandler in front", func(h http.Handler) http.Handler {
			return http.TimeoutHandler(h, 2500*time.Millisecond, "timeout")
		}, func() http.ResponseWriter { return httptest.NewRecorder() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := &chunkWriter{body: payload(size), pause: time.Second}
				mw := newMiddleware(t, nil)
				inner := mw(h)
				outer := inner
				if tc.wrap != nil {
					outer = tc.wrap(inner)
				}
				req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("pay"))
				req.Header.Set("X-User", "alice")
				req.Header.Set(idempotency.Header, "k")
				outer.ServeHTTP(tc.w(), req)
				time.Sleep(time.Hour) // let a handler cut loose by the TimeoutHandler finish
				synctest.Wait()
				rep := call{body: "pay", keys: key("k")}.do(inner)
				if rep.Code != http.StatusCreated || rep.Header().Get(idempotency.ReplayHeader) != "true" {
					t.Fatalf("retry: status %d, replayed %q; want the 201 replayed", rep.Code, rep.Header().Get(idempotency.ReplayHeader))
				}
				if got := rep.Body.Len(); got != size || !bytes.Equal(rep.Body.Bytes(), h.body) {
					t.Fatalf("replayed body: %d bytes, want the handler's %d bytes", got, size)
				}
				if n := h.runs.Load(); n != 1 {
					t.Fatalf("handler ran %d times, want 1", n)
				}
			})
		})
	}
}

// TestCanceledHandlerWithoutAnswerNotStored: a handler that returns without
// writing because its request was canceled (client gone, TimeoutHandler)
// produced nothing: the key is released, never stored as an empty 200.
func TestCanceledHandlerWithoutAnswerNotStored(t *testing.T) {
	tests := []struct {
		name    string
		timeout bool // TimeoutHandler in front; otherwise the client goes away
	}{
		{"client gone", false},
		{"TimeoutHandler", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var runs atomic.Int64
				inner := newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if runs.Add(1) == 1 {
						<-r.Context().Done() // gives up without a word
						return
					}
					w.WriteHeader(http.StatusCreated)
					io.WriteString(w, "charged")
				}))
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				outer := inner
				if tc.timeout {
					outer = http.TimeoutHandler(inner, time.Second, "timeout")
				} else {
					time.AfterFunc(time.Second, cancel)
				}
				req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", nil)
				req.Header.Set("X-User", "alice")
				req.Header.Set(idempotency.Header, "k")
				outer.ServeHTTP(httptest.NewRecorder(), req)
				time.Sleep(time.Minute)
				synctest.Wait()
				rec := call{keys: key("k")}.do(inner)
				if rec.Code != http.StatusCreated || rec.Body.String() != "charged" || rec.Header().Get(idempotency.ReplayHeader) != "" {
					t.Fatalf("retry: %d %q replayed %q; want a fresh 201 \"charged\"", rec.Code, rec.Body, rec.Header().Get(idempotency.ReplayHeader))
				}
			})
		})
	}
}

// TestBodyNotKeptStillRunsOnce: a response whose body the store cannot
// keep (over the size cap, or the memory store full for that size) is
// still a completed write: a retry gets its status and allow-listed header
// fields, marked as a replay without the body, and the handler runs once.
func TestBodyNotKeptStillRunsOnce(t *testing.T) {
	small, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxBytes: 4000})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		mem  store.Store
		opts []idempotency.Option
		size int
	}{
		{"over WithMaxResponseBody", nil, []idempotency.Option{idempotency.WithMaxResponseBody(10)}, 11},
		{"memory store full for the record", small, nil, 8000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := &chunkWriter{body: payload(tc.size)}
			mw := newMiddleware(t, tc.mem, tc.opts...)(h)
			first := call{keys: key("k")}.do(mw)
			if first.Code != http.StatusCreated || first.Body.Len() != tc.size {
				t.Fatalf("first call: %d with %d bytes, want 201 with %d", first.Code, first.Body.Len(), tc.size)
			}
			for i := range 2 {
				rep := call{keys: key("k")}.do(mw)
				if n := h.runs.Load(); n != 1 {
					t.Fatalf("retry %d: handler ran %d times, want 1", i, n)
				}
				if rep.Code != http.StatusCreated || rep.Header().Get(idempotency.ReplayHeader) != "true" ||
					rep.Header().Get("Idempotent-Body-Omitted") != "true" || rep.Body.Len() != 0 {
					t.Fatalf("retry %d: %d, header %v, %d body bytes; want 201 replayed, Idempotent-Body-Omitted: true, no body", i, rep.Code, rep.Header(), rep.Body.Len())
				}
				if got := rep.Header().Get("Location"); got != "/charges/1" {
					t.Fatalf("retry %d: Location %q, want the original /charges/1", i, got)
				}
			}
		})
	}
}

// postWith sends alice's POST /charges "pay" with the header fields hd to
// h.
func postWith(h http.Handler, hd http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader("pay"))
	req.Header.Set("X-User", "alice")
	for k, vs := range hd {
		req.Header[k] = vs
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// legacyHeader is the older name of idempotency.Header, which the
// middleware reads too.
const legacyHeader = "X-Idempotency-Key"

// TestLegacyKeyHeader: X-Idempotency-Key, which clients (and net/http)
// treat as a key, is a key: a retry that sends it is deduplicated.
func TestLegacyKeyHeader(t *testing.T) {
	const legacy = legacyHeader
	tests := []struct {
		name     string
		first    http.Header
		second   http.Header
		wantRuns int64
		want     int // status of the second call; 0: a replay of the first
	}{
		{"legacy twice", http.Header{legacy: {"k"}}, http.Header{legacy: {"k"}}, 1, 0},
		{"draft then legacy", http.Header{idempotency.Header: {"k"}}, http.Header{legacy: {"k"}}, 1, 0},
		{"both, equal", http.Header{idempotency.Header: {"k"}, legacy: {"k"}}, http.Header{legacy: {`"k"`}}, 1, 0},
		{"both, different", http.Header{idempotency.Header: {"k"}, legacy: {"j"}}, nil, 0, 400},
		{"legacy empty", http.Header{legacy: {""}}, nil, 0, 400},
		{"draft empty", http.Header{idempotency.Header: {""}}, nil, 0, 400},
		{"legacy empty beside a draft key", http.Header{idempotency.Header: {"k"}, legacy: {""}}, nil, 0, 400},
		{"legacy twice in one request", http.Header{legacy: {"k", "k"}}, nil, 0, 400},
		{"legacy malformed", http.Header{legacy: {"a, b"}}, nil, 0, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l ledger
			h := newMiddleware(t, nil)(&l)
			first := postWith(h, tc.first)
			if tc.second == nil {
				wantProblem(t, tc.name, first, tc.want)
			} else {
				if first.Code != http.StatusCreated {
					t.Fatalf("first call: status %d, want 201", first.Code)
				}
				rep := postWith(h, tc.second)
				if rep.Header().Get(idempotency.ReplayHeader) != "true" || rep.Body.String() != first.Body.String() {
					t.Fatalf("second call: %d %q replayed %q, want the replay of %q", rep.Code, rep.Body, rep.Header().Get(idempotency.ReplayHeader), first.Body)
				}
			}
			if n := l.runs.Load(); n != tc.wantRuns {
				t.Fatalf("handler ran %d times, want %d", n, tc.wantRuns)
			}
		})
	}
}

// TestLockRenewedWhileHandlerRuns: a handler that runs longer than the lock
// timeout keeps its key: a duplicate meanwhile gets 409, never a second
// run.
func TestLockRenewedWhileHandlerRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int64
		h := newMiddleware(t, nil, idempotency.WithLockTimeout(time.Minute))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			time.Sleep(5 * time.Minute)
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "run %d", n)
		}))
		c := call{keys: key("k")}
		first := make(chan *httptest.ResponseRecorder, 1)
		go func() { first <- c.do(h) }()
		for range 4 {
			time.Sleep(time.Minute + time.Second)
			wantProblem(t, "duplicate while the first runs past its lock timeout", c.do(h), http.StatusConflict)
		}
		if rec := <-first; rec.Code != 201 || rec.Body.String() != "run 1" {
			t.Fatalf("first call: %d %q, want 201 \"run 1\"", rec.Code, rec.Body)
		}
		if rep := c.do(h); rep.Body.String() != "run 1" || rep.Header().Get(idempotency.ReplayHeader) != "true" {
			t.Fatalf("after the first finished: %d %q, want the replay of \"run 1\"", rep.Code, rep.Body)
		}
		if n := runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

// lostLockStore is a memory store whose locks cannot be extended: every
// renewal finds the lock gone.
type lostLockStore struct{ *idempotency.MemoryStore }

func (lostLockStore) Extend(context.Context, store.ID, store.Owner, time.Duration) error {
	return fmt.Errorf("lock taken over: %w", store.ErrStaleOwner)
}

// TestLockLostCancelsHandler: when the lock cannot be renewed, the
// handler's context is canceled and its result is not stored.
func TestLockLostCancelsHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		var runs atomic.Int64
		var canceled atomic.Bool
		var logs logBuffer
		h := newMiddleware(t, lostLockStore{mem}, idempotency.WithLockTimeout(time.Minute),
			idempotency.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n := runs.Add(1)
			select {
			case <-r.Context().Done():
				canceled.Store(errors.Is(context.Cause(r.Context()), idempotency.ErrLockLost))
			case <-time.After(5 * time.Minute):
			}
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "run %d", n)
		}))
		c := call{keys: key("k")}
		c.do(h)
		if !canceled.Load() {
			t.Fatal("handler's context not canceled with ErrLockLost when its lock could not be renewed")
		}
		if !strings.Contains(logs.String(), "lock lost") {
			t.Fatalf("no warning logged for the lost lock; log: %s", logs.String())
		}
		time.Sleep(time.Minute) // the unrenewed lock expires
		if rec := c.do(h); rec.Header().Get(idempotency.ReplayHeader) != "" {
			t.Fatalf("after a lost lock: %d %q replayed; want no stored result", rec.Code, rec.Body)
		}
	})
}

// TestCrashRecoveryDeadServer: a server that died holding a lock stops
// renewing it; once it expires, a retry claims the key and runs.
func TestCrashRecoveryDeadServer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		var l ledger
		h := newMiddleware(t, mem, idempotency.WithLockTimeout(time.Minute))(&l)
		c := call{keys: key("k"), body: "pay"}
		// The dead server's claim: the same key and request, never renewed.
		fp := store.NewFingerprint(http.MethodPost, "/charges", sha256.Sum256([]byte("pay")))
		if res, err := mem.Begin(context.Background(), idempotency.HashKey("alice", "k"), fp, time.Minute); err != nil || res.Outcome != store.Claimed {
			t.Fatalf("dead server's Begin = %v, %v", res.Outcome, err)
		}
		wantProblem(t, "retry while the dead server's lock lives", c.do(h), http.StatusConflict)
		time.Sleep(time.Minute)
		if rec := c.do(h); rec.Code != 201 || rec.Header().Get(idempotency.ReplayHeader) != "" {
			t.Fatalf("retry after the lock timeout: %d replayed %q, want a fresh 201", rec.Code, rec.Header().Get(idempotency.ReplayHeader))
		}
		if n := l.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

// TestHijackedNotStored: a handler can hijack the connection through the
// middleware (type assertion or ResponseController); a hijacked exchange is
// never stored, so the next request with the key runs the handler again
// instead of replaying an empty 200.
func TestHijackedNotStored(t *testing.T) {
	for _, via := range []string{"type assertion", "ResponseController"} {
		t.Run(via, func(t *testing.T) {
			var runs atomic.Int64
			returned := make(chan struct{}, 2) // the middleware returned
			mw := newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				if _, ok := w.(http.Flusher); !ok {
					http.Error(w, "no http.Flusher", http.StatusInternalServerError)
					return
				}
				var conn net.Conn
				var brw *bufio.ReadWriter
				var err error
				if via == "type assertion" {
					hj, ok := w.(http.Hijacker)
					if !ok {
						http.Error(w, "no http.Hijacker", http.StatusInternalServerError)
						return
					}
					conn, brw, err = hj.Hijack()
				} else {
					conn, brw, err = http.NewResponseController(w).Hijack()
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				defer conn.Close()
				brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nraw ok")
				brw.Flush()
			}))
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { returned <- struct{}{} }()
				mw.ServeHTTP(w, r)
			}))
			defer srv.Close()
			for i := range 2 {
				req, _ := http.NewRequest(http.MethodPost, srv.URL+"/ws", nil)
				req.Header.Set("X-User", "alice")
				req.Header.Set(idempotency.Header, "k")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || string(body) != "raw ok" || resp.Header.Get(idempotency.ReplayHeader) != "" {
					t.Fatalf("request %d: %d %q replayed %q; want the hijacked 200 \"raw ok\"", i, resp.StatusCode, body, resp.Header.Get(idempotency.ReplayHeader))
				}
				<-returned // the client may see the end before the handler returns
			}
			if n := runs.Load(); n != 2 {
				t.Fatalf("handler ran %d times, want 2 (a hijacked exchange is not stored)", n)
			}
		})
	}
}

// TestScopeFloodHurtsOnlyItsScope: one caller filling the default memory
// store with keys leaves room for the others.
func TestScopeFloodHurtsOnlyItsScope(t *testing.T) {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var l ledger
	h := newMiddleware(t, mem)(&l)
	refused := 0
	for i := range 110_000 {
		res, err := mem.Begin(context.Background(), idempotency.HashKey("mallory", fmt.Sprint("flood-", i)), fp("a"), time.Hour)
		switch {
		case errors.Is(err, store.ErrStoreFull):
			refused++
		case err != nil || res.Outcome != store.Claimed:
			t.Fatalf("flood Begin %d = %v, %v", i, res.Outcome, err)
		}
	}
	if refused == 0 {
		t.Fatalf("110,000 keys from one scope: none refused, want the scope bounded")
	}
	for i := range 20 {
		if rec := (call{user: "bob", keys: key(fmt.Sprint("bob-", i))}).do(h); rec.Code != http.StatusCreated {
			t.Fatalf("bob's request %d after mallory's flood: status %d, want 201", i, rec.Code)
		}
	}
	// Mallory's own new keys are still refused.
	wantProblem(t, "mallory after her flood", call{user: "mallory", keys: key("one-more")}.do(h), http.StatusServiceUnavailable)
}

// hangingStore is a memory store whose chosen calls block until release
// is closed, ignoring their context (as a client with no deadline on a
// blackholed connection does), or honoring it when honor is set.
type hangingStore struct {
	*idempotency.MemoryStore
	begin, complete bool
	honor           bool
	release         chan struct{}
}

func (s *hangingStore) hang(ctx context.Context) error {
	if s.honor {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.release:
			return nil
		}
	}
	<-s.release
	return nil
}

func (s *hangingStore) Begin(ctx context.Context, k store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	if s.begin {
		if err := s.hang(ctx); err != nil {
			return store.Result{}, err
		}
	}
	return s.MemoryStore.Begin(context.Background(), k, fp, ttl)
}

func (s *hangingStore) Complete(ctx context.Context, k store.ID, o store.Owner, rec store.Record, d time.Duration) error {
	if s.complete {
		if err := s.hang(ctx); err != nil {
			return err
		}
	}
	return s.MemoryStore.Complete(context.Background(), k, o, rec, d)
}

// TestStoreCallsBounded: a store that never answers gets a bounded wait,
// then 503 (Begin), or the handler's answer with the key left to its lock
// timeout (Complete); a claim that lands after the middleware gave up is
// released.
func TestStoreCallsBounded(t *testing.T) {
	tests := []struct {
		name            string
		begin, complete bool
		honor           bool
		want            int
	}{
		{"Begin ignores its context", true, false, false, 503},
		{"Begin honors its context", true, false, true, 503},
		{"Complete ignores its context", false, true, false, 201},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
				s := &hangingStore{MemoryStore: mem, begin: tc.begin, complete: tc.complete, honor: tc.honor, release: make(chan struct{})}
				var l ledger
				h := newMiddleware(t, s)(&l)
				rec := call{keys: key("k")}.do(h)
				if rec.Code != tc.want {
					t.Fatalf("status %d, want %d", rec.Code, tc.want)
				}
				if tc.want == 503 {
					wantProblem(t, tc.name, rec, 503)
					if rec.Header().Get("Retry-After") == "" {
						t.Fatal("503 without Retry-After")
					}
				}
				close(s.release) // the store answers at last
				synctest.Wait()
				s.begin, s.complete = false, false
				if tc.begin {
					// The late claim was released: the key is free.
					if rec := (call{keys: key("k")}).do(h); rec.Code != 201 || rec.Header().Get(idempotency.ReplayHeader) != "" {
						t.Fatalf("after the late Begin: %d replayed %q, want a fresh 201", rec.Code, rec.Header().Get(idempotency.ReplayHeader))
					}
				}
			})
		})
	}
}

// TestZeroMiddleware: a middleware given no handler answers 500 instead of
// panicking.
func TestZeroMiddleware(t *testing.T) {
	var l ledger
	built := newMiddleware(t, nil)
	for _, h := range []http.Handler{built(nil)} {
		for range 2 {
			rec := call{keys: key("k")}.do(h)
			if rec.Code != http.StatusInternalServerError && rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("zero Middleware: status %d, want 500 or 503", rec.Code)
			}
		}
	}
	if n := l.runs.Load(); n != 0 {
		t.Fatalf("zero Middleware ran the handler %d times, want 0", n)
	}
}

// TestZeroMemoryStore: the zero MemoryStore is an empty store with the
// default bounds.
func TestZeroMemoryStore(t *testing.T) {
	var l ledger
	var mem idempotency.MemoryStore
	h := newMiddleware(t, &mem)(&l)
	call{keys: key("k")}.do(h)
	if rep := (call{keys: key("k")}).do(h); rep.Header().Get(idempotency.ReplayHeader) != "true" || l.runs.Load() != 1 {
		t.Fatalf("zero MemoryStore: second call replayed %q, runs %d; want a replay and 1 run", rep.Header().Get(idempotency.ReplayHeader), l.runs.Load())
	}
	if idempotency.MemoryLen(&mem) != 1 || idempotency.MemorySweep(&mem) != 0 {
		t.Fatalf("zero MemoryStore: Len %d, want 1", idempotency.MemoryLen(&mem))
	}
}

// slowClaimStore is a memory store behind a slow network: a claim is made
// at once, but its answer takes a second to come back, and a caller who
// cancels meanwhile gets only its context's error (the owner is lost), as
// with a database that commits a statement whose client canceled.
type slowClaimStore struct{ *idempotency.MemoryStore }

func (s slowClaimStore) Begin(ctx context.Context, k store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	res, err := s.MemoryStore.Begin(context.Background(), k, fp, ttl)
	select {
	case <-ctx.Done():
		return store.Result{}, ctx.Err()
	case <-time.After(time.Second):
		return res, err
	}
}

// TestCanceledClaimNotLeftLocked: a request canceled while its claim is in
// flight leaves the key free, not locked by an owner nobody knows until the
// lock timeout.
func TestCanceledClaimNotLeftLocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		var l ledger
		h := newMiddleware(t, slowClaimStore{mem})(&l)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel) // the client leaves
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", nil)
		req.Header.Set("X-User", "alice")
		req.Header.Set(idempotency.Header, "k")
		h.ServeHTTP(httptest.NewRecorder(), req)
		if rec := (call{keys: key("k")}).do(h); rec.Code != http.StatusCreated || rec.Header().Get(idempotency.ReplayHeader) != "" {
			t.Fatalf("retry after a canceled claim: %d %q, want a fresh 201", rec.Code, rec.Body)
		}
		if n := l.runs.Load(); n != 1 {
			t.Fatalf("handler ran %d times, want 1", n)
		}
	})
}

// FuzzKeyHeaders: whatever the two key header fields hold, the middleware
// (key required) answers 201 or 400, never panics, runs the handler only
// for a request whose present fields all parse to one key, and a retry
// with that key in the other field is a replay.
func FuzzKeyHeaders(f *testing.F) {
	f.Add("k", true, "", false)
	f.Add("", false, "k", true)
	f.Add("k", true, `"k"`, true)
	f.Add("k", true, "j", true)
	f.Add("", true, "k", true)
	f.Add(`"a\"b"`, true, `a"b`, true)
	f.Add("a, b", false, "a, b", true)
	f.Fuzz(func(t *testing.T, draft string, hasDraft bool, legacy string, hasLegacy bool) {
		var l ledger
		h := newMiddleware(t, nil, idempotency.WithRequired())(&l)
		hd := http.Header{}
		if hasDraft {
			hd[idempotency.Header] = []string{draft}
		}
		if hasLegacy {
			hd[legacyHeader] = []string{legacy}
		}
		var keys []string
		ok := hasDraft || hasLegacy
		for _, v := range []struct {
			has bool
			s   string
		}{{hasDraft, draft}, {hasLegacy, legacy}} {
			if !v.has {
				continue
			}
			k, err := idempotency.ParseKey(v.s)
			ok = ok && err == nil
			keys = append(keys, k)
		}
		ok = ok && (len(keys) < 2 || keys[0] == keys[1])
		rec := postWith(h, hd)
		want := http.StatusBadRequest
		if ok {
			want = http.StatusCreated
		}
		if rec.Code != want {
			t.Fatalf("draft %q (%v), legacy %q (%v): status %d, want %d", draft, hasDraft, legacy, hasLegacy, rec.Code, want)
		}
		if !ok {
			if n := l.runs.Load(); n != 0 {
				t.Fatalf("handler ran %d times for a 400", n)
			}
			return
		}
		other := legacyHeader
		if !hasDraft {
			other = idempotency.Header
		}
		rep := postWith(h, http.Header{other: {quoteKey(keys[0])}})
		if rep.Header().Get(idempotency.ReplayHeader) != "true" || l.runs.Load() != 1 {
			t.Fatalf("retry with key %q in %s: %d, replayed %q, runs %d; want a replay", keys[0], other, rep.Code, rep.Header().Get(idempotency.ReplayHeader), l.runs.Load())
		}
	})
}
