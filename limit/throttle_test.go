package limit

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The throttle rejects nothing while the destination accepts at least 1/K
// of the attempts, and nearly everything once it accepts less: at
// p = (R − K·A)/(R + 1) the attempts sent settle at K times the accepts,
// so a destination that accepts a share a < 1/K is sent fewer and fewer.
func TestThrottleShare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		k, accept float64 // accept: the share of attempts the destination accepts
		lo, hi    float64 // bounds of the rejected share over the last 3 s
	}{
		{2, 1, 0, 0},
		{2, 0.6, 0, 0.01},
		{1.5, 0.7, 0, 0.01},
		{2, 0.3, 0.9, 1},
		{2, 0, 0.99, 1},
		{1, 0.9, 0.9, 1},
	} {
		th := newThrottle(tc.k, 1)
		var sent, rejected, debt float64
		now := time.Duration(0)
		for range 60_000 { // 6 s at 10,000 calls per second
			now += 100 * time.Microsecond
			late := now > 3*time.Second
			if late {
				sent++
			}
			if !th.admit(now) {
				if late {
					rejected++
				}
				continue
			}
			debt += tc.accept // a fixed share, spread evenly
			ok := debt >= 1
			if ok {
				debt--
			}
			th.done(now, ok)
		}
		got := rejected / sent
		t.Logf("K %v, destination accepts %.2f: rejected %.4f", tc.k, tc.accept, got)
		if got < tc.lo || got > tc.hi {
			t.Errorf("K %v accept %v: rejected share %.4f, want in [%v, %v]", tc.k, tc.accept, got, tc.lo, tc.hi)
		}
	}
}

// After 10 s of an outage (every attempt dropped) the throttle rejects
// nearly every call; once the destination is healthy again it stops
// rejecting within seconds (its history is 500 ms; the accepts, weighted
// K, outgrow the requests exponentially).
func TestThrottleRecovers(t *testing.T) {
	t.Parallel()
	for _, step := range []time.Duration{time.Millisecond, 100 * time.Microsecond} {
		t.Run(step.String(), func(t *testing.T) { throttleRecovers(t, step) })
	}
}

func throttleRecovers(t *testing.T, step time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Throttle: 2})
		start := time.Now()
		var rejected, sent [30]int // per second
		var lastReject time.Duration
		for time.Since(start) < 30*time.Second {
			sec := int(time.Since(start) / time.Second)
			down := sec < 10
			sent[sec]++
			p, err := l.Acquire(context.Background())
			if err != nil {
				if !errors.Is(err, ErrLimited) || !strings.Contains(err.Error(), "throttled") {
					t.Fatalf("Acquire: %v", err)
				}
				rejected[sec]++
				if !down {
					lastReject = time.Since(start)
				}
			} else {
				time.Sleep(step)
				l.Release(p, down)
			}
			time.Sleep(step)
		}
		t.Logf("rejected per second: %v of about %d", rejected, sent[0])
		t.Logf("last rejection %v after the recovery at 10s", lastReject-10*time.Second)
		if r := float64(rejected[9]) / float64(sent[9]); r < 0.9 {
			t.Errorf("rejected %.2f of the calls in the outage's 10th second, want at least 0.9", r)
		}
		if lastReject > 14*time.Second {
			t.Errorf("last rejection at %v, want within 4 s of the recovery at 10 s", lastReject)
		}
	})
}

// The decisions come from the throttle's own seeded generator: the same
// seed gives the same decisions, and no global state is used.
func TestThrottleSeeded(t *testing.T) {
	run := func(seed uint64) (out []bool) {
		th := newThrottle(2, seed)
		for i := range 1000 {
			now := time.Duration(i) * time.Millisecond
			ok := th.admit(now)
			out = append(out, ok)
			if ok {
				th.done(now, i%4 == 0)
			}
		}
		return out
	}
	a, b, c := run(7), run(7), run(8)
	same, diff := true, false
	for i := range a {
		same = same && a[i] == b[i]
		diff = diff || a[i] != c[i]
	}
	if !same || !diff {
		t.Errorf("same seed same decisions: %v; another seed differs: %v", same, diff)
	}
}

// TestThrottleJudgesWaitersAgain: calls that arrive faster than the limit
// lets out, without deadlines, while the destination stops accepting: the
// ones admitted by the throttle in the first half second of the outage,
// when its history still held the healthy accepts, wait for slots. A
// call that waited longer than the throttle's history is judged again at
// its slot, so the destination that accepts none gets about 2 attempts a
// second (one per 500 ms of history), not one per slot (200 a second at
// 5 ms a drop, as it did).
func TestThrottleJudgesWaitersAgain(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		l := mustNew(t, Config{Max: 100000, Throttle: 2})
		var down atomic.Bool
		var sent atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // 5000 calls a second, each its own goroutine
			defer wg.Done()
			tick := time.NewTicker(200 * time.Microsecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					p, err := l.Acquire(context.Background())
					if err != nil {
						return
					}
					sent.Add(1)
					time.Sleep(5 * time.Millisecond)
					l.Release(p, down.Load())
				}()
			}
		}()
		time.Sleep(2 * time.Second)
		down.Store(true)
		time.Sleep(2 * time.Second)
		s0 := sent.Load()
		time.Sleep(8 * time.Second)
		perSec := float64(sent.Load()-s0) / 8
		down.Store(false)
		close(stop)
		wg.Wait()
		t.Logf("attempts a second to a destination that accepts none, seconds 2-10 of the outage: %.1f", perSec)
		if perSec > 6 {
			t.Errorf("%.1f attempts a second to a destination that accepts none, want about 2 (one per 500 ms)", perSec)
		}
	})
}
