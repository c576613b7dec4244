package pgstore_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
)

// Doc (idempotency package): a replay is "the stored status, allow-listed
// headers and body, plus Idempotent-Replayed: true"; over the cap, "the
// same without the body, plus Idempotent-Body-Omitted: true"; same key,
// different fingerprint: 422. End to end over PostgreSQL, with a real
// server, odd header values and a binary body.
func TestAttackMWPostgresReplayEndToEnd(t *testing.T) {
	p, _ := pool(t, 4)
	s, _ := newTable(t, p)
	var runs atomic.Int32
	mw, err := idempotency.NewMiddleware(s, idempotency.WithScope(func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }),
		idempotency.WithMaxResponseBody(64))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header()["Vary"] = []string{"A", "", "B"}
		w.Header().Set("Location", "/\xffx")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(299)
		if string(b) == "big" {
			w.Write(make([]byte, 65))
			return
		}
		w.Write([]byte("\x00\xff\xfe body"))
	})))
	defer srv.Close()
	send := func(key, user, body string) (*http.Response, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/c?q=1", strings.NewReader(body))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-User", user)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	r1, b1 := send("k", "u", "small")
	r2, b2 := send("k", "u", "small")
	if r2.StatusCode != r1.StatusCode || b1 != b2 || r2.Header.Get(idempotency.ReplayHeader) != "true" ||
		!reflect.DeepEqual(r1.Header["Vary"], r2.Header["Vary"]) || r1.Header.Get("Location") != r2.Header.Get("Location") || runs.Load() != 1 {
		t.Errorf("first %d %q %v\nreplay %d %q %v runs %d", r1.StatusCode, b1, r1.Header, r2.StatusCode, b2, r2.Header, runs.Load())
	}
	if r, _ := send("k", "u", "other"); r.StatusCode != 422 {
		t.Errorf("other body: %d", r.StatusCode)
	}
	if r, _ := send("k", "v", "other"); r.StatusCode != 299 || r.Header.Get(idempotency.ReplayHeader) != "" {
		t.Errorf("other caller: %d %v", r.StatusCode, r.Header)
	}
	r3, b3 := send("big", "u", "big")
	r4, b4 := send("big", "u", "big")
	if len(b3) != 65 || r4.StatusCode != 299 || b4 != "" || r4.Header.Get(idempotency.BodyOmittedHeader) != "true" ||
		r4.Header.Get("Content-Type") != "application/octet-stream" || r4.Header.Get("Content-Length") != "0" {
		t.Errorf("over cap: first %d %d bytes; replay %d %q %v", r3.StatusCode, len(b3), r4.StatusCode, b4, r4.Header)
	}
}
