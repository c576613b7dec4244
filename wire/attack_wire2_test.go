// Black-box attacks (AREA wire2) on package wire against its docs.

package wire_test

import (
	"net/http"
	"testing"

	"github.com/stormguard/stormguard/wire"
)

// DOC (wire.go, ParseGiveUp): "ok is false, and g the zero GiveUp, when the
// reason token is unknown". The reason tokens are the ASCII words listed
// on GiveUp.Reason; "attempt\u017f-exhausted" (LATIN SMALL LETTER LONG S)
// is not one of them, nor an HTTP token at all (tchar is ASCII), yet
// Unicode case folding maps it onto "attempts-exhausted".
func TestAttackWire2GiveUpNonASCIIReasonToken(t *testing.T) {
	for _, v := range []string{
		"attempt\u017f-exhausted;attempts=3",
		"budget-exhau\u017fted",
	} {
		if g, ok := wire.ParseGiveUp(v); ok {
			t.Errorf("ParseGiveUp(%q) = %+v, true; want the zero GiveUp, false (not a listed reason token)", v, g)
		}
	}
	// Same for the parameter name "attempts".
	g, ok := wire.ParseGiveUp("deadline;attempt\u017f=7")
	if !ok || g.Attempts != 0 {
		t.Errorf("ParseGiveUp(\"deadline;attempt\\u017f=7\") = %+v, %v; want Attempts 0 (unknown parameter ignored)", g, ok)
	}
}

// Passing probes: edges of the documented grammar.
func TestAttackWire2GiveUpEdgesPass(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want wire.GiveUp
		ok   bool
	}{
		{"circuit-open;attempts=2;retry-after=3", wire.GiveUp{"circuit-open", 2, 3e9}, true},
		{" \tCIRCUIT-OPEN\t ; ATTEMPTS = 2", wire.GiveUp{Reason: "circuit-open"}, true}, // "ATTEMPTS " is not "attempts"
		{"limited;attempts=0", wire.GiveUp{Reason: "limited"}, true},
		{"limited;attempts=1048577", wire.GiveUp{Reason: "limited"}, true},
		{"limited;retry-after=-1", wire.GiveUp{Reason: "limited"}, true},
		{"limited;retry-after=99999999999999999999999", wire.GiveUp{Reason: "limited", RetryAfter: 1<<63 - 1}, true},
		{"limited,deadline", wire.GiveUp{}, false},
		{"circuit-open\x00", wire.GiveUp{}, false},
		{"", wire.GiveUp{}, false},
	} {
		g, ok := wire.ParseGiveUp(tc.in)
		if g != tc.want || ok != tc.ok {
			t.Errorf("ParseGiveUp(%q) = %+v,%v; want %+v,%v", tc.in, g, ok, tc.want, tc.ok)
		}
	}
	if !wire.DontRetry(http.Header{"Stormguard-Retry": {"x", "\t No \t"}}) {
		t.Error("DontRetry missed a second line")
	}
	if wire.DontRetry(http.Header{"Stormguard-Retry": {"no, no"}}) {
		t.Error("DontRetry accepted a non-value")
	}
}
