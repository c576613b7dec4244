package guards_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// TestCapHintHoldsThenRelaxes: a hint caps the layer's limiter at once;
// hints keep the cap in force; HintHold after the last one the cap
// doubles every HintStep while it binds, and is removed once the
// limiter's own limit is below it. The latest hint replaces the cap,
// higher or lower. Run on synctest's clock.
func TestCapHintHoldsThenRelaxes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &guards.Layer{Classify: retry.IsRetryable, Limit: &limit.Config{}}
		d, err := l.New("h")
		if err != nil || d.Hint == nil {
			t.Fatalf("New = %+v, %v; want a destination with hint state", d, err)
		}
		lim := d.Guards.Limiter // cold: 10
		check := func(when string, wantCap, wantLimit int) {
			t.Helper()
			synctest.Wait() // timers due now have run
			if c, lm := d.Hint.Cap(), lim.Limit(); c != wantCap || lm != wantLimit {
				t.Errorf("%s: cap %d, limit %d; want %d, %d", when, c, lm, wantCap, wantLimit)
			}
		}
		check("before any hint", 0, 10)
		d.Hint.Apply(2)
		check("hint 2", 2, 2)
		time.Sleep(guards.HintHold / 2)
		d.Hint.Apply(3) // the latest hint replaces the cap, and holds it anew
		check("hint 3", 3, 3)
		time.Sleep(guards.HintHold - time.Millisecond)
		check("just before the hold's end", 3, 3)
		time.Sleep(time.Millisecond)
		check("at the hold's end", 6, 6)
		time.Sleep(guards.HintStep)
		check("a step later", 12, 10) // no longer binds the limiter's 10
		time.Sleep(guards.HintStep)
		check("two steps later", 0, 10) // found not binding: gone
		time.Sleep(time.Minute)
		check("a minute later", 0, 10)
		d.Hint.Apply(0) // clamped to 1
		check("hint 0", 1, 1)
		d.Hint.Apply(1 << 40)
		check("a huge hint", guards.MaxHint, 10)
		time.Sleep(guards.HintHold)
		check("a huge hint's hold over", 0, 10)
	})
}

// TestCapHintOnlyForLayersLimiter: no hint state without a limiter, or
// with a limiter the supplied guards bring; one for a limiter the layer
// adds to supplied guards.
func TestCapHintOnlyForLayersLimiter(t *testing.T) {
	lim, err := limit.New(limit.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		layer  guards.Layer
		wantOK bool
	}{
		{"no limiter", guards.Layer{Classify: retry.IsRetryable}, false},
		{"layer's limiter", guards.Layer{Classify: retry.IsRetryable, Limit: &limit.Config{}}, true},
		{"supplied limiter", guards.Layer{Classify: retry.IsRetryable, Limit: &limit.Config{},
			Supply: func(string) (retry.Guards, error) { return retry.Guards{Limiter: lim}, nil }}, false},
		{"layer's limiter beside supplied guards", guards.Layer{Classify: retry.IsRetryable, Limit: &limit.Config{},
			Supply: func(string) (retry.Guards, error) { return retry.Guards{}, nil }}, true},
	}
	for _, tt := range tests {
		d, err := tt.layer.New("h")
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Hint != nil; got != tt.wantOK {
			t.Errorf("%s: hint state %v, want %v", tt.name, got, tt.wantOK)
		}
		d.Hint.Apply(1) // nil: does nothing
	}
	if lim.Limit() != 10 {
		t.Errorf("supplied limiter's limit = %d, want 10 (untouched)", lim.Limit())
	}
}
