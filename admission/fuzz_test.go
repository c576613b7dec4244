package admission_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// FuzzWrapAttemptHeader sends arbitrary attempt header lines through the
// middleware: it never panics, a request is a retry exactly when its first
// line parses as a number of 2 or more, and an admitted request reaches
// the handler.
func FuzzWrapAttemptHeader(f *testing.F) {
	for _, s := range []string{"", "1", "2", " 3 ", "2,5", "0", "-1", "+2", "1048576", "1048577", "x", "\x00", "9999999"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, value string, second bool) {
		var got observe.Event
		ctl, err := admission.New(admission.Config{Observer: observe.Func(func(_ context.Context, e observe.Event) { got = e })})
		if err != nil {
			t.Fatal(err)
		}
		called := false
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
		r := request(0)
		r.Header[wire.AttemptHeader] = []string{value}
		if second {
			r.Header[wire.AttemptHeader] = []string{"1", value} // the first line counts
		}
		h.ServeHTTP(&nopWriter{h: http.Header{}}, r)
		want := 1
		if n, ok := wire.ParseAttempt(value); ok && !second {
			want = n
		}
		if got.Attempt != want {
			t.Errorf("header %q (second line %v): attempt %d, want %d", value, second, got.Attempt, want)
		}
		if called != (got.Outcome == "admitted") {
			t.Errorf("header %q: handler called %v for outcome %v", value, called, got.Outcome)
		}
	})
}

// FuzzWrapFields sends arbitrary probe, timeout and idempotency-key fields
// through the middleware: it never panics or blocks, an admitted request
// reaches the handler and a refused one gets a 503, and a timeout field
// that parses as 0 ms is refused before the handler.
func FuzzWrapFields(f *testing.F) {
	f.Add("1", "1000", "", "k")
	f.Add(" 1 ", "0", "500", "")
	f.Add("yes", "-1", "0", " ")
	f.Add("", "99999999999999999999", "x", "k-1")
	f.Fuzz(func(t *testing.T, probe, timeout, envoy, key string) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: -1})
		if err != nil {
			t.Fatal(err)
		}
		called := false
		h := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true }))
		for _, attempt := range []string{"", "2"} {
			called = false
			r := request(0)
			if attempt != "" {
				r.Header[wire.AttemptHeader] = []string{attempt}
			}
			r.Header[wire.ProbeHeader] = []string{probe}
			r.Header[wire.TimeoutHeader] = []string{timeout}
			r.Header["X-Envoy-Expected-Rq-Timeout-Ms"] = []string{envoy}
			r.Header["Idempotency-Key"] = []string{key}
			w := &codeWriter{h: http.Header{}}
			h.ServeHTTP(w, r)
			if called != (w.code == 0 || w.code == http.StatusOK) || (!called && w.code != http.StatusServiceUnavailable) {
				t.Fatalf("handler called %v, status %d", called, w.code)
			}
			if zeroMillis(timeout) || zeroMillis(envoy) {
				if called {
					t.Fatalf("timeout %q / envoy %q: handler ran for a caller whose time was up", timeout, envoy)
				}
			}
		}
	})
}

// zeroMillis reports whether v, as a timeout field, says 0 ms: digits that
// are all zeros, before any comma, after trimming spaces and tabs.
func zeroMillis(v string) bool {
	v, _, _ = strings.Cut(v, ",")
	v = strings.Trim(v, " \t")
	return v != "" && strings.Trim(v, "0") == ""
}

// codeWriter keeps the status of the answer (0 if none was written).
type codeWriter struct {
	h    http.Header
	code int
}

func (w *codeWriter) Header() http.Header { return w.h }
func (w *codeWriter) Write(p []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return len(p), nil
}
func (w *codeWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
