package idemtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// Charged is the body of the answer of the handler [Serve] guards.
const Charged = "charged"

// SharedScope puts every caller of a test middleware in one scope: the
// harness's driver is its only caller.
var SharedScope = idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil })

// Serve starts a test server whose handler answers 201 [Charged], guarded
// by a middleware on s (SharedScope, then opts), and
// returns its URL. The server is closed at tb's cleanup; a cleanup
// registered later (e.g. closing a proxy the store's calls hang on) runs
// before.
func Serve(tb testing.TB, s store.Store, opts ...idempotency.Option) string {
	tb.Helper()
	mw, err := idempotency.NewMiddleware(s, append([]idempotency.Option{SharedScope}, opts...)...)
	if err != nil {
		tb.Fatalf("idempotency.NewMiddleware: %v", err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, Charged)
	})))
	tb.Cleanup(srv.Close)
	return srv.URL
}

// postWait bounds how long [Post] waits for an answer.
const postWait = 30 * time.Second

// Post sends a POST with the idempotency key key to url and returns the
// status and body of the answer. It fails tb if no answer comes within
// 30 s: a server that hangs fails the test instead of blocking it.
func Post(tb testing.TB, url, key string) (int, string) {
	tb.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		tb.Fatalf("Post: %v", err)
	}
	req.Header.Set(idempotency.Header, key)
	resp, err := (&http.Client{Timeout: postWait}).Do(req)
	if err != nil {
		tb.Fatalf("POST %s: no answer: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("POST %s: reading the answer: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
