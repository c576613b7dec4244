package retry_test

import (
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
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

// Guards doc: "Each call deposits once, just before its first attempt runs".
// A call that waited 12 s for a limiter slot (its deadline allows it) must
// have its deposit in the budget's window once its first attempt runs.
func TestAttackDepositAfterLimiterWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{}) // default clock: the loop hands it its own reading
		if err != nil {
			t.Fatal(err)
		}
		lim, err := limit.New(limit.Config{Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: b, Limiter: lim}))
		if err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // holds the only slot for 12 s
			defer wg.Done()
			_ = p.Do(ctx, func(context.Context, int) error { time.Sleep(12 * time.Second); return nil })
		}()
		synctest.Wait()
		var during budget.Stats
		wg.Add(1)
		go func() { // waits 12 s for the slot, then runs its first attempt
			defer wg.Done()
			_ = p.Do(ctx, func(context.Context, int) error {
				during = b.Stats()
				<-release
				return nil
			})
		}()
		time.Sleep(13 * time.Second)
		synctest.Wait()
		close(release)
		wg.Wait()
		// At 12 s the first call's deposit (made at 0) has left the 10 s
		// window; the second call's, made "just before its first attempt
		// runs" (at 12 s), must be there.
		if during.Requests < 1 {
			t.Fatalf("second call's first attempt ran at 12 s, but the budget's window holds %d requests (its deposit was stamped with the clock reading from before its 12 s wait for a limiter slot, and fell out of the 10 s window at once)", during.Requests)
		}
	})
}

// WithGuards: "success (nil error) is a success (unless it took the
// breaker's SlowCall or longer)". Three calls at once through a limiter of
// one slot: each attempt takes 900 ms, under SlowCall (1 s), and succeeds;
// the second and third wait 0.9 s and 1.8 s for the slot first (the
// limiter is asked after the breaker). None of the attempts took SlowCall.
func TestAttackLimiterWaitIsNotSlowCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{SlowCall: time.Second, ConsecutiveFailures: 2})
		if err != nil {
			t.Fatal(err)
		}
		lim, err := limit.New(limit.Config{Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		var longest atomic.Int64
		for range 3 {
			wg.Go(func() {
				err := p.Do(ctx, func(context.Context, int) error {
					s := time.Now()
					time.Sleep(900 * time.Millisecond)
					if d := int64(time.Since(s)); d > longest.Load() {
						longest.Store(d)
					}
					return nil
				})
				if err != nil {
					t.Errorf("Do: %v", err)
				}
			})
		}
		wg.Wait()
		s := brk.Snapshot()
		if s.State != breaker.Closed || s.Failures != 0 {
			t.Errorf("3 successful attempts of at most %v each (SlowCall 1s): breaker %v with %d failures of %d calls (the wait for a limiter slot counted as the attempt's time)", time.Duration(longest.Load()), s.State, s.Failures, s.Calls)
		}
	})
}
