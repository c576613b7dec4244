package httpretry_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// FuzzRetryAfterResponse sends fuzzed Retry-After values through a real
// Transport: whatever the header says, the transport never panics, never
// sleeps less than a valid hint asks, and retries a 503 at most twice.
func FuzzRetryAfterResponse(f *testing.F) {
	for _, s := range []string{"2", "0", "-1", "1.5", "Sun, 06 Nov 1994 08:49:37 GMT", "Mon, 02 Mar 2026 12:00:00 GMT", "99999999999999999999", "", "soon"} {
		f.Add(s)
	}
	o := &observed{}
	var hint string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.record(r)
		w.Header()["Retry-After"] = []string{hint}
		w.WriteHeader(503)
	}))
	defer srv.Close()
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsFunc(s, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
			return // control characters: not a header value net/http sends as is
		}
		hint = s
		clock := newFakeClock()
		tr, err := httpretry.NewTransport(srv.Client().Transport, httpretry.WithRetry(retry.WithClock(clock), retry.WithBackoff(smallBackoff(t))), httpretry.WithoutBudget())
		if err != nil {
			t.Fatal(err)
		}
		before := o.count()
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if err != nil {
			t.Fatalf("RoundTrip with Retry-After %q: %v", s, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n := o.count() - before; n < 1 || n > 3 || resp.StatusCode != 503 {
			t.Fatalf("Retry-After %q: %d attempts, status %d", s, n, resp.StatusCode)
		}
		if d, ok := httpretry.ParseRetryAfter(s, newFakeClock().Now()); ok {
			// The first sleep follows the first 503, read at the clock's
			// start time (later ones are read after the fake time moved).
			if sl := clock.Sleeps(); len(sl) > 0 && sl[0] < d {
				t.Fatalf("Retry-After %q (%v): slept %v, less than the hint", s, d, sl[0])
			}
			if d > retry.DefaultMaxRetryAfter && len(clock.Sleeps()) > 0 {
				t.Fatalf("Retry-After %q (%v) beyond MaxRetryAfter: slept %v", s, d, clock.Sleeps())
			}
		}
	})
}

// TestGaveUpThroughClientTimeout: an http.Client with a Timeout wraps the
// response body; the give-up mark must survive that.
func TestGaveUpThroughClientTimeout(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) { w.WriteHeader(http.StatusBadGateway) })
	tr, _ := newTransport(t, srv.Client().Transport)
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readClose(t, resp)
	if g, ok := gaveUp(resp); g.Reason != "attempts-exhausted" || g.Attempts != 3 || !ok {
		t.Errorf("GaveUp = %+v, %v; want attempts exhausted, 3, true", g, ok)
	}
	if !overloaded(resp, nil) {
		t.Errorf("Overloaded = false, want true")
	}
}
