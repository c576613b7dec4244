// Black-box attacks on package idempotency (AREA idem), from its documentation only.

package idempotency_test

import (
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
)

func atkIdemDo(h http.Handler, method, target, body, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	r.Header.Set(idempotency.Header, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// WithMaxRequestBody accepts any n > 0. With n = math.MaxInt64 (the natural
// "no practical cap"), the guarded handler must still get the request's body,
// and the same key with another body must be answered 422 (package doc:
// "same key, different fingerprint ... 422", the fingerprint holding the
// SHA-256 of the body).
func TestAttackMaxRequestBodyMaxInt64(t *testing.T) {
	var runs atomic.Int32
	var got atomic.Value
	h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		runs.Add(1)
		got.Store(string(b))
		w.WriteHeader(201)
		_, _ = w.Write([]byte("got:" + string(b)))
	}), idempotency.WithMaxRequestBody(math.MaxInt64))

	w := atkIdemDo(h, "POST", "/pay", `{"amount":100}`, "k1")
	if g, _ := got.Load().(string); g != `{"amount":100}` {
		t.Errorf("handler read body %q, want %q (first answer %d %q)", g, `{"amount":100}`, w.Code, w.Body)
	}
	w = atkIdemDo(h, "POST", "/pay", `{"amount":999999}`, "k1")
	if w.Code != http.StatusUnprocessableEntity {
		t.Errorf("same key, different body: got %d %q (replayed=%q), want 422; handler runs %d",
			w.Code, w.Body, w.Header().Get(idempotency.ReplayHeader), runs.Load())
	}
}

// The same attack with a declared Content-Length the cap allows: the
// middleware must answer (the doc lists 400 for an unreadable body, 413 for
// one over the cap), not panic.
func TestAttackMaxRequestBodyHugeContentLength(t *testing.T) {
	for _, n := range []int64{math.MaxInt64, 1 << 62} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { atkIdemHugeContentLength(t, n) })
	}
}

func atkIdemHugeContentLength(t *testing.T, n int64) {
	h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }),
		idempotency.WithMaxRequestBody(n))
	r := httptest.NewRequest("POST", "/pay", strings.NewReader("x"))
	r.ContentLength = n // what a client may declare (net/http parses up to MaxInt64); the body is 1 byte
	r.Header.Set(idempotency.Header, "k2")
	w := httptest.NewRecorder()
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("middleware panicked on Content-Length %d: %v", r.ContentLength, p)
			}
		}()
		h.ServeHTTP(w, r)
	}()
}

// Package doc: "what is stored is what the handler produced, whole (its
// status, allow-listed header fields as they were when it wrote the
// header, and body; not its trailers: a replay carries none)". A handler's
// trailers (Etag declared, Location undeclared) reach the client on the
// first answer; the replay has neither, as a header or a trailer.
func TestAttackReplayCarriesNoTrailers(t *testing.T) {
	h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Etag")
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(201)
		_, _ = w.Write([]byte("charged"))
		w.Header().Set("Etag", `"v1"`)                        // declared trailer
		w.Header().Set(http.TrailerPrefix+"Location", "/p/1") // undeclared trailer
	}))
	srv := httptest.NewServer(h)
	defer srv.Close()
	do := func() (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/pay", strings.NewReader("x"))
		req.Header.Set(idempotency.Header, "kt")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	r1, b1 := do()
	r2, b2 := do()
	t.Logf("first: %d %q header %v trailer %v", r1.StatusCode, b1, r1.Header, r1.Trailer)
	t.Logf("replay: %d %q header %v trailer %v", r2.StatusCode, b2, r2.Header, r2.Trailer)
	if r2.Header.Get(idempotency.ReplayHeader) != "true" {
		t.Fatalf("second answer not a replay")
	}
	for _, name := range []string{"Etag", "Location"} {
		if first := r1.Trailer.Get(name); first == "" {
			t.Errorf("%s: the first answer has no such trailer", name)
		}
		if replay := r2.Trailer.Get(name) + r2.Header.Get(name); replay != "" {
			t.Errorf("%s: the replay carries %q, want nothing (trailers are not stored)", name, replay)
		}
	}
}

// Over the wire: a client declares a huge Content-Length and sends one byte.
func TestAttackHugeContentLengthOverTheWire(t *testing.T) {
	h := atkMW(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }),
		idempotency.WithMaxRequestBody(1<<62))
	var panicked atomic.Value
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				panicked.Store(fmt.Sprint(p))
				panic(p)
			}
		}()
		h.ServeHTTP(w, r)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: kw\r\nConnection: close\r\nContent-Length: %d\r\n\r\nx", int64(1<<62))
	_ = c.(*net.TCPConn).CloseWrite() // the body ends after 1 byte: unreadable
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b, _ := io.ReadAll(c)
	if p, _ := panicked.Load().(string); p != "" {
		t.Errorf("handler panicked (%s); the client got %q", p, b)
	}
	if !strings.HasPrefix(string(b), "HTTP/1.1 400 ") {
		t.Errorf("a body cut short after 1 byte of a declared 2^62: the client got %q, want 400 (body unreadable)", b)
	}
}
