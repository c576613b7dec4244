package limit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

// a6DoneCtx is a canceled context: Acquire with it takes a free slot only,
// and such a slot is no latency sample.
func a6DoneCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// a6Run drives l with workers closed-loop callers, each attempt taking
// lat, for dur (bubble time).
func a6Run(l *limit.Limiter, workers int, lat, dur time.Duration) {
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				p, err := l.Acquire(context.Background())
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				time.Sleep(lat)
				l.Release(p, false)
			}
		})
	}
	wg.Wait()
}

// a6Baseline reads the baseline (the destination's fastest answer) from
// outside: with every slot taken (by done contexts: no samples), a call
// with a 1 s deadline leaves when its deadline comes within the baseline
// ("fastest answer"), so 1 s less its wait is the baseline.
func a6Baseline(t *testing.T, l *limit.Limiter) time.Duration {
	t.Helper()
	var ps []limit.Permit
	for {
		p, err := l.Acquire(a6DoneCtx())
		if err != nil {
			break
		}
		ps = append(ps, p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, err := l.Acquire(ctx)
	waited := time.Since(start)
	for _, p := range ps {
		l.Release(p, false)
	}
	if err == nil || !strings.Contains(err.Error(), "fastest answer") {
		t.Fatalf("baseline probe: %v after %v", err, waited)
	}
	return time.Second - waited
}

// TestAttackLimit6BaselineIdleSpell: "the baseline holds through an incident
// instead of drifting up to its latency; it rises only as healthy buckets
// age out, or after 5 minutes of continuous incident". Three histories
// with the same 30 s of a 3x slower destination (healthy 10 ms, incident
// 30 ms), the baseline read after each:
//
//	A: healthy 30 s, slow 15 s, idle 10 min, slow 15 s
//	B: healthy 30 s, idle 10 min, slow 15 s + 15 s
//	C: healthy 30 s, slow 15 s, slow 15 s (no idle)
//
// The idle spell either counts as incident time ("no sample" buckets) or
// it does not: either way A and B must agree. In A the baseline jumped to
// the incident's 30 ms after 30 s of incident (the idle spell counted
// towards the 5 minutes; fixed: it does not); in B and C it held at 10 ms.
func TestAttackLimit6BaselineIdleSpell(t *testing.T) {
	const healthy, slow = 10 * time.Millisecond, 30 * time.Millisecond
	scen := []struct {
		name  string
		steps []struct {
			lat, dur time.Duration // lat 0: idle
		}
	}{
		{"A slow-idle-slow", []struct{ lat, dur time.Duration }{{healthy, 30 * time.Second}, {slow, 15 * time.Second}, {0, 10 * time.Minute}, {slow, 15 * time.Second}}},
		{"B idle-slow", []struct{ lat, dur time.Duration }{{healthy, 30 * time.Second}, {0, 10 * time.Minute}, {slow, 15 * time.Second}, {slow, 15 * time.Second}}},
		{"C slow-slow", []struct{ lat, dur time.Duration }{{healthy, 30 * time.Second}, {slow, 15 * time.Second}, {slow, 15 * time.Second}}},
	}
	got := map[string]time.Duration{}
	for _, s := range scen {
		synctest.Test(t, func(t *testing.T) {
			l, err := limit.New(limit.Config{Max: 16})
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range s.steps {
				if st.lat == 0 {
					time.Sleep(st.dur)
					continue
				}
				a6Run(l, 16, st.lat, st.dur)
			}
			got[s.name] = a6Baseline(t, l)
			t.Logf("%s: baseline %v after the history (limit %d)", s.name, got[s.name], l.Limit())
		})
	}
	for name, b := range got {
		if b != healthy {
			t.Errorf("%s: baseline %v after 30 s of incident, want %v (it holds for 5 minutes of continuous incident)", name, b, healthy)
		}
	}
}

// TestAttackLimit6ThrottleRecoveryByK: Config.Throttle's doc: "about one per
// 500 ms when it accepts none" and "lets healthy traffic through again
// about 2.5 s after a recovery at K = 2 ..., about 3.5 s at 1.5, 7.5 s at
// 1.1 ... (after a 10 s outage, 1,000 calls a second)".
func TestAttackLimit6ThrottleRecoveryByK(t *testing.T) {
	for _, c := range []struct {
		k    float64
		want time.Duration
	}{{2, 2500 * time.Millisecond}, {1.5, 3500 * time.Millisecond}, {1.1, 7500 * time.Millisecond}} {
		synctest.Test(t, func(t *testing.T) {
			l, err := limit.New(limit.Config{Throttle: c.k})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			var admitted [40]int
			var last time.Duration
			for time.Since(start) < 40*time.Second {
				sec := int(time.Since(start) / time.Second)
				down := sec < 10
				p, err := l.Acquire(context.Background())
				if err != nil {
					if !strings.Contains(err.Error(), "throttled") {
						t.Fatalf("Acquire: %v", err)
					}
					if !down {
						last = time.Since(start) - 10*time.Second
					}
					time.Sleep(time.Millisecond)
				} else {
					admitted[sec]++
					time.Sleep(time.Millisecond)
					l.Release(p, down)
				}
			}
			t.Logf("K=%v: admitted per second %v; last rejection %v after the recovery (doc: about %v)", c.k, admitted, last, c.want)
			sum := 0
			for s := 1; s < 10; s++ {
				sum += admitted[s]
			}
			if sum > 9*4 {
				t.Errorf("K=%v: %d admitted in outage seconds 1-9, want about 18 (one per 500 ms)", c.k, sum)
			}
			if last > c.want*3/2 || last < c.want/2 {
				t.Errorf("K=%v: last rejection %v after the recovery, doc says about %v", c.k, last, c.want)
			}
		})
	}
}
