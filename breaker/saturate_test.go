package breaker_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/sat"
)

// hugeHints are server hints near the largest duration: a Retry-After of
// 99999999999 seconds parses to the largest Duration (it saturates), and
// the spread the breaker adds above a hint (up to half of it) must not wrap
// a long hint round to a short open period.
var hugeHints = []time.Duration{
	math.MaxInt64,
	math.MaxInt64 - 1,
	math.MaxInt64 / 4 * 3, // hint + 0.999·hint/2 passes the largest Duration
	math.MaxInt64 / 2,
	100 * 365 * 24 * time.Hour,
}

// almostOne spreads a hint by nearly all of the half of it the breaker may
// add.
func almostOne() float64 { return 0.999 }

// A failure whose answer asked to wait a very long time opens the breaker
// for at least that long: the next probe round is not before the hint
// (saturating at the largest time the breaker can hold), never a short
// wait after an overflow.
func TestFailHugeHintIsAFloor(t *testing.T) {
	for _, hint := range hugeHints {
		h := newHarness(t, func(c *breaker.Config) { c.MinCalls = 1; c.OpenFor = time.Second; c.Rand = almostOne })
		h.clk.Advance(time.Hour) // the breaker's clock is not at its origin
		p, _ := h.b.Allow()
		h.b.Fail(p, hint)
		s := h.b.Snapshot()
		if s.State != breaker.Open || s.HalfOpenIn < min(hint, math.MaxInt64-time.Hour) {
			t.Errorf("Fail(permit, %v): %v, next round in %v; want open with the next round in at least %v", hint, s.State, s.HalfOpenIn, hint)
		}
		h.clk.Advance(time.Minute)
		if _, err := h.b.Allow(); err == nil {
			t.Errorf("Fail(permit, %v): a call was admitted a minute later", hint)
		}
	}
}

// Trip with a very long hint opens a closed breaker for at least that
// long, and moves an open breaker's next round that far.
func TestTripHugeHintIsAFloor(t *testing.T) {
	for _, hint := range hugeHints {
		for _, open := range []bool{false, true} {
			h := newHarness(t, func(c *breaker.Config) { c.OpenFor = time.Second; c.Rand = almostOne })
			h.clk.Advance(time.Hour)
			if open {
				h.b.Trip(0)
			}
			h.b.Trip(hint)
			s := h.b.Snapshot()
			if s.State != breaker.Open || s.HalfOpenIn < min(hint, math.MaxInt64-time.Hour) {
				t.Errorf("Trip(%v) on a breaker open=%v: %v, next round in %v; want open with the next round in at least %v",
					hint, open, s.State, s.HalfOpenIn, hint)
			}
		}
	}
}

// An open period of the largest duration (a breaker meant to stay open
// until Reset) is not jittered past the largest Duration into a negative
// one.
func TestHugeOpenForStaysOpen(t *testing.T) {
	for _, u := range []float64{0, 0.5, 0.999} {
		h := newHarness(t, func(c *breaker.Config) {
			c.OpenFor = math.MaxInt64
			c.Rand = func() float64 { return u }
		})
		h.clk.Advance(time.Hour)
		h.b.Trip(0)
		h.clk.Advance(24 * time.Hour)
		if s := h.b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn < 100*365*24*time.Hour {
			t.Errorf("OpenFor MaxInt64, Rand %v: a day after Trip: %v, next round in %v; want still open for years", u, s.State, s.HalfOpenIn)
		}
	}
}

// A call that can wait without bound (maxWait the largest Duration) has
// the latest deadline of all: it does not overflow into the earliest, and
// it takes the probe (the most time left) from a call with 5 s left.
func TestUnboundedWaitKeepsDeadlineOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.ReleaseRate = -1 })
		time.Sleep(time.Second) // the breaker's clock is not at its origin
		trip(t, b)
		order := servedOrder(t, b, []time.Duration{5 * time.Second, math.MaxInt64})
		if len(order) != 2 || order[0] != 1 {
			t.Errorf("served in order %v (0: 5 s left, 1: unbounded), want the unbounded call first (the probe to the most time left)", order)
		}
	})
}

// While the calls that waited are released after a close, the breaker
// re-trips at Probes failing calls (as Breaker.Done documents), not at
// MinCalls: with MinCalls 20 and Probes 3, a dependency that fails again
// after its probes succeeded gets 3 released calls per round, not 20.
func TestReleaseRetripsAtProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWaitBreaker(t, func(c *breaker.Config) { c.MinCalls = 20; c.Probes = 3; c.ReleaseRate = 100 })
		b.Trip(0)
		var mu sync.Mutex
		count := map[string]int{}
		var wg sync.WaitGroup
		for range 60 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				p, err := b.Wait(ctx, 10*time.Second)
				result := "gave up"
				switch {
				case err != nil:
				case p.Probe():
					b.Done(p, true) // the probes find the dependency back
					result = "probe"
				default:
					b.Done(p, false) // and the released calls find it down again
					result = "failed"
				}
				mu.Lock()
				count[result]++
				mu.Unlock()
			})
		}
		wg.Wait()
		rounds := count["probe"] / 3
		if rounds < 2 || count["failed"] > 3*rounds || count["probe"]+count["failed"]+count["gave up"] != 60 {
			t.Errorf("outcomes %v: want rounds of 3 probes, each followed by at most 3 failed releases (Probes), not MinCalls (20)", count)
		}
	})
}

// FuzzBreakerTimes drives a breaker with arbitrary time inputs: hints given
// to Fail and Trip (up to the largest Duration), open periods, clock moves
// and the maximum waits of waiting calls. The next probe round is never
// sooner than a hint asked (saturating at the largest time the breaker can
// hold), a half-open-in time is never negative, and waiting calls are
// served earliest deadline first whatever their waits.
func FuzzBreakerTimes(f *testing.F) {
	f.Add(int64(time.Second), []byte{0, 1, 2, 3, 4, 5, 6, 7}, []byte{1, 2, 3})
	f.Add(int64(math.MaxInt64), []byte{0xff, 0x7f, 3, 0xff, 0xff, 2, 1}, []byte{0xff, 0, 0x80, 7})
	f.Fuzz(func(t *testing.T, openFor int64, ops, waits []byte) {
		clk := newClock()
		b, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Duration(openFor), Now: clk.Now})
		if err != nil {
			return // a negative OpenFor
		}
		var elapsed time.Duration
		duration := func(x, y byte) time.Duration {
			if x&0x80 != 0 {
				return math.MaxInt64 - time.Duration(y)
			}
			return time.Duration(x)<<(y%64) + time.Duration(y)
		}
		for len(ops) >= 3 {
			op, x, y := ops[0], ops[1], ops[2]
			ops = ops[3:]
			d := duration(x, y)
			switch op % 4 {
			case 0: // a failure with a hint
				p, err := b.Allow()
				if err != nil {
					continue
				}
				was := b.State()
				b.Fail(p, d)
				if s := b.Snapshot(); was != breaker.Open && s.State == breaker.Open && s.HalfOpenIn < min(d, math.MaxInt64-elapsed) {
					t.Fatalf("Fail(%v) opened the breaker with the next round in %v", d, s.HalfOpenIn)
				}
			case 1: // a verdict from elsewhere
				b.Trip(d)
				if s := b.Snapshot(); s.State != breaker.Open || s.HalfOpenIn < min(d, math.MaxInt64-elapsed) {
					t.Fatalf("Trip(%v): %v, next round in %v", d, s.State, s.HalfOpenIn)
				}
			case 2: // time passes, as far as the fake clock's int64 reaches
				d = min(d, math.MaxInt64-time.Duration(t0.UnixNano())-elapsed)
				clk.Advance(d)
				elapsed += d
			case 3:
				p, err := b.Allow()
				if err == nil {
					b.Done(p, true)
				}
			}
			if s := b.Snapshot(); s.HalfOpenIn < 0 {
				t.Fatalf("HalfOpenIn %v < 0", s.HalfOpenIn)
			}
		}
		if len(waits) > 8 {
			waits = waits[:8]
		}
		synctest.Test(t, func(t *testing.T) {
			b := newWaitBreaker(t, func(c *breaker.Config) { c.ReleaseRate = -1 })
			built := time.Now()
			time.Sleep(time.Duration(openFor & 0xffff_ffff))
			trip(t, b)
			waited := make([]time.Duration, len(waits))
			deadlines := make([]time.Duration, len(waits)) // since the breaker was built, saturating
			for i, x := range waits {
				waited[i] = max(duration(x, x*7), 2*time.Second) // beyond the open period
				deadlines[i] = sat.Add(time.Since(built), waited[i])
			}
			order := servedOrder(t, b, waited)
			if len(order) == 0 {
				return
			}
			// The probe (served first) goes to the latest deadline, the
			// first of equal ones (deadlines that saturate are equal).
			first := order[0]
			for _, i := range order[1:] {
				if deadlines[i] > deadlines[first] || deadlines[i] == deadlines[first] && i < first {
					t.Fatalf("served %v (deadlines %v): the probe went to %v, not to the latest %v", order, deadlines, deadlines[first], deadlines[i])
				}
			}
		})
	})
}
