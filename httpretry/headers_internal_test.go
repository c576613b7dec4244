package httpretry

import (
	"math"
	"strconv"
	"strings"
	"sync"
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

// TestGiveUpValueHugeRetryAfter: a Retry-After near the largest Duration
// (a legal 10-digit delay-seconds) gives a positive number of seconds,
// rounded up without overflowing.
func TestGiveUpValueHugeRetryAfter(t *testing.T) {
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - time.Second + 1, 9223372036 * time.Second} {
		v := giveUpValue(&retry.Error{Reason: retry.Deadline, Attempts: 1, Err: &StatusError{Code: 503, After: d}})
		g, ok := wire.ParseGiveUp(v)
		if !ok || g.RetryAfter < d-time.Second {
			t.Errorf("giveUpValue with Retry-After %v = %q, read back %+v", d, v, g)
		}
	}
}

// timeoutValue is the wire.TimeoutHeader value of an attempt with left
// until its deadline, made afresh: whole milliseconds, rounded down, at
// least 0.
func timeoutValue(left time.Duration) []string {
	return []string{strconv.FormatInt(max(int64(left/time.Millisecond), 0), 10)}
}

// TestTimeoutValuesReuse: timeoutValues.get returns what timeoutValue
// returns, for values that share a slot as well (0 and 64 ms, 1 s and
// 1.064 s), reuses the value last made for a slot without allocating, and
// is safe under concurrent use (-race).
func TestTimeoutValuesReuse(t *testing.T) {
	var tv timeoutValues
	for _, left := range []time.Duration{-time.Second, 0, 999 * time.Microsecond, time.Millisecond,
		64 * time.Millisecond, 999 * time.Millisecond, time.Second, 1064 * time.Millisecond, time.Second,
		time.Duration(math.MaxInt64)} {
		for range 2 {
			if got, want := tv.get(left), timeoutValue(left); len(got) != 1 || got[0] != want[0] {
				t.Errorf("get(%v) = %q, want %q", left, got, want)
			}
		}
	}
	tv.get(time.Second)
	if n := testing.AllocsPerRun(100, func() { tv.get(time.Second + 500*time.Microsecond) }); n != 0 {
		t.Errorf("get of the value last made for its slot: %v allocations, want 0", n)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				left := time.Duration(g*1000+i%100) * time.Millisecond
				if got, want := tv.get(left), timeoutValue(left); got[0] != want[0] {
					t.Errorf("concurrent get(%v) = %q, want %q", left, got, want)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestMarkSpellings: the lower-case spellings callerMarks looks up are
// package wire's names in lower case.
func TestMarkSpellings(t *testing.T) {
	if attemptLower != strings.ToLower(wire.AttemptHeader) || probeLower != strings.ToLower(wire.ProbeHeader) {
		t.Errorf("attemptLower %q, probeLower %q; want %q, %q", attemptLower, probeLower,
			strings.ToLower(wire.AttemptHeader), strings.ToLower(wire.ProbeHeader))
	}
}
