package backoff_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// The default (what the zero Config gives): full jitter, base 100 ms, cap
// 10 s. With the random source pinned at 0.5, each delay is half of
// min(cap, base·2^n).
func ExampleNew() {
	b, err := backoff.New(backoff.Config{
		Strategy: backoff.FullJitter,
		Base:     100 * time.Millisecond,
		Cap:      10 * time.Second,
		Rand:     func() float64 { return 0.5 }, // U pinned at 0.5
	})
	if err != nil {
		panic(err)
	}
	seq := b.Sequence()
	for range 4 {
		fmt.Println(seq.Next())
	}
	// Output:
	// 100ms
	// 200ms
	// 400ms
	// 800ms
}

// Settings that cannot work are rejected when the Backoff is built, never
// when a delay is computed.
func ExampleNew_invalid() {
	_, err := backoff.New(backoff.Config{Base: time.Second, Cap: time.Millisecond})
	fmt.Println(err)
	// Output:
	// backoff: invalid config: Cap 1ms must be at least Base 1s
}

// Every strategy for the first four retries, with U fixed at 0.5: one
// Sequence per call, each fed its own previous delay (which only
// Decorrelated uses).
func ExampleSequence() {
	for _, st := range []backoff.Strategy{backoff.NoJitter, backoff.FullJitter, backoff.EqualJitter, backoff.Decorrelated} {
		b, _ := backoff.New(backoff.Config{Strategy: st, Base: 100 * time.Millisecond, Cap: 10 * time.Second, Rand: func() float64 { return 0.5 }})
		seq := b.Sequence()
		fmt.Printf("%-12s", st)
		for range 4 {
			fmt.Printf(" %v", seq.Next())
		}
		fmt.Println()
	}
	// Output:
	// none         200ms 400ms 800ms 1.6s
	// full         100ms 200ms 400ms 800ms
	// equal        150ms 300ms 600ms 1.2s
	// decorrelated 200ms 350ms 575ms 912.5ms
}

// The fixed schedules, by name: Constant sleeps the base before every retry,
// Linear base·n up to the cap. Neither has jitter (the random source is not
// used).
func ExampleStrategy_fixed() {
	for _, name := range []string{"constant", "linear"} {
		var st backoff.Strategy
		if err := st.UnmarshalText([]byte(name)); err != nil { // as flag.TextVar or JSON would
			panic(err)
		}
		b, err := backoff.New(backoff.Config{Strategy: st, Base: 250 * time.Millisecond, Cap: time.Second})
		if err != nil {
			panic(err)
		}
		seq := b.Sequence()
		fmt.Printf("%-8s", st)
		for range 5 {
			fmt.Printf(" %v", seq.Next())
		}
		fmt.Println()
	}
	// Output:
	// constant 250ms 250ms 250ms 250ms 250ms
	// linear   250ms 500ms 750ms 1s 1s
}
