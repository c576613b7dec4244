// Black-box attacks (AREA wire2) on ParseRetryAfter against its doc.

package httpretry_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
)

// Passing probes of the documented grammar.
func TestAttackWire2RetryAfterPass(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.FixedZone("X", -7*3600))
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"Thu, 03 Dec 2026 19:00:10 GMT", 10 * time.Second, true}, // now is 19:00 UTC
		{"Thursday, 03-Dec-26 19:01:00 GMT", time.Minute, true},   // RFC 850
		{"Thu Dec  3 19:00:05 2026", 5 * time.Second, true},       // asctime
		{"Thu Dec  3 18:00:05 2026", 0, true},                     // past
		{"Mon, 01 Jan 0001 00:00:00 GMT", 0, true},                // far past
		{"Fri, 31 Dec 9999 23:59:59 GMT", time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC).Sub(now), true},
		{strings.Repeat("0", 10000) + "7", 7 * time.Second, true},
		{strings.Repeat("9", 10000), math.MaxInt64, true},
		{"9223372036", 9223372036 * time.Second, true},
		{"9223372037", math.MaxInt64, true},
		{"120, 60", 0, false},
		{"120,", 0, false},
		{"-0", 0, false},
		{"1e3", 0, false},
		{"Thu, 03 Dec 2026 19:00:10 GMT, Thu, 03 Dec 2026 19:00:20 GMT", 0, false},
		{"Thu, 03 Dec 2026 19:00:10 gmt", 0, false},
		{"Thu, 03 Dec 2026 19:00:10 +0000", 0, false},
		{"\"5\"", 0, false},
	} {
		d, ok := httpretry.ParseRetryAfter(tc.in, now)
		if d != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%.50q) = %v,%v; want %v,%v", tc.in, d, ok, tc.want, tc.ok)
		}
		if d < 0 {
			t.Errorf("negative %v", d)
		}
	}
	// Saturating Sub: a far-future date seen from the far past, and back.
	if d, ok := httpretry.ParseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", time.Date(-290000, 1, 1, 0, 0, 0, 0, time.UTC)); !ok || d != math.MaxInt64 {
		t.Errorf("far future from far past = %v,%v", d, ok)
	}
	if d, ok := httpretry.ParseRetryAfter("Mon, 01 Jan 0001 00:00:00 GMT", time.Date(290000, 1, 1, 0, 0, 0, 0, time.UTC)); !ok || d != 0 {
		t.Errorf("far past from far future = %v,%v", d, ok)
	}
}

// Leniency probe (passes or not, reported as a note): only spaces are said
// to be trimmed.
func TestAttackWire2RetryAfterOtherWhitespace(t *testing.T) {
	for _, v := range []string{"\v5", "5\u00a0", "\u00855", "5\r\n"} {
		d, ok := httpretry.ParseRetryAfter(v, time.Unix(0, 0))
		t.Logf("ParseRetryAfter(%q) = %v,%v", v, d, ok)
	}
}
