//go:build !race

// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks. 50M calls: run
// without -race (make test runs it in NORACE_PKGS).

package breaker_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Window: 1 hour in one bucket (a valid Config). 2^25 successes and 2^24
// failures, interleaved (two successes, a failure): 33% failed, below
// FailureRatio 0.5, so the rule "failures >= FailureRatio·calls" says it
// must not trip. A black-box attack found it tripped: the success count
// stopped at 16,777,215 while the failures went on. A full bucket now
// halves both counts (Snapshot's doc), which keeps their ratio.
func TestAttackCounterSaturation(t *testing.T) {
	if testing.Short() {
		t.Skip("50M calls")
	}
	synctest.Test(t, func(t *testing.T) {
		b := atkMust(t, breaker.Config{Window: time.Hour, Buckets: 1, Rand: atkHalf})
		for i := 0; i < 1<<24; i++ {
			for _, ok := range [...]bool{true, true, false} {
				p, err := b.Allow()
				if err != nil {
					t.Fatalf("tripped after %d rounds of two successes and a failure (33%% failed, FailureRatio 50%%): %v", i, err)
				}
				b.Done(p, ok)
			}
		}
		s := b.Snapshot()
		if s.State != breaker.Closed || s.Calls < 1<<23 || s.Failures*3 < s.Calls-3 || s.Failures*3 > s.Calls+3 {
			t.Errorf("after 2^24 rounds of two successes and a failure: %+v, want closed, a third failed", s)
		}
	})
}

// "A bucket that fills one of its counts (16,777,215 outcomes) halves both,
// which keeps their ratio": one success among 16,777,215 failures, at
// FailureRatio 1 (trip only when every call failed).
func TestAttackCounterSaturationKeepsRatio(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	synctest.Test(t, func(t *testing.T) {
		b, err := breaker.New(breaker.Config{FailureRatio: 1, Window: time.Hour, Buckets: 1, MinCalls: 1})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := b.Allow()
		b.Done(p, true)
		const full = 1<<24 - 1
		for i := 0; i < full+1; i++ {
			p, err := b.Allow()
			if err != nil {
				s := b.Snapshot()
				t.Fatalf("tripped after %d failures with a success in the window (ratio < 1): %+v", i, s)
			}
			b.Done(p, false)
		}
		if s := b.Snapshot(); s.State != breaker.Closed {
			t.Errorf("tripped by the halving of a full bucket, with a success in it (ratio 1/%d < FailureRatio 1): %+v", full+2, s)
		}
	})
}

// README: "It trips within about a second of an outage at 20 calls a
// second or more ..., in about half its 10 s window below that". The
// default Config after 20 s of healthy traffic at each rate, then every
// call failing.
func TestAttackReadmeTripTime(t *testing.T) {
	tests := []struct {
		rate     int
		min, max time.Duration
	}{
		{10, 4 * time.Second, 6 * time.Second},
		{19, 4 * time.Second, 6 * time.Second},
		{20, 0, 1500 * time.Millisecond},
		{100, 0, 1500 * time.Millisecond},
		{1000, 0, 1500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.rate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := breaker.New(breaker.Config{})
				if err != nil {
					t.Fatal(err)
				}
				call := func(ok bool) {
					p, err := b.Allow()
					if err != nil {
						t.Fatalf("Allow: %v", err)
					}
					b.Done(p, ok)
				}
				gap := time.Second / time.Duration(tt.rate)
				for range 20 * tt.rate {
					call(true)
					time.Sleep(gap)
				}
				start := time.Now()
				for b.State() == breaker.Closed && time.Since(start) < 20*time.Second {
					call(false)
					time.Sleep(gap)
				}
				if took := time.Since(start); took < tt.min || took > tt.max {
					t.Errorf("%d calls a second: tripped %v after the outage began, want within [%v, %v]", tt.rate, took, tt.min, tt.max)
				}
			})
		})
	}
}
