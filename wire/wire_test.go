package wire_test

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/wire"
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
		{"00000002", 2, true},       // leading zeros of any length are the number's
		{"01048576", 1 << 20, true}, // the largest, with a zero in front
		{"000000000000000000000000000001", 1, true},
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
		n, ok := wire.ParseAttempt(tt.value)
		if n != tt.want || ok != tt.ok {
			t.Errorf("ParseAttempt(%q) = %d, %v; want %d, %v", tt.value, n, ok, tt.want, tt.ok)
		}
	}
}

// TestParseAttemptFromHeader: the one-line read of the documentation, on
// the header forms a server meets.
func TestParseAttemptFromHeader(t *testing.T) {
	tests := []struct {
		name   string
		header http.Header
		want   int
		ok     bool
	}{
		{"absent", http.Header{}, 0, false},
		{"set", http.Header{wire.AttemptHeader: {"2"}}, 2, true},
		{"first line counts", http.Header{wire.AttemptHeader: {"3", "1"}}, 3, true},
		{"lower-case name set by hand", http.Header{"stormguard-attempt": {"2"}}, 0, false},
		{"garbage", http.Header{wire.AttemptHeader: {"x"}}, 0, false},
	}
	for _, tt := range tests {
		if n, ok := wire.ParseAttempt(tt.header.Get(wire.AttemptHeader)); n != tt.want || ok != tt.ok {
			t.Errorf("ParseAttempt(Get(AttemptHeader)) of %s = %d, %v; want %d, %v", tt.name, n, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseAttempt(f *testing.F) {
	for _, s := range []string{"1", " 2 ", "3,4", "0", "-1", "1048576", "1048577", "99999999999999999999", "", "x", "\t7\t,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := wire.ParseAttempt(s)
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
		// What a client writes parses back.
		if m, ok := wire.ParseAttempt(strconv.Itoa(n)); m != n || !ok {
			t.Fatalf("ParseAttempt(Itoa(%d)) = %d, %v", n, m, ok)
		}
	})
}

func TestDontRetry(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want bool
	}{
		{"absent", http.Header{}, false},
		{"no", http.Header{"Stormguard-Retry": {"no"}}, true},
		{"case and spaces", http.Header{"Stormguard-Retry": {" NO\t"}}, true},
		{"a later line", http.Header{"Stormguard-Retry": {"later", "no"}}, true},
		{"reserved value", http.Header{"Stormguard-Retry": {"later"}}, false},
		{"empty", http.Header{"Stormguard-Retry": {""}}, false},
	}
	for _, tt := range tests {
		if got := wire.DontRetry(tt.h); got != tt.want {
			t.Errorf("DontRetry(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
	h := http.Header{}
	wire.SetDontRetry(h)
	if !wire.DontRetry(h) || h.Get("Stormguard-Retry") != "no" {
		t.Errorf("after SetDontRetry the header is %v; want Stormguard-Retry: no", h)
	}
	if n := testing.AllocsPerRun(100, func() { wire.SetDontRetry(h) }); n > 1 {
		t.Errorf("SetDontRetry allocates %v times, want at most 1", n)
	}
	// Each header owns its value: editing one in place leaves the next.
	h["Stormguard-Retry"][0] = "yes"
	h2 := http.Header{}
	wire.SetDontRetry(h2)
	if !wire.DontRetry(h2) {
		t.Errorf("after an edit of another header's value, SetDontRetry set %q", h2["Stormguard-Retry"])
	}
}

func TestParseGiveUp(t *testing.T) {
	type g = wire.GiveUp
	tests := []struct {
		value string
		want  g
		ok    bool
	}{
		{"attempts-exhausted;attempts=3", g{Reason: "attempts-exhausted", Attempts: 3}, true},
		{" Budget-Exhausted ; attempts = 2", g{Reason: "budget-exhausted"}, true}, // spaces around '=' are not allowed
		{"budget-exhausted; attempts=2", g{Reason: "budget-exhausted", Attempts: 2}, true},
		{"circuit-open", g{Reason: "circuit-open"}, true},
		{"circuit-open;attempts=2;retry-after=3", g{Reason: "circuit-open", Attempts: 2, RetryAfter: 3 * time.Second}, true},
		{"deadline; Retry-After= 60 ;attempts=1", g{Reason: "deadline", Attempts: 1, RetryAfter: time.Minute}, true},
		{"circuit-open;retry-after=0", g{Reason: "circuit-open"}, true},
		{"circuit-open;retry-after=", g{Reason: "circuit-open"}, true},
		{"circuit-open;retry-after=-3", g{Reason: "circuit-open"}, true},
		{"circuit-open;retry-after=1.5", g{Reason: "circuit-open"}, true},
		{"circuit-open;retry-after=Sun, 06 Nov 1994 08:49:37 GMT", g{Reason: "circuit-open"}, true},
		{"circuit-open;retry-after=99999999999999999999", g{Reason: "circuit-open", RetryAfter: math.MaxInt64}, true},
		{"deadline;attempts=x", g{Reason: "deadline"}, true},
		{"circuit-open;attempts=3;attempts=x", g{Reason: "circuit-open", Attempts: 3}, true}, // a malformed repeat is ignored, not a reset
		{"not-retryable;foo=1;attempts=1", g{Reason: "not-retryable", Attempts: 1}, true},
		{"canceled;attempts=1", g{Reason: "canceled", Attempts: 1}, true},
		{"exhausted", g{}, false},
		{"unknown;attempts=3", g{}, false},
		{"", g{}, false},
	}
	for _, tt := range tests {
		got, ok := wire.ParseGiveUp(tt.value)
		if got != tt.want || ok != tt.ok {
			t.Errorf("ParseGiveUp(%q) = %+v, %v; want %+v, %v", tt.value, got, ok, tt.want, tt.ok)
		}
	}
}

func FuzzParseGiveUp(f *testing.F) {
	for _, s := range []string{
		"attempts-exhausted;attempts=3", "circuit-open", "deadline;attempts=", ";;;", "budget-exhausted; attempts=99999999", "",
		"circuit-open;attempts=2;retry-after=3", "deadline;retry-after=99999999999999999999", "circuit-open;retry-after=;retry-after=2",
	} {
		f.Add(s)
	}
	reasons := []string{"not-retryable", "attempts-exhausted", "deadline", "canceled", "budget-exhausted", "circuit-open", "limited"}
	f.Fuzz(func(t *testing.T, s string) {
		g, ok := wire.ParseGiveUp(s)
		if !ok {
			if g != (wire.GiveUp{}) {
				t.Fatalf("ParseGiveUp(%q) = %+v, false; want the zero GiveUp", s, g)
			}
			return
		}
		if !slices.Contains(reasons, g.Reason) || g.Attempts < 0 || g.Attempts > 1<<20 || g.RetryAfter < 0 {
			t.Fatalf("ParseGiveUp(%q) = %+v, true; out of range", s, g)
		}
		if g.RetryAfter%time.Second != 0 && g.RetryAfter != math.MaxInt64 {
			t.Fatalf("ParseGiveUp(%q).RetryAfter = %v, not whole seconds", s, g.RetryAfter)
		}
	})
}

// The header field names are in canonical form: servers read them from
// the header map directly, without canonicalising.
func TestHeaderNamesCanonical(t *testing.T) {
	for _, name := range []string{wire.AttemptHeader, wire.GiveUpHeader, wire.ProbeHeader, wire.TimeoutHeader, wire.CapacityHeader} {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("%q is not canonical (%q)", name, c)
		}
	}
}
