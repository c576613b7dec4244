package admission

import (
	"context"
	"testing"
	"time"
)

func newTestLimiter(top int, ceiling time.Duration) *limiter {
	return newLimiter(Config{MaxInFlight: top, LatencyCeiling: ceiling})
}

// A hang: every request ends at or past the ceiling. Each is a drop: the
// limit only falls (at most one cut per ceiling/10), down to 1, never
// below.
func TestLimiterHangLowersOnly(t *testing.T) {
	l := newTestLimiter(100, time.Second)
	start := time.Unix(1000, 0)
	prev := int64(100)
	for i := range 1000 {
		now := start.Add(time.Duration(i) * 50 * time.Millisecond)
		n := l.sample(context.Background(), now, now.Add(-2*time.Second), time.Time{}, prev, nil)
		if n > prev || n < 1 {
			t.Fatalf("sample %d: limit %d after %d; a drop may only lower it, to at least 1", i, n, prev)
		}
		prev = n
	}
	if prev != 1 {
		t.Errorf("after 50 s of hang the limit is %d, want 1", prev)
	}
	// Cut at most once per 100 ms: ten drops at the same instant cut once.
	l = newTestLimiter(100, time.Second)
	for range 10 {
		prev = l.sample(context.Background(), start, start.Add(-2*time.Second), time.Time{}, 100, nil)
	}
	if prev != 90 {
		t.Errorf("ten simultaneous drops: limit %d, want 90 (one cut)", prev)
	}
}

// A request whose caller left (context ended, or past its deadline) is a
// drop when it ran longer than the reference (ceiling/2), and no sample at
// all when it ran within it: neither a cut nor growth.
func TestLimiterCallerGoneIsDrop(t *testing.T) {
	start := time.Unix(1000, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tt := range []struct {
		name string
		ctx  context.Context
		dl   time.Time
	}{
		{"canceled", ctx, time.Time{}},
		{"past its deadline", context.Background(), start.Add(5 * time.Millisecond)},
	} {
		l := newTestLimiter(100, time.Second)
		if n := l.sample(tt.ctx, start.Add(600*time.Millisecond), start, tt.dl, 100, nil); n != 90 {
			t.Errorf("%s, slow: limit %d, want 90 (a drop)", tt.name, n)
		}
		l = newTestLimiter(100, time.Second)
		l.limit = 50
		for i := range 100 {
			now := start.Add(time.Duration(i) * 200 * time.Millisecond)
			if n := l.sample(tt.ctx, now.Add(10*time.Millisecond), now, tt.dl, 50, nil); n != 50 {
				t.Fatalf("%s, fast, sample %d: limit %d, want 50 (no sample: neither grown nor cut)", tt.name, i, n)
			}
		}
	}
}

// TestLimiterCallerGoneFastIsNoSample: callers whose time goes before their
// requests get a slot (a queue, the network, a client that lags) leave
// during fast requests. Taken for drops, 10 s of them cut the limit from 10
// to 1, where a server of 10 slots serves a tenth of its capacity, waits
// grow, and every request is again for a caller who leaves: live, after a
// hang, the limit fell to 1 and stayed there to the end of the run, all
// its work wasted. They are no sample: the limit stays.
func TestLimiterCallerGoneFastIsNoSample(t *testing.T) {
	l := newTestLimiter(10, time.Second)
	start := time.Unix(1000, 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	n := int64(10)
	for i := range 5000 { // 10 s, a request every 2 ms, 20 ms each, its caller gone
		now := start.Add(time.Duration(i) * 2 * time.Millisecond)
		n = l.sample(ctx, now, now.Add(-20*time.Millisecond), time.Time{}, n, nil)
	}
	if n != 10 {
		t.Errorf("after 10 s of fast requests whose callers left: limit %d, want 10", n)
	}
}

// Fast requests grow the limit back to MaxInFlight (never past it) while it
// is in use, and not while it is not.
func TestLimiterGrowsWhenInUse(t *testing.T) {
	l := newTestLimiter(100, time.Second)
	start := time.Unix(1000, 0)
	for i := range 30 { // down to 0.9^30·100 ≈ 4
		now := start.Add(time.Duration(i) * 200 * time.Millisecond)
		l.sample(context.Background(), now, now.Add(-time.Second), time.Time{}, 1, nil)
	}
	low := l.sample(context.Background(), start.Add(time.Hour), start.Add(time.Hour-10*time.Millisecond), time.Time{}, 0, nil)
	for range 1000 { // not in use: one in flight of a limit of 4
		l.sample(context.Background(), start.Add(time.Hour), start.Add(time.Hour-10*time.Millisecond), time.Time{}, 1, nil)
	}
	if n := l.sample(context.Background(), start.Add(time.Hour), start.Add(time.Hour-10*time.Millisecond), time.Time{}, 0, nil); n != low {
		t.Errorf("fast samples with the limit not in use: limit %d, want it unchanged at %d", n, low)
	}
	var n int64
	steps := 0
	for n = low; n < 100; steps++ {
		n = l.sample(context.Background(), start.Add(time.Hour), start.Add(time.Hour-10*time.Millisecond), time.Time{}, n, nil)
		if n > 100 {
			t.Fatalf("limit %d above MaxInFlight", n)
		}
	}
	t.Logf("from %d back to 100 in %d fast requests in use", low, steps)
	if steps > 2000 {
		t.Errorf("%d fast requests to grow from %d to 100, want at most 2000", steps, low)
	}
}

// The reference does not drift: after 60 s of an incident whose requests
// take 0.8 of the ceiling, requests that take 0.6 of it still shrink the
// limit (they are slow against the fixed reference, ceiling/2), and the
// limit stays where the incident put it or lower.
func TestLimiterReferenceDoesNotDrift(t *testing.T) {
	l := newTestLimiter(100, time.Second)
	start := time.Unix(1000, 0)
	var n int64 = 100
	for i := range 6000 { // 60 s, a request every 10 ms, the limit in use
		now := start.Add(time.Duration(i) * 10 * time.Millisecond)
		n = l.sample(context.Background(), now, now.Add(-800*time.Millisecond), time.Time{}, n, nil)
	}
	during := n
	for i := range 100 {
		now := start.Add(time.Minute + time.Duration(i)*10*time.Millisecond)
		if m := l.sample(context.Background(), now, now.Add(-600*time.Millisecond), time.Time{}, n, nil); m > n {
			t.Fatalf("a request at 0.6 of the ceiling after the incident raised the limit %d -> %d", n, m)
		} else {
			n = m
		}
	}
	t.Logf("limit %d after 60 s at 0.8 of the ceiling, %d after 100 requests at 0.6", during, n)
	if during >= 100 {
		t.Errorf("60 s of requests at 0.8 of the ceiling left the limit at %d, want it lowered", during)
	}
}
