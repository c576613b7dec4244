package storetest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
)

// duplicates is the number of concurrent duplicates of one request that
// testMiddlewareDuplicates sends.
const duplicates = 100

// testMiddlewareDuplicates sends duplicates concurrent requests with one key
// through an idempotency middleware (NewMiddleware) on the store: the handler must run
// exactly once, and every other request gets 409 or the replay.
func testMiddlewareDuplicates(t *testing.T, f fixture) {
	mw, err := idempotency.NewMiddleware(f.Store, idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil }))
	if err != nil {
		t.Fatalf("idempotency.NewMiddleware: %v", err)
	}
	var runs atomic.Int64
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	}))
	key := idempotency.NewKey()
	var (
		wg    sync.WaitGroup
		start = make(chan struct{})
		codes = make([]int, duplicates)
		recs  = make([]*httptest.ResponseRecorder, duplicates)
	)
	for i := range duplicates {
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
			req.Header.Set(idempotency.Header, key)
			rec := httptest.NewRecorder()
			<-start
			h.ServeHTTP(rec, req)
			codes[i], recs[i] = rec.Code, rec
		})
	}
	close(start)
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("%d concurrent duplicates ran the handler %d times, want 1", duplicates, n)
	}
	originals, replays, conflicts := 0, 0, 0
	for i, rec := range recs {
		switch {
		case rec.Code == http.StatusCreated && rec.Header().Get(idempotency.ReplayHeader) == "":
			originals++
		case rec.Code == http.StatusCreated && rec.Header().Get(idempotency.ReplayHeader) == "true":
			replays++
			if got := rec.Body.String(); got != `{"charge":1}` {
				t.Errorf("duplicate %d: replayed body %q, want {\"charge\":1}", i, got)
			}
		case rec.Code == http.StatusConflict && rec.Header().Get("Retry-After") != "":
			conflicts++
		default:
			t.Errorf("duplicate %d: status %d, headers %v, body %q; want 201 or 409 with Retry-After", i, rec.Code, rec.Header(), rec.Body)
		}
	}
	if originals != 1 {
		t.Errorf("%d original responses, want 1 (replays %d, conflicts %d)", originals, replays, conflicts)
	}
	t.Logf("%d duplicates: 1 ran, %d got 409, %d got the replay", duplicates, conflicts, replays)
}
