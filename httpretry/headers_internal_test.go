package httpretry

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// TestGiveUpValueParses: every give-up value the transport writes reads
// back with wire.ParseGiveUp (the format is written here, parsed there).
func TestGiveUpValueParses(t *testing.T) {
	for r := retry.NotRetryable; r <= retry.Limited; r++ {
		re := &retry.Error{Reason: r, Attempts: 2, Err: &StatusError{Code: 503, After: 1500 * time.Millisecond}}
		v := giveUpValue(re)
		g, ok := wire.ParseGiveUp(v)
		if !ok || g.Reason != giveUpTokens[r] || g.Attempts != 2 || g.RetryAfter != 2*time.Second {
			t.Errorf("ParseGiveUp(giveUpValue(%v) = %q) = %+v, %v; want %q, 2 attempts, 2s", r, v, g, ok, giveUpTokens[r])
		}
	}
}
