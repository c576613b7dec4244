package limit_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
)

const extYear = 365 * 24 * time.Hour

func extNew(t *testing.T, c limit.Config) *limit.Limiter {
	t.Helper()
	l, err := limit.New(c)
	if err != nil {
		t.Fatalf("New(%+v): %v", c, err)
	}
	return l
}

// New: "It returns an error naming the field when Max is negative or above
// 2^30, Timeout is negative, or Throttle is NaN, infinite, negative or in
// (0, 1). Every Waiting is valid."
func TestAttackExtremesNewEdges(t *testing.T) {
	bad := map[string]limit.Config{
		"max -1":        {Max: -1},
		"max MinInt":    {Max: math.MinInt},
		"max 2^30+1":    {Max: 1<<30 + 1},
		"max MaxInt":    {Max: math.MaxInt},
		"timeout -1":    {Timeout: -1},
		"throttle NaN":  {Throttle: math.NaN()},
		"throttle +Inf": {Throttle: math.Inf(1)},
		"throttle -Inf": {Throttle: math.Inf(-1)},
		"throttle -1":   {Throttle: -1},
		"throttle 0.5":  {Throttle: 0.5},
		"throttle 1-e":  {Throttle: math.Nextafter(1, 0)},
		"throttle tiny": {Throttle: math.SmallestNonzeroFloat64},
	}
	for name, c := range bad {
		if l, err := limit.New(c); err == nil || l != nil {
			t.Errorf("%s: New = %v, %v; want an error", name, l, err)
		}
	}
	good := map[string]limit.Config{
		"max 2^30":         {Max: 1 << 30},
		"max 1":            {Max: 1},
		"timeout 1ns":      {Timeout: 1},
		"timeout MaxInt64": {Timeout: math.MaxInt64},
		"throttle 1":       {Throttle: 1},
		"throttle max":     {Throttle: math.MaxFloat64},
		"waiting MinInt":   {Waiting: math.MinInt},
		"waiting MaxInt":   {Waiting: math.MaxInt},
	}
	for name, c := range good {
		if _, err := limit.New(c); err != nil {
			t.Errorf("%s: New: %v; want success", name, err)
		}
	}
}

// SetCap at the extremes: MaxInt leaves the learned limit in force, MinInt
// removes the cap, 0 stops new attempts and a removed cap grants the waiter.
func TestAttackExtremesSetCapExtremes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := extNew(t, limit.Config{Max: 4})
		l.SetCap(math.MaxInt)
		if got := l.Limit(); got != 4 {
			t.Errorf("SetCap(MaxInt): Limit %d, want 4", got)
		}
		l.SetCap(math.MinInt)
		if got := l.Limit(); got != 4 {
			t.Errorf("SetCap(MinInt): Limit %d, want 4", got)
		}
	})
}

// SetCap(0) then a waiting call without a deadline; SetCap(MinInt) removes
// the cap and grants it at once.
func TestAttackExtremesSetCapZeroThenRemoved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := extNew(t, limit.Config{Max: 4})
		l.SetCap(0)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := l.Acquire(done); !errors.Is(err, limit.ErrLimited) {
			t.Errorf("capped at 0, done context: %v, want ErrLimited", err)
		}
		var wg sync.WaitGroup
		var got error = errors.New("not yet")
		wg.Go(func() {
			p, err := l.Acquire(context.Background())
			got = err
			if err == nil {
				l.Release(p, false)
			}
		})
		synctest.Wait()
		if _, waiting := l.SetCap(0); waiting != 1 {
			t.Errorf("waiting %d, want 1", waiting)
		}
		l.SetCap(math.MinInt)
		wg.Wait()
		if got != nil {
			t.Errorf("after SetCap(MinInt): %v", got)
		}
	})
}

// SetRate: "a token bucket of perSecond tokens per second". A rate of one
// token per 10,000 years (perSecond ≈ 3.17e-12): after the idle gate's one
// token, the next call without a deadline waits for the next token, due
// 10,000 years later. The limiter silently raises any rate below one token
// SetRate: "A perSecond below one token a century counts as one a
// century": a rate of one token per 10,000 years gives its second token a
// century after the first, not sooner, and a call whose deadline comes
// before that is refused at once.
func TestAttackExtremesSetRateSlowerThanACentury(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := extNew(t, limit.Config{Max: 10})
		perSeconds := 10000 * extYear.Seconds()
		l.SetRate(1/perSeconds, 1)
		p, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
		short, cancel := context.WithTimeout(context.Background(), 50*extYear)
		defer cancel()
		start := time.Now()
		if _, err = l.Acquire(short); err == nil || time.Since(start) != 0 {
			t.Fatalf("a call with 50 years left, the next token a century away: err %v after %v, want refused at once", err, time.Since(start))
		}
		ctx, cancel2 := context.WithTimeout(context.Background(), 200*extYear)
		defer cancel2()
		p, err = l.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(p, false)
		// Its time a century on; a waiting call gets it at a drawn point
		// of the century that follows.
		if got := time.Since(start); got < 99*extYear || got > 201*extYear {
			t.Errorf("second token after %.1f years, want a century to two", got.Hours()/24/365)
		}
	})
}

// SetRate at the extremes: NaN leaves the gate as it is, +Inf and <= 0
// turn it off, MaxFloat64 is as good as no gate, a denormal rate is the
// slowest; a huge burst holds a day's worth. None panics.
func TestAttackExtremesSetRateExtremesNoPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := extNew(t, limit.Config{Max: 1 << 30})
		vals := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, -1, math.SmallestNonzeroFloat64, 1e-300, 1e-9, 1, 1e9, 1e18, math.MaxFloat64}
		for _, r := range vals {
			for _, b := range vals {
				l.SetRate(r, b)
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				if p, err := l.Acquire(ctx); err == nil {
					l.Release(p, false)
				}
			}
		}
		l.SetRate(0, 0)
		// Off: calls go at once.
		for i := 0; i < 100; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			p, err := l.Acquire(ctx)
			if err != nil {
				t.Fatalf("gate off, call %d: %v", i, err)
			}
			l.Release(p, false)
		}
	})
}

// A huge burst at 1 token/s holds a day's worth: 86,400 calls go at once on
// an idle gate, the next one does not.
func TestAttackExtremesSetRateHugeBurstDaysWorth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := extNew(t, limit.Config{Max: 1 << 30})
		l.SetRate(1, math.MaxFloat64)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		n := 0
		for ; n < 100000; n++ {
			p, err := l.Acquire(done)
			if err != nil {
				break
			}
			l.Release(p, false)
		}
		if n < 86400 || n > 86401 {
			t.Errorf("an idle gate of 1/s with burst MaxFloat64 let %d calls go at once, want a day's worth (86,400)", n)
		}
	})
}

// Acquire under the limit with a deadline in year 9999 and one in the past.
func TestAttackExtremesAcquireDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := extNew(t, limit.Config{Max: 1})
		hold, err := l.Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		past, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
		defer cancel()
		if _, err := l.Acquire(past); !errors.Is(err, limit.ErrLimited) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("past deadline: %v, want ErrLimited and DeadlineExceeded", err)
		}
		far, cancel2 := context.WithDeadline(context.Background(), time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC))
		defer cancel2()
		var wg sync.WaitGroup
		var got error = errors.New("not yet")
		wg.Go(func() {
			p, err := l.Acquire(far)
			got = err
			if err == nil {
				l.Release(p, false)
			}
		})
		time.Sleep(50 * extYear)
		synctest.Wait()
		l.Release(hold, false)
		wg.Wait()
		if got != nil {
			t.Errorf("year-9999 deadline: %v, want a slot", got)
		}
	})
}
