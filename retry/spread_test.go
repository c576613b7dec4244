package retry_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/retry"
)

// herd runs n clients sharing p that all fail at once with Retry-After:
// hint, and returns when each one's retry arrived, since the failure.
func herd(t *testing.T, p *retry.Policy, n int, hint time.Duration) []time.Duration {
	t.Helper()
	return herdWithin(t, p, n, hint, 0)
}

// herdWithin is herd with calls whose deadline is timeout away (0: none).
func herdWithin(t *testing.T, p *retry.Policy, n int, hint, timeout time.Duration) []time.Duration {
	t.Helper()
	var mu sync.Mutex
	retries := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	start := time.Now()
	for range n {
		wg.Go(func() {
			ctx := context.Background()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			err := p.Do(ctx, func(ctx context.Context, attempt int) error {
				if attempt == 1 {
					return &statusErr{Code: 503, After: hint}
				}
				mu.Lock()
				retries = append(retries, time.Since(start))
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Errorf("Do = %v, want success on the retry", err)
			}
		})
	}
	wg.Wait()
	slices.Sort(retries)
	return retries
}

// peakPer returns the largest number of arrivals in one window of width w
// (windows aligned at 0) and how many windows hold any.
func peakPer(at []time.Duration, w time.Duration) (peak, occupied int) {
	counts := map[time.Duration]int{}
	for _, d := range at {
		counts[d/w]++
	}
	for _, c := range counts {
		peak = max(peak, c)
	}
	return peak, len(counts)
}

// TestHerdSpreadAboveRetryAfter: 1000 clients sharing one policy all get a
// 503 with Retry-After: 2s at the same instant. None retries before 2 s,
// none later than 1.5 × 2 s, and their retries spread over that second: the
// busiest 50 ms window holds far fewer than 1000 (uniform: about 50). With
// a random source pinned at 0, which sleeps the hint exactly, all 1000 come
// back in the same instant, 2 s after the failure: a hint slept exactly
// erases the clients' jitter, which is why the loop spreads it.
func TestHerdSpreadAboveRetryAfter(t *testing.T) {
	const (
		n    = 1000
		hint = 2 * time.Second
		w    = 50 * time.Millisecond
	)
	tests := []struct {
		name        string
		exact       bool
		wantPeakMax int           // the busiest window holds fewer
		wantLast    time.Duration // no retry at or after this
	}{
		{"spread", false, 100, hint + hint/2},
		{"exact", true, n + 1, hint + 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rnd := lockedRand(42)
				if tt.exact {
					rnd = func() float64 { return 0 }
				}
				b, err := backoff.New(backoff.Config{Rand: rnd}) // full jitter, 100 ms, 10 s
				if err != nil {
					t.Fatal(err)
				}
				at := herd(t, mustNew(t, retry.WithBackoff(b), retry.WithMaxAttempts(2)), n, hint)
				if len(at) != n {
					t.Fatalf("%d retries, want %d", len(at), n)
				}
				if at[0] < hint {
					t.Errorf("first retry at %v, before the server's Retry-After %v", at[0], hint)
				}
				if last := at[n-1]; last >= tt.wantLast {
					t.Errorf("last retry at %v, want before %v", last, tt.wantLast)
				}
				peak, occupied := peakPer(at, w)
				t.Logf("retries from %v to %v: %d windows of %v occupied, peak %d", at[0], at[n-1], occupied, w, peak)
				if peak >= tt.wantPeakMax {
					t.Errorf("peak per %v = %d, want below %d", w, peak, tt.wantPeakMax)
				}
				if tt.exact && (at[0] != hint || at[n-1] != hint) {
					t.Errorf("exact: retries from %v to %v, want all at %v", at[0], at[n-1], hint)
				}
				if !tt.exact && occupied < 15 {
					t.Errorf("spread: %d windows of %v occupied, want most of the 20 in [2s, 3s)", occupied, w)
				}
			})
		})
	}
}

// TestHerdSpreadBeforeTheDeadline: with a deadline 2.4 s away the spread is
// cut so that every retry still starts before it.
func TestHerdSpreadBeforeTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := backoff.New(backoff.Config{Rand: lockedRand(7)})
		if err != nil {
			t.Fatal(err)
		}
		const n = 200
		at := herdWithin(t, mustNew(t, retry.WithBackoff(b), retry.WithMaxAttempts(2)), n, 2*time.Second, 2400*time.Millisecond)
		if len(at) != n || at[0] < 2*time.Second || at[n-1] >= 2400*time.Millisecond {
			t.Errorf("%d retries from %v to %v, want %d in [2s, 2.4s)", len(at), at[0], at[n-1], n)
		}
		if peak, _ := peakPer(at, 50*time.Millisecond); peak > n/4 {
			t.Errorf("peak per 50ms = %d of %d in 8 windows, want them spread", peak, n)
		}
	})
}
