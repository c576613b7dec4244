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

	// The limit is reached. A done context takes a slot only if one is
	// free: it is refused at once (ErrLimited, with the context's error).
	done, cancel := context.WithCancel(ctx)
	cancel()
	_, err = l.Acquire(done)
	fmt.Println(errors.Is(err, limit.ErrLimited), errors.Is(err, context.Canceled))

	// With a deadline a call waits, earliest deadline first, and leaves
	// at its deadline if no slot comes.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	_, err = l.Acquire(short)
	fmt.Println(errors.Is(err, limit.ErrLimited), errors.Is(err, context.DeadlineExceeded))

	// Without a deadline it waits until a slot is given back (or its
	// context ends).
	got := make(chan error, 1)
	go func() {
		p, err := l.Acquire(ctx)
		got <- err
		l.Release(p, false)
	}()
	l.Release(a, false)
	fmt.Println(<-got)
	// Give the slots back with the outcome: b timed out (a drop).
	l.Release(b, true)
	// Output:
	// cold limit: 2
	// true true
	// true true
	// <nil>
}
