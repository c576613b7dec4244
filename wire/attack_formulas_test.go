package wire_test

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

func TestAttackFormulasParseAttemptForms(t *testing.T) {
	for _, tc := range []struct {
		v  string
		n  int
		ok bool
	}{
		{"1", 1, true}, {"\t 2 \t", 2, true}, {"3,", 3, true}, {"3 , 9", 3, true}, {"1048576", 1 << 20, true},
		{"0001048576", 1 << 20, true}, {"1048577", 0, false}, {"0", 0, false}, {"00", 0, false}, {"", 0, false},
		{",", 0, false}, {" ,3", 0, false}, {"+2", 0, false}, {"-2", 0, false}, {"2\n", 0, false}, {"\v2", 0, false},
		{"2 3", 0, false}, {"2e0", 0, false}, {"\u00a02", 0, false}, {strings.Repeat("9", 40), 0, false},
		{strings.Repeat("0", 40) + "7", 7, true}, {"x,2", 0, false},
	} {
		n, ok := wire.ParseAttempt(tc.v)
		if n != tc.n || ok != tc.ok {
			t.Errorf("ParseAttempt(%q) = %d,%v; want %d,%v", tc.v, n, ok, tc.n, tc.ok)
		}
	}
	if a := testing.AllocsPerRun(50, func() { wire.ParseAttempt(" 17 , 3") }); a != 0 {
		t.Errorf("ParseAttempt allocates %v", a)
	}
}

func TestAttackFormulasParseGiveUpGrammar(t *testing.T) {
	type g = wire.GiveUp
	for _, tc := range []struct {
		v  string
		w  g
		ok bool
	}{
		{"Not-Retryable", g{Reason: "not-retryable"}, true},
		{"ATTEMPTS-EXHAUSTED;ATTEMPTS=3;RETRY-AFTER=2", g{"attempts-exhausted", 3, 2 * time.Second}, true},
		{"deadline;retry-after=4;attempts=2", g{"deadline", 2, 4 * time.Second}, true}, // order free
		{"limited;attempts=2;attempts=5", g{Reason: "limited", Attempts: 5}, true},
		{"canceled ;  attempts=2\t;\tretry-after=1 ", g{"canceled", 2, time.Second}, true},
		{"budget-exhausted;;attempts=1;", g{Reason: "budget-exhausted", Attempts: 1}, true},
		{"circuit-open;retry-after=9223372036", g{Reason: "circuit-open", RetryAfter: 9223372036 * time.Second}, true},
		{"circuit-open;retry-after=9223372037", g{Reason: "circuit-open", RetryAfter: math.MaxInt64}, true},
		{"circuit-open;unknown=1;x", g{Reason: "circuit-open"}, true},
		{"circuit-open;attempts=-1", g{Reason: "circuit-open"}, true},
		{";attempts=3", g{}, false},
		{"circuit open", g{}, false},
		{"gave-up", g{}, false},
		{"", g{}, false},
	} {
		got, ok := wire.ParseGiveUp(tc.v)
		if got != tc.w || ok != tc.ok {
			t.Errorf("ParseGiveUp(%q) = %+v,%v; want %+v,%v", tc.v, got, ok, tc.w, tc.ok)
		}
	}
}

func TestAttackFormulasDontRetryValues(t *testing.T) {
	for v, want := range map[string]bool{"no": true, "NO": true, "No": true, " \tno\t ": true, "nO": true, "no.": false, "n o": false, "false": false, "": false, "yes": false, "\nno": false} {
		if got := wire.DontRetry(http.Header{"Stormguard-Retry": {v}}); got != want {
			t.Errorf("DontRetry(%q) = %v, want %v", v, got, want)
		}
	}
	h := http.Header{}
	h.Add("stormguard-retry", "later")
	wire.SetDontRetry(h)
	if got := h.Values("Stormguard-Retry"); len(got) != 1 || got[0] != "no" || !wire.DontRetry(h) {
		t.Errorf("after SetDontRetry: %q", got)
	}
}

// A real give-up through httpretry parses back to the reason and attempts.
func TestAttackFormulasGiveUpRoundTripHTTPRetry(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		attempts   int
		max        int
		reason     string
		wantRA     time.Duration
	}{
		{"exhausted", "", 3, 3, "attempts-exhausted", 0},
		{"exhausted2", "", 2, 2, "attempts-exhausted", 0},
		{"retry-after too long", "3600", 1, 3, "deadline", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hits int
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits++
				if tc.retryAfter != "" {
					w.Header().Set("Retry-After", tc.retryAfter)
				}
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			defer srv.Close()
			bo, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: 2 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			tr, err := httpretry.NewTransport(nil, httpretry.WithRetry(retry.WithMaxAttempts(tc.max), retry.WithBackoff(bo)))
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest("GET", srv.URL, nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			v := resp.Header.Get(wire.GiveUpHeader)
			gu, ok := wire.ParseGiveUp(v)
			if !ok || gu.Reason != tc.reason || gu.Attempts != tc.attempts || gu.Attempts != hits {
				t.Errorf("header %q parses to %+v,%v; want reason %s, attempts %d (server saw %d)", v, gu, ok, tc.reason, tc.attempts, hits)
			}
			if tc.retryAfter != "" && gu.RetryAfter != time.Hour {
				t.Errorf("header %q: RetryAfter %v, want 1h (the server's hint)", v, gu.RetryAfter)
			}
			if resp.StatusCode != 503 {
				t.Errorf("status %d", resp.StatusCode)
			}
		})
	}
}
