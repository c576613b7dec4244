package sim

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// The model's release rate follows breaker.Config.ReleaseRate: the trip's
// window per second of the time its calls took, at least Probes per
// OpenFor; a set rate as is; a negative one all at once.
func TestSimBreakerReleaseRate(t *testing.T) {
	s := DefaultBreakerSettings() // 10 s window in 1 s buckets, 3 probes per 1 s
	tests := []struct {
		name     string
		rate     float64 // ReleaseRate setting
		calls    int     // in the window at the trip
		closedAt time.Duration
		trip     time.Duration
		want     float64
	}{
		{"whole window", 0, 500, 0, 30 * time.Second, 50},
		{"closed 2 s before the trip", 0, 500, 28 * time.Second, 30 * time.Second, 250},
		{"closed just before: one bucket", 0, 500, 30*time.Second - time.Millisecond, 30 * time.Second, 500},
		{"floor: probes per open period", 0, 10, 0, 30 * time.Second, 3},
		{"set", 42, 500, 0, 30 * time.Second, 42},
		{"all at once", -1, 500, 0, 30 * time.Second, math.Inf(1)},
	}
	for _, tt := range tests {
		s.ReleaseRate = tt.rate
		b, err := s.build(fixedClock, nil, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		sb := &simBreaker{b: b, cfg: b.Config(), calls: tt.calls, closedAt: tt.closedAt}
		sb.tripped(tt.trip)
		if got := sb.releaseRate(); math.Abs(got-tt.want) > 1e-9 && got != tt.want {
			t.Errorf("%s: release rate %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestSimBreakerCompact(t *testing.T) {
	sb := &simBreaker{}
	for i := range 3000 {
		sb.fifo = append(sb.fifo, waitEntry{id: int32(i)})
	}
	sb.head, sb.n = 2000, 1000
	sb.compact()
	if sb.head != 0 || len(sb.fifo) != 1000 || sb.fifo[0].id != 2000 {
		t.Errorf("compact with 2000 consumed of 3000: head %d, %d left starting at %d; want 0, 1000, 2000", sb.head, len(sb.fifo), sb.fifo[0].id)
	}
	sb.n = 0
	sb.compact()
	if sb.head != 0 || len(sb.fifo) != 0 {
		t.Errorf("compact with nothing waiting: head %d, %d left; want an empty list", sb.head, len(sb.fifo))
	}
}

func TestOpenWait(t *testing.T) {
	b, err := DefaultBreakerSettings().build(fixedClock, nil, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	b.Trip(0)
	_, rejection := b.Allow()
	wait, open, err := openWait(rejection)
	if err != nil || !open || wait <= 0 || wait > 2*time.Second {
		t.Errorf("openWait(open breaker's rejection) = %v, %v, %v; want up to 1.2 s, open", wait, open, err)
	}
	if _, _, err := openWait(errors.New("not a breaker's")); !errors.Is(err, errNotOpen) {
		t.Errorf("openWait(other error) = %v, want errNotOpen", err)
	}
	if _, open, _ := openWait(&breaker.OpenError{State: breaker.HalfOpen}); open {
		t.Error("openWait(half-open rejection) reports open")
	}
}

// golden returns a deterministic source of numbers in [0, 1) whose k-th
// draw (from 1) is the fractional part of k times the golden ratio, the
// first skip draws dropped. It is safe for concurrent use.
func golden(skip uint64) func() float64 {
	var k atomic.Uint64
	k.Store(skip)
	return func() float64 {
		_, f := math.Modf(float64(k.Add(1)) * math.Phi)
		return f
	}
}

// The model's pacer releases the waiting calls when the breaker's own
// pacer releases calls parked in Breaker.Wait, to the nanosecond: the
// breaker on a testing/synctest clock, the model's breaker (built 7 s
// into the run) on the simulated clock, both drawing the same jitter from
// the same sequence. Each breaker sees the same calls: tripHistory
// successes and as many failures (the last one trips it) some time after
// it was built, which set the release rate; a probe round that succeeds;
// failures counted in the closed window while the waiting calls are
// released (they slow the release down) and one of a call that started
// before the trip (it does not count).
func TestSimPacerFollowsBreaker(t *testing.T) {
	tests := []struct {
		name    string
		rate    float64         // ReleaseRate
		trip    time.Duration   // when the calls that trip the breaker come, after it was built
		waiters int             // calls waiting when it closes, probes included
		fails   []time.Duration // closed-state failures, after the close
		stale   time.Duration   // when the call that started before the trip fails, after the close (0: never)
	}{
		{"default: 40 calls in 2.5 s", 0, 2500 * time.Millisecond, 60, nil, 0},
		{"default: 40 calls in the 10 s window", 0, 30 * time.Second, 20, nil, 0},
		{"200 per second", 200, time.Second, 400, nil, 0},
		{"200 per second, slowed by failures", 200, time.Second, 400,
			[]time.Duration{137_345_679, 137_345_680, 142_000_001, 611_111_111, 1_234_567_891}, 0},
		{"a stale failure does not slow it", 200, time.Second, 400, []time.Duration{611_111_111}, 93_456_789},
		{"all at once", -1, time.Second, 50, []time.Duration{3_000_001}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DefaultBreakerSettings()
			s.ReleaseRate = tt.rate
			s.MinCalls = 2 * tripHistory // the failures after the close never trip it
			got, closeAt := breakerReleases(t, s, tt.trip, tt.waiters, tt.fails, tt.stale)
			want := modelReleases(t, s, tt.trip, tt.waiters-s.Probes, tt.fails, tt.stale)
			if len(got) != len(want) {
				t.Fatalf("breaker released %d calls, model %d", len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("release %d of %d: breaker at %v, model at %v (close at %v)", i, len(got), got[i], want[i], closeAt)
				}
			}
			if n := len(got); n > 1 && tt.rate > 0 && got[n-1]-closeAt < time.Duration(float64(n-1)/tt.rate*float64(time.Second)) {
				t.Errorf("%d calls released within %v of the close, faster than %v/s", n, got[n-1]-closeAt, tt.rate)
			}
		})
	}
}

// tripHistory is the successes, and then the failures, that trip the
// breakers of TestSimPacerFollowsBreaker.
const tripHistory = 20

// breakerReleases runs the breaker of s in a synctest bubble as
// TestSimPacerFollowsBreaker describes, with waiters calls waiting in Wait
// (oldest first) when its probe round comes, and returns when each of the
// calls that were not handed a probe was released, oldest first, and when
// the breaker closed, from the origin of its clock.
func breakerReleases(t *testing.T, s BreakerSettings, trip time.Duration, waiters int, fails []time.Duration, stale time.Duration) ([]time.Duration, time.Duration) {
	var at []time.Duration
	var closeAt time.Duration
	synctest.Test(t, func(t *testing.T) {
		b, err := s.build(time.Now, golden(0), nil, true)
		if err != nil {
			t.Fatal(err)
		}
		base := time.Now()
		time.Sleep(trip)
		old, _ := b.Allow()
		for _, ok := range tripCalls() {
			p, _ := b.Allow()
			b.Done(p, ok)
		}
		closeAt = time.Since(base) + b.Snapshot().HalfOpenIn
		released := make([]time.Duration, waiters)
		for i := range waiters {
			go func() {
				p, err := b.Wait(context.Background(), time.Minute)
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				released[i] = time.Since(base)
				if p.Probe() {
					b.Done(p, true)
				}
			}()
			synctest.Wait() // waiting in turn: oldest first
		}
		if stale > 0 {
			go func() {
				time.Sleep(closeAt + stale - time.Since(base))
				b.Done(old, false)
			}()
		}
		go func() {
			for _, f := range fails {
				time.Sleep(closeAt + f - time.Since(base))
				p, err := b.Allow()
				if err != nil {
					t.Errorf("closed-state call at %v: %v", f, err)
					return
				}
				b.Done(p, false)
			}
		}()
		time.Sleep(time.Minute)
		if st := b.State(); st != breaker.Closed {
			t.Errorf("breaker %v after the release, want closed", st)
		}
		at = released[s.Probes:]
	})
	return at, closeAt
}

// tripCalls returns the outcomes that trip the breakers: tripHistory
// successes, then as many failures.
func tripCalls() []bool {
	calls := make([]bool, 2*tripHistory)
	for i := range tripHistory {
		calls[i] = true
	}
	return calls
}

// modelReleases runs the model's breaker and pacer as breakerReleases
// runs the breaker, with waiters calls waiting when the breaker closes
// (the probes are taken by others), and returns when each was released,
// oldest first, from the origin of the breaker's clock.
func modelReleases(t *testing.T, s BreakerSettings, trip time.Duration, waiters int, fails []time.Duration, stale time.Duration) []time.Duration {
	t.Helper()
	const built = 7 * time.Second
	r := &outRun{c: &OutageConfig{Horizon: time.Hour, Breaker: s}, p: OutagePolicy{Breaker: true, Wait: true},
		bu: golden(0), reqs: make([]outRequest, waiters)}
	r.now = built
	sb, err := r.newBreaker()
	if err != nil {
		t.Fatal(err)
	}
	call := func(ok bool) {
		p, err := sb.b.Allow()
		if err != nil {
			t.Fatalf("model's breaker rejected a call at %v: %v", r.now, err)
		}
		r.record(sb, outOutcome{permit: p, gen: sb.epoch, ok: ok})
	}
	r.now += trip
	old, oldGen := outOutcome{}, sb.epoch
	old.permit, _ = sb.b.Allow()
	for _, ok := range tripCalls() {
		call(ok)
	}
	if st := sb.b.State(); st != breaker.Open {
		t.Fatalf("model's breaker %v after the trip, want open", st)
	}
	for i := range r.reqs {
		r.reqs[i] = outRequest{state: reqWaiting, seq: 1}
		sb.fifo = append(sb.fifo, waitEntry{id: int32(i), seq: 1})
		sb.n++
	}
	r.now += sb.b.Snapshot().HalfOpenIn
	probes := make([]outOutcome, s.Probes)
	for i := range probes {
		p, err := sb.b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("model's breaker: probe %d = %+v, %v", i, p, err)
		}
		probes[i] = outOutcome{permit: p, gen: sb.epoch, ok: true}
	}
	for _, p := range probes {
		r.record(sb, p)
	}
	const failEvent, staleEvent = 254, 255
	for _, f := range fails {
		r.q.push(r.now+f, -1, failEvent)
	}
	if stale > 0 {
		r.q.push(r.now+stale, -1, staleEvent)
	}
	at := make([]time.Duration, waiters)
	for r.q.len() > 0 {
		e := r.q.pop()
		r.now = e.at
		switch e.kind {
		case outPace:
			r.paceTick(sb)
		case outRelease:
			if r.reqs[e.who].release != sb.epoch {
				t.Fatalf("call %d released in epoch %d, breaker in %d", e.who, r.reqs[e.who].release, sb.epoch)
			}
			at[e.who] = r.now - built
			r.leave(e.who, sb)
			sb.compact()
		case failEvent:
			call(false)
		case staleEvent:
			old.gen = oldGen
			r.record(sb, old)
		}
	}
	return at
}
