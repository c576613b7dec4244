package admission_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
)

const extYear = 365 * 24 * time.Hour

// Config: "Where a negative value is allowed it says so; otherwise a
// negative value is an error"; Window "a multiple of 10 nanoseconds of at
// least 10 ms"; "RetryAfterBase + RetryAfterSpread must not exceed 24
// hours"; RetryRatio "at most 1"; MinRetriesPerSecond "must be finite".
func TestAttackExtremesNewEdges(t *testing.T) {
	bad := map[string]admission.Config{
		"latency -1":         {LatencyCeiling: -1},
		"latency w/o max":    {LatencyCeiling: time.Second, MaxInFlight: -1},
		"queuewait -1":       {MaxQueueWait: -1},
		"ratio NaN":          {RetryRatio: math.NaN()},
		"ratio +Inf":         {RetryRatio: math.Inf(1)},
		"ratio 1+eps":        {RetryRatio: math.Nextafter(1, 2)},
		"floor NaN":          {MinRetriesPerSecond: math.NaN()},
		"floor -Inf":         {MinRetriesPerSecond: math.Inf(-1)},
		"window -1":          {Window: -1},
		"window 9ms":         {Window: 9 * time.Millisecond},
		"window 10ms+1":      {Window: 10*time.Millisecond + 1},
		"window MaxInt64":    {Window: math.MaxInt64},
		"ra base -1":         {RetryAfterBase: -1},
		"ra base MaxInt64":   {RetryAfterBase: math.MaxInt64, RetryAfterSpread: -1},
		"ra base 24h+spread": {RetryAfterBase: 24 * time.Hour, RetryAfterSpread: 1},
		"ra spread MaxInt64": {RetryAfterSpread: math.MaxInt64},
	}
	for name, c := range bad {
		if ctl, err := admission.New(c); err == nil || ctl != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, ctl, err)
		}
	}
	good := map[string]admission.Config{
		"max MinInt":         {MaxInFlight: math.MinInt},
		"max MaxInt":         {MaxInFlight: math.MaxInt, MaxQueue: math.MaxInt},
		"queue MinInt":       {MaxQueue: math.MinInt},
		"queuewait MaxInt64": {MaxQueueWait: math.MaxInt64},
		"latency MaxInt64":   {LatencyCeiling: math.MaxInt64, MaxInFlight: 1},
		"ratio -Inf":         {RetryRatio: math.Inf(-1)},
		"floor MaxFloat":     {MinRetriesPerSecond: math.MaxFloat64},
		"window 10ms":        {Window: 10 * time.Millisecond},
		"ra 24h":             {RetryAfterBase: 24 * time.Hour, RetryAfterSpread: -1},
		"ra 1ns":             {RetryAfterBase: 1, RetryAfterSpread: -1},
	}
	for name, c := range good {
		if _, err := admission.New(c); err != nil {
			t.Errorf("%s: New: %v; want success", name, err)
		}
	}
}

// MaxQueueWait of the largest Duration, a request with a deadline in year
// 9999 and one without: both wait in the queue (no overflowed, instant
// timeout) and are admitted when the slot frees 50 years later.
func TestAttackExtremesQueueWaitMaxDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl, err := admission.New(admission.Config{MaxInFlight: 1, MaxQueue: 4, MaxQueueWait: math.MaxInt64})
		if err != nil {
			t.Fatal(err)
		}
		p, d := ctl.Acquire(context.Background(), 1)
		if d.Outcome != admission.Admitted {
			t.Fatalf("first: %+v", d)
		}
		far, cancel := context.WithDeadline(context.Background(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
		defer cancel()
		var wg sync.WaitGroup
		for _, ctx := range []context.Context{far, context.Background()} {
			wg.Go(func() {
				start := time.Now()
				p, d := ctl.Acquire(ctx, 1)
				if d.Outcome != admission.Admitted {
					t.Errorf("queued request: %+v after %v, want admitted", d, time.Since(start))
					return
				}
				p.Release()
			})
		}
		time.Sleep(50 * extYear)
		p.Release()
		wg.Wait()
	})
}

// A request whose caller's deadline has passed (Unix epoch) is dropped at
// once as Canceled with the don't-retry signal.
func TestAttackExtremesPastDeadline(t *testing.T) {
	ctl, err := admission.New(admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	_, d := ctl.Acquire(ctx, 1)
	if d.Outcome != admission.Canceled || !d.DontRetry {
		t.Errorf("past deadline: %+v, want Canceled with DontRetry", d)
	}
}

// Retry-After of a refusal stays in [base, base+spread) at the largest
// allowed values, with a Rand at the edges (NaN, ±Inf, 1, -1).
func TestAttackExtremesRefusalRetryAfterBounds(t *testing.T) {
	for _, u := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), 1, -1, math.Nextafter(1, 0), 0} {
		ctl, err := admission.New(admission.Config{RetryAfterBase: 12 * time.Hour, RetryAfterSpread: 12 * time.Hour,
			RetryRatio: -1, MinRetriesPerSecond: -1, Rand: func() float64 { return u }})
		if err != nil {
			t.Fatal(err)
		}
		_, d := ctl.Acquire(context.Background(), 2)
		if d.Outcome != admission.RetryRefused {
			t.Fatalf("u %v: %+v, want RetryRefused", u, d)
		}
		if d.RetryAfter < 12*time.Hour || d.RetryAfter >= 24*time.Hour {
			t.Errorf("u %v: RetryAfter %v, want in [12h, 24h)", u, d.RetryAfter)
		}
	}
}
