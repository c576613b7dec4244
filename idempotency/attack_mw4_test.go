package idempotency_test

// Black-box attacks (area idem2026) on the middleware's replay: the
// Content-Type net/http picks, flushes, trailers, 1xx, WithReplayHeaders.

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
)

const zzHTML = "<html><body>charged</body></html>"

func zzMW(t *testing.T, opts ...idempotency.Option) func(http.Handler) http.Handler {
	t.Helper()
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	opts = append([]idempotency.Option{idempotency.WithScope(func(*http.Request) (string, error) { return "t", nil })}, opts...)
	mw, err := idempotency.NewMiddleware(s, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

type zzResp struct {
	code     int
	header   http.Header
	trailer  http.Header
	body     string
	replayed bool
}

// zzPost sends a POST with key over a real server (net/http's own
// Content-Type picking and framing).
func zzPost(t *testing.T, url, key string) zzResp {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader("pay"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(idempotency.Header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return zzResp{code: resp.StatusCode, header: resp.Header, trailer: resp.Trailer, body: string(b),
		replayed: resp.Header.Get(idempotency.ReplayHeader) == "true"}
}

func zzServe(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// Package doc: "a Content-Type the handler left to net/http, which picks
// one from the first bytes it sends, is picked again from the replay's
// whole body, or left out if the first answer's header was flushed before
// any byte". Behind an http.TimeoutHandler (which the package doc names as
// a front the middleware works behind), the handler's Flush does not reach
// the client (the TimeoutHandler's writer cannot flush): the first answer's
// header is sent with the whole body, and net/http picks text/html. The
// replay must then pick it again; it is left out.
func TestAttackIdemUnsupportedFlushKeepsContentType(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		if f, ok := w.(http.Flusher); ok {
			f.Flush() // does nothing behind a TimeoutHandler
		}
		_, _ = io.WriteString(w, zzHTML)
	})
	url := zzServe(t, http.TimeoutHandler(zzMW(t)(h), time.Minute, "timeout"))
	first := zzPost(t, url, "k-flush-th")
	replay := zzPost(t, url, "k-flush-th")
	if runs.Load() != 1 || !replay.replayed || replay.body != first.body || replay.code != first.code {
		t.Fatalf("runs %d, first %d %q, replay %d %q replayed %v", runs.Load(), first.code, first.body, replay.code, replay.body, replay.replayed)
	}
	got, want := replay.header.Get("Content-Type"), first.header.Get("Content-Type")
	if got != want {
		t.Errorf("first answer's Content-Type %q (net/http picked it from the body: the flush did not happen), replay's %q", want, got)
	}
}

// The direct case of the same sentence: a header flushed before any byte
// goes without a Content-Type, and the replay too; through Flush and
// through http.ResponseController.
func TestAttackIdem4FlushedHeaderNoContentType(t *testing.T) {
	for _, via := range []string{"flusher", "controller"} {
		t.Run(via, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Etag", `"v1"`)
				if via == "flusher" {
					w.(http.Flusher).Flush()
				} else if err := http.NewResponseController(w).Flush(); err != nil {
					t.Errorf("Flush: %v", err)
				}
				_, _ = io.WriteString(w, zzHTML)
			})
			url := zzServe(t, zzMW(t)(h))
			first := zzPost(t, url, "k-"+via)
			replay := zzPost(t, url, "k-"+via)
			if !replay.replayed || replay.body != zzHTML || replay.header.Get("Etag") != `"v1"` {
				t.Fatalf("replay %+v", replay)
			}
			if _, ok := first.header["Content-Type"]; ok {
				t.Fatalf("premise: net/http picked %q for a header flushed before any byte", first.header.Get("Content-Type"))
			}
			if ct, ok := replay.header["Content-Type"]; ok {
				t.Errorf("replay's Content-Type %q, first answer had none", ct)
			}
		})
	}
}

// "allow-listed header fields as they were when it wrote the header": a
// handler that suppresses net/http's picking (Content-Type present,
// without a value) gets a replay without one; a picked type is picked
// again; an explicit one is kept.
func TestAttackIdem4ContentTypeForms(t *testing.T) {
	cases := []struct {
		name string
		set  func(h http.Header)
	}{
		{"suppressed", func(h http.Header) { h["Content-Type"] = nil }},
		{"picked", func(http.Header) {}},
		{"explicit", func(h http.Header) { h.Set("Content-Type", "application/vnd.x+json") }},
		{"encoded", func(h http.Header) { h.Set("Content-Encoding", "identity") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c.set(w.Header())
				_, _ = io.WriteString(w, zzHTML)
			})
			url := zzServe(t, zzMW(t)(h))
			first := zzPost(t, url, "k")
			replay := zzPost(t, url, "k")
			if !replay.replayed {
				t.Fatalf("no replay: %+v", replay)
			}
			if f, r := first.header.Values("Content-Type"), replay.header.Values("Content-Type"); strings.Join(f, ",") != strings.Join(r, ",") {
				t.Errorf("Content-Type first %q, replay %q", f, r)
			}
		})
	}
}

// "not its trailers: a replay carries none"; 1xx are passed through, the
// stored header is the final one's; a 204's body write is refused and the
// replay has none.
func TestAttackIdem4TrailersInformationalNoBody(t *testing.T) {
	mw := zzMW(t, idempotency.WithReplayHeaders("Etag", "Link", "Content-Type"))
	mux := http.NewServeMux()
	mux.Handle("/trailer", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Sum")
		w.Header().Set("Etag", `"e"`)
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "body")
		w.Header().Set("X-Sum", "1")
		w.Header().Set(http.TrailerPrefix+"Etag", `"late"`)
	})))
	mux.Handle("/early", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		w.Header().Set("Etag", `"final"`)
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, "ok")
	})))
	mux.Handle("/nobody", mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		if _, err := io.WriteString(w, "ignored"); err == nil {
			t.Errorf("a 204's body write succeeded")
		}
	})))
	url := zzServe(t, mux)

	first := zzPost(t, url+"/trailer", "k1")
	replay := zzPost(t, url+"/trailer", "k1")
	if first.trailer.Get("X-Sum") != "1" {
		t.Fatalf("premise: first answer's trailer %v", first.trailer)
	}
	if !replay.replayed || replay.body != "body" || replay.header.Get("Etag") != `"e"` || len(replay.trailer) != 0 || replay.header.Get("Trailer") != "" {
		t.Errorf("trailer replay: %+v", replay)
	}

	first = zzPost(t, url+"/early", "k2")
	replay = zzPost(t, url+"/early", "k2")
	if !replay.replayed || replay.code != http.StatusAccepted || replay.header.Get("Etag") != `"final"` || replay.header.Get("Link") != "" || replay.body != "ok" {
		t.Errorf("1xx then 202: first %+v replay %+v", first, replay)
	}

	first = zzPost(t, url+"/nobody", "k3")
	replay = zzPost(t, url+"/nobody", "k3")
	if !replay.replayed || replay.code != http.StatusNoContent || replay.body != "" {
		t.Errorf("204: first %+v replay %+v", first, replay)
	}
}

// WithReplayHeaders: "listing one is an error. So is a name that is not a
// header field name (a token of RFC 9110), which includes net/http's
// "Trailer:" prefix".
func TestAttackIdem4ReplayHeaderNames(t *testing.T) {
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	scope := idempotency.WithScope(func(*http.Request) (string, error) { return "t", nil })
	bad := []string{"", "Trailer:Etag", "trailer:x", "X Y", "X\x00", "Ét", "x:", ":", "(x)", "a/b",
		"set-cookie", "SET-COOKIE2", "www-authenticate", "content-length", "transfer-encoding", "te", "TRAILER",
		"keep-alive", "connection", "upgrade", "proxy-connection", "authorization", "cookie",
		"idempotent-replayed", "idempotent-body-omitted", "authentication-info", "proxy-authentication-info"}
	for _, name := range bad {
		if _, err := idempotency.NewMiddleware(s, scope, idempotency.WithReplayHeaders("Etag", name)); err == nil {
			t.Errorf("WithReplayHeaders(%q) accepted", name)
		}
	}
	for _, name := range []string{"x-a_b", "X-!#$%&'*+-.^`|~", "Link", "content-type", "ETAG", "Retry-After", "Date"} {
		if _, err := idempotency.NewMiddleware(s, scope, idempotency.WithReplayHeaders(name)); err != nil {
			t.Errorf("WithReplayHeaders(%q): %v", name, err)
		}
	}
	// the empty list: nothing replayed but the replay header
	mw, err := idempotency.NewMiddleware(s, scope, idempotency.WithReplayHeaders())
	if err != nil {
		t.Fatal(err)
	}
	url := zzServe(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Etag", `"x"`)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "{}")
	})))
	zzPost(t, url, "k-empty")
	replay := zzPost(t, url, "k-empty")
	if !replay.replayed || replay.code != http.StatusCreated || replay.header.Get("Etag") != "" || replay.body != "{}" {
		t.Errorf("empty allow-list replay %+v", replay)
	}
}
