package httpretry_test

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// now is a fixed instant: Sun, 06 Nov 1994 08:49:37 GMT, RFC 9110's example.
var now = time.Date(1994, time.November, 6, 8, 49, 37, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name  string
		value string
		want  time.Duration
		ok    bool
	}{
		{"seconds", "120", 120 * time.Second, true},
		{"zero", "0", 0, true},
		{"leading zeros", "007", 7 * time.Second, true},
		{"spaces trimmed", "  5\t", 5 * time.Second, true},
		{"largest exact", strconv.FormatInt(math.MaxInt64/int64(time.Second), 10),
			time.Duration(math.MaxInt64/int64(time.Second)) * time.Second, true},
		{"one past largest saturates", strconv.FormatInt(math.MaxInt64/int64(time.Second)+1, 10), math.MaxInt64, true},
		{"huge saturates", "99999999999999999999999999999", math.MaxInt64, true},
		{"484289 hours", "1743440400", 1743440400 * time.Second, true},

		{"IMF-fixdate future", "Sun, 06 Nov 1994 08:49:47 GMT", 10 * time.Second, true},
		{"RFC 850 future", "Sunday, 06-Nov-94 08:50:37 GMT", time.Minute, true},
		{"asctime future", "Sun Nov  6 08:52:37 1994", 3 * time.Minute, true},
		{"IMF-fixdate now", "Sun, 06 Nov 1994 08:49:37 GMT", 0, true},
		{"IMF-fixdate past", "Sun, 06 Nov 1994 08:49:36 GMT", 0, true},
		{"RFC 850 past", "Saturday, 05-Nov-94 08:49:37 GMT", 0, true},
		{"asctime past", "Sat Nov  5 08:49:37 1994", 0, true},
		{"date far future", "Fri, 31 Dec 9999 23:59:59 GMT", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Sub(now), true},

		{"empty", "", 0, false},
		{"blank", "   ", 0, false},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"fraction", "1.5", 0, false},
		{"inner space", "1 0", 0, false},
		{"unit", "10s", 0, false},
		{"hex", "0x10", 0, false},
		{"garbage", "soon", 0, false},
		{"non-ASCII digits", "١٢", 0, false},
		{"date without zone", "Sun, 06 Nov 1994 08:49:47", 0, false},
		{"ISO 8601", "1994-11-06T08:49:47Z", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, ok := httpretry.ParseRetryAfter(tt.value, now)
			if d != tt.want || ok != tt.ok {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.value, d, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestParseRetryAfterHTTPDateRoundTrip checks every format net/http writes
// (http.TimeFormat) parses back to the exact distance.
func TestParseRetryAfterHTTPDateRoundTrip(t *testing.T) {
	for _, ahead := range []time.Duration{time.Second, 90 * time.Second, 25 * time.Hour} {
		v := now.Add(ahead).Format(http.TimeFormat)
		if d, ok := httpretry.ParseRetryAfter(v, now); d != ahead || !ok {
			t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, true", v, d, ok, ahead)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{
		"0", "120", " 5 ", "-1", "1.5", "99999999999999999999999999999", "9223372036", "9223372037",
		"Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994",
		"Fri, 31 Dec 9999 23:59:59 GMT", "Mon, 01 Jan 0001 00:00:00 GMT", "", "soon",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, ok := httpretry.ParseRetryAfter(s, now)
		if d < 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v; negative", s, d, ok)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %v, false; want 0 when not ok", s, d)
		}
		v := strings.TrimSpace(s)
		digits := v != "" && strings.Trim(v, "0123456789") == ""
		if digits && !ok {
			t.Fatalf("ParseRetryAfter(%q) not ok; want delay-seconds", s)
		}
		if digits {
			// Delay-seconds must agree with strconv where strconv does not
			// overflow, and saturate where it does.
			n, err := strconv.ParseInt(v, 10, 64)
			switch {
			case err == nil && n <= math.MaxInt64/int64(time.Second):
				if want := time.Duration(n) * time.Second; d != want {
					t.Fatalf("ParseRetryAfter(%q) = %v; want %v", s, d, want)
				}
			default:
				if d != math.MaxInt64 {
					t.Fatalf("ParseRetryAfter(%q) = %v; want saturation at %v", s, d, time.Duration(math.MaxInt64))
				}
			}
		}
		// Trimming is idempotent: padding never changes the answer.
		if d2, ok2 := httpretry.ParseRetryAfter(" "+s+" ", now); d2 != d || ok2 != ok {
			t.Fatalf("ParseRetryAfter(%q) = %v, %v but padded = %v, %v", s, d, ok, d2, ok2)
		}
	})
}
