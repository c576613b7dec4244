package retry_test

// Black-box checks of README.md's promises about package retry, through the
// public API, on testing/synctest's fake clock.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

type rdmHint time.Duration

func (h rdmHint) Error() string             { return "server busy" }
func (h rdmHint) RetryAfter() time.Duration { return time.Duration(h) }
func (h rdmHint) String() string            { return fmt.Sprint(time.Duration(h)) }

type rdmTemp bool

func (t rdmTemp) Error() string   { return "temp" }
func (t rdmTemp) Temporary() bool { return bool(t) }

// README: "Plain errors are not retried. The loop retries timeouts, broken
// connections, errors that carry a server hint (RetryAfter() time.Duration)
// or say Temporary() bool. Mark your own with retry.Permanent, or pass
// retry.WithClassifier"; "a plain error is not retried, and the message names
// retry.WithClassifier"; "it caps attempts per request (3)".
func TestAttackReadmeClassifierAndDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, err := retry.New()
		if err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			err  error
			want int
		}{
			{"plain", errors.New("boom"), 1},
			{"fmt wrapped plain", fmt.Errorf("x: %w", errors.New("boom")), 1},
			{"timeout", context.DeadlineExceeded, 3},
			{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), 3},
			{"refused", syscall.ECONNREFUSED, 3},
			{"unexpected EOF", io.ErrUnexpectedEOF, 3},
			{"hint", rdmHint(10 * time.Millisecond), 3},
			{"temporary true", rdmTemp(true), 3},
			{"temporary false", rdmTemp(false), 1},
			{"permanent reset", retry.Permanent(syscall.ECONNRESET), 1},
			{"canceled", context.Canceled, 1},
		}
		for _, c := range cases {
			n := 0
			err := p.Do(context.Background(), func(context.Context, int) error { n++; return c.err })
			if n != c.want {
				t.Errorf("%s: %d attempts, want %d", c.name, n, c.want)
			}
			if err == nil {
				t.Errorf("%s: nil error", c.name)
			}
			if c.name == "plain" && !strings.Contains(err.Error(), "retry.WithClassifier") {
				t.Errorf("plain error message %q does not name retry.WithClassifier", err)
			}
			if c.want == 3 && !errors.Is(err, retry.AttemptsExhausted) {
				t.Errorf("%s: %v, want AttemptsExhausted", c.name, err)
			}
			if c.want == 3 && !errors.Is(err, c.err) {
				t.Errorf("%s: %v does not wrap the last error", c.name, err)
			}
		}
		// WithClassifier retries a plain error.
		p2, _ := retry.New(retry.WithClassifier(func(error) bool { return true }))
		n := 0
		p2.Do(context.Background(), func(context.Context, int) error { n++; return errors.New("boom") })
		if n != 3 {
			t.Errorf("WithClassifier(always): %d attempts, want 3", n)
		}
	})
}

// README: "Retry-After is a floor, spread above: a hint of 2 s sleeps 2 to 3
// s ... Hints above 1 minute (retry.WithMaxRetryAfter) give up."
func TestAttackReadmeHintFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithMaxAttempts(2))
		var lo, hi time.Duration = time.Hour, 0
		for i := 0; i < 200; i++ {
			var first time.Time
			p.Do(context.Background(), func(_ context.Context, a int) error {
				if a == 1 {
					first = time.Now()
				} else {
					d := time.Since(first)
					lo, hi = min(lo, d), max(hi, d)
				}
				return rdmHint(2 * time.Second)
			})
		}
		if lo < 2*time.Second || hi >= 3*time.Second || hi-lo < time.Second/4 {
			t.Errorf("sleeps after a 2 s hint from %v to %v, want spread over [2 s, 3 s)", lo, hi)
		}
		n := 0
		start := time.Now()
		err := p.Do(context.Background(), func(context.Context, int) error { n++; return rdmHint(61 * time.Second) })
		if n != 1 || time.Since(start) != 0 || !errors.Is(err, retry.Deadline) {
			t.Errorf("61 s hint: %d attempts, %v, err %v; want a give-up at once (Deadline)", n, time.Since(start), err)
		}
		if retry.RetryAfter(err) != 61*time.Second {
			t.Errorf("RetryAfter of the give-up = %v, want 61s", retry.RetryAfter(err))
		}
	})
}

// README: "One deadline, the context's, covers attempts and sleeps; a sleep
// that would end past it is never started."
func TestAttackReadmeDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, _ := retry.New(retry.WithMaxAttempts(10))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		n := 0
		err := p.Do(ctx, func(context.Context, int) error { n++; return rdmHint(2 * time.Second) })
		el := time.Since(start)
		if el >= 5*time.Second {
			t.Errorf("took %v, at or past the 5 s deadline", el)
		}
		if !errors.Is(err, retry.Deadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err %v, want Deadline", err)
		}
		if n < 2 || n > 3 {
			t.Errorf("%d attempts in 5 s with 2-3 s sleeps, want 2 or 3", n)
		}
	})
}

// README: "budget: retries stay below 10% of requests (plus a floor) ...; a
// refused retry ends the call with its last real error."
func TestAttackReadmeBudgetRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := budget.New(budget.Config{})
		if err != nil {
			t.Fatal(err)
		}
		bo, _ := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond})
		p, _ := retry.New(retry.WithGuards(retry.Guards{Budget: b}), retry.WithBackoff(bo))
		start := time.Now()
		retries, calls := 0, 0
		var last error
		for i := 0; i < 500; i++ {
			err := p.Do(context.Background(), func(_ context.Context, a int) error {
				if a > 1 {
					retries++
				}
				return fmt.Errorf("call %d: %w", i, io.ErrUnexpectedEOF)
			})
			calls++
			if errors.Is(err, retry.BudgetExhausted) {
				last = err
			}
			time.Sleep(10 * time.Millisecond) // 500 calls over 5 s
		}
		if el := time.Since(start); el >= 9*time.Second {
			t.Fatalf("took %v: more than one budget window", el)
		}
		if limit := calls/10 + 10; retries > limit {
			t.Errorf("%d retries for %d calls, want at most %d", retries, calls, limit)
		}
		var re *retry.Error
		if last == nil || !errors.As(last, &re) || !errors.Is(re.Err, io.ErrUnexpectedEOF) {
			t.Errorf("budget refusal %v: want the last real error", last)
		}
	})
}

// README: "Config structs take defaults for zero fields
// (breaker.Config{OpenFor: 5 * time.Second} changes only that)".
func TestAttackReadmeConfigDefaults(t *testing.T) {
	b0, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b5, err := breaker.New(breaker.Config{OpenFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c0, c5 := b0.Config(), b5.Config()
	if c5.OpenFor != 5*time.Second {
		t.Errorf("OpenFor %v", c5.OpenFor)
	}
	c5.OpenFor = c0.OpenFor
	if fmt.Sprintf("%+v", c0) != fmt.Sprintf("%+v", c5) {
		t.Errorf("OpenFor changed more than itself:\n%+v\n%+v", c0, c5)
	}
	if c0.FailureRatio != 0.5 || c0.MinCalls != 20 || c0.Window != 10*time.Second || c0.Probes != 3 || c0.OpenFor != time.Second || c0.MaxWaiters != 10000 {
		t.Errorf("breaker defaults %+v, want 50%% of at least 20 calls over 10 s, 3 probes every 1 s, 10,000 waiters", c0)
	}
	bc := (&budget.Budget{}).Config()
	if bc.Ratio != 0.1 || bc.MinPerSecond != 1 || bc.Window != 10*time.Second {
		t.Errorf("budget defaults %+v, want 10%%, 1/s, 10 s", bc)
	}
}

// README: "The success path allocates nothing".
func TestAttackReadmeSuccessPathAllocs(t *testing.T) {
	b, _ := budget.New(budget.Config{})
	br, _ := breaker.New(breaker.Config{})
	for _, p := range []*retry.Policy{
		func() *retry.Policy { p, _ := retry.New(); return p }(),
		func() *retry.Policy {
			p, _ := retry.New(retry.WithGuards(retry.Guards{Budget: b, Breaker: br}))
			return p
		}(),
	} {
		op := func(context.Context, int) error { return nil }
		ctx := context.Background()
		if a := testing.AllocsPerRun(1000, func() { _ = p.Do(ctx, op) }); a != 0 {
			t.Errorf("Do success path: %v allocs, want 0", a)
		}
	}
}
