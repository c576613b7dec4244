package limit_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/limit"
)

func Example() {
	// One Limiter per destination, shared by every call to it.
	l, err := limit.New(limit.Config{Max: 2, Timeout: time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("cold limit:", l.Limit())

	ctx := context.Background()
	a, _ := l.Acquire(ctx)
	b, _ := l.Acquire(ctx)

	// The limit is reached: a call without a deadline cannot wait.
	_, err = l.Acquire(ctx)
	fmt.Println(errors.Is(err, limit.ErrLimited), err)

	// With a deadline it waits, earliest deadline first, and leaves at
	// its deadline if no slot comes.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err = l.Acquire(short)
	fmt.Println(errors.Is(err, limit.ErrLimited), errors.Is(err, context.DeadlineExceeded))

	// Give the slots back with the outcome: b timed out (a drop).
	l.Release(a, false)
	l.Release(b, true)
	p, err := l.Acquire(ctx)
	fmt.Println(err)
	l.Release(p, false)
	// Output:
	// cold limit: 2
	// true limit: refused: limit reached and the call has no deadline to wait within
	// true true
	// <nil>
}
