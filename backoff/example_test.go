package backoff_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/backoff"
)

// The default: full jitter, base 100 ms, cap 10 s. With the random source
// pinned at 0.5, each delay is half of min(cap, base·2^n).
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

// Zero fields take the defaults: Config{} is full jitter, base 100 ms, cap
// 10 s.
func ExampleDefault() {
	c := backoff.Default().Config()
	fmt.Println(c.Strategy, c.Base, c.Cap)
	// Output:
	// full 100ms 10s
}

// Settings that cannot work are rejected when the Backoff is built, never
// when a delay is computed.
func ExampleNew_invalid() {
	_, err := backoff.New(backoff.Config{Base: time.Second, Cap: time.Millisecond})
	fmt.Println(err)
	// Output:
	// backoff: invalid config: cap 1ms must be at least base 1s
}

// Every strategy for the first four retries, with U fixed at 0.5.
func ExampleBackoff_Delay() {
	for _, st := range backoff.Strategies() {
		b, _ := backoff.New(backoff.Config{Strategy: st, Base: 100 * time.Millisecond, Cap: 10 * time.Second, Rand: func() float64 { return 0.5 }})
		var prev time.Duration
		fmt.Printf("%-12s", st)
		for n := 1; n <= 4; n++ {
			prev = b.Delay(n, prev)
			fmt.Printf(" %v", prev)
		}
		fmt.Println()
	}
	// Output:
	// none         200ms 400ms 800ms 1.6s
	// full         100ms 200ms 400ms 800ms
	// equal        150ms 300ms 600ms 1.2s
	// decorrelated 200ms 350ms 575ms 912.5ms
}

// Mulberry32 reproduces the seed's JavaScript generator bit for bit.
func ExampleMulberry32() {
	m := backoff.NewMulberry32(42)
	fmt.Println(m.Float64())
	fmt.Println(m.Float64())
	// Output:
	// 0.6011037519201636
	// 0.44829055899754167
}
