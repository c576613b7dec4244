package wire_test

import (
	"testing"

	"github.com/stormguard/stormguard/wire"
)

// ParseGiveUp: "Unknown parameters and malformed values are ignored."
// A retry-after value that is a long run of digits followed by junk is
// malformed (it is not "a number of whole seconds"), so it must be ignored
// like "retry-after=5x" is, not read as the largest Duration.
func TestAttack6GiveUpOverflowThenJunkIsMalformed(t *testing.T) {
	for _, v := range []string{
		"circuit-open;retry-after=5x",                      // control: ignored
		"circuit-open;retry-after=99999999999999999999x",   // 20 digits then junk
		"circuit-open;retry-after=99999999999999999999 5",  // an inner space
		"circuit-open;retry-after=99999999999999999999-1",  // junk after overflow
		"circuit-open;retry-after=184467440737095516160.5", // a fraction
	} {
		g, ok := wire.ParseGiveUp(v)
		if !ok || g.Reason != "circuit-open" {
			t.Fatalf("ParseGiveUp(%q) = %+v, %v", v, g, ok)
		}
		if g.RetryAfter != 0 {
			t.Errorf("ParseGiveUp(%q).RetryAfter = %v (%d ns), want 0: a malformed value is ignored", v, g.RetryAfter, int64(g.RetryAfter))
		}
	}
}
