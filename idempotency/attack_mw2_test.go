package idempotency_test

// Attacks on the HTTP middleware, against the package doc,
// docs/idempotency.md and README.md. Handler runs are counted per key.

import (
	"bufio"
	"errors"
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

func ihScope(r *http.Request) (string, error) {
	if t := r.Header.Get("X-Tenant"); t != "" {
		return t, nil
	}
	return "t0", nil
}

func ihMW(t *testing.T, opts ...idempotency.Option) func(http.Handler) http.Handler {
	t.Helper()
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idempotency.NewMiddleware(s, append([]idempotency.Option{idempotency.WithScope(ihScope)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

type ihResp struct {
	status  int
	header  http.Header
	trailer http.Header
	body    string
}

func ihDo(t *testing.T, c *http.Client, method, url, key, tenant, body string) ihResp {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(idempotency.Header, key)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return ihResp{resp.StatusCode, resp.Header, resp.Trailer, string(b)}
}

// Package doc: "what is stored is what the handler produced, whole"; the
// replay is "the stored status, allow-listed headers and body". A
// streaming handler that flushes its header before its body (or its first
// bytes before the rest) leaves Content-Type to net/http's sniffing of the
// first flushed bytes; the replay writes the body in one piece and is
// sniffed again, from other bytes: the replay's Content-Type differs from
// the one the client got the first time.
func TestAttackMW2ReplaySniffedContentType(t *testing.T) {
	const page = "<html><body>charged</body></html>"
	for _, c := range []struct {
		name        string
		h           func(w http.ResponseWriter)
		first, want string // the first answer's Content-Type, the replay's
	}{
		// Flushed before any byte: net/http had nothing to pick a type
		// from and sent none; the replay sends none (it once picked
		// text/html from the whole body).
		{"flush header first", func(w http.ResponseWriter) {
			w.WriteHeader(201)
			w.(http.Flusher).Flush()
			io.WriteString(w, page)
		}, "", ""},
		// The first bytes went alone: net/http picked from "<ht"; the
		// replay picks from the whole body (documented).
		{"flush a prefix first", func(w http.ResponseWriter) {
			w.WriteHeader(201)
			io.WriteString(w, page[:3])
			w.(http.Flusher).Flush()
			io.WriteString(w, page[3:])
		}, "text/plain; charset=utf-8", "text/html; charset=utf-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			srv := httptest.NewServer(ihMW(t)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				c.h(w)
			})))
			defer srv.Close()
			r1 := ihDo(t, srv.Client(), "POST", srv.URL+"/pay", "k-sniff", "", "x")
			r2 := ihDo(t, srv.Client(), "POST", srv.URL+"/pay", "k-sniff", "", "x")
			if r2.header.Get(idempotency.ReplayHeader) != "true" || runs.Load() != 1 {
				t.Fatalf("second answer not a replay (runs %d)", runs.Load())
			}
			if r1.body != r2.body || r1.status != r2.status {
				t.Fatalf("bodies/status differ: %d %q / %d %q", r1.status, r1.body, r2.status, r2.body)
			}
			if a, b := strings.Join(r1.header.Values("Content-Type"), "|"), strings.Join(r2.header.Values("Content-Type"), "|"); a != c.first || b != c.want {
				t.Errorf("Content-Type: first answer %q, replay %q; want %q, %q", a, b, c.first, c.want)
			}
		})
	}
}

// Package doc: "not its trailers: a replay carries none"; WithReplayHeaders
// refuses a name that is not a header field name. A trailer named with
// http.TrailerPrefix was taken as a header name to store and replay, and
// the replay then carried it as a trailer.
func TestAttackMW2TrailerPrefixInAllowList(t *testing.T) {
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{http.TrailerPrefix + "X-Checksum", "X Bad", "X-Bad\r\n", "X:Y"} {
		if _, err := idempotency.NewMiddleware(s, idempotency.WithReplayHeaders("Content-Type", name)); err == nil {
			t.Errorf("WithReplayHeaders(%q) accepted; want an error (not a header field name)", name)
		}
	}
}

func TestAttackMW2AnswerTable(t *testing.T) {
	runs := map[string]*atomic.Int32{}
	var mu sync.Mutex
	count := func(k string) *atomic.Int32 {
		mu.Lock()
		defer mu.Unlock()
		if runs[k] == nil {
			runs[k] = new(atomic.Int32)
		}
		return runs[k]
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		count(r.Header.Get("X-Tenant") + "/" + r.Header.Get(idempotency.Header)).Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Private", "no")
		w.Header().Add("Vary", "A")
		w.Header().Add("Vary", "B")
		w.Header().Set("Set-Cookie", "s=1")
		w.WriteHeader(201)
		io.WriteString(w, "got:"+string(b)+":"+r.Header.Get("X-Tenant"))
	})
	srv := httptest.NewServer(ihMW(t, idempotency.WithRequired(), idempotency.WithMaxRequestBody(10),
		idempotency.WithReplayHeaders("Content-Type", "Vary"))(h))
	defer srv.Close()
	c := srv.Client()
	u := srv.URL + "/pay?x=1"

	r1 := ihDo(t, c, "POST", u, "k1", "A", "body")
	r2 := ihDo(t, c, "POST", u, "k1", "A", "body")
	if r1.status != 201 || r2.status != 201 || r1.body != r2.body || r2.header.Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("replay: %+v / %+v", r1, r2)
	}
	if r2.header.Get("X-Private") != "" || r2.header.Get("Set-Cookie") != "" || strings.Join(r2.header.Values("Vary"), ",") != "A,B" {
		t.Errorf("replayed header %v", r2.header)
	}
	if r1.header.Get(idempotency.ReplayHeader) != "" {
		t.Errorf("first answer marked replayed")
	}
	for _, c2 := range []struct {
		name, method, url, body string
	}{
		{"body", "POST", u, "other"},
		{"route", "POST", srv.URL + "/pay?x=2", "body"},
		{"method", "PATCH", u, "body"},
	} {
		if r := ihDo(t, c, c2.method, c2.url, "k1", "A", c2.body); r.status != 422 || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
			t.Errorf("%s differs: %d %v", c2.name, r.status, r.header)
		}
	}
	// scope isolation: same key, another tenant, runs anew and its own answer
	r3 := ihDo(t, c, "POST", u, "k1", "B", "body")
	if r3.status != 201 || r3.header.Get(idempotency.ReplayHeader) != "" || !strings.HasSuffix(r3.body, ":B") {
		t.Errorf("other scope: %+v", r3)
	}
	// another scope with a different body is its own operation, no 422
	if r := ihDo(t, c, "POST", u, "k1", "C", "zz"); r.status != 201 {
		t.Errorf("third scope: %d", r.status)
	}
	// missing key, malformed keys, body over cap
	if r := ihDo(t, c, "POST", u, "", "A", "b"); r.status != 400 {
		t.Errorf("missing: %d", r.status)
	}
	for _, k := range []string{`"unterminated`, `a,b`, strings.Repeat("k", 256), `"a"; p=1`, `""`, `"a\x"`} {
		if r := ihDo(t, c, "POST", u, k, "A", "b"); r.status != 400 {
			t.Errorf("key %q: %d", k, r.status)
		}
	}
	if r := ihDo(t, c, "POST", u, "k-big", "A", "01234567890"); r.status != 413 {
		t.Errorf("11-byte body: %d", r.status)
	}
	if r := ihDo(t, c, "POST", u, "k-cap", "A", "0123456789"); r.status != 201 {
		t.Errorf("10-byte body: %d", r.status)
	}
	// quoted and bare forms name one key
	if r := ihDo(t, c, "POST", u, `"k1"`, "A", "body"); r.status != 201 || r.header.Get(idempotency.ReplayHeader) != "true" {
		t.Errorf("quoted k1: %d %v", r.status, r.header)
	}
	// GET passes through untouched, even with a bad key
	if r := ihDo(t, c, "GET", u, `"bad`, "A", ""); r.status != 201 {
		t.Errorf("GET: %d", r.status)
	}
	for k, n := range map[string]int32{"A/k1": 1, "B/k1": 1, "C/k1": 1, "A/k-cap": 1, "A/k-big": 0} {
		if got := count(k).Load(); got != n {
			t.Errorf("runs of %s: %d, want %d", k, got, n)
		}
	}
}

// Stored or not: statuses, body over the cap, a handler that hijacks,
// writes nothing, streams, panics; Content-Type suppressed with nil.
func TestAttackMW2StoredOrNot(t *testing.T) {
	big := strings.Repeat("z", 100)
	for _, c := range []struct {
		name      string
		h         func(w http.ResponseWriter, r *http.Request)
		runs      int32 // after 2 requests
		omitted   bool
		sameCT    bool
		noHijack  bool
		wantReply int
	}{
		{"over cap streamed", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Location", "/p/1")
			w.WriteHeader(202)
			for range 10 {
				io.WriteString(w, big[:10])
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, "!")
		}, 1, true, false, true, 202},
		{"exactly the cap", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, big)
		}, 1, false, true, true, 200},
		{"content-type suppressed", func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			w.WriteHeader(201)
			io.WriteString(w, "<html>hi</html>")
		}, 1, false, true, true, 201},
		{"writes nothing", func(w http.ResponseWriter, r *http.Request) {}, 1, false, true, true, 200},
		{"503", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }, 2, false, true, true, 503},
		{"hijack", func(w http.ResponseWriter, r *http.Request) {
			conn, brw, err := http.NewResponseController(w).Hijack()
			if err != nil {
				w.WriteHeader(500)
				return
			}
			brw.WriteString("HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			brw.Flush()
			conn.Close()
		}, 2, false, true, false, 201},
		{"panic after answer", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			io.WriteString(w, "x")
			panic(http.ErrAbortHandler)
		}, 2, false, true, true, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			mw := ihMW(t, idempotency.WithMaxResponseBody(100))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				c.h(w, r)
			}))
			// served counts the requests the middleware is done with: a
			// handler that hijacks answers before the middleware releases
			// its claim, and a second request sent at once would find the
			// key still claimed (409).
			served := make(chan struct{}, 2)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				defer func() { served <- struct{}{} }()
				mw.ServeHTTP(w, r)
			}))
			srv.Config.ErrorLog = nil
			defer srv.Close()
			do := func() (ihResp, error) {
				req, _ := http.NewRequest("POST", srv.URL+"/", strings.NewReader("b"))
				req.Header.Set(idempotency.Header, "k")
				resp, err := srv.Client().Do(req)
				if err != nil {
					return ihResp{}, err
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				return ihResp{resp.StatusCode, resp.Header, resp.Trailer, string(b)}, err
			}
			r1, err1 := do()
			select {
			case <-served:
			case <-time.After(10 * time.Second):
				t.Fatal("the middleware never returned from the first request")
			}
			r2, err2 := do()
			if runs.Load() != c.runs {
				t.Errorf("runs %d, want %d", runs.Load(), c.runs)
			}
			if c.wantReply < 0 {
				return
			}
			if err1 != nil || err2 != nil {
				t.Fatalf("errors %v %v", err1, err2)
			}
			if r2.status != c.wantReply {
				t.Errorf("second status %d, want %d", r2.status, c.wantReply)
			}
			replayed := r2.header.Get(idempotency.ReplayHeader) == "true"
			if replayed != (c.runs == 1) {
				t.Errorf("replayed %v with %d runs", replayed, c.runs)
			}
			if !replayed {
				return
			}
			if got := r2.header.Get(idempotency.BodyOmittedHeader) == "true"; got != c.omitted {
				t.Errorf("body omitted header %v, want %v", got, c.omitted)
			}
			if c.omitted {
				if r2.body != "" || r2.header.Get("Location") != "/p/1" || r2.header.Get("Content-Type") != "text/plain" {
					t.Errorf("omitted replay %+v", r2)
				}
				return
			}
			if r1.body != r2.body {
				t.Errorf("bodies %q / %q", r1.body, r2.body)
			}
			if c.sameCT && strings.Join(r1.header.Values("Content-Type"), "|") != strings.Join(r2.header.Values("Content-Type"), "|") {
				t.Errorf("Content-Type %q / %q", r1.header.Values("Content-Type"), r2.header.Values("Content-Type"))
			}
		})
	}
}

// A request while the first runs gets 409 with Retry-After; the first's
// answer is then replayed; one run; over many concurrent requests.
func TestAttackMW2InProgressStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var runs atomic.Int32
		gate := make(chan struct{})
		h := ihMW(t)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			<-gate
			w.WriteHeader(201)
			io.WriteString(w, "ok")
		}))
		do := func() *httptest.ResponseRecorder {
			r := httptest.NewRequest("POST", "/p", strings.NewReader("b"))
			r.Header.Set(idempotency.Header, "ks")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		first := make(chan *httptest.ResponseRecorder)
		go func() { first <- do() }()
		synctest.Wait()
		for range 20 {
			if w := do(); w.Code != 409 || w.Header().Get("Retry-After") == "" {
				t.Fatalf("while running: %d %v", w.Code, w.Header())
			}
		}
		close(gate)
		if w := <-first; w.Code != 201 {
			t.Fatalf("first %d", w.Code)
		}
		if w := do(); w.Code != 201 || w.Body.String() != "ok" || w.Header().Get(idempotency.ReplayHeader) != "true" {
			t.Fatalf("after: %d %q", w.Code, w.Body)
		}
		if runs.Load() != 1 {
			t.Fatalf("runs %d", runs.Load())
		}
	})
}

// ParseKey's rules: bare and quoted forms.
func TestAttackMW2ParseKeyRules(t *testing.T) {
	ok := map[string]string{
		" abc\t":                              "abc",
		`"a\"b\\c"`:                           `a"b\c`,
		`"a,b"`:                               "a,b",
		`" x "`:                               " x ",
		strings.Repeat("k", 255):              strings.Repeat("k", 255),
		`"` + strings.Repeat(`\\`, 255) + `"`: strings.Repeat(`\`, 255),
		"a b":                                 "a b",
	}
	for in, want := range ok {
		got, err := idempotency.ParseKey(in)
		if err != nil || got != want {
			t.Errorf("ParseKey(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", " ", `""`, `"`, `"a`, `"a"b`, `"a\n"`, "a,b", "a\x00", "é", `"é"`, strings.Repeat("k", 256),
		`"` + strings.Repeat("k", 256) + `"`, `"` + strings.Repeat(`\\`, 256) + `"`, "a\x7f", `"a\tb"`} {
		if k, err := idempotency.ParseKey(in); err == nil {
			t.Errorf("ParseKey(%q) = %q, want an error", in, k)
		} else if !strings.HasPrefix(err.Error(), "idempotency: invalid key: ") {
			t.Errorf("ParseKey(%q) error %q", in, err)
		}
	}
}

var _ = errors.New
var _ = bufio.NewReader
