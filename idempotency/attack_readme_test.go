package idempotency_test

// Black-box checks of README.md's promises about package idempotency.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// rdmDownStore is a store that is down: every call fails.
type rdmDownStore struct{}

var errRdmDown = errors.New("connection refused")

func (rdmDownStore) Begin(context.Context, store.ID, store.Fingerprint, time.Duration) (store.Result, error) {
	return store.Result{}, errRdmDown
}
func (rdmDownStore) Complete(context.Context, store.ID, store.Owner, store.Record, time.Duration) error {
	return errRdmDown
}
func (rdmDownStore) Extend(context.Context, store.ID, store.Owner, time.Duration) error {
	return errRdmDown
}
func (rdmDownStore) Release(context.Context, store.ID, store.Owner) error { return errRdmDown }

func rdmScope(r *http.Request) (string, error) { return r.Header.Get("X-Merchant"), nil }

func rdmSend(h http.Handler, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/charges", strings.NewReader(body))
	req.Header.Set("X-Merchant", "m-42")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// README: "400 for a missing or malformed key, 422 for a key reused with
// another request, 409 with Retry-After while the first still runs, the
// stored response replayed with Idempotent-Replayed: true, 503 and never the
// handler when the store is down."
func TestAttackReadmeMiddlewareAnswers(t *testing.T) {
	st, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.NewMiddleware(st, idempotency.WithScope(rdmScope), idempotency.WithRequired())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	block := make(chan struct{})
	started := make(chan struct{}, 1)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.Header.Get("X-Block") != "" {
			started <- struct{}{}
			<-block
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("charged"))
	}))

	if rec := rdmSend(h, "", "a=1"); rec.Code != 400 {
		t.Errorf("missing key (WithRequired): %d, want 400", rec.Code)
	}
	if rec := rdmSend(h, strings.Repeat("k", 256), "a=1"); rec.Code != 400 {
		t.Errorf("256-char key: %d, want 400", rec.Code)
	}
	if rec := rdmSend(h, "bad\x01key", "a=1"); rec.Code != 400 {
		t.Errorf("key with a control char: %d, want 400", rec.Code)
	}
	k := idempotency.NewKey()
	if rec := rdmSend(h, k, "a=1"); rec.Code != 201 || rec.Body.String() != "charged" {
		t.Fatalf("first: %d %q", rec.Code, rec.Body)
	}
	rec := rdmSend(h, k, "a=1")
	if rec.Code != 201 || rec.Header().Get("Idempotent-Replayed") != "true" || rec.Body.String() != "charged" {
		t.Errorf("replay: %d %q replayed=%q", rec.Code, rec.Body, rec.Header().Get("Idempotent-Replayed"))
	}
	if rec := rdmSend(h, k, "a=2"); rec.Code != 422 {
		t.Errorf("same key, other body: %d, want 422", rec.Code)
	}
	if runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", runs.Load())
	}

	// 409 with Retry-After while the first still runs.
	k2 := idempotency.NewKey()
	var wg sync.WaitGroup
	wg.Go(func() {
		req := httptest.NewRequest("POST", "/charges", strings.NewReader("a=1"))
		req.Header.Set("X-Merchant", "m-42")
		req.Header.Set("Idempotency-Key", k2)
		req.Header.Set("X-Block", "1")
		h.ServeHTTP(httptest.NewRecorder(), req)
	})
	<-started
	rec = rdmSend(h, k2, "a=1")
	close(block)
	wg.Wait()
	if rec.Code != 409 || rec.Header().Get("Retry-After") == "" {
		t.Errorf("while the first runs: %d Retry-After %q, want 409 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}

	// Store down: 503, the handler never runs.
	down, err := idempotency.NewMiddleware(rdmDownStore{}, idempotency.WithScope(rdmScope))
	if err != nil {
		t.Fatal(err)
	}
	var downRuns atomic.Int32
	hd := down(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { downRuns.Add(1) }))
	if rec := rdmSend(hd, idempotency.NewKey(), "a=1"); rec.Code != 503 || downRuns.Load() != 0 {
		t.Errorf("store down: %d, handler ran %d times; want 503 and never", rec.Code, downRuns.Load())
	}
}

// README: "Keys are scoped to the caller": the same key from another
// merchant is another operation.
func TestAttackReadmeKeysScoped(t *testing.T) {
	st, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	mw, err := idempotency.NewMiddleware(st, idempotency.WithScope(rdmScope))
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); w.WriteHeader(201) }))
	k := idempotency.NewKey()
	rdmSend(h, k, "a=1")
	req := httptest.NewRequest("POST", "/charges", strings.NewReader("a=1"))
	req.Header.Set("X-Merchant", "m-43")
	req.Header.Set("Idempotency-Key", k)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if runs.Load() != 2 || rec.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("same key, other caller: %d runs, replayed %q; want 2 runs, no replay", runs.Load(), rec.Header().Get("Idempotent-Replayed"))
	}
}
