package limit

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestSetCap: a cap bounds the limit in force, 0 makes calls wait, raising
// it grants the waiters, and removing it restores the learned limit.
func TestSetCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := New(Config{})
		if err != nil {
			t.Fatal(err)
		}
		learned := l.Limit()
		if in, w := l.SetCap(2); in != 0 || w != 0 || l.Limit() != 2 {
			t.Fatalf("SetCap(2) = %d, %d; limit %d, want 0, 0, 2", in, w, l.Limit())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p1, err1 := l.Acquire(ctx)
		p2, err2 := l.Acquire(ctx)
		if err1 != nil || err2 != nil {
			t.Fatalf("two acquires under a cap of 2: %v, %v", err1, err2)
		}
		// Lower the cap below what is in flight: nothing new starts.
		if in, _ := l.SetCap(0); in != 2 || l.Limit() != 0 {
			t.Fatalf("SetCap(0): in flight %d, limit %d; want 2, 0", in, l.Limit())
		}
		l.Release(p1, false)
		l.Release(p2, false)
		got := make(chan error, 1)
		go func() {
			p, err := l.Acquire(ctx)
			if err == nil {
				l.Release(p, false)
			}
			got <- err
		}()
		synctest.Wait()
		if in, w := l.SetCap(0); in != 0 || w != 1 {
			t.Fatalf("under a cap of 0: in flight %d, waiting %d; want 0, 1", in, w)
		}
		l.SetCap(1) // raised: the waiter gets its slot at once
		if err := <-got; err != nil {
			t.Fatalf("the waiter after SetCap(1): %v", err)
		}
		// A cap of 0 that stays: the waiter fails at its deadline.
		l.SetCap(0)
		short, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel2()
		if _, err := l.Acquire(short); !errors.Is(err, ErrLimited) {
			t.Fatalf("Acquire under a cap of 0: %v, want ErrLimited", err)
		}
		l.SetCap(-5)
		if l.Limit() != learned {
			t.Fatalf("cap removed: limit %d, want the learned %d", l.Limit(), learned)
		}
	})
}
