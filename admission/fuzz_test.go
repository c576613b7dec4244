package admission_test

import (
	"context"
	"net/http"
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
