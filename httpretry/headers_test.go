package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

func TestParseAttempt(t *testing.T) {
	tests := []struct {
		value string
		want  int
		ok    bool
	}{
		{"1", 1, true},
		{"2", 2, true},
		{" 3\t", 3, true},
		{"007", 7, true},
		{"4, 9", 4, true}, // folded by a proxy: the first counts
		{"1048576", 1 << 20, true},
		{"1048577", 0, false},
		{"9999999", 0, false},
		{"99999999999999999999", 0, false},
		{"0", 0, false},
		{"", 0, false},
		{" ", 0, false},
		{",2", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{"1.0", 0, false},
		{"1 2", 0, false},
		{"two", 0, false},
		{"0x2", 0, false},
		{"١", 0, false},
	}
	for _, tt := range tests {
		n, ok := httpretry.ParseAttempt(tt.value)
		if n != tt.want || ok != tt.ok {
			t.Errorf("ParseAttempt(%q) = %d, %v; want %d, %v", tt.value, n, ok, tt.want, tt.ok)
		}
	}
}

func TestAttemptFromRequest(t *testing.T) {
	tests := []struct {
		name   string
		header http.Header
		want   int
		ok     bool
	}{
		{"absent", http.Header{}, 0, false},
		{"set", http.Header{httpretry.AttemptHeader: {"2"}}, 2, true},
		{"first line counts", http.Header{httpretry.AttemptHeader: {"3", "1"}}, 3, true},
		{"garbage", http.Header{httpretry.AttemptHeader: {"x"}}, 0, false},
	}
	for _, tt := range tests {
		r := &http.Request{Header: tt.header}
		if n, ok := httpretry.AttemptFromRequest(r); n != tt.want || ok != tt.ok {
			t.Errorf("AttemptFromRequest(%s) = %d, %v; want %d, %v", tt.name, n, ok, tt.want, tt.ok)
		}
	}
	if n, ok := httpretry.AttemptFromRequest(nil); n != 0 || ok {
		t.Errorf("AttemptFromRequest(nil) = %d, %v; want 0, false", n, ok)
	}
}

func FuzzParseAttempt(f *testing.F) {
	for _, s := range []string{"1", " 2 ", "3,4", "0", "-1", "1048576", "1048577", "99999999999999999999", "", "x", "\t7\t,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := httpretry.ParseAttempt(s)
		if !ok {
			if n != 0 {
				t.Fatalf("ParseAttempt(%q) = %d, false; want 0 when not ok", s, n)
			}
			return
		}
		if n < 1 || n > 1<<20 {
			t.Fatalf("ParseAttempt(%q) = %d, true; out of range", s, n)
		}
		// The first comma-separated element, trimmed, is n in decimal
		// (leading zeros allowed).
		first, _, _ := strings.Cut(s, ",")
		v := strings.Trim(first, " \t")
		if m, err := strconv.Atoi(v); err != nil || m != n || strings.ContainsAny(v, "+-") {
			t.Fatalf("ParseAttempt(%q) = %d, but the value %q reads as %d, %v", s, n, v, m, err)
		}
		// What the transport writes parses back.
		if m, ok := httpretry.ParseAttempt(strconv.Itoa(n)); m != n || !ok {
			t.Fatalf("ParseAttempt(Itoa(%d)) = %d, %v", n, m, ok)
		}
		r := &http.Request{Header: http.Header{httpretry.AttemptHeader: {s}}}
		if m, ok := httpretry.AttemptFromRequest(r); m != n || !ok {
			t.Fatalf("AttemptFromRequest(%q) = %d, %v; ParseAttempt says %d", s, m, ok, n)
		}
	})
}

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

func TestOverloaded(t *testing.T) {
	giveUp := func(r retry.Reason) error { return &retry.Error{Reason: r, Attempts: 3, Err: errors.New("x")} }
	withHeader := &http.Response{Header: http.Header{httpretry.RetryHeader: {" NO "}}}
	otherValue := &http.Response{Header: http.Header{httpretry.RetryHeader: {"later"}}}
	plain := &http.Response{StatusCode: 503, Header: http.Header{}, Body: http.NoBody}
	tests := []struct {
		name string
		resp *http.Response
		err  error
		want bool
	}{
		{"nothing", nil, nil, false},
		{"attempts exhausted", nil, giveUp(retry.AttemptsExhausted), true},
		{"budget", nil, giveUp(retry.BudgetExhausted), true},
		{"circuit", nil, giveUp(retry.CircuitOpen), true},
		{"bare breaker error", nil, fmt.Errorf("wrapped: %w", &breaker.OpenError{State: breaker.Open, Wait: time.Second}), true},
		{"canceled", nil, giveUp(retry.Canceled), false},
		{"not retryable", nil, giveUp(retry.NotRetryable), false},
		{"deadline", nil, giveUp(retry.Deadline), false},
		{"other error", nil, io.ErrUnexpectedEOF, false},
		{"don't-retry header from below", withHeader, nil, true},
		{"unknown header value", otherValue, nil, false},
		{"plain 503 not from a Transport", plain, nil, false},
	}
	for _, tt := range tests {
		if got := httpretry.Overloaded(tt.resp, tt.err); got != tt.want {
			t.Errorf("Overloaded(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestPushBack(t *testing.T) {
	w := httptest.NewRecorder()
	if httpretry.PushBack(w, &http.Response{StatusCode: 404, Header: http.Header{}, Body: http.NoBody}, nil) {
		t.Fatalf("PushBack(404) = true, want false")
	}
	if w.Code != 200 || len(w.Header()) != 0 {
		t.Errorf("PushBack(404) wrote %d %v; want nothing", w.Code, w.Header())
	}
	w = httptest.NewRecorder()
	if !httpretry.PushBack(w, nil, &retry.Error{Reason: retry.BudgetExhausted, Attempts: 1}) {
		t.Fatalf("PushBack(budget exhausted) = false, want true")
	}
	if w.Code != 503 || w.Header().Get(httpretry.RetryHeader) != "no" {
		t.Errorf("PushBack wrote %d with %s %q; want 503 with \"no\"", w.Code, httpretry.RetryHeader, w.Header().Get(httpretry.RetryHeader))
	}
}

func TestGaveUpParse(t *testing.T) {
	type g = httpretry.GiveUp
	tests := []struct {
		value []string
		want  g
		ok    bool
	}{
		{nil, g{}, false},
		{[]string{"attempts-exhausted;attempts=3"}, g{Reason: retry.AttemptsExhausted, Attempts: 3}, true},
		{[]string{" Budget-Exhausted ; attempts = 2"}, g{Reason: retry.BudgetExhausted}, true}, // spaces around '=' are not allowed
		{[]string{"budget-exhausted; attempts=2"}, g{Reason: retry.BudgetExhausted, Attempts: 2}, true},
		{[]string{"circuit-open"}, g{Reason: retry.CircuitOpen}, true},
		{[]string{"circuit-open;attempts=2;retry-after=3"}, g{Reason: retry.CircuitOpen, Attempts: 2, RetryAfter: 3 * time.Second}, true},
		{[]string{"deadline; Retry-After= 60 ;attempts=1"}, g{Reason: retry.Deadline, Attempts: 1, RetryAfter: time.Minute}, true},
		{[]string{"circuit-open;retry-after=0"}, g{Reason: retry.CircuitOpen}, true},
		{[]string{"circuit-open;retry-after=-3"}, g{Reason: retry.CircuitOpen}, true},
		{[]string{"circuit-open;retry-after=1.5"}, g{Reason: retry.CircuitOpen}, true},
		{[]string{"circuit-open;retry-after=Sun, 06 Nov 1994 08:49:37 GMT"}, g{Reason: retry.CircuitOpen}, true},
		{[]string{"circuit-open;retry-after=99999999999999999999"}, g{Reason: retry.CircuitOpen, RetryAfter: math.MaxInt64}, true},
		{[]string{"deadline;attempts=x"}, g{Reason: retry.Deadline}, true},
		{[]string{"not-retryable;foo=1;attempts=1"}, g{Reason: retry.NotRetryable, Attempts: 1}, true},
		{[]string{"canceled;attempts=1"}, g{Reason: retry.Canceled, Attempts: 1}, true},
		{[]string{"exhausted"}, g{}, false},
		{[]string{"unknown;attempts=3"}, g{}, false},
		{[]string{""}, g{}, false},
	}
	for _, tt := range tests {
		resp := &http.Response{Header: http.Header{}}
		if tt.value != nil {
			resp.Header[httpretry.GaveUpHeader] = tt.value
		}
		got, ok := httpretry.GaveUp(resp)
		if got != tt.want || ok != tt.ok {
			t.Errorf("GaveUp(%q) = %+v, %v; want %+v, %v", tt.value, got, ok, tt.want, tt.ok)
		}
	}
	if _, ok := httpretry.GaveUp(nil); ok {
		t.Errorf("GaveUp(nil) ok = true")
	}
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
	if g, ok := httpretry.GaveUp(resp); g.Reason != retry.AttemptsExhausted || g.Attempts != 3 || !ok {
		t.Errorf("GaveUp = %+v, %v; want attempts exhausted, 3, true", g, ok)
	}
	if !httpretry.Overloaded(resp, nil) {
		t.Errorf("Overloaded = false, want true")
	}
}

func FuzzGaveUp(f *testing.F) {
	for _, s := range []string{
		"attempts-exhausted;attempts=3", "circuit-open", "deadline;attempts=", ";;;", "budget-exhausted; attempts=99999999", "",
		"circuit-open;attempts=2;retry-after=3", "deadline;retry-after=99999999999999999999", "circuit-open;retry-after=;retry-after=2",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		resp := &http.Response{Header: http.Header{httpretry.GaveUpHeader: {s}}}
		g, ok := httpretry.GaveUp(resp)
		if !ok {
			if g != (httpretry.GiveUp{}) {
				t.Fatalf("GaveUp(%q) = %+v, false; want the zero GiveUp", s, g)
			}
			return
		}
		if name := g.Reason.String(); strings.HasPrefix(name, "Reason(") || g.Attempts < 0 || g.Attempts > 1<<20 || g.RetryAfter < 0 {
			t.Fatalf("GaveUp(%q) = %+v, true; out of range", s, g)
		}
		if g.RetryAfter%time.Second != 0 && g.RetryAfter != math.MaxInt64 {
			t.Fatalf("GaveUp(%q).RetryAfter = %v, not whole seconds", s, g.RetryAfter)
		}
		if httpretry.Overloaded(resp, nil) != (g.Reason == retry.AttemptsExhausted || g.Reason == retry.BudgetExhausted || g.Reason == retry.CircuitOpen) {
			t.Fatalf("Overloaded disagrees with GaveUp(%q) = %+v", s, g)
		}
	})
}
