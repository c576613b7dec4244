package breaker_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// The two-step form, for middleware: Allow before the call, Done after it.
// The breaker trips when half of at least 4 calls failed, rejects calls
// while open, and closes again after two good probes.
func ExampleBreaker() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC) // a fake clock
	c := breaker.Config{MinCalls: 4, OpenFor: 5 * time.Second, Probes: 2}
	c.Now = func() time.Time { return now }
	c.Rand = func() float64 { return 0.5 } // no jitter: open for exactly 5 s
	c.OnStateChange = func(from, to breaker.State) { fmt.Println("state:", from, "->", to) }
	b, err := breaker.New(c)
	if err != nil {
		panic(err)
	}

	call := func(ok bool) {
		p, err := b.Allow()
		if err != nil {
			fmt.Println("rejected:", err)
			return
		}
		b.Done(p, ok) // report the outcome
	}
	call(true)
	call(false)
	call(true)
	call(false) // 2 of 4 failed: 50%

	now = now.Add(2 * time.Second)
	call(true)
	_, err = b.Allow()
	var oe *breaker.OpenError
	if errors.As(err, &oe) {
		fmt.Println("retry after:", oe.RetryAfter())
	}

	now = now.Add(3 * time.Second)
	call(true) // probe 1
	call(true) // probe 2
	fmt.Println(b.State())
	// Output:
	// state: closed -> open
	// rejected: breaker: open, half-open in 3s
	// retry after: 3s
	// state: open -> half-open
	// state: half-open -> closed
	// closed
}

// Execute wraps a closure: the breaker decides whether to call it and
// records its error. IsFailure decides which errors count against the
// dependency; here a "not found" answer is a healthy dependency.
func ExampleBreaker_Execute() {
	errNotFound := errors.New("not found")
	c := breaker.Config{}
	c.MinCalls = 2
	c.IsFailure = func(err error) bool { return err != nil && !errors.Is(err, errNotFound) }
	b, err := breaker.New(c)
	if err != nil {
		panic(err)
	}

	fmt.Println(b.Execute(func() error { return errNotFound }))
	fmt.Println(b.Execute(func() error { return errors.New("503") }))
	fmt.Println(b.State()) // 1 failure of 2
	err = b.Execute(func() error { panic("not called") })
	fmt.Println(errors.Is(err, breaker.ErrOpen))
	// Output:
	// not found
	// 503
	// open
	// true
}
