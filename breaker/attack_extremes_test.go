package breaker_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

const extYear = 365 * 24 * time.Hour

func extNew(t *testing.T, c breaker.Config) *breaker.Breaker {
	t.Helper()
	b, err := breaker.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return b
}

// New: "It returns an error ... if and only if FailureRatio is not in (0, 1],
// Window, Buckets, MinCalls, ConsecutiveFailures, OpenFor or Probes is
// negative, Buckets exceeds 3600, Window is not a multiple of Buckets
// nanoseconds of at least 1 ms each, MaxOpenFor is neither 0 nor at least
// OpenFor, SlowCall is negative, or ReleaseRate is NaN."
func TestAttackExtremesNewEdges(t *testing.T) {
	bad := map[string]breaker.Config{
		"ratio NaN":            {FailureRatio: math.NaN()},
		"ratio +Inf":           {FailureRatio: math.Inf(1)},
		"ratio -Inf":           {FailureRatio: math.Inf(-1)},
		"ratio -0.1":           {FailureRatio: -0.1},
		"ratio 1+eps":          {FailureRatio: math.Nextafter(1, 2)},
		"window -1":            {Window: -1},
		"window MinInt64":      {Window: math.MinInt64},
		"buckets -1":           {Buckets: -1},
		"buckets 3601":         {Buckets: 3601},
		"buckets MaxInt":       {Buckets: math.MaxInt},
		"mincalls -1":          {MinCalls: -1},
		"consec -1":            {ConsecutiveFailures: -1},
		"openfor -1":           {OpenFor: -1},
		"probes -1":            {Probes: -1},
		"probes MinInt":        {Probes: math.MinInt},
		"window 999us/1":       {Window: 999 * time.Microsecond, Buckets: 1},
		"window 10s+1/10":      {Window: 10*time.Second + 1},
		"maxopen < open":       {OpenFor: 2 * time.Second, MaxOpenFor: time.Second},
		"maxopen -1":           {MaxOpenFor: -1},
		"slowcall -1":          {SlowCall: -1},
		"releaserate NaN":      {ReleaseRate: math.NaN()},
		"window 3600ms/3600 -": {Window: 3599 * time.Millisecond, Buckets: 3600},
	}
	for name, c := range bad {
		if b, err := breaker.New(c); err == nil || b != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, b, err)
		}
	}
	good := map[string]breaker.Config{
		"ratio 1":              {FailureRatio: 1},
		"ratio min":            {FailureRatio: math.SmallestNonzeroFloat64},
		"window 1ms/1":         {Window: time.Millisecond, Buckets: 1},
		"window 3.6s/3600":     {Window: 3600 * time.Millisecond, Buckets: 3600},
		"window max/7":         {Window: math.MaxInt64, Buckets: 7},
		"mincalls MaxInt":      {MinCalls: math.MaxInt},
		"consec 2^32-1":        {ConsecutiveFailures: math.MaxUint32},
		"openfor 1ns":          {OpenFor: 1},
		"openfor MaxInt64":     {OpenFor: math.MaxInt64},
		"maxopen MaxInt64":     {OpenFor: 1, MaxOpenFor: math.MaxInt64},
		"probes MaxInt":        {Probes: math.MaxInt},
		"maxwaiters MinInt":    {MaxWaiters: math.MinInt},
		"maxwaiters MaxInt":    {MaxWaiters: math.MaxInt},
		"releaserate +Inf":     {ReleaseRate: math.Inf(1)},
		"releaserate -Inf":     {ReleaseRate: math.Inf(-1)},
		"releaserate tiny":     {ReleaseRate: math.SmallestNonzeroFloat64},
		"releaserate MaxFloat": {ReleaseRate: math.MaxFloat64},
		"slowcall MaxInt64":    {SlowCall: math.MaxInt64},
		"slowcall 1ns":         {SlowCall: 1},
	}
	for name, c := range good {
		if _, err := breaker.New(c); err != nil {
			t.Errorf("%s: New: %v; want success", name, err)
		}
	}
}

// Fail: "a retryAfter near the largest Duration keeps the breaker open that
// long (the sum saturates; it never wraps round to a short wait)". Trip: "no
// sooner than retryAfter". Negative retryAfters mean the usual open period.
func TestAttackExtremesFailTripExtremeRetryAfter(t *testing.T) {
	for _, ra := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, math.MaxInt64 / 3 * 2, 200 * extYear} {
		for _, how := range []string{"fail", "trip"} {
			synctest.Test(t, func(t *testing.T) {
				b := extNew(t, breaker.Config{MinCalls: 1, Rand: func() float64 { return 0.999999 }})
				if how == "fail" {
					p, err := b.Allow()
					if err != nil {
						t.Fatal(err)
					}
					b.Fail(p, ra)
				} else {
					b.Trip(ra)
				}
				s := b.Snapshot()
				if s.State != breaker.Open || s.HalfOpenIn < min(ra, 200*extYear) {
					t.Fatalf("%s(%v): Snapshot %+v, want open for at least the retry-after", how, ra, s)
				}
				time.Sleep(min(ra-time.Second, 250*extYear))
				if st := b.State(); st != breaker.Open {
					t.Errorf("%s(%v): %v after %v, want still open", how, ra, st, min(ra-time.Second, 250*extYear))
				}
				if _, err := b.Allow(); err == nil {
					t.Errorf("%s(%v): admitted before the retry-after", how, ra)
				}
				var oe *breaker.OpenError
				if _, err := b.Allow(); !errors.As(err, &oe) || oe.Wait <= 0 {
					t.Errorf("%s(%v): Allow = %v, want an OpenError with a positive wait", how, ra, err)
				}
			})
		}
	}
	for _, ra := range []time.Duration{-1, math.MinInt64, -time.Hour} {
		synctest.Test(t, func(t *testing.T) {
			b := extNew(t, breaker.Config{OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
			b.Trip(ra)
			s := b.Snapshot()
			if s.State != breaker.Open || s.HalfOpenIn != time.Second {
				t.Errorf("Trip(%v): %+v, want open for OpenFor (1s)", ra, s)
			}
			time.Sleep(time.Second)
			if st := b.State(); st != breaker.HalfOpen {
				t.Errorf("Trip(%v): %v after OpenFor, want half-open", ra, st)
			}
		})
	}
}

// FINDING (low): OpenFor of the largest Duration. Config.OpenFor: "The sums
// saturate: an OpenFor near the largest Duration keeps the breaker open until
// Reset". The ±20% jitter (breaker/probe.go jitter: sat.Scale(d, 0.8+0.4u))
// scales it down first: with the Rand at its low end the breaker half-opens
// after 0.8·MaxInt64 = 233.6 years, not "until Reset".
func TestAttackExtremesOpenForMaxUntilReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := extNew(t, breaker.Config{OpenFor: math.MaxInt64, MinCalls: 1, Rand: func() float64 { return 0 }})
		p, _ := b.Allow()
		b.Done(p, false)
		if st := b.State(); st != breaker.Open {
			t.Fatalf("state %v, want open", st)
		}
		time.Sleep(240 * extYear)
		if st := b.State(); st != breaker.Open {
			t.Errorf("OpenFor MaxInt64: state %v after 240 years, want open until Reset", st)
		}
		b.Reset()
		if _, err := b.Allow(); err != nil {
			t.Errorf("Allow after Reset: %v", err)
		}
	})
}

// MaxOpenFor of the largest Duration, OpenFor 1 ms: each failed probe doubles
// the open period; it grows up to the max and never wraps to a short or
// negative one.
func TestAttackExtremesMaxOpenForDoublingSaturates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := extNew(t, breaker.Config{OpenFor: time.Millisecond, MaxOpenFor: math.MaxInt64, MinCalls: 1, Probes: 1,
			Rand: func() float64 { return 0.5 }})
		p, _ := b.Allow()
		b.Done(p, false)
		prev := time.Duration(0)
		for i := 0; i < 80; i++ {
			s := b.Snapshot()
			if s.State != breaker.Open || s.HalfOpenIn <= 0 {
				t.Fatalf("round %d: %+v, want open with a positive wait", i, s)
			}
			if s.HalfOpenIn < prev {
				t.Fatalf("round %d: open period %v shrank from %v", i, s.HalfOpenIn, prev)
			}
			prev = s.HalfOpenIn
			if s.HalfOpenIn > 100*extYear {
				return // far enough: it saturated without wrapping
			}
			time.Sleep(s.HalfOpenIn)
			p, err := b.Allow()
			if err != nil {
				t.Fatalf("round %d: probe refused: %v (%+v)", i, err, b.Snapshot())
			}
			b.Done(p, false)
		}
	})
}

// Wait with maxWait of the largest Duration: "A maxWait near the largest
// Duration means no bound". It waits for the probe round and gets a probe.
func TestAttackExtremesWaitMaxDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := extNew(t, breaker.Config{OpenFor: time.Hour, Rand: func() float64 { return 0.5 }})
		b.Trip(0)
		var wg sync.WaitGroup
		for _, mw := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				start := time.Now()
				p, err := b.Wait(context.Background(), mw)
				if err != nil {
					t.Errorf("Wait(%v): %v", mw, err)
					return
				}
				if el := time.Since(start); el < time.Hour {
					t.Errorf("Wait(%v) admitted after %v, before the round", mw, el)
				}
				b.Done(p, true)
			}()
		}
		wg.Wait()
	})
}

// Wait with a context whose deadline is in year 9999 and maxWait from it.
func TestAttackExtremesWaitDeadline9999(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := extNew(t, breaker.Config{OpenFor: 100 * extYear, Rand: func() float64 { return 0.5 }})
		b.Trip(0)
		dl := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
		ctx, cancel := context.WithDeadline(context.Background(), dl)
		defer cancel()
		start := time.Now()
		p, err := b.Wait(ctx, time.Until(dl))
		if err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if el := time.Since(start); el < 100*extYear {
			t.Errorf("admitted after %v", el)
		}
		b.Done(p, true)
	})
}

// MinCalls of MaxInt, Buckets 1: a breaker that never trips on the ratio;
// with ConsecutiveFailures 2^32-1 it does not trip on the run either within
// a few million failures. No overflow in the counts: the bucket's counts
// saturate and halve.
func TestAttackExtremesHugeCountsNoTrip(t *testing.T) {
	b := extNew(t, breaker.Config{MinCalls: math.MaxInt, ConsecutiveFailures: math.MaxUint32, Window: time.Hour, Buckets: 1})
	for i := 0; i < 1<<21; i++ {
		p, err := b.Allow()
		if err != nil {
			t.Fatalf("call %d refused: %v", i, err)
		}
		b.Done(p, false)
	}
	if s := b.Snapshot(); s.State != breaker.Closed || s.Calls < 0 || s.Failures < 0 {
		t.Errorf("snapshot %+v", s)
	}
}
