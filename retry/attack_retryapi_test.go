package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// rapHint is an error carrying a server hint.
type rapHint struct {
	d     time.Duration
	inner error
}

func (e *rapHint) Error() string             { return fmt.Sprintf("hint %v", e.d) }
func (e *rapHint) RetryAfter() time.Duration { return e.d }
func (e *rapHint) Unwrap() error             { return e.inner }

// rapTemp is an error with a Temporary method.
type rapTemp struct{ t bool }

func rapTempErr(t bool) error      { return &rapTemp{t} }
func (e *rapTemp) Error() string   { return fmt.Sprintf("temp %v", e.t) }
func (e *rapTemp) Temporary() bool { return e.t }

// rapTimeout reports Timeout.
type rapTimeout struct{ t bool }

func (e rapTimeout) Error() string { return "timeout?" }
func (e rapTimeout) Timeout() bool { return e.t }

// rapMulti unwraps to several errors.
type rapMulti []error

func (m rapMulti) Error() string   { return "multi" }
func (m rapMulti) Unwrap() []error { return m }

func rapNew(t testing.TB, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

func rapBackoff(t testing.TB, base, cap time.Duration, u float64) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Base: base, Cap: cap, Rand: func() float64 { return u }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rapAsError(t *testing.T, err error) *retry.Error {
	t.Helper()
	var re *retry.Error
	if !errors.As(err, &re) {
		t.Fatalf("error %v (%T) is not a *retry.Error", err, err)
	}
	return re
}

type rapBudget struct {
	deposits, withdraws atomic.Int32
	allow               bool
}

func (b *rapBudget) Deposit()       { b.deposits.Add(1) }
func (b *rapBudget) Withdraw() bool { b.withdraws.Add(1); return b.allow }

// ---- DoValue ----

func TestAttackRetryAPIDoValueLastValueOnGiveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := rapNew(t, retry.WithMaxAttempts(3))
		v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, n int) (int, error) {
			return 10 * n, io.ErrUnexpectedEOF
		})
		re := rapAsError(t, err)
		if v != 30 || re.Reason != retry.AttemptsExhausted || re.Attempts != 3 || re.Err != io.ErrUnexpectedEOF {
			t.Fatalf("v=%d err=%v", v, err)
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(err, retry.AttemptsExhausted) {
			t.Fatal("errors.Is")
		}
		// Not retryable on attempt 1: its value comes back.
		v, err = retry.DoValue(context.Background(), p, func(ctx context.Context, n int) (int, error) {
			return 7, errors.New("plain")
		})
		re = rapAsError(t, err)
		if v != 7 || re.Reason != retry.NotRetryable || re.Attempts != 1 {
			t.Fatalf("v=%d err=%v", v, err)
		}
		if !strings.Contains(err.Error(), "to retry others, use retry.WithClassifier") {
			t.Fatalf("message lacks the hint: %q", err.Error())
		}
		// Context already ended: zero value, Attempts 0, op not called.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		called := false
		v, err = retry.DoValue(ctx, p, func(ctx context.Context, n int) (int, error) {
			called = true
			return 5, nil
		})
		re = rapAsError(t, err)
		if called || v != 0 || re.Attempts != 0 || re.Reason != retry.Canceled || !errors.Is(err, context.Canceled) || re.Err != nil {
			t.Fatalf("called=%v v=%d err=%v", called, v, err)
		}
		// Success: the successful value, nil error.
		v, err = retry.DoValue(context.Background(), p, func(ctx context.Context, n int) (int, error) {
			if n < 2 {
				return -1, io.ErrUnexpectedEOF
			}
			return 42, nil
		})
		if v != 42 || err != nil {
			t.Fatalf("v=%d err=%v", v, err)
		}
	})
}

func TestAttackRetryAPIDoValueCanceledAfterAttemptKeepsValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(context.Background())
		myCause := errors.New("my cause")
		p := rapNew(t, retry.WithBackoff(rapBackoff(t, time.Second, time.Second, 0.99)))
		done := make(chan struct{})
		var v int
		var err error
		go func() {
			defer close(done)
			v, err = retry.DoValue(ctx, p, func(ctx context.Context, n int) (int, error) {
				return 9, io.ErrUnexpectedEOF
			})
		}()
		time.Sleep(500 * time.Millisecond)
		cancel(myCause)
		<-done
		re := rapAsError(t, err)
		if v != 9 || re.Reason != retry.Canceled || re.Attempts != 1 || !errors.Is(err, context.Canceled) || !errors.Is(err, myCause) || !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("v=%d err=%v", v, err)
		}
	})
}

// ---- DoValueIf ----

func TestAttackRetryAPIDoValueIfAgainExhausted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var classified atomic.Int32
		p := rapNew(t, retry.WithMaxAttempts(4), retry.WithClassifier(func(err error) bool {
			classified.Add(1)
			return false // says no to everything: the again-attempt is retryable whatever it says
		}))
		var asked []string
		start := time.Now()
		v, err := retry.DoValueIf(context.Background(), p, func(ctx context.Context, n int) (string, error) {
			return fmt.Sprintf("pending-%d", n), nil
		}, func(s string) bool { asked = append(asked, s); return true })
		re := rapAsError(t, err)
		if v != "pending-4" || re.Reason != retry.AttemptsExhausted || re.Attempts != 4 {
			t.Fatalf("v=%q err=%v", v, err)
		}
		if re.Err == nil || re.Err.Error() != "retry: the result asked for another attempt" {
			t.Fatalf("Err = %v", re.Err)
		}
		if len(asked) != 4 {
			t.Fatalf("again asked %d times: %v", len(asked), asked)
		}
		if classified.Load() != 0 {
			t.Fatalf("classifier asked %d times about the again-error", classified.Load())
		}
		if time.Since(start) <= 0 {
			t.Fatalf("no backoff slept")
		}
		if retry.IsRetryable(err) {
			t.Fatal("a give-up is retryable")
		}
	})
}

func TestAttackRetryAPIDoValueIfAgainNotAskedOnError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := rapNew(t, retry.WithMaxAttempts(3))
		asked := 0
		v, err := retry.DoValueIf(context.Background(), p, func(ctx context.Context, n int) (int, error) {
			if n == 1 {
				return 1, io.ErrUnexpectedEOF
			}
			if n == 2 {
				return 2, nil // again: true
			}
			return 3, nil // again: false
		}, func(v int) bool { asked++; return v == 2 })
		if err != nil || v != 3 || asked != 2 {
			t.Fatalf("v=%d err=%v asked=%d", v, err, asked)
		}
		// A non-retryable error: again not asked, NotRetryable, value kept.
		asked = 0
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, n int) (int, error) {
			return 11, retry.Permanent(io.ErrUnexpectedEOF)
		}, func(v int) bool { asked++; return true })
		re := rapAsError(t, err)
		if asked != 0 || v != 11 || re.Reason != retry.NotRetryable || re.Err != io.ErrUnexpectedEOF {
			t.Fatalf("v=%d err=%v asked=%d", v, err, asked)
		}
		// nil again means DoValue.
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, n int) (int, error) {
			return 5, nil
		}, nil)
		if v != 5 || err != nil {
			t.Fatal(v, err)
		}
		// nil op
		_, err = retry.DoValueIf[int](context.Background(), p, nil, func(int) bool { return true })
		if err == nil {
			t.Fatal("nil op: no error")
		}
	})
}

func TestAttackRetryAPIDoValueIfDeadlineBudgetBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Deadline: the sleep (pinned at 0.99 s·2^0) does not fit the 500 ms left.
		p := rapNew(t, retry.WithBackoff(rapBackoff(t, time.Second, time.Second, 0.99)))
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		v, err := retry.DoValueIf(ctx, p, func(ctx context.Context, n int) (int, error) { return n, nil }, func(int) bool { return true })
		cancel()
		re := rapAsError(t, err)
		if v != 1 || re.Reason != retry.Deadline || re.Attempts != 1 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("v=%d err=%v", v, err)
		}
		if ra := retry.RetryAfter(err); ra != 990*time.Millisecond {
			t.Fatalf("RetryAfter = %v, want the refused sleep 990ms", ra)
		}

		// Budget refusal.
		b := &rapBudget{}
		p = rapNew(t, retry.WithGuards(retry.Guards{Budget: b}))
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, n int) (int, error) { return 100 + n, nil }, func(int) bool { return true })
		re = rapAsError(t, err)
		if v != 101 || re.Reason != retry.BudgetExhausted || re.Attempts != 1 || b.deposits.Load() != 1 || b.withdraws.Load() != 1 {
			t.Fatalf("v=%d err=%v dep=%d wd=%d", v, err, b.deposits.Load(), b.withdraws.Load())
		}

		// Breaker: again=true is a failure for it.
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Hour, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		p = rapNew(t, retry.WithMaxAttempts(5), retry.WithGuards(retry.Guards{Breaker: brk}))
		v, err = retry.DoValueIf(context.Background(), p, func(ctx context.Context, n int) (int, error) { return 200 + n, nil }, func(int) bool { return true })
		re = rapAsError(t, err)
		if brk.State() != breaker.Open {
			t.Fatalf("breaker %v after again-failures", brk.State())
		}
		if v != 202 || re.Reason != retry.CircuitOpen || re.Attempts != 2 || !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("v=%d err=%v", v, err)
		}
		if ra := retry.RetryAfter(err); ra <= 0 || ra > time.Hour {
			t.Fatalf("RetryAfter = %v", ra)
		}
	})
}

// rapBig is a result larger than a word or two (the padding is its size).
type rapBig struct {
	a int64
	_ [3]int64
	_ string
	p *int
}

func TestAttackRetryAPIDoValueIfAllocs(t *testing.T) {
	ctx := context.Background()
	p := rapNew(t)
	x := 3
	for _, pol := range []*retry.Policy{nil, p} {
		n := testing.AllocsPerRun(200, func() {
			_, _ = retry.DoValueIf(ctx, pol, func(ctx context.Context, n int) (rapBig, error) {
				return rapBig{a: 1, p: &x}, nil
			}, func(v rapBig) bool { return false })
		})
		if n != 0 {
			t.Errorf("DoValueIf(%p) success path: %v allocs", pol, n)
		}
		n = testing.AllocsPerRun(200, func() {
			_, _ = retry.DoValue(ctx, pol, func(ctx context.Context, n int) (*int, error) {
				return &x, nil
			})
		})
		if n != 0 {
			t.Errorf("DoValue(%p) success path: %v allocs", pol, n)
		}
		n = testing.AllocsPerRun(200, func() {
			_, _ = retry.DoValueIf(ctx, pol, func(ctx context.Context, n int) (string, error) {
				return "ok", nil
			}, func(v string) bool { return v != "ok" })
		})
		if n != 0 {
			t.Errorf("DoValueIf[string](%p) success path: %v allocs", pol, n)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = retry.IsProbe(ctx) }); n != 0 {
		t.Errorf("IsProbe: %v allocs", n)
	}
}

// ---- Plan ----

func TestAttackRetryAPIPlanNilPolicyDefaults(t *testing.T) {
	var p *retry.Policy
	next := p.Plan()
	for i := 1; i <= 2; i++ {
		s, stop := next(io.ErrUnexpectedEOF, 0)
		lim := 200 * time.Millisecond << (i - 1) // exp(n) = base·2^n
		if stop != 0 || s < 0 || s >= lim {
			t.Fatalf("retry %d: sleep %v stop %v", i, s, stop)
		}
	}
	if s, stop := next(io.ErrUnexpectedEOF, 0); stop != retry.AttemptsExhausted {
		t.Fatalf("3rd: %v %v", s, stop)
	}
	next = p.Plan()
	if _, stop := next(errors.New("plain"), 0); stop != retry.NotRetryable {
		t.Fatalf("plain: %v", stop)
	}
	next = p.Plan()
	if s, stop := next(&rapHint{d: 2 * time.Minute}, 0); stop != retry.Deadline || s != 2*time.Minute {
		t.Fatalf("hint above max: %v %v", s, stop)
	}
	next = p.Plan()
	if s, stop := next(&rapHint{d: time.Minute}, 0); stop != 0 || s < time.Minute || s >= 90*time.Second {
		t.Fatalf("hint at max: %v %v", s, stop)
	}
	// A hint that fits the deadline: never passes it.
	for i := 0; i < 200; i++ {
		next = p.Plan()
		s, stop := next(&rapHint{d: time.Second}, 1200*time.Millisecond)
		if stop != 0 || s < time.Second || s >= 1200*time.Millisecond {
			t.Fatalf("hint 1s, left 1.2s: %v %v", s, stop)
		}
	}
	// A hint at or above left: Deadline with the refused sleep.
	next = p.Plan()
	if s, stop := next(&rapHint{d: time.Second}, time.Second); stop != retry.Deadline || s < time.Second {
		t.Fatalf("hint == left: %v %v", s, stop)
	}
	// Permanent beats a hint.
	next = p.Plan()
	if _, stop := next(retry.Permanent(&rapHint{d: time.Second}), 0); stop != retry.NotRetryable {
		t.Fatalf("permanent hint: %v", stop)
	}
	// Negative left: no deadline.
	next = p.Plan()
	if _, stop := next(io.ErrUnexpectedEOF, -time.Second); stop != 0 {
		t.Fatalf("negative left: %v", stop)
	}
}

func TestAttackRetryAPIPlanMatchesDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mk := func() *retry.Policy {
			var i atomic.Int64
			us := []float64{0.1, 0.9, 0.5, 0.3, 0.7, 0.2}
			b, err := backoff.New(backoff.Config{Base: 100 * time.Millisecond, Cap: 5 * time.Second, Rand: func() float64 {
				return us[int(i.Add(1)-1)%len(us)]
			}})
			if err != nil {
				t.Fatal(err)
			}
			return rapNew(t, retry.WithMaxAttempts(6), retry.WithBackoff(b))
		}
		errs := []error{io.ErrUnexpectedEOF, &rapHint{d: 700 * time.Millisecond}, rapTempErr(true), rapTimeout{true}, io.ErrUnexpectedEOF, io.ErrUnexpectedEOF}
		// Plan's figures.
		next := mk().Plan()
		var planned []time.Duration
		var stop retry.Reason
		for i := 0; ; i++ {
			var s time.Duration
			s, stop = next(errs[i], 0)
			if stop != 0 {
				break
			}
			planned = append(planned, s)
		}
		// Do's.
		var starts []time.Time
		err := mk().Do(context.Background(), func(ctx context.Context, n int) error {
			starts = append(starts, time.Now())
			return errs[n-1]
		})
		re := rapAsError(t, err)
		if re.Reason != stop || re.Attempts != len(planned)+1 {
			t.Fatalf("Do stopped %v after %d; Plan %v after %d", re.Reason, re.Attempts, stop, len(planned)+1)
		}
		for i := range planned {
			if got := starts[i+1].Sub(starts[i]); got != planned[i] {
				t.Fatalf("sleep %d: Do %v, Plan %v (all planned %v)", i+1, got, planned[i], planned)
			}
		}
	})
}

func TestAttackRetryAPIPlanBudgetAndBreaker(t *testing.T) {
	b := &rapBudget{allow: false}
	p := rapNew(t, retry.WithGuards(retry.Guards{Budget: b}))
	next := p.Plan()
	if _, stop := next(io.ErrUnexpectedEOF, 0); stop != retry.BudgetExhausted || b.withdraws.Load() != 1 || b.deposits.Load() != 0 {
		t.Fatalf("stop %v wd %d dep %d", stop, b.withdraws.Load(), b.deposits.Load())
	}
	// Not retryable: no withdrawal.
	next = p.Plan()
	if _, stop := next(errors.New("x"), 0); stop != retry.NotRetryable || b.withdraws.Load() != 1 {
		t.Fatalf("stop %v wd %d", stop, b.withdraws.Load())
	}
	brk, _ := breaker.New(breaker.Config{OpenFor: time.Hour, MaxWaiters: -1, Rand: func() float64 { return 0.5 }})
	brk.Trip(0)
	p = rapNew(t, retry.WithGuards(retry.Guards{Breaker: brk, Budget: b}))
	next = p.Plan()
	if _, stop := next(io.ErrUnexpectedEOF, 0); stop != retry.CircuitOpen || b.withdraws.Load() != 1 {
		t.Fatalf("open breaker: stop %v wd %d", stop, b.withdraws.Load())
	}
}

// ---- IsRetryable / Permanent / RetryAfter ----

func TestAttackRetryAPIIsRetryableRules(t *testing.T) {
	ctxHint := &rapHint{d: time.Second, inner: context.Canceled}
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"perm", retry.Permanent(io.ErrUnexpectedEOF), false},
		{"perm deep", fmt.Errorf("w: %w", retry.Permanent(io.ErrUnexpectedEOF)), false},
		{"reason", retry.AttemptsExhausted, false},
		{"wrapped reason", fmt.Errorf("w: %w", retry.Deadline), false},
		{"canceled", context.Canceled, false},
		{"hint over canceled", ctxHint, false},
		{"hint", &rapHint{d: time.Second}, true},
		{"neg hint", &rapHint{d: -time.Second}, false},
		{"neg hint over pos hint", &rapHint{d: -time.Second, inner: &rapHint{d: time.Second}}, true},
		{"deadline", context.DeadlineExceeded, true},
		{"timeout true", rapTimeout{true}, true},
		{"timeout false", rapTimeout{false}, false},
		{"timeout beats temp false", rapMulti{rapTempErr(false), rapTimeout{true}}, true},
		{"eof", io.ErrUnexpectedEOF, true},
		{"plain eof", io.EOF, false},
		{"temp true", rapTempErr(true), true},
		{"temp false", rapTempErr(false), false},
		{"temp false over eof", fmt.Errorf("%w %w", rapTempErr(false), io.ErrUnexpectedEOF), true},
		{"plain", errors.New("x"), false},
		{"multi", rapMulti{errors.New("a"), io.ErrUnexpectedEOF}, true},
		{"multi with canceled", rapMulti{io.ErrUnexpectedEOF, context.Canceled}, false},
	}
	for _, c := range cases {
		if got := retry.IsRetryable(c.err); got != c.want {
			t.Errorf("%s: IsRetryable = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAttackRetryAPIPermanentContract(t *testing.T) {
	if retry.Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	inner := &rapTemp{true}
	pe := retry.Permanent(inner)
	var tp *rapTemp
	if !errors.Is(pe, inner) || !errors.As(pe, &tp) || tp != inner || pe.Error() != inner.Error() {
		t.Fatal("errors.Is/As through the mark")
	}
	var calls atomic.Int32
	p := rapNew(t, retry.WithClassifier(func(err error) bool {
		calls.Add(1)
		return true
	}))
	err := p.Do(context.Background(), func(ctx context.Context, n int) error { return pe })
	re := rapAsError(t, err)
	if re.Reason != retry.NotRetryable || re.Attempts != 1 || re.Err != inner {
		t.Fatalf("err %v, Err %#v", err, re.Err)
	}
	// Deep mark stays.
	deep := fmt.Errorf("ctx: %w", pe)
	err = p.Do(context.Background(), func(ctx context.Context, n int) error { return deep })
	re = rapAsError(t, err)
	if re.Err != deep || !errors.Is(err, inner) {
		t.Fatalf("deep: Err %v", re.Err)
	}
	// Breaker counting: the classifier judges the error inside the mark.
	brk, _ := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Hour})
	p = rapNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
	_ = p.Do(context.Background(), func(ctx context.Context, n int) error { return retry.Permanent(errors.New("404")) })
	if brk.State() != breaker.Closed {
		t.Fatal("a permanent caller error opened the breaker")
	}
	_ = p.Do(context.Background(), func(ctx context.Context, n int) error { return retry.Permanent(io.ErrUnexpectedEOF) })
	if brk.State() != breaker.Open {
		t.Fatal("a permanent transient failure did not count as a failure")
	}
}

func TestAttackRetryAPIRetryAfter(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want time.Duration
	}{
		{"nil", nil, 0},
		{"plain", errors.New("x"), 0},
		{"hint", &rapHint{d: 3 * time.Second}, 3 * time.Second},
		{"wrapped", fmt.Errorf("a: %w", fmt.Errorf("b: %w", &rapHint{d: time.Second})), time.Second},
		{"neg then pos", &rapHint{d: -time.Second, inner: &rapHint{d: 2 * time.Second}}, 2 * time.Second},
		{"zero then pos", &rapHint{d: 0, inner: &rapHint{d: 2 * time.Second}}, 2 * time.Second},
		{"multi depth first", rapMulti{fmt.Errorf("x: %w", &rapHint{d: 5 * time.Second}), &rapHint{d: time.Second}}, 5 * time.Second},
		{"multi skip none", rapMulti{errors.New("a"), &rapHint{d: time.Second}}, time.Second},
		{"through permanent", retry.Permanent(&rapHint{d: time.Second}), time.Second},
		{"huge", &rapHint{d: math.MaxInt64}, math.MaxInt64},
		{"bare reason", retry.Deadline, 0},
	}
	for _, c := range cases {
		if got := retry.RetryAfter(c.err); got != c.want {
			t.Errorf("%s: RetryAfter = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAttackRetryAPIHugeHintNeverSleeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, max := range []time.Duration{time.Minute, math.MaxInt64} {
			p := rapNew(t, retry.WithMaxRetryAfter(max))
			start := time.Now()
			n := 0
			h := &rapHint{d: math.MaxInt64}
			v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, a int) (int, error) {
				n++
				return a, h
			})
			re := rapAsError(t, err)
			if time.Since(start) != 0 || n != 1 || v != 1 || re.Reason != retry.Deadline || re.Err != h || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("max %v: slept %v n=%d err=%v", max, time.Since(start), n, err)
			}
			if ra := retry.RetryAfter(err); ra != math.MaxInt64 {
				t.Fatalf("RetryAfter = %v", ra)
			}
			if !strings.Contains(err.Error(), "above the policy's maximum") {
				t.Fatalf("message %q", err.Error())
			}
		}
	})
}

// ---- Error ----

func TestAttackRetryAPIErrorUnwrapAndMessage(t *testing.T) {
	e := &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: io.ErrUnexpectedEOF}
	if got := e.Error(); got != "retry: attempts exhausted after 3 attempts: unexpected EOF" {
		t.Fatalf("Error() = %q", got)
	}
	u := e.Unwrap()
	if len(u) != 2 || u[0] != retry.AttemptsExhausted || u[1] != io.ErrUnexpectedEOF {
		t.Fatalf("Unwrap = %v", u)
	}
	e = &retry.Error{Reason: retry.Deadline, Attempts: 1, Err: io.EOF}
	if !errors.Is(e, context.DeadlineExceeded) || !errors.Is(e, retry.Deadline) || errors.Is(e, context.Canceled) {
		t.Fatal("Deadline Is")
	}
	e = &retry.Error{Reason: retry.Canceled}
	if !errors.Is(e, context.Canceled) || errors.Is(e, context.DeadlineExceeded) {
		t.Fatal("Canceled Is")
	}
	if got := (&retry.Error{Reason: 0, Attempts: 0}).Error(); got != "retry: Reason(0) after 0 attempts" {
		t.Fatalf("zero: %q", got)
	}
	for r, w := range map[retry.Reason]string{retry.NotRetryable: "retry: not retryable", retry.AttemptsExhausted: "retry: attempts exhausted",
		retry.Deadline: "retry: deadline", retry.Canceled: "retry: canceled", retry.BudgetExhausted: "retry: budget exhausted",
		retry.CircuitOpen: "retry: circuit open", retry.Limited: "retry: limited", 99: "retry: Reason(99)"} {
		if r.Error() != w {
			t.Errorf("%d: %q", r, r.Error())
		}
	}
	// A nested give-up is not retried.
	synctest.Test(t, func(t *testing.T) {
		p := rapNew(t)
		inner := &retry.Error{Reason: retry.AttemptsExhausted, Attempts: 3, Err: io.ErrUnexpectedEOF}
		n := 0
		err := p.Do(context.Background(), func(ctx context.Context, a int) error { n++; return fmt.Errorf("w: %w", inner) })
		re := rapAsError(t, err)
		if n != 1 || re.Reason != retry.NotRetryable || strings.Contains(err.Error(), "WithClassifier") {
			t.Fatalf("n=%d err=%v", n, err)
		}
	})
}

// The NotRetryable give-up's advice names only the default classifier.
func TestAttackRetryAPIClassifierHintOnlyDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := rapNew(t, retry.WithName("payments"), retry.WithClassifier(func(err error) bool { return false }))
		err := p.Do(context.Background(), func(ctx context.Context, a int) error { return errors.New("plain") })
		if strings.Contains(err.Error(), "WithClassifier") {
			t.Fatalf("custom classifier: message %q", err.Error())
		}
		p = rapNew(t, retry.WithName("payments"))
		err = p.Do(context.Background(), func(ctx context.Context, a int) error { return errors.New("plain") })
		if !strings.Contains(err.Error(), "WithClassifier") {
			t.Fatalf("default classifier with name: message %q", err.Error())
		}
		// Temporary() false matched rule 5: no advice.
		err = p.Do(context.Background(), func(ctx context.Context, a int) error { return rapTempErr(false) })
		if strings.Contains(err.Error(), "WithClassifier") {
			t.Fatalf("temp false: message %q", err.Error())
		}
	})
}

func TestAttackRetryAPIIsProbe(t *testing.T) {
	//lint:ignore SA1012 nil on purpose
	if retry.IsProbe(nil) || retry.IsProbe(context.Background()) {
		t.Fatal("IsProbe of a plain context")
	}
	synctest.Test(t, func(t *testing.T) {
		p := rapNew(t)
		err := p.Do(context.Background(), func(ctx context.Context, a int) error {
			if retry.IsProbe(ctx) {
				t.Error("probe without a breaker")
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
}

// rapWithin is a fleet budget whose withdrawal takes wait.
type rapWithin struct {
	wait  time.Duration
	lefts []time.Duration
}

func (b *rapWithin) Deposit()       {}
func (b *rapWithin) Withdraw() bool { panic("Withdraw called on a WithdrawWithin budget") }
func (b *rapWithin) WithdrawWithin(left time.Duration) bool {
	b.lefts = append(b.lefts, left)
	time.Sleep(b.wait)
	return true
}

func TestAttackRetryAPIPlanWithdrawWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &rapWithin{wait: 300 * time.Millisecond}
		p := rapNew(t, retry.WithBackoff(rapBackoff(t, time.Second, time.Second, 0.8)), retry.WithGuards(retry.Guards{Budget: b}))
		next := p.Plan()
		s, stop := next(io.ErrUnexpectedEOF, time.Second)
		if stop != retry.Deadline || s != 800*time.Millisecond {
			t.Fatalf("plan: %v %v", s, stop)
		}
		next = p.Plan()
		s, stop = next(io.ErrUnexpectedEOF, 2*time.Second)
		if stop != 0 || s != 800*time.Millisecond {
			t.Fatalf("plan fits: %v %v", s, stop)
		}
		next = p.Plan()
		s, stop = next(io.ErrUnexpectedEOF, 0)
		if stop != 0 || s != 800*time.Millisecond {
			t.Fatalf("plan no deadline: %v %v", s, stop)
		}
		if b.lefts[2] != 0 {
			t.Fatalf("left passed for no deadline: %v", b.lefts)
		}
		// Do agrees.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := p.Do(ctx, func(ctx context.Context, a int) error { return io.ErrUnexpectedEOF })
		re := rapAsError(t, err)
		if re.Reason != retry.Deadline || re.Attempts != 1 || retry.RetryAfter(err) != 800*time.Millisecond {
			t.Fatalf("Do: %v (RetryAfter %v)", err, retry.RetryAfter(err))
		}
	})
}

// A nested give-up: errors.Is reports the inner loop's reason too.
func TestAttackRetryAPINestedReasonsIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := rapNew(t, retry.WithMaxAttempts(2))
		outer := rapNew(t, retry.WithMaxAttempts(3))
		n := 0
		err := outer.Do(context.Background(), func(ctx context.Context, a int) error {
			return inner.Do(ctx, func(ctx context.Context, a int) error { n++; return io.ErrUnexpectedEOF })
		})
		re := rapAsError(t, err)
		if n != 2 || re.Reason != retry.NotRetryable {
			t.Fatalf("n=%d err=%v", n, err)
		}
		t.Logf("outer NotRetryable; errors.Is(err, AttemptsExhausted) = %v; RetryAfter=%v", errors.Is(err, retry.AttemptsExhausted), retry.RetryAfter(err))
	})
}

func TestAttackRetryAPIConnErrnosRetryable(t *testing.T) {
	for _, e := range []error{syscall.ECONNRESET, syscall.ECONNREFUSED, syscall.ECONNABORTED, syscall.EPIPE, net.ErrClosed,
		&net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, os.ErrDeadlineExceeded} {
		if !retry.IsRetryable(e) {
			t.Errorf("%v not retryable", e)
		}
	}
	if retry.IsRetryable(syscall.ENOENT) {
		t.Error("ENOENT retryable")
	}
}

type rapObs struct{ evs []observe.Event }

func (o *rapObs) Observe(ctx context.Context, e observe.Event) { o.evs = append(o.evs, e) }

func TestAttackRetryAPIObserverNameAndGiveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := &rapObs{}
		p := rapNew(t, retry.WithName("payments"), retry.WithObserver(o), retry.WithMaxAttempts(2),
			retry.WithBackoff(rapBackoff(t, time.Second, time.Second, 0.5)))
		v, err := retry.DoValueIf(context.Background(), p, func(ctx context.Context, a int) (int, error) { return a, nil }, func(int) bool { return true })
		re := rapAsError(t, err)
		if v != 2 || re.Reason != retry.AttemptsExhausted {
			t.Fatal(v, err)
		}
		var last observe.Event
		for _, e := range o.evs {
			if e.Name != "payments" {
				t.Errorf("event %v without name: %q", e.Kind, e.Name)
			}
			if e.Kind == observe.AttemptEnd && e.Outcome != "failure" {
				t.Errorf("again attempt outcome %q", e.Outcome)
			}
			last = e
		}
		if last.Kind != observe.GiveUp || last.Reason != "attempts-exhausted" || last.Attempt != 2 {
			t.Fatalf("last event %+v", last)
		}
	})
}

func TestAttackRetryAPIProbeMarkAndAllocsGuarded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1, Rand: func() float64 { return 0.5 }})
		brk.Trip(0)
		p := rapNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var probes []bool
		v, err := retry.DoValueIf(ctx, p, func(ctx context.Context, a int) (int, error) {
			probes = append(probes, retry.IsProbe(ctx))
			return a, nil
		}, func(v int) bool { return v < 2 })
		if err != nil || v != 2 {
			t.Fatalf("v=%d err=%v probes=%v", v, err, probes)
		}
		if !probes[0] {
			t.Fatalf("first attempt after the wait not a probe: %v", probes)
		}
		t.Logf("probes %v, breaker %v", probes, brk.State())
	})
	brk, _ := breaker.New(breaker.Config{})
	p := rapNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
	ctx := context.Background()
	if n := testing.AllocsPerRun(200, func() {
		_, _ = retry.DoValueIf(ctx, p, func(ctx context.Context, a int) (string, error) { return "x", nil }, func(s string) bool { return false })
	}); n != 0 {
		t.Errorf("guarded DoValueIf success: %v allocs", n)
	}
}

func TestAttackRetryAPIHintSpreadInDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, u := range []float64{0, 0.5, 0.999} {
			p := rapNew(t, retry.WithMaxAttempts(2), retry.WithBackoff(rapBackoff(t, 10*time.Millisecond, 10*time.Millisecond, u)))
			var starts []time.Time
			_ = p.Do(context.Background(), func(ctx context.Context, a int) error {
				starts = append(starts, time.Now())
				return &rapHint{d: 2 * time.Second}
			})
			got := starts[1].Sub(starts[0])
			want := 2*time.Second + time.Duration(u*float64(time.Second))
			if got != want {
				t.Errorf("u=%v: slept %v, want %v", u, got, want)
			}
		}
		// Backoff longer than the hint: the backoff's delay.
		p := rapNew(t, retry.WithMaxAttempts(2), retry.WithBackoff(rapBackoff(t, 5*time.Second, 5*time.Second, 0.9)))
		var starts []time.Time
		_ = p.Do(context.Background(), func(ctx context.Context, a int) error {
			starts = append(starts, time.Now())
			return &rapHint{d: time.Second}
		})
		if got := starts[1].Sub(starts[0]); got != 4500*time.Millisecond {
			t.Errorf("backoff over hint: slept %v", got)
		}
	})
}
