package idempotency_test

import (
	"bytes"
	"context"
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

	"github.com/stormguard/stormguard/idempotency"
)

func mw3Scope(r *http.Request) (string, error) {
	if t := r.Header.Get("X-Tenant"); t != "" {
		return t, nil
	}
	return "default", nil
}

func mw3MW(t *testing.T, s *idempotency.MemoryStore, opts ...idempotency.Option) func(http.Handler) http.Handler {
	t.Helper()
	if s == nil {
		var err error
		s, err = idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
	}
	mw, err := idempotency.NewMiddleware(s, append([]idempotency.Option{idempotency.WithScope(mw3Scope)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

func mw3Do(h http.Handler, method, target, key, tenant, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.Header, key)
	}
	if tenant != "" {
		r.Header.Set("X-Tenant", tenant)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Replay over a real server: status, allow-listed fields (multi-valued),
// body byte for byte, Idempotent-Replayed, no trailers, no Set-Cookie.
func TestAttackMW3ReplayByteForByte(t *testing.T) {
	var runs atomic.Int32
	body := bytes.Repeat([]byte("0123456789abcdef"), 300) // 4800 bytes
	h := mw3MW(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Add("Vary", "Accept")
		w.Header().Add("Vary", "Origin")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Location", "/x/1")
		w.Header().Set("Set-Cookie", "a=b")
		w.Header().Set("X-Other", "no")
		w.Header().Set("Trailer", "X-Sum")
		w.WriteHeader(201)
		w.Write(body[:100])
		w.(http.Flusher).Flush()
		w.Write(body[100:])
		w.Header().Set("X-Sum", "s")
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	send := func() (*http.Response, []byte) {
		req, _ := http.NewRequest("POST", srv.URL+"/p?q=1", strings.NewReader("req"))
		req.Header.Set(idempotency.Header, "k-bytes")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	r1, b1 := send()
	r2, b2 := send()
	if runs.Load() != 1 {
		t.Fatalf("runs %d", runs.Load())
	}
	if r2.StatusCode != 201 || !bytes.Equal(b2, body) || !bytes.Equal(b1, body) {
		t.Fatalf("status %d body len %d/%d", r2.StatusCode, len(b1), len(b2))
	}
	if r2.Header.Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("no replay header: %v", r2.Header)
	}
	for _, n := range []string{"Vary", "Content-Type", "Location"} {
		if fmt.Sprint(r1.Header[n]) != fmt.Sprint(r2.Header[n]) {
			t.Errorf("%s: first %q replay %q", n, r1.Header[n], r2.Header[n])
		}
	}
	for _, n := range []string{"Set-Cookie", "X-Other", "Trailer"} {
		if _, ok := r2.Header[n]; ok {
			t.Errorf("replay carries %s", n)
		}
	}
	if len(r2.Trailer) != 0 {
		t.Errorf("replay trailers %v", r2.Trailer)
	}
}

func TestAttackMW3FingerprintAndScope(t *testing.T) {
	var runs atomic.Int32
	h := mw3MW(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "run %d %s %s", n, r.Header.Get("X-Tenant"), b)
	}))
	w := mw3Do(h, "POST", "/a", "k1", "t1", "body")
	if w.Code != 200 || w.Body.String() != "run 1 t1 body" {
		t.Fatalf("%d %q", w.Code, w.Body)
	}
	if w := mw3Do(h, "POST", "/a", "k1", "t1", "other"); w.Code != 422 {
		t.Errorf("different body: %d", w.Code)
	}
	if w := mw3Do(h, "POST", "/b", "k1", "t1", "body"); w.Code != 422 {
		t.Errorf("different route: %d", w.Code)
	}
	if w := mw3Do(h, "POST", "/a?x=1", "k1", "t1", "body"); w.Code != 422 {
		t.Errorf("different query: %d", w.Code)
	}
	if w := mw3Do(h, "PATCH", "/a", "k1", "t1", "body"); w.Code != 422 {
		t.Errorf("different method: %d", w.Code)
	}
	w = mw3Do(h, "POST", "/a", "k1", "t2", "body")
	if w.Code != 200 || w.Body.String() != "run 2 t2 body" || w.Header().Get(idempotency.ReplayHeader) != "" {
		t.Errorf("other tenant: %d %q %v", w.Code, w.Body, w.Header())
	}
	w = mw3Do(h, "POST", "/a", `"k1"`, "t1", "body")
	if w.Code != 200 || w.Body.String() != "run 1 t1 body" || w.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("replay: %d %q %v", w.Code, w.Body, w.Header())
	}
	// legacy header
	r := httptest.NewRequest("POST", "/a", strings.NewReader("body"))
	r.Header.Set("X-Idempotency-Key", "k1")
	r.Header.Set("X-Tenant", "t1")
	w = httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 || w.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("legacy replay: %d %v", w.Code, w.Header())
	}
	if runs.Load() != 2 {
		t.Errorf("runs %d", runs.Load())
	}
}

func TestAttackMW3RequiredAndRoute(t *testing.T) {
	var runs atomic.Int32
	h := mw3MW(t, nil, idempotency.WithRequired(), idempotency.WithRoute(func(r *http.Request) string { return "fixed" }))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); w.WriteHeader(201) }))
	if w := mw3Do(h, "POST", "/a", "", "", "x"); w.Code != 400 || !strings.Contains(w.Header().Get("Content-Type"), "problem+json") {
		t.Errorf("missing key: %d %v", w.Code, w.Header())
	}
	if w := mw3Do(h, "GET", "/a", "", "", ""); w.Code != 201 {
		t.Errorf("GET unguarded: %d", w.Code)
	}
	mw3Do(h, "POST", "/a", "k", "", "x")
	if w := mw3Do(h, "POST", "/other", "k", "", "x"); w.Code != 201 || w.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("same route name, other path: %d %v", w.Code, w.Header())
	}
	if runs.Load() != 2 {
		t.Errorf("runs %d", runs.Load())
	}
}

func TestAttackMW3BodyBounds(t *testing.T) {
	const reqCap, respCap = 100, 50
	var runs atomic.Int32
	h := mw3MW(t, nil, idempotency.WithMaxRequestBody(reqCap), idempotency.WithMaxResponseBody(respCap))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			b, _ := io.ReadAll(r.Body)
			n := len(b) - reqCap + respCap // respCap-1, respCap, respCap+1
			w.Header().Set("Content-Type", "text/x")
			w.WriteHeader(202)
			w.Write(bytes.Repeat([]byte("r"), n/2))
			w.Write(bytes.Repeat([]byte("r"), n-n/2))
		}))
	for i, n := range []int{reqCap - 1, reqCap, reqCap + 1} {
		key := fmt.Sprint("kb", i)
		body := strings.Repeat("q", n)
		w1 := mw3Do(h, "POST", "/a", key, "", body)
		if n > reqCap {
			if w1.Code != 413 {
				t.Errorf("req %d: %d", n, w1.Code)
			}
			// chunked (unknown length)
			r := httptest.NewRequest("POST", "/a", io.MultiReader(strings.NewReader(body)))
			r.ContentLength = -1
			r.Header.Set(idempotency.Header, key+"c")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != 413 {
				t.Errorf("chunked req %d: %d", n, w.Code)
			}
			continue
		}
		if w1.Code != 202 {
			t.Fatalf("req %d: %d", n, w1.Code)
		}
	}
	// response at and one under the cap are replayed whole; the one over without body.
	for i, n := range []int{reqCap - 1, reqCap} {
		w := mw3Do(h, "POST", "/a", fmt.Sprint("kb", i), "", strings.Repeat("q", n))
		wantLen := n - reqCap + respCap
		if w.Code != 202 || w.Body.Len() != wantLen || w.Header().Get(idempotency.BodyOmittedHeader) != "" || w.Header().Get("Content-Type") != "text/x" {
			t.Errorf("replay %d: %d len %d %v", n, w.Code, w.Body.Len(), w.Header())
		}
	}
	// over response cap: a third request whose body makes respCap+1
	hOver := mw3MW(t, nil, idempotency.WithMaxResponseBody(respCap))(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			w.Header().Set("Content-Type", "text/x")
			w.Write(bytes.Repeat([]byte("r"), respCap+1))
		}))
	w1 := mw3Do(hOver, "POST", "/a", "ko", "", "")
	w2 := mw3Do(hOver, "POST", "/a", "ko", "", "")
	if w1.Body.Len() != respCap+1 || w2.Code != 200 || w2.Body.Len() != 0 || w2.Header().Get(idempotency.BodyOmittedHeader) != "true" || w2.Header().Get("Content-Type") != "text/x" {
		t.Errorf("over: first %d, replay %d len %d %v", w1.Body.Len(), w2.Code, w2.Body.Len(), w2.Header())
	}
	if runs.Load() != 3 {
		t.Errorf("runs %d", runs.Load())
	}
}

func TestAttackMW3HandlerShapes(t *testing.T) {
	type tc struct {
		name       string
		h          func(w http.ResponseWriter, r *http.Request)
		wantStatus int
		wantRuns   int32 // after two requests
	}
	for _, c := range []tc{
		{"no-status", func(w http.ResponseWriter, r *http.Request) {}, 200, 1},
		{"only-body", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "x") }, 200, 1},
		{"twice", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201); w.WriteHeader(500) }, 201, 1},
		{"500", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, 500, 2},
		{"429", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(429) }, 429, 2},
		{"401", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) }, 401, 2},
		{"408", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(408) }, 408, 2},
		{"404", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(404) }, 404, 1},
		{"flush", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "a")
			w.(http.Flusher).Flush()
			http.NewResponseController(w).Flush()
			io.WriteString(w, "b")
		}, 200, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			h := mw3MW(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); c.h(w, r) }))
			w1 := mw3Do(h, "POST", "/", "k", "", "")
			w2 := mw3Do(h, "POST", "/", "k", "", "")
			if w1.Code != c.wantStatus || w2.Code != c.wantStatus || runs.Load() != c.wantRuns || w1.Body.String() != w2.Body.String() {
				t.Errorf("codes %d %d runs %d bodies %q %q", w1.Code, w2.Code, runs.Load(), w1.Body, w2.Body)
			}
		})
	}
	// panic releases
	var runs atomic.Int32
	h := mw3MW(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			panic("boom")
		}
		w.WriteHeader(201)
	}))
	func() {
		defer func() { recover() }()
		mw3Do(h, "POST", "/", "kp", "", "")
	}()
	if w := mw3Do(h, "POST", "/", "kp", "", ""); w.Code != 201 || runs.Load() != 2 {
		t.Errorf("after panic: %d runs %d", w.Code, runs.Load())
	}
}

func TestAttackMW3ConcurrentOneKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		release := make(chan struct{})
		h := mw3MW(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			<-release
			w.WriteHeader(201)
			io.WriteString(w, "done")
		}))
		var wg sync.WaitGroup
		codes := make([]*httptest.ResponseRecorder, 8)
		for i := range codes {
			wg.Add(1)
			go func() { defer wg.Done(); codes[i] = mw3Do(h, "POST", "/", "kc", "", "b") }()
		}
		synctest.Wait()
		// 7 have answered 409 by now
		n409 := 0
		for i := range codes {
			if codes[i] != nil {
				if codes[i].Code != 409 || codes[i].Header().Get("Retry-After") == "" {
					t.Errorf("early answer %d %v", codes[i].Code, codes[i].Header())
				}
				n409++
			}
		}
		close(release)
		wg.Wait()
		if n409 != 7 || runs.Load() != 1 {
			t.Errorf("409s %d runs %d", n409, runs.Load())
		}
		w := mw3Do(h, "POST", "/", "kc", "", "b")
		if w.Code != 201 || w.Body.String() != "done" {
			t.Errorf("replay %d %q", w.Code, w.Body)
		}
	})
}

// A handler that runs 10 lock timeouts keeps its key.
func TestAttackMW3LockRenewalLongHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		var ctxErr atomic.Value
		h := mw3MW(t, nil, idempotency.WithLockTimeout(time.Second))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			select {
			case <-time.After(10 * time.Second):
			case <-r.Context().Done():
				ctxErr.Store(context.Cause(r.Context()))
			}
			w.WriteHeader(201)
		}))
		done := make(chan *httptest.ResponseRecorder)
		go func() { done <- mw3Do(h, "POST", "/", "kl", "", "") }()
		for i := 0; i < 9; i++ {
			time.Sleep(time.Second)
			if w := mw3Do(h, "POST", "/", "kl", "", ""); w.Code != 409 {
				t.Errorf("at %ds: %d", i+1, w.Code)
			}
		}
		w := <-done
		if w.Code != 201 || runs.Load() != 1 || ctxErr.Load() != nil {
			t.Errorf("first %d runs %d err %v", w.Code, runs.Load(), ctxErr.Load())
		}
		if w := mw3Do(h, "POST", "/", "kl", "", ""); w.Code != 201 || w.Header().Get(idempotency.ReplayHeader) != "true" {
			t.Errorf("replay %d", w.Code)
		}
	})
}

func TestAttackMW3RetentionExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		h := mw3MW(t, nil, idempotency.WithRetention(time.Minute))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprint(w, runs.Add(1))
		}))
		mw3Do(h, "POST", "/", "kr", "", "")
		time.Sleep(59 * time.Second)
		if w := mw3Do(h, "POST", "/", "kr", "", ""); w.Body.String() != "1" || w.Header().Get(idempotency.ReplayHeader) != "true" {
			t.Errorf("at 59s: %q", w.Body)
		}
		time.Sleep(2 * time.Second)
		if w := mw3Do(h, "POST", "/", "kr", "", ""); w.Body.String() != "2" {
			t.Errorf("at 61s: %q", w.Body)
		}
		// different body after expiry is fine too
		time.Sleep(2 * time.Minute)
		if w := mw3Do(h, "POST", "/", "kr", "", "new"); w.Body.String() != "3" {
			t.Errorf("after expiry, new body: %d %q", w.Code, w.Body)
		}
	})
}

// Store full: a new request is answered 503 with Retry-After, the handler
// does not run; a record without room is stored without its body.
func TestAttackMW3StoreFull(t *testing.T) {
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{MaxEntries: 4})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw3MW(t, s)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); w.WriteHeader(201) }))
	for i := 0; i < 2; i++ {
		if w := mw3Do(h, "POST", "/", fmt.Sprint("f", i), "", ""); w.Code != 201 {
			t.Fatalf("key %d: %d", i, w.Code)
		}
	}
	w := mw3Do(h, "POST", "/", "f2", "", "")
	if w.Code != 503 || w.Header().Get("Retry-After") == "" || runs.Load() != 2 {
		t.Errorf("full: %d %v runs %d", w.Code, w.Header(), runs.Load())
	}
	// another tenant still has room
	if w := mw3Do(h, "POST", "/", "f2", "t2", ""); w.Code != 201 {
		t.Errorf("other tenant: %d", w.Code)
	}
	// old keys replay
	if w := mw3Do(h, "POST", "/", "f0", "", ""); w.Code != 201 || w.Header().Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("replay: %d", w.Code)
	}
}

func TestAttackMW3InformationalOverRealServer(t *testing.T) {
	for _, c := range []struct {
		name string
		h    func(w http.ResponseWriter, r *http.Request)
		want int
	}{
		{"103-then-201", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</a>; rel=preload")
			w.WriteHeader(103)
			w.Header().Set("Location", "/x")
			w.WriteHeader(201)
			io.WriteString(w, "made")
		}, 201},
		{"103-only", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(103) }, 200},
		{"204-with-body", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204); io.WriteString(w, "x") }, 204},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			srv := httptest.NewServer(mw3MW(t, nil)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { runs.Add(1); c.h(w, r) })))
			defer srv.Close()
			var got []string
			for i := 0; i < 2; i++ {
				req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("b"))
				req.Header.Set(idempotency.Header, "k1xx")
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				got = append(got, fmt.Sprintf("%d %q loc=%q", resp.StatusCode, b, resp.Header.Get("Location")))
				if resp.StatusCode != c.want {
					t.Errorf("attempt %d: %s", i, got[i])
				}
			}
			if runs.Load() != 1 || got[0] != got[1] {
				t.Errorf("runs %d: %v", runs.Load(), got)
			}
		})
	}
}

func TestAttackMW3ParseKeyForms(t *testing.T) {
	long := strings.Repeat("a", 255)
	for _, c := range []struct {
		in, want string
		ok       bool
	}{
		{long, long, true},
		{long + "a", "", false},
		{`"` + strings.Repeat(`\"`, 0) + long + `"`, long, true},
		{`"` + strings.Repeat(`\\`, 255) + `"`, strings.Repeat(`\\`, 255)[:0] + strings.Repeat(`\`, 255), true},
		{` 	abc 	`, "abc", true},
		{`"a,b"`, "a,b", true},
		{`a,b`, "", false},
		{`""`, "", false},
		{`"abc";p=1`, "", false},
		{"a\x7fb", "", false},
		{"\"a\\\"b\"", "a\"b", true},
	} {
		got, err := idempotency.ParseKey(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}
