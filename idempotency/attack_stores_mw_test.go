// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package idempotency_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
)

func atkMW(t *testing.T, h http.Handler, opts ...idempotency.Option) http.Handler {
	t.Helper()
	opts = append([]idempotency.Option{idempotency.WithScope(func(*http.Request) (string, error) { return "s", nil })}, opts...)
	mw, err := idempotency.NewMiddleware(&idempotency.MemoryStore{}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw(h)
}

func atkDo(h http.Handler, method, target, body string, hdr map[string][]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	for k, vs := range hdr {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestAttackMiddlewareAnswers(t *testing.T) {
	var runs atomic.Int32
	h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		runs.Add(1)
		w.Header().Set("Set-Cookie", "a=b")
		w.Header().Set("Location", "/p/1")
		w.Header().Set("X-Other", "1")
		w.WriteHeader(201)
		w.Write(append([]byte("got:"), b...))
	}), idempotency.WithMaxRequestBody(10))
	key := map[string][]string{"Idempotency-Key": {"k1"}}
	w := atkDo(h, "POST", "/p?x=1", "body", key)
	if w.Code != 201 || w.Body.String() != "got:body" {
		t.Fatalf("first: %d %q", w.Code, w.Body)
	}
	w = atkDo(h, "POST", "/p?x=1", "body", map[string][]string{"X-Idempotency-Key": {`"k1"`}})
	if w.Code != 201 || w.Body.String() != "got:body" || w.Header().Get(idempotency.ReplayHeader) != "true" ||
		w.Header().Get("Set-Cookie") != "" || w.Header().Get("X-Other") != "" || w.Header().Get("Location") != "/p/1" {
		t.Errorf("replay via legacy quoted header: %d %q %v", w.Code, w.Body, w.Header())
	}
	for name, c := range map[string]struct {
		method, target, body string
		hdr                  map[string][]string
		want                 int
	}{
		"other body":    {"POST", "/p?x=1", "bodz", key, 422},
		"other query":   {"POST", "/p?x=2", "body", key, 422},
		"other method":  {"PATCH", "/p?x=1", "body", key, 422},
		"two lines":     {"POST", "/p?x=1", "body", map[string][]string{"Idempotency-Key": {"k1", "k1"}}, 400},
		"differ":        {"POST", "/p?x=1", "body", map[string][]string{"Idempotency-Key": {"k1"}, "X-Idempotency-Key": {"k2"}}, 400},
		"empty":         {"POST", "/p?x=1", "body", map[string][]string{"Idempotency-Key": {""}}, 400},
		"256":           {"POST", "/p?x=1", "body", map[string][]string{"Idempotency-Key": {strings.Repeat("a", 256)}}, 400},
		"too big":       {"POST", "/p", "01234567890", map[string][]string{"Idempotency-Key": {"k9"}}, 413},
		"get passes":    {"GET", "/p", "", key, 201},
		"no key passes": {"POST", "/p", "x", nil, 201},
	} {
		before := runs.Load()
		w := atkDo(h, c.method, c.target, c.body, c.hdr)
		if w.Code != c.want {
			t.Errorf("%s: %d %q, want %d", name, w.Code, w.Body, c.want)
		}
		if c.want >= 400 && (runs.Load() != before || !strings.HasPrefix(w.Header().Get("Content-Type"), "application/problem+json")) {
			t.Errorf("%s: handler ran or not problem+json: %v", name, w.Header())
		}
	}
}

func TestAttackMiddlewareNotStored(t *testing.T) {
	for _, code := range []int{500, 503, 401, 429} {
		var runs atomic.Int32
		h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.WriteHeader(code)
		}))
		key := map[string][]string{"Idempotency-Key": {"k"}}
		atkDo(h, "POST", "/", "", key)
		w := atkDo(h, "POST", "/", "", key)
		if runs.Load() != 2 || w.Code != code || w.Header().Get(idempotency.ReplayHeader) != "" {
			t.Errorf("%d: runs %d, second %d %v", code, runs.Load(), w.Code, w.Header())
		}
	}
	// Over the response cap: the body is omitted from the replay, the handler does not run again.
	var runs atomic.Int32
	h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Write([]byte("0123456789"))
	}), idempotency.WithMaxResponseBody(9))
	key := map[string][]string{"Idempotency-Key": {"k"}}
	if w := atkDo(h, "POST", "/", "", key); w.Body.String() != "0123456789" {
		t.Fatalf("first %q", w.Body)
	}
	w := atkDo(h, "POST", "/", "", key)
	if runs.Load() != 1 || w.Code != 200 || w.Body.Len() != 0 || w.Header().Get(idempotency.BodyOmittedHeader) != "true" {
		t.Errorf("over cap replay: runs %d %d %q %v", runs.Load(), w.Code, w.Body, w.Header())
	}
	// Exactly at the cap: kept.
	h = atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("012345678")) }), idempotency.WithMaxResponseBody(9))
	atkDo(h, "POST", "/", "", key)
	if w := atkDo(h, "POST", "/", "", key); w.Body.String() != "012345678" || w.Header().Get(idempotency.BodyOmittedHeader) != "" {
		t.Errorf("at cap replay: %q %v", w.Body, w.Header())
	}
}
