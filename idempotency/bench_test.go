package idempotency_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
)

const benchBody = `{"amount":100,"currency":"EUR","source":"tok_visa"}`

var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"id":"ch_123","status":"captured"}`))
})

// discardWriter is a minimal ResponseWriter, so that the figures are the
// middleware's own cost rather than httptest.ResponseRecorder's. It keeps
// the last status, so that a benchmark can check it measured what it
// meant to (a store full halfway would measure 503s).
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }

func benchRequests(b *testing.B, n int, sameKey bool) []*http.Request {
	b.Helper()
	reqs := make([]*http.Request, n)
	for i := range reqs {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(benchBody))
		r.Header.Set("X-User", "tenant-1")
		k := "bench-key"
		if !sameKey {
			k += strconv.Itoa(i)
		}
		r.Header.Set(idempotency.Header, k)
		reqs[i] = r
	}
	return reqs
}

func benchServe(b *testing.B, h http.Handler, reqs []*http.Request) {
	b.Helper()
	w := &discardWriter{h: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		clear(w.h)
		w.status = 0
		r := reqs[i]
		r.Body = io.NopCloser(strings.NewReader(benchBody))
		h.ServeHTTP(w, r)
		if w.status != http.StatusCreated {
			b.Fatalf("request %d: status %d, want 201", i, w.status)
		}
	}
}

// BenchmarkMiddleware measures the middleware's overhead per request with
// the memory store, against the bare handler.
func BenchmarkMiddleware(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		benchServe(b, benchHandler, benchRequests(b, b.N, false))
	})
	b.Run("new", func(b *testing.B) {
		// Room for every key: one scope may take about half the store
		// (half of each shard).
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 1 << 24, MaxBytes: 1 << 32})
		mw, _ := idempotency.NewMiddleware(s, idempotency.WithScope(userScope))
		benchServe(b, mw(benchHandler), benchRequests(b, b.N, false))
	})
	b.Run("replay", func(b *testing.B) {
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		mw, _ := idempotency.NewMiddleware(s, idempotency.WithScope(userScope))
		h := mw(benchHandler)
		reqs := benchRequests(b, b.N+1, true)
		h.ServeHTTP(&discardWriter{h: make(http.Header)}, reqs[b.N])
		benchServe(b, h, reqs[:b.N])
	})
	// The same with an observer that counts the events, as a metrics
	// adapter would: the events cost no allocation.
	var events atomic.Int64
	count := idempotency.WithObserver(observe.Func(func(context.Context, observe.Event) { events.Add(1) }))
	b.Run("new-observed", func(b *testing.B) {
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 1 << 24, MaxBytes: 1 << 32})
		mw, _ := idempotency.NewMiddleware(s, idempotency.WithScope(userScope), count)
		benchServe(b, mw(benchHandler), benchRequests(b, b.N, false))
	})
	b.Run("replay-observed", func(b *testing.B) {
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		mw, _ := idempotency.NewMiddleware(s, idempotency.WithScope(userScope), count)
		h := mw(benchHandler)
		reqs := benchRequests(b, b.N+1, true)
		h.ServeHTTP(&discardWriter{h: make(http.Header)}, reqs[b.N])
		benchServe(b, h, reqs[:b.N])
	})
	b.Run("unguarded-GET", func(b *testing.B) {
		s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		mw, _ := idempotency.NewMiddleware(s, idempotency.WithScope(userScope))
		reqs := benchRequests(b, b.N, false)
		for _, r := range reqs {
			r.Method = http.MethodGet
		}
		benchServe(b, mw(benchHandler), reqs)
	})
}

// BenchmarkMemoryStoreParallel measures Begin+Complete of new keys from
// many goroutines (the sharded map's contention).
func BenchmarkMemoryStoreParallel(b *testing.B) {
	s, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 1 << 24, MaxBytes: 1 << 34})
	fp := store.NewFingerprint("POST", "/charges", [32]byte{})
	rec := store.Record{Status: 201, Body: []byte(`{"id":"ch_123"}`)}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := b.Context()
		for pb.Next() {
			k := idempotency.HashKey("tenant", idempotency.NewKey())
			res, err := s.Begin(ctx, k, fp, 60e9)
			if err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, k, res.Owner, rec, 3600e9); err != nil {
				b.Fatal(err)
			}
		}
	})
}
