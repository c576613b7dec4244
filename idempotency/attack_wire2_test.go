// Black-box attacks (AREA wire2) on ParseKey against its doc.

package idempotency_test

import (
	"strings"
	"testing"

	"github.com/stormguard/stormguard/idempotency"
)

// Passing probes: ParseKey's documented forms and bounds.
func TestAttackWire2ParseKeyPass(t *testing.T) {
	k255, k256 := strings.Repeat("k", 255), strings.Repeat("k", 256)
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{k255, k255, true},
		{k256, "", false},
		{" \t" + k255 + "\t ", k255, true},
		{`"` + k255 + `"`, k255, true},
		{`"` + k256 + `"`, "", false},
		{`"` + strings.Repeat(`\\`, 255) + `"`, strings.Repeat(`\`, 255), true},
		{`"` + strings.Repeat(`\"`, 256) + `"`, "", false},
		{`"a\"b\\c"`, `a"b\c`, true},
		{`"a,b"`, "a,b", true},
		{"a,b", "", false},
		{`"a\nb"`, "", false},
		{`"a\`, "", false},
		{`"abc\"`, "", false},
		{`"abc";p=1`, "", false},
		{`"a", "b"`, "", false},
		{`""`, "", false},
		{`"`, "", false},
		{"\"\t\"", "", false},
		{"caf\u00e9", "", false},
		{"\"caf\u00e9\"", "", false},
		{"a\x7fb", "", false},
		{"a\x00", "", false},
		{"\u00a0key", "", false},
		{"a b", "a b", true},
		{`" a "`, " a ", true},
	} {
		got, err := idempotency.ParseKey(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("ParseKey(%.40q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if !tc.ok && (err == nil || got != "" || !strings.HasPrefix(err.Error(), "idempotency: invalid key: ")) {
			t.Errorf("ParseKey(%.40q) = %q, %v; want an invalid-key error", tc.in, got, err)
		}
	}
}
