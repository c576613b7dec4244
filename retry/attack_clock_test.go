package retry_test

import (
	"context"
	"io"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

func atkPolicy(t *testing.T, g retry.Guards, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(append([]retry.Option{retry.WithGuards(g)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// WithGuards: "Every admitted attempt is reported back to the breaker,
// exactly once: success (nil error) is a success"; breaker.Done: "While the
// breaker is closed, Done records the outcome in the current bucket". A
// first attempt that takes longer than the breaker's window and succeeds,
// under a policy with a budget and a breaker on their default clocks,
// must show in the window.
func TestAttackLongSuccessCountedInWindow(t *testing.T) {
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		opts []retry.Option
	}{
		{"no deadline", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, nil},
		{"a deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Minute)
		}, nil},
		{"an attempt timeout", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
			[]retry.Option{retry.WithAttemptTimeout(time.Minute)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				br, err := breaker.New(breaker.Config{}) // 10 s window
				if err != nil {
					t.Fatal(err)
				}
				bu, err := budget.New(budget.Config{})
				if err != nil {
					t.Fatal(err)
				}
				p := atkPolicy(t, retry.Guards{Budget: bu, Breaker: br}, tt.opts...)
				ctx, cancel := tt.ctx()
				defer cancel()
				err = p.Do(ctx, func(ctx context.Context, attempt int) error {
					time.Sleep(12 * time.Second)
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if s := br.Snapshot(); s.Calls != 1 {
					t.Errorf("after a 12 s successful attempt through the policy (budget+breaker): Snapshot.Calls = %d, want 1 (as Allow/Done directly)", s.Calls)
				}
				if s := bu.Stats(); s.Requests != 0 {
					t.Errorf("budget 12 s after the deposit: %d requests in its window, want 0 (deposited when the attempt started)", s.Requests)
				}
			})
		})
	}
}

// breaker.Config.ConsecutiveFailures: "A success ends the run". A success
// reported by the retry loop (budget + breaker on default clocks) for a
// long first attempt does not end the run: the breaker trips on the
// failure after it, though only 2 failures came in a row before it.
func TestAttackLongSuccessEndsConsecutiveRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br, err := breaker.New(breaker.Config{ConsecutiveFailures: 3, MinCalls: 1000})
		if err != nil {
			t.Fatal(err)
		}
		bu, err := budget.New(budget.Config{})
		if err != nil {
			t.Fatal(err)
		}
		p := atkPolicy(t, retry.Guards{Budget: bu, Breaker: br}, retry.WithMaxAttempts(1))
		ok := func(ctx context.Context, attempt int) error { return nil }
		fail := func(ctx context.Context, attempt int) error { return io.ErrUnexpectedEOF }
		done := make(chan error)
		go func() {
			done <- p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				time.Sleep(10500 * time.Millisecond) // a long poll
				return nil
			})
		}()
		time.Sleep(10200 * time.Millisecond)
		_ = p.Do(context.Background(), ok)
		time.Sleep(100 * time.Millisecond)
		_ = p.Do(context.Background(), fail)
		_ = p.Do(context.Background(), fail)
		if err := <-done; err != nil { // the long poll succeeds now: the run ends
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
		_ = p.Do(context.Background(), fail)
		if st := br.State(); st != breaker.Closed {
			t.Errorf("failures in order: fail, fail, success, fail (ConsecutiveFailures 3): state %v, want closed", st)
		}
	})
}

// breaker package doc: "After a failure, if the window holds at least
// MinCalls calls and failures >= FailureRatio·calls, or the current bucket
// alone does, the breaker trips"; WithGuards: every admitted attempt is
// reported back, a success as a success. Six 2.2 s calls succeed in bucket
// 2, then four fail fast in bucket 2: the bucket holds 10 calls and 4
// failures (40% < 50%), the window the same. The breaker must stay closed;
// with a budget beside the breaker (both on their default clocks) the
// successes are counted in bucket 0, where the calls started, and the
// bucket alone (4 failures of 4) trips it.
func TestAttackSuccessesCountInTheirBucket(t *testing.T) {
	for _, withBudget := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			br, err := breaker.New(breaker.Config{MinCalls: 4}) // 50%, 10 s in 1 s buckets
			if err != nil {
				t.Fatal(err)
			}
			g := retry.Guards{Breaker: br}
			if withBudget {
				bu, err := budget.New(budget.Config{})
				if err != nil {
					t.Fatal(err)
				}
				g.Budget = bu
			}
			p := atkPolicy(t, g, retry.WithMaxAttempts(1))
			done := make(chan error, 6)
			for range 6 {
				go func() {
					done <- p.Do(context.Background(), func(ctx context.Context, attempt int) error {
						time.Sleep(2200 * time.Millisecond)
						return nil
					})
				}()
			}
			for range 6 {
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(100 * time.Millisecond) // t = 2.3 s, bucket 2
			for range 4 {
				_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return io.ErrUnexpectedEOF })
			}
			if st := br.State(); st != breaker.Closed {
				t.Errorf("budget beside the breaker: %v; bucket 2 holds 6 successes and 4 failures (40%%), window the same: state %v, want closed", withBudget, st)
			}
		})
	}
}
