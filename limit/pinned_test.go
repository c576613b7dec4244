package limit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// pinnedRun warms l with 10 rounds of 2 attempts of 1 s at once, then
// makes 30 calls at once with a 3 s deadline, each holding its slot for
// 1 s: it returns how many were refused within 100 ms, how many later,
// and how many were served.
func pinnedRun(t *testing.T, l *limit.Limiter) (atOnce, later, served int) {
	t.Helper()
	for range 10 {
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Errorf("warm-up: %v", err)
					return
				}
				time.Sleep(time.Second)
				l.Release(p, false)
			})
		}
		wg.Wait()
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 30 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			start := time.Now()
			p, err := l.Acquire(ctx)
			took := time.Since(start)
			mu.Lock()
			switch {
			case err == nil:
				served++
			case !errors.Is(err, limit.ErrLimited):
				t.Errorf("refused with %v, want ErrLimited", err)
			case took < 100*time.Millisecond:
				atOnce++
			default:
				later++
			}
			mu.Unlock()
			if err == nil {
				time.Sleep(time.Second)
				l.Release(p, false)
			}
		})
	}
	wg.Wait()
	return atOnce, later, served
}

// TestLimitPinnedFailsAtOnce: a limit held down by Config.Max or by a cap,
// at a steady latency, never leaves slow start; the hopeless check on
// arrival must hold there all the same. At 2 in flight and 1 s per
// attempt, the destination serves 2 calls per second: of 30 calls with
// 3 s to live, those with more than 2*2*(3-1) = 8 calls ahead cannot be
// served before their deadline (less the baseline) even at twice the rate,
// and fail at once. A cold limiter whose limit is free to double (no Max
// reached, no cap) refuses none of them at once: slow start serves them.
func TestLimitPinnedFailsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    limit.Config
		cap    int // -1: none
		atOnce int // at least; 0: exactly 0, and all served
	}{
		{"max", limit.Config{Max: 2}, -1, 30 - 2 - 8},
		{"cap", limit.Config{}, 2, 30 - 2 - 8},
		{"cap above max", limit.Config{Max: 2}, 5, 30 - 2 - 8},
		{"free", limit.Config{}, -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, err := limit.New(tc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				l.SetCap(tc.cap)
				atOnce, later, served := pinnedRun(t, l)
				t.Logf("limit %d: refused at once %d, later %d; served %d", l.Limit(), atOnce, later, served)
				switch {
				case tc.atOnce == 0 && (atOnce != 0 || served != 30):
					t.Errorf("%d refused at once and %d served, want none refused and all 30 served", atOnce, served)
				case atOnce < tc.atOnce:
					t.Errorf("%d of 30 calls refused at once, want at least %d", atOnce, tc.atOnce)
				}
			})
		})
	}
}
