package admission

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseMillis(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"0", 0, true},
		{"1500", 1500 * time.Millisecond, true},
		{" 250\t", 250 * time.Millisecond, true},
		{"100, 200", 100 * time.Millisecond, true},
		{"9223372036854", 9223372036854 * time.Millisecond, true},
		{"9223372036855", math.MaxInt64, true}, // past the largest Duration: saturates
		{"99999999999999999999999", math.MaxInt64, true},
		{"", 0, false},
		{" ", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{"1.5", 0, false},
		{"1e3", 0, false},
		{"0x10", 0, false},
		{"12 34", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseMillis(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseMillis(%q) = %v, %v; want %v, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

// FuzzParseMillis: never panics, never negative; a value that is digits
// only (after trimming, before any comma) parses, to its number of
// milliseconds or, past the largest Duration, to the largest Duration.
func FuzzParseMillis(f *testing.F) {
	for _, s := range []string{"0", "1500", " 7 ", "1,2", "", "-1", "+1", "9223372036855", strings.Repeat("9", 40), "\x00", "١٢"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := parseMillis(s)
		if d < 0 || (!ok && d != 0) {
			t.Fatalf("parseMillis(%q) = %v, %v", s, d, ok)
		}
		v, _, _ := strings.Cut(s, ",")
		v = strings.Trim(v, " \t")
		n, err := strconv.ParseUint(v, 10, 64)
		digits := v != "" && strings.Trim(v, "0123456789") == ""
		if ok != digits {
			t.Fatalf("parseMillis(%q) ok = %v, want %v", s, ok, digits)
		}
		if ok && err == nil && n <= math.MaxInt64/uint64(time.Millisecond) && d != time.Duration(n)*time.Millisecond {
			t.Fatalf("parseMillis(%q) = %v, want %dms", s, d, n)
		}
		if ok && (err != nil || n > math.MaxInt64/uint64(time.Millisecond)) && d != math.MaxInt64 {
			t.Fatalf("parseMillis(%q) = %v, want saturation", s, d)
		}
	})
}

// envoyTimeoutHeader is read from the header map directly: canonical form.
func TestEnvoyHeaderCanonical(t *testing.T) {
	if c := http.CanonicalHeaderKey(envoyTimeoutHeader); c != envoyTimeoutHeader {
		t.Errorf("%q is not canonical (%q)", envoyTimeoutHeader, c)
	}
	if !strings.EqualFold(envoyTimeoutHeader, "x-envoy-expected-rq-timeout-ms") {
		t.Errorf("envoyTimeoutHeader = %q, not Envoy's field", envoyTimeoutHeader)
	}
}
