package backoff_test

import (
	"math"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// Package doc: "NoJitter exp(n)" with exp(n) = min(c, b·2^n); "EqualJitter
// ... the delay is in [exp(n)/2, exp(n))". Durations are integers of
// nanoseconds, so exp(n) is exact. Linear was made exact above 2^53 ns;
// NoJitter and EqualJitter are computed in float64 and are not.
func TestAttack6NoJitterExactAbove2p53(t *testing.T) {
	base := time.Duration(1<<53 + 1) // about 104 days
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: base, Cap: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	s := b.Sequence()
	for n := 1; n <= 3; n++ {
		want := base << n // exact, far below the cap
		if d := s.Next(); d != want {
			t.Errorf("NoJitter base %d retry %d = %d ns, want exp(n) = b·2^n = %d ns (off by %d)", int64(base), n, int64(d), int64(want), int64(want-d))
		}
	}
	// The cap side: b·2^n below the cap, but the cap rounds up in float64.
	base2 := time.Duration(1<<59 - 1)
	cp := time.Duration(1<<60 - 1)
	b2, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: base2, Cap: cp})
	s2 := b2.Sequence()
	if d, want := s2.Next(), min(cp, base2*2); d != want {
		t.Errorf("NoJitter base %d cap %d retry 1 = %d ns, want min(c, b·2) = %d ns", int64(base2), int64(cp), int64(d), int64(want))
	}
}

func TestAttack6EqualJitterLowerBoundAbove2p53(t *testing.T) {
	base := time.Duration(1<<53 + 1)
	b, err := backoff.New(backoff.Config{Strategy: backoff.EqualJitter, Base: base, Cap: math.MaxInt64, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	s := b.Sequence()
	exp := base * 2
	if d := s.Next(); d < exp/2 {
		t.Errorf("EqualJitter base %d retry 1 = %d ns, below exp(n)/2 = %d ns (the doc: in [exp(n)/2, exp(n)))", int64(base), int64(d), int64(exp/2))
	}
}
