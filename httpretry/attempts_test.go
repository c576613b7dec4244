package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// requestCopy is a deep copy of what a caller's request holds, to tell
// whether RoundTrip modified it.
type requestCopy struct {
	shallow    http.Request // with Header, URL, Body and GetBody cleared
	header     http.Header
	url        url.URL
	body       io.ReadCloser
	hasGetBody bool
}

func copyRequest(r *http.Request) requestCopy {
	c := requestCopy{shallow: *r, header: r.Header.Clone(), url: *r.URL, body: r.Body, hasGetBody: r.GetBody != nil}
	if r.URL.User != nil {
		u := *r.URL.User
		c.url.User = &u
	}
	c.shallow.Header, c.shallow.URL, c.shallow.Body, c.shallow.GetBody = nil, nil, nil, nil
	return c
}

// diff returns what differs between r and the copy, "" if nothing.
func (c requestCopy) diff(r *http.Request) string {
	var d []string
	if !reflect.DeepEqual(r.Header, c.header) {
		d = append(d, "header "+fmtHeader(r.Header)+", was "+fmtHeader(c.header))
	}
	if r.URL == nil || !reflect.DeepEqual(*r.URL, c.url) {
		d = append(d, "URL")
	}
	if r.Body != c.body {
		d = append(d, "Body replaced")
	}
	if (r.GetBody != nil) != c.hasGetBody {
		d = append(d, "GetBody")
	}
	shallow := *r
	shallow.Header, shallow.URL, shallow.Body, shallow.GetBody = nil, nil, nil, nil
	if !reflect.DeepEqual(shallow, c.shallow) {
		d = append(d, "other fields (method, context, length, host, ...)")
	}
	return strings.Join(d, "; ")
}

func fmtHeader(h http.Header) string {
	var b strings.Builder
	_ = h.Write(&b)
	return strings.ReplaceAll(strings.TrimSpace(b.String()), "\r\n", " | ")
}

// TestAttemptHeaderAndCallerRequest: the first attempt carries no attempt
// header, retries carry 2 and 3; the caller's request is never modified;
// the first attempt of a request that needs nothing added is the caller's
// request itself.
func TestAttemptHeaderAndCallerRequest(t *testing.T) {
	tests := []struct {
		name    string
		opts    []httpretry.Option
		method  string
		body    func() io.Reader
		key     string
		header  http.Header // extra request fields
		fails   int         // 503s before the 200
		asIs    bool        // the first attempt is the caller's request itself
		wantHdr []string    // attempt headers the server saw
	}{
		{name: "GET answered at once", method: "GET", asIs: true, wantHdr: []string{""}},
		{name: "GET 503 503 200", method: "GET", fails: 2, asIs: true, wantHdr: wantAttemptHeaders(3)},
		{name: "PUT with a body 503 200", method: "PUT", body: func() io.Reader { return strings.NewReader("put body") },
			fails: 1, asIs: true, wantHdr: wantAttemptHeaders(2)},
		{name: "keyed POST 503 503 200", method: "POST", key: "caller-key",
			body: func() io.Reader { return strings.NewReader("post body") }, fails: 2, asIs: true, wantHdr: wantAttemptHeaders(3)},
		{name: "auto key POST 503 503 200", opts: []httpretry.Option{httpretry.WithAutoIdempotencyKey()}, method: "POST",
			body: func() io.Reader { return strings.NewReader("post body") }, fails: 2, wantHdr: wantAttemptHeaders(3)},
		{name: "auto key POST answered at once", opts: []httpretry.Option{httpretry.WithAutoIdempotencyKey()}, method: "POST",
			wantHdr: []string{""}},
		{name: "GET with a timeout 503 200", opts: []httpretry.Option{httpretry.WithTimeout(time.Minute)}, method: "GET",
			fails: 1, wantHdr: wantAttemptHeaders(2)},
		{name: "GET with an observer 503 200", opts: []httpretry.Option{httpretry.WithObserver(observe.Func(func(context.Context, observe.Event) {}))},
			method: "GET", fails: 1, asIs: true, wantHdr: wantAttemptHeaders(2)},
		{name: "GET with an observer that tags attempts 503 200", opts: []httpretry.Option{httpretry.WithObserver(tagger{})},
			method: "GET", fails: 1, wantHdr: wantAttemptHeaders(2)},
		{name: "buffered body without GetBody 503 200", opts: []httpretry.Option{httpretry.WithBufferBodies(1024)}, method: "PUT",
			body: func() io.Reader { return io.NopCloser(strings.NewReader("hand-made body")) }, fails: 1, wantHdr: wantAttemptHeaders(2)},
		// A stale attempt header of the caller's (a proxy's copy of the
		// request it got): the first attempt goes as a copy without it,
		// retries replace it, whether the request would have gone as it
		// is or not.
		{name: "caller's attempt header, copied", opts: []httpretry.Option{httpretry.WithTimeout(time.Minute)}, method: "GET",
			header: http.Header{wire.AttemptHeader: {"7"}}, fails: 2, wantHdr: wantAttemptHeaders(3)},
		{name: "caller's attempt header, plain request", method: "GET",
			header: http.Header{wire.AttemptHeader: {"7"}}, fails: 2, wantHdr: wantAttemptHeaders(3)},
		// A probe mark of the caller's: no copy carries it (none of these
		// attempts is the breaker's probe).
		{name: "caller's probe mark, copied", opts: []httpretry.Option{httpretry.WithTimeout(time.Minute)}, method: "GET",
			header: http.Header{wire.ProbeHeader: {"1"}, wire.AttemptHeader: {"7"}}, fails: 2, wantHdr: wantAttemptHeaders(3)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, obs := serve(t, failThenOK(tt.fails))
			rec := &recordingRT{base: srv.Client().Transport}
			tr, _ := newTransport(t, rec, tt.opts...)
			var body io.Reader
			if tt.body != nil {
				body = tt.body()
			}
			req := newRequest(t, context.Background(), tt.method, srv.URL+"/path?q=1", body)
			req.Header.Set("X-Caller", "a")
			req.Header.Add("X-Caller", "b")
			if tt.key != "" {
				req.Header.Set(idempotency.Header, tt.key)
			}
			for k, v := range tt.header {
				req.Header[k] = v
			}
			before := copyRequest(req)

			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			if got := readClose(t, resp); resp.StatusCode != 200 || got != "ok" {
				t.Errorf("RoundTrip = %d %q, want 200 \"ok\"", resp.StatusCode, got)
			}
			if d := before.diff(req); d != "" {
				t.Errorf("RoundTrip modified the caller's request: %s", d)
			}
			attempts, keys, _ := obs.snapshot()
			if !slices.Equal(attempts, tt.wantHdr) {
				t.Errorf("server saw attempt headers %q, want %q (\"\" = none)", attempts, tt.wantHdr)
			}
			sent := rec.sent()
			if len(sent) != len(tt.wantHdr) {
				t.Fatalf("base got %d requests, want %d", len(sent), len(tt.wantHdr))
			}
			if got := sent[0] == req; got != tt.asIs {
				t.Errorf("first attempt is the caller's request itself: %v, want %v", got, tt.asIs)
			}
			for i, r := range sent {
				if i > 0 && r == req {
					t.Errorf("attempt %d is the caller's request itself; a retry must be a copy", i+1)
				}
				if _, ok := r.Header[wire.ProbeHeader]; ok && r != req {
					t.Errorf("attempt %d, a copy, carries a probe mark %q; it is no probe", i+1, r.Header[wire.ProbeHeader])
				}
				if got := r.Header.Values("X-Caller"); !slices.Equal(got, []string{"a", "b"}) {
					t.Errorf("attempt %d X-Caller = %q, want the caller's [a b]", i+1, got)
				}
			}
			for i, k := range keys {
				if k != keys[0] {
					t.Errorf("attempt %d Idempotency-Key %q, want %q as on the first", i+1, k, keys[0])
				}
			}
		})
	}
}

// TestRequestCopyDiff checks the checker: every kind of change to a
// request shows.
func TestRequestCopyDiff(t *testing.T) {
	changes := map[string]func(r *http.Request){
		"header added":         func(r *http.Request) { r.Header.Set(wire.AttemptHeader, "1") },
		"header value changed": func(r *http.Request) { r.Header["X-Caller"][0] = "z" },
		"URL":                  func(r *http.Request) { r.URL.Path = "/other" },
		"body":                 func(r *http.Request) { r.Body = http.NoBody },
		"GetBody":              func(r *http.Request) { r.GetBody = nil },
		"method":               func(r *http.Request) { r.Method = "PUT" },
		"context":              func(r *http.Request) { *r = *r.WithContext(context.WithValue(r.Context(), t, 1)) },
		"content length":       func(r *http.Request) { r.ContentLength++ },
	}
	for name, change := range changes {
		req := newRequest(t, context.Background(), "POST", "http://example.test/path", strings.NewReader("x"))
		req.Header.Set("X-Caller", "a")
		before := copyRequest(req)
		if d := before.diff(req); d != "" {
			t.Fatalf("diff of an unchanged request = %q", d)
		}
		change(req)
		if before.diff(req) == "" {
			t.Errorf("diff misses a change of the %s", name)
		}
	}
}

// tagger is an observer that gives each attempt a context of its own.
type tagger struct{}

type tagKey struct{}

func (tagger) Observe(context.Context, observe.Event) {}
func (tagger) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	return context.WithValue(ctx, tagKey{}, e.Attempt)
}
