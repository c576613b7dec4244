package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// ledger is a payment handler that counts how often it really ran.
type ledger struct {
	runs   atomic.Int64
	status int // response status; 0 means 201
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := l.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/charges/%d", n))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Not-Allowed", "1")
	status := l.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"charge":%d,"request":%q}`, n, body)
}

// sharedScope puts every caller in one scope.
var sharedScope = idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil })

// userScope scopes requests by the X-User header, as an authentication
// middleware in front would.
func userScope(r *http.Request) (string, error) {
	u := r.Header.Get("X-User")
	if u == "" {
		return "", errors.New("no user")
	}
	return u, nil
}

// orMemory returns mem, or a new MemoryStore if mem is nil.
func orMemory(t *testing.T, mem store.Store) store.Store {
	t.Helper()
	if mem != nil {
		return mem
	}
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newMiddleware(t *testing.T, mem store.Store, opts ...idempotency.Option) func(http.Handler) http.Handler {
	t.Helper()
	mem = orMemory(t, mem)
	mw, err := idempotency.NewMiddleware(mem, append([]idempotency.Option{idempotency.WithScope(userScope)}, opts...)...)
	if err != nil {
		t.Fatalf("NewMiddleware: %v", err)
	}
	return mw
}

type call struct {
	method, target, body, user string
	keys                       []string // Idempotency-Key header lines
}

func (c call) do(h http.Handler) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, c.request())
	return rec
}

// request returns the request c describes.
func (c call) request() *http.Request {
	method, target, user := c.method, c.target, c.user
	if method == "" {
		method = http.MethodPost
	}
	if target == "" {
		target = "/charges"
	}
	if user == "" {
		user = "alice"
	}
	req := httptest.NewRequest(method, target, strings.NewReader(c.body))
	req.Header.Set("X-User", user)
	for _, k := range c.keys {
		req.Header.Add(idempotency.Header, k)
	}
	return req
}

func key(k string) []string { return []string{k} }

// wantProblem checks an RFC 9457 problem response with the given status.
func wantProblem(t *testing.T, what string, rec *httptest.ResponseRecorder, status int) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("%s: status %d, want %d (body %q)", what, rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	var p struct {
		Type, Title string
		Status      int
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("%s: problem body %q: %v", what, rec.Body, err)
	}
	if p.Status != status || p.Type == "" || p.Title == "" {
		t.Fatalf("%s: problem %+v, want status %d with type and title", what, p, status)
	}
}

func TestNewErrors(t *testing.T) {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	scope := idempotency.WithScope(userScope)
	tests := []struct {
		name string
		mem  store.Store
		opts []idempotency.Option
	}{
		{"nil store", nil, []idempotency.Option{scope}},
		{"no scope", mem, nil},
		{"WithScope(nil)", mem, []idempotency.Option{idempotency.WithScope(nil)}},
		{"two scopes", mem, []idempotency.Option{scope, sharedScope}},
		{"WithMethods()", mem, []idempotency.Option{scope, idempotency.WithMethods()}},
		{"WithMethods(post)", mem, []idempotency.Option{scope, idempotency.WithMethods("post")}},
		{"WithRoute(nil)", mem, []idempotency.Option{scope, idempotency.WithRoute(nil)}},
		{"WithMaxRequestBody(0)", mem, []idempotency.Option{scope, idempotency.WithMaxRequestBody(0)}},
		{"WithMaxResponseBody(-1)", mem, []idempotency.Option{scope, idempotency.WithMaxResponseBody(-1)}},
		{"WithLockTimeout(0)", mem, []idempotency.Option{scope, idempotency.WithLockTimeout(0)}},
		{"WithRetention(-1s)", mem, []idempotency.Option{scope, idempotency.WithRetention(-time.Second)}},
		{"WithStoreStatus(nil)", mem, []idempotency.Option{scope, idempotency.WithStoreStatus(nil)}},
		{"WithReplayHeaders(Set-Cookie)", mem, []idempotency.Option{scope, idempotency.WithReplayHeaders("Content-Type", "set-cookie")}},
		{"WithReplayHeaders(Authorization)", mem, []idempotency.Option{scope, idempotency.WithReplayHeaders("authorization")}},
		{"WithReplayHeaders(WWW-Authenticate)", mem, []idempotency.Option{scope, idempotency.WithReplayHeaders("WWW-Authenticate")}},
		{"WithReplayHeaders(Proxy-Authentication-Info)", mem, []idempotency.Option{scope, idempotency.WithReplayHeaders("Proxy-Authentication-Info")}},
		{"WithReplayHeaders(Content-Length)", mem, []idempotency.Option{scope, idempotency.WithReplayHeaders("Content-Type", "content-length")}},
		{"WithReplayHeaders(Transfer-Encoding)", mem, []idempotency.Option{scope, idempotency.WithReplayHeaders("Transfer-Encoding")}},
		{"WithLogger(nil)", mem, []idempotency.Option{scope, idempotency.WithLogger(nil)}},
	}
	for _, tc := range tests {
		if _, err := idempotency.NewMiddleware(tc.mem, tc.opts...); err == nil {
			t.Errorf("NewMiddleware(%s) = nil error, want an error", tc.name)
		}
	}
	if _, err := idempotency.NewMiddleware(mem, nil, idempotency.GuardOption{}, sharedScope); err != nil {
		t.Errorf("NewMiddleware(nil Option, zero GuardOption, a shared scope) error: %v", err)
	}
}

func TestFirstRequestThenReplay(t *testing.T) {
	var l ledger
	h := newMiddleware(t, nil)(&l)
	c := call{body: `{"amount":100}`, keys: key("k-1")}
	first := c.do(h)
	if first.Code != http.StatusCreated || first.Header().Get(idempotency.ReplayHeader) != "" {
		t.Fatalf("first call: %d %v, want 201 without replay marker", first.Code, first.Header())
	}
	if got := first.Header().Get("Set-Cookie"); got != "session=secret" {
		t.Fatalf("first call: Set-Cookie %q, want the handler's", got)
	}
	for i := range 2 {
		rep := c.do(h)
		if rep.Code != http.StatusCreated {
			t.Fatalf("replay %d: status %d, want 201", i, rep.Code)
		}
		if got := rep.Header().Get(idempotency.ReplayHeader); got != "true" {
			t.Fatalf("replay %d: %s = %q, want true", i, idempotency.ReplayHeader, got)
		}
		if rep.Body.String() != first.Body.String() {
			t.Fatalf("replay %d: body %q, want %q", i, rep.Body, first.Body)
		}
		for name, want := range map[string]string{"Content-Type": "application/json", "Location": "/charges/1", "Set-Cookie": "", "X-Not-Allowed": ""} {
			if got := rep.Header().Get(name); got != want {
				t.Errorf("replay %d: %s = %q, want %q", i, name, got, want)
			}
		}
	}
	if n := l.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestKeyHeaderValidation(t *testing.T) {
	long := strings.Repeat("k", maxKeyLen)
	tests := []struct {
		name   string
		keys   []string
		status int
	}{
		{"bare UUID", key("8e03978e-40d5-43e8-bc93-6894a57f9324"), 201},
		{"structured-field string", key(`"8e03978e-40d5-43e8-bc93-6894a57f9324"`), 201},
		{"escaped quote", key(`"a\"b"`), 201},
		{"255 chars", key(long), 201},
		{"256 chars", key(long + "k"), 400},
		{"quoted 256 chars", key(`"` + long + `k"`), 400},
		{"two header lines", []string{"a", "b"}, 400},
		{"empty", key(""), 400},
		{"empty string item", key(`""`), 400},
		{"non-ASCII", key("clé"), 400},
		{"control character", key("a\x01b"), 400},
		{"unterminated string", key(`"abc`), 400},
		{"parameters", key(`"abc";x=1`), 400},
		{"bad escape", key(`"a\nb"`), 400},
		{"list folded by a proxy", key("a, b"), 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var l ledger
			rec := call{keys: tc.keys}.do(newMiddleware(t, nil)(&l))
			if tc.status == 400 {
				wantProblem(t, tc.name, rec, 400)
				if l.runs.Load() != 0 {
					t.Fatalf("%s: handler ran on an invalid key", tc.name)
				}
				return
			}
			if rec.Code != tc.status {
				t.Fatalf("%s: status %d, want %d", tc.name, rec.Code, tc.status)
			}
		})
	}
}

func TestQuotedAndBareFormsAreTheSameKey(t *testing.T) {
	var l ledger
	h := newMiddleware(t, nil)(&l)
	call{keys: key("abc")}.do(h)
	rep := call{keys: key(`"abc"`)}.do(h)
	if rep.Header().Get(idempotency.ReplayHeader) != "true" || l.runs.Load() != 1 {
		t.Fatalf(`"abc" after abc: replay %q, runs %d; want a replay and 1 run`, rep.Header().Get(idempotency.ReplayHeader), l.runs.Load())
	}
}

func TestGuardedMethods(t *testing.T) {
	tests := []struct {
		name    string
		opts    []idempotency.Option
		method  string
		guarded bool
	}{
		{"POST by default", nil, http.MethodPost, true},
		{"PATCH by default", nil, http.MethodPatch, true},
		{"GET passes", nil, http.MethodGet, false},
		{"PUT passes by default", nil, http.MethodPut, false},
		{"PUT with WithMethods(PUT)", []idempotency.Option{idempotency.WithMethods("PUT")}, http.MethodPut, true},
		{"POST without it in WithMethods", []idempotency.Option{idempotency.WithMethods("PUT")}, http.MethodPost, false},
	}
	for _, tc := range tests {
		var l ledger
		h := newMiddleware(t, nil, tc.opts...)(&l)
		c := call{method: tc.method, keys: key("k")}
		c.do(h)
		second := c.do(h)
		wantRuns := int64(2)
		if tc.guarded {
			wantRuns = 1
		}
		if got := l.runs.Load(); got != wantRuns {
			t.Errorf("%s: two %s calls with one key ran the handler %d times, want %d", tc.name, tc.method, got, wantRuns)
		}
		if replayed := second.Header().Get(idempotency.ReplayHeader) == "true"; replayed != tc.guarded {
			t.Errorf("%s: second call replayed = %v, want %v", tc.name, replayed, tc.guarded)
		}
	}
}

func TestMissingKey(t *testing.T) {
	var l ledger
	optional := newMiddleware(t, nil)(&l)
	call{}.do(optional)
	call{}.do(optional)
	if n := l.runs.Load(); n != 2 {
		t.Fatalf("two calls without a key (optional) ran the handler %d times, want 2", n)
	}
	l.runs.Store(0)
	required := newMiddleware(t, nil, idempotency.WithRequired())(&l)
	wantProblem(t, "POST without a key (required)", call{}.do(required), 400)
	if rec := (call{method: http.MethodGet}).do(required); rec.Code != 201 {
		t.Fatalf("GET without a key (required): status %d, want 201 (GET is not guarded)", rec.Code)
	}
	if n := l.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1 (the GET)", n)
	}
}

func TestFingerprintMismatch(t *testing.T) {
	tests := []struct {
		name   string
		second call
	}{
		{"different body", call{body: `{"amount":999}`}},
		{"different path", call{target: "/refunds", body: `{"amount":100}`}},
		{"different query", call{target: "/charges?currency=EUR", body: `{"amount":100}`}},
		{"different method", call{method: http.MethodPatch, body: `{"amount":100}`}},
	}
	for _, tc := range tests {
		var l ledger
		h := newMiddleware(t, nil)(&l)
		call{body: `{"amount":100}`, keys: key("k")}.do(h)
		tc.second.keys = key("k")
		wantProblem(t, tc.name, tc.second.do(h), http.StatusUnprocessableEntity)
		if n := l.runs.Load(); n != 1 {
			t.Errorf("%s: handler ran %d times, want 1", tc.name, n)
		}
	}
}

func TestPatternRouteOption(t *testing.T) {
	// With WithRoute(r.Pattern), one pattern is one route: the same key and
	// body on another path value is a replay, not a mismatch.
	var l ledger
	mw := newMiddleware(t, nil, idempotency.WithRoute(func(r *http.Request) string { return r.Pattern }))
	mux := http.NewServeMux()
	mux.Handle("POST /accounts/{id}/charges", mw(&l))
	call{target: "/accounts/1/charges", keys: key("k")}.do(mux)
	rep := call{target: "/accounts/2/charges", keys: key("k")}.do(mux)
	if rep.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("pattern route: second call status %d, want a replay", rep.Code)
	}
	// The default (path) keeps them apart.
	var l2 ledger
	mux2 := http.NewServeMux()
	mux2.Handle("POST /accounts/{id}/charges", newMiddleware(t, nil)(&l2))
	call{target: "/accounts/1/charges", keys: key("k")}.do(mux2)
	wantProblem(t, "default route, other account", call{target: "/accounts/2/charges", keys: key("k")}.do(mux2), 422)
}

func TestRequestBody(t *testing.T) {
	var l ledger
	h := newMiddleware(t, nil, idempotency.WithMaxRequestBody(10))(&l)
	// The handler still reads the whole body.
	if rec := (call{body: "0123456789", keys: key("k1")}).do(h); !strings.Contains(rec.Body.String(), `"request":"0123456789"`) {
		t.Fatalf("body at the cap: handler saw %q, want the whole body", rec.Body)
	}
	wantProblem(t, "body over the cap", call{body: "0123456789A", keys: key("k2")}.do(h), http.StatusRequestEntityTooLarge)
	// Unknown length (chunked) over the cap.
	req := httptest.NewRequest(http.MethodPost, "/charges", io.MultiReader(strings.NewReader("0123456"), strings.NewReader("789AB")))
	req.ContentLength = -1
	req.Header.Set("X-User", "alice")
	req.Header.Set(idempotency.Header, "k3")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	wantProblem(t, "chunked body over the cap", rec, http.StatusRequestEntityTooLarge)
	if n := l.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	// A refused body claimed nothing: the key still works.
	if rec := (call{body: "ok", keys: key("k2")}).do(h); rec.Code != 201 || rec.Header().Get(idempotency.ReplayHeader) != "" {
		t.Fatalf("k2 after 413: status %d, want a fresh 201", rec.Code)
	}
}

func TestInProgressConflict(t *testing.T) {
	entered, unblock := make(chan struct{}), make(chan struct{})
	var runs atomic.Int64
	h := newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(entered)
		<-unblock
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done")
	}))
	c := call{keys: key("k")}
	firstDone := make(chan *httptest.ResponseRecorder)
	go func() { firstDone <- c.do(h) }()
	<-entered
	rec := c.do(h)
	wantProblem(t, "duplicate while the first runs", rec, http.StatusConflict)
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("409 without Retry-After")
	}
	close(unblock)
	if first := <-firstDone; first.Code != 201 {
		t.Fatalf("first call: status %d, want 201", first.Code)
	}
	if rep := c.do(h); rep.Code != 201 || rep.Body.String() != "done" || rep.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("after the first finished: %d %q, want the replay", rep.Code, rep.Body)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

func TestConcurrentDuplicates(t *testing.T) {
	const n = 100
	var l ledger
	h := newMiddleware(t, nil)(&l)
	var wg sync.WaitGroup
	recs := make([]*httptest.ResponseRecorder, n)
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			recs[i] = call{body: "pay", keys: key("same")}.do(h)
		})
	}
	close(start)
	wg.Wait()
	if got := l.runs.Load(); got != 1 {
		t.Fatalf("%d concurrent duplicates ran the handler %d times, want 1", n, got)
	}
	originals := 0
	for i, rec := range recs {
		replayed := rec.Header().Get(idempotency.ReplayHeader) == "true"
		switch {
		case rec.Code == 201 && !replayed:
			originals++
		case rec.Code == 201 && replayed, rec.Code == 409:
		default:
			t.Errorf("duplicate %d: status %d, want 201 or 409", i, rec.Code)
		}
	}
	if originals != 1 {
		t.Fatalf("%d original responses, want 1", originals)
	}
}

func TestStatusesNotStored(t *testing.T) {
	tests := []struct {
		status int
		opts   []idempotency.Option
		stored bool
	}{
		{200, nil, true},
		{201, nil, true},
		{400, nil, true},
		{404, nil, true},
		{422, nil, true},
		{401, nil, false},
		{429, nil, false},
		{500, nil, false},
		{502, nil, false},
		{503, nil, false},
		{500, []idempotency.Option{idempotency.WithStoreStatus(func(int) bool { return true })}, true},
		{201, []idempotency.Option{idempotency.WithStoreStatus(func(code int) bool { return code != 201 })}, false},
	}
	for _, tc := range tests {
		l := ledger{status: tc.status}
		h := newMiddleware(t, nil, tc.opts...)(&l)
		c := call{keys: key("k")}
		c.do(h)
		second := c.do(h)
		if second.Code != tc.status {
			t.Errorf("status %d: second call got %d", tc.status, second.Code)
		}
		wantRuns := int64(2)
		if tc.stored {
			wantRuns = 1
		}
		if got := l.runs.Load(); got != wantRuns {
			t.Errorf("status %d (opts %d): handler ran %d times for two calls, want %d", tc.status, len(tc.opts), got, wantRuns)
		}
	}
}

// TestResponseAtCap: a response of exactly the cap is stored whole; one
// byte more is stored without its body (TestBodyNotKeptStillRunsOnce).
func TestResponseAtCap(t *testing.T) {
	for _, size := range []int{10, 11} {
		var runs atomic.Int64
		h := newMiddleware(t, nil, idempotency.WithMaxResponseBody(10))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Write(bytes.Repeat([]byte("x"), size-5))
			w.Write([]byte("yyyyy"))
		}))
		c := call{keys: key("k")}
		first := c.do(h)
		if first.Body.Len() != size {
			t.Fatalf("response of %d bytes: client got %d bytes", size, first.Body.Len())
		}
		second := c.do(h)
		whole := size <= 10
		if second.Header().Get(idempotency.ReplayHeader) != "true" || runs.Load() != 1 {
			t.Errorf("response of %d bytes (cap 10): replayed %q, runs %d; want a replay and 1 run", size, second.Header().Get(idempotency.ReplayHeader), runs.Load())
		}
		if got := second.Body.Len() == size; got != whole {
			t.Errorf("response of %d bytes (cap 10): replay of %d bytes, want the whole body: %v", size, second.Body.Len(), whole)
		}
		if omitted := second.Header().Get(idempotency.BodyOmittedHeader) == "true"; omitted == whole {
			t.Errorf("response of %d bytes (cap 10): %s %q", size, idempotency.BodyOmittedHeader, second.Header().Get(idempotency.BodyOmittedHeader))
		}
	}
}

func TestPanicReleasesKey(t *testing.T) {
	var runs atomic.Int64
	h := newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	c := call{keys: key("k")}
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Fatalf("recovered %v, want the handler's panic \"boom\"", p)
			}
		}()
		c.do(h)
		t.Fatal("a panicking handler did not panic through the middleware")
	}()
	if rec := c.do(h); rec.Code != 201 || rec.Header().Get(idempotency.ReplayHeader) != "" {
		t.Fatalf("after the panic: status %d replay %q, want a fresh 201 (key released)", rec.Code, rec.Header().Get(idempotency.ReplayHeader))
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// failingStore fails every call.
type failingStore struct{ err error }

func (s failingStore) Begin(context.Context, store.ID, store.Fingerprint, time.Duration) (store.Result, error) {
	return store.Result{}, s.err
}
func (s failingStore) Complete(context.Context, store.ID, store.Owner, store.Record, time.Duration) error {
	return s.err
}
func (s failingStore) Extend(context.Context, store.ID, store.Owner, time.Duration) error {
	return s.err
}
func (s failingStore) Release(context.Context, store.ID, store.Owner) error {
	return s.err
}

func TestStoreUnavailableFailsClosed(t *testing.T) {
	full, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 4})
	// Scope x takes its half, scope w half of what is left: no room for a third.
	for _, k := range [][2]string{{"x", "y"}, {"x", "z"}, {"w", "v"}} {
		if _, err := full.Begin(context.Background(), idempotency.HashKey(k[0], k[1]), store.Fingerprint{}, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		mem  store.Store
	}{
		{"store error", failingStore{errors.New("connection refused")}},
		{"store full", full},
	} {
		var l ledger
		rec := call{keys: key("k")}.do(newMiddleware(t, tc.mem)(&l))
		wantProblem(t, tc.name, rec, http.StatusServiceUnavailable)
		if rec.Header().Get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", tc.name)
		}
		if n := l.runs.Load(); n != 0 {
			t.Errorf("%s: handler ran %d times, want 0 (fail closed)", tc.name, n)
		}
	}
}

func TestScopeIsolation(t *testing.T) {
	var l ledger
	h := newMiddleware(t, nil)(&l)
	alice := call{user: "alice", body: "pay", keys: key("shared-key")}
	bob := call{user: "bob", body: "pay", keys: key("shared-key")}
	a1 := alice.do(h)
	b1 := bob.do(h)
	if b1.Header().Get(idempotency.ReplayHeader) != "" || b1.Body.String() == a1.Body.String() {
		t.Fatalf("bob with alice's key got alice's response %q", b1.Body)
	}
	if a2 := alice.do(h); a2.Body.String() != a1.Body.String() {
		t.Fatalf("alice's replay %q, want %q", a2.Body, a1.Body)
	}
	if b2 := bob.do(h); b2.Body.String() != b1.Body.String() {
		t.Fatalf("bob's replay %q, want %q", b2.Body, b1.Body)
	}
	if n := l.runs.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once per caller)", n)
	}
}

func TestSharedScope(t *testing.T) {
	var l ledger
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	mw, err := idempotency.NewMiddleware(mem, sharedScope)
	if err != nil {
		t.Fatal(err)
	}
	h := mw(&l)
	call{user: "alice", keys: key("k")}.do(h)
	if rep := (call{user: "bob", keys: key("k")}).do(h); rep.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("shared scope: bob's call was not a replay (status %d)", rep.Code)
	}
}

func TestScopeErrors(t *testing.T) {
	for name, scope := range map[string]func(*http.Request) (string, error){
		"error": func(*http.Request) (string, error) { return "", errors.New("unauthenticated") },
		"empty": func(*http.Request) (string, error) { return "", nil },
	} {
		var l ledger
		mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		mw, _ := idempotency.NewMiddleware(mem, idempotency.WithScope(scope))
		wantProblem(t, "scope "+name, call{keys: key("k")}.do(mw(&l)), http.StatusInternalServerError)
		if l.runs.Load() != 0 {
			t.Errorf("scope %s: handler ran", name)
		}
	}
}

// logBuffer collects log records for assertions; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestClientGoneStillStores(t *testing.T) {
	var runs atomic.Int64
	h := newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/charges", nil)
	req.Header.Set("X-User", "alice")
	req.Header.Set(idempotency.Header, "k")
	h.ServeHTTP(&cancelingWriter{httptest.NewRecorder(), cancel}, req)
	if rep := (call{keys: key("k")}).do(h); rep.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("after the client went away mid-response: status %d, want a replay", rep.Code)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// cancelingWriter cancels the request context when the header is written,
// as if the client disconnected.
type cancelingWriter struct {
	*httptest.ResponseRecorder
	cancel context.CancelFunc
}

func (w *cancelingWriter) WriteHeader(code int) {
	w.ResponseRecorder.WriteHeader(code)
	w.cancel()
}

func TestReplayHeadersOption(t *testing.T) {
	var l ledger
	h := newMiddleware(t, nil, idempotency.WithReplayHeaders("x-not-allowed"))(&l)
	call{keys: key("k")}.do(h)
	rep := call{keys: key("k")}.do(h)
	if got := rep.Header().Get("X-Not-Allowed"); got != "1" {
		t.Errorf("replayed X-Not-Allowed = %q, want 1 (allow-listed)", got)
	}
	if got := rep.Header().Get("Location"); got != "" {
		t.Errorf("replayed Location = %q, want none (not allow-listed)", got)
	}
}

func TestInformationalAndEmptyResponses(t *testing.T) {
	// A real server: httptest.ResponseRecorder takes a 1xx for the final
	// status.
	srv := httptest.NewServer(newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hints" {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, "accepted")
		}
		// "/empty" writes nothing: net/http sends 200.
	})))
	defer srv.Close()
	for _, tc := range []struct {
		target string
		status int
		body   string
	}{{"/hints", 202, "accepted"}, {"/empty", 200, ""}} {
		var got []string
		for range 2 {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.target, nil)
			req.Header.Set("X-User", "alice")
			req.Header.Set(idempotency.Header, "key"+tc.target)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got = append(got, fmt.Sprintf("%d %q %q", resp.StatusCode, body, resp.Header.Get(idempotency.ReplayHeader)))
		}
		want := []string{fmt.Sprintf("%d %q %q", tc.status, tc.body, ""), fmt.Sprintf("%d %q %q", tc.status, tc.body, "true")}
		if got[0] != want[0] || got[1] != want[1] {
			t.Errorf("POST %s twice = %q, want %q", tc.target, got, want)
		}
	}
}

// deadlineWriter is a ResponseWriter that supports SetWriteDeadline, for
// checking that http.ResponseController reaches it through the wrapper.
type deadlineWriter struct {
	*httptest.ResponseRecorder
	deadline time.Time
}

func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.deadline = t
	return nil
}

func TestResponseControllerThroughWrapper(t *testing.T) {
	want := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var errs []error
	var asserted bool
	h := newMiddleware(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		errs = append(errs, rc.SetWriteDeadline(want))
		io.WriteString(w, "part 1")
		errs = append(errs, rc.Flush())
		if f, ok := w.(http.Flusher); ok {
			asserted = true
			f.Flush()
		}
		io.WriteString(w, ", part 2")
	}))
	dw := &deadlineWriter{ResponseRecorder: httptest.NewRecorder()}
	req := httptest.NewRequest(http.MethodPost, "/stream", nil)
	req.Header.Set("X-User", "alice")
	req.Header.Set(idempotency.Header, "k")
	h.ServeHTTP(dw, req)
	for i, err := range errs {
		if err != nil {
			t.Errorf("ResponseController call %d through the wrapper: %v", i, err)
		}
	}
	if !dw.deadline.Equal(want) {
		t.Errorf("SetWriteDeadline reached the writer with %v, want %v", dw.deadline, want)
	}
	if !dw.Flushed || !asserted {
		t.Errorf("Flush: flushed %v, http.Flusher assertion %v; want both", dw.Flushed, asserted)
	}
	rep := call{target: "/stream", keys: key("k")}.do(h)
	if rep.Body.String() != "part 1, part 2" {
		t.Errorf("replay of a flushed response: %q, want the whole body", rep.Body)
	}
}

// TestStoredKeysAreHashed checks that what reaches the store is the hash of
// (scope, key), never the raw key.
func TestStoredKeysAreHashed(t *testing.T) {
	spy := &spyStore{}
	spy.inner, _ = idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	var l ledger
	h := newMiddleware(t, spy)(&l)
	call{user: "alice", keys: key("raw-key")}.do(h)
	if len(spy.keys) != 1 || spy.keys[0] != idempotency.HashKey("alice", "raw-key") {
		t.Fatalf("store saw keys %v, want [HashKey(alice, raw-key)]", spy.keys)
	}
}

type spyStore struct {
	inner *idempotency.MemoryStore
	mu    sync.Mutex
	keys  []store.ID
}

func (s *spyStore) Begin(ctx context.Context, k store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	s.mu.Lock()
	s.keys = append(s.keys, k)
	s.mu.Unlock()
	return s.inner.Begin(ctx, k, fp, ttl)
}
func (s *spyStore) Complete(ctx context.Context, k store.ID, o store.Owner, r store.Record, d time.Duration) error {
	return s.inner.Complete(ctx, k, o, r, d)
}
func (s *spyStore) Extend(ctx context.Context, k store.ID, o store.Owner, d time.Duration) error {
	return s.inner.Extend(ctx, k, o, d)
}
func (s *spyStore) Release(ctx context.Context, k store.ID, o store.Owner) error {
	return s.inner.Release(ctx, k, o)
}

// TestTwoServersOneStore: two middlewares (two servers) sharing one store
// run a request once between them.
func TestTwoServersOneStore(t *testing.T) {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	var l ledger
	a := newMiddleware(t, mem)(&l)
	b := newMiddleware(t, mem)(&l)
	c := call{keys: key("k"), body: "pay"}
	c.do(a)
	if rep := c.do(b); rep.Header().Get(idempotency.ReplayHeader) != "true" || l.runs.Load() != 1 {
		t.Fatalf("server b after server a: replay %q, runs %d; want a replay and 1 run", rep.Header().Get(idempotency.ReplayHeader), l.runs.Load())
	}
}
