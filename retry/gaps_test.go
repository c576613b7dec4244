package retry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// TestNotRetryableNamesTheWay: a plain error stops the loop at once (the
// safe default) and the message says so and names retry.WithClassifier; an
// error that speaks for itself, or a classifier of the caller's, gets the
// plain message.
func TestNotRetryableNamesTheWay(t *testing.T) {
	plain := errors.New("boom")
	tests := []struct {
		name     string
		opts     []retry.Option
		err      error
		wantHint bool
	}{
		{"errors.New", nil, plain, true},
		{"fmt.Errorf wrapping a plain error", nil, fmt.Errorf("fetch: %w", plain), true},
		{"says it is not temporary", nil, err404, false},
		{"marked Permanent", nil, retry.Permanent(plain), false},
		{"canceled by the operation", nil, context.Canceled, false},
		{"the caller's classifier", []retry.Option{retry.WithClassifier(func(error) bool { return false })}, plain, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, append([]retry.Option{retry.WithMaxAttempts(5)}, tt.opts...)...)
			calls := 0
			err := p.Do(context.Background(), func(context.Context, int) error { calls++; return tt.err })
			if calls != 1 || !errors.Is(err, retry.NotRetryable) {
				t.Fatalf("Do = %v after %d calls, want NotRetryable after 1", err, calls)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, "retry: not retryable after 1 attempt") {
				t.Errorf("message %q does not start with the reason", msg)
			}
			if got := strings.Contains(msg, "retry.WithClassifier"); got != tt.wantHint {
				t.Errorf("message %q names retry.WithClassifier: %v, want %v", msg, got, tt.wantHint)
			}
			if !strings.HasSuffix(msg, ": "+tt.err.Error()) {
				t.Errorf("message %q does not end with the error %q", msg, tt.err)
			}
		})
	}
}

// pending is a job status: the operation's value says whether to ask again.
type pending struct {
	state string
}

func TestDoValueIf(t *testing.T) {
	notDone := func(p pending) bool { return p.state != "done" }
	boom := errors.New("boom")
	tests := []struct {
		name      string
		script    []pending
		errs      []error // per attempt; nil entries are successes
		again     func(pending) bool
		want      pending
		wantCalls int
		reason    retry.Reason // 0: success
	}{
		{"first value is good", []pending{{"done"}}, nil, notDone, pending{"done"}, 1, 0},
		{"retried until done", []pending{{"queued"}, {"running"}, {"done"}}, nil, notDone, pending{"done"}, 3, 0},
		{"attempts run out: the last value comes back", []pending{{"queued"}, {"running"}, {"running"}, {"done"}}, nil, notDone, pending{"running"}, 3, retry.AttemptsExhausted},
		{"nil predicate is DoValue", []pending{{"queued"}}, nil, nil, pending{"queued"}, 1, 0},
		{"an error is judged as DoValue judges it", []pending{{"queued"}}, []error{boom}, notDone, pending{"queued"}, 1, retry.NotRetryable},
		{"a value then a retryable error then done", []pending{{"queued"}, {}, {"done"}}, []error{nil, err503, nil}, notDone, pending{"done"}, 3, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustNew(t, retry.WithMaxAttempts(3), retry.WithBackoff(mustBackoff(t, backoff.Constant, time.Nanosecond, time.Nanosecond, 0)))
			calls := 0
			v, err := retry.DoValueIf(context.Background(), p, func(ctx context.Context, attempt int) (pending, error) {
				calls++
				var e error
				if attempt <= len(tt.errs) {
					e = tt.errs[attempt-1]
				}
				return tt.script[attempt-1], e
			}, tt.again)
			if v != tt.want || calls != tt.wantCalls {
				t.Errorf("DoValueIf = %v after %d calls, want %v after %d", v, calls, tt.want, tt.wantCalls)
			}
			switch {
			case tt.reason == 0 && err != nil:
				t.Errorf("error %v, want nil", err)
			case tt.reason != 0 && !errors.Is(err, tt.reason):
				t.Errorf("error %v, want reason %v", err, tt.reason)
			}
			if tt.reason == retry.AttemptsExhausted && !strings.Contains(err.Error(), "the result asked for another attempt") {
				t.Errorf("error %q does not say the result asked for another attempt", err)
			}
		})
	}
}

// TestDoValueIfBreaker: a value that asks for another attempt is a failure
// for the breaker, and retried whatever the classifier says.
func TestDoValueIfBreaker(t *testing.T) {
	brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 2})
	if err != nil {
		t.Fatal(err)
	}
	never := retry.WithClassifier(func(error) bool { return false })
	p := mustNew(t, retry.WithMaxAttempts(2), never, retry.WithGuards(retry.Guards{Breaker: brk}),
		retry.WithBackoff(mustBackoff(t, backoff.Constant, time.Nanosecond, time.Nanosecond, 0)))
	calls := 0
	_, err = retry.DoValueIf(context.Background(), p, func(context.Context, int) (int, error) { calls++; return 0, nil },
		func(v int) bool { return v == 0 })
	if calls != 2 || !errors.Is(err, retry.AttemptsExhausted) {
		t.Fatalf("DoValueIf = %v after %d calls, want AttemptsExhausted after 2", err, calls)
	}
	if s := brk.State(); s != breaker.Open {
		t.Errorf("breaker %v after 2 values that asked again, want open (2 failures in a row)", s)
	}
}

func TestDoValueIfAllocs(t *testing.T) {
	p := mustNew(t)
	ctx := context.Background()
	op := func(context.Context, int) (int, error) { return 1, nil }
	again := func(v int) bool { return v != 1 }
	if n := testing.AllocsPerRun(1000, func() { _, _ = retry.DoValueIf(ctx, p, op, again) }); n != 0 {
		t.Errorf("DoValueIf success: %v allocs, want 0 (as DoValue)", n)
	}
}

// tokens is a tiny limiter: Wait takes a token, waiting 1/rate per token
// after the first burst ones (on the bubble's clock), and refuses a wait
// that would end past the context's deadline, as x/time/rate does.
type tokens struct {
	mu    sync.Mutex
	next  time.Time
	every time.Duration
	waits atomic.Int64
}

var errTooLate = errors.New("tokens: wait would exceed context deadline")

func (l *tokens) Wait(ctx context.Context) error {
	l.waits.Add(1)
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) {
		at = now
	}
	if dl, ok := ctx.Deadline(); ok && at.After(dl) {
		l.mu.Unlock()
		return errTooLate
	}
	l.next = at.Add(l.every)
	l.mu.Unlock()
	t := time.NewTimer(at.Sub(now))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TestRateLimit: every attempt, the first included, waits for the
// limiter; the waits count against the deadline; a refusal stops the call
// with Reason Deadline and the limiter's error; a cancel ends the wait.
func TestRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := &tokens{every: 100 * time.Millisecond}
		p := mustNew(t, retry.WithMaxAttempts(3), retry.WithRateLimit(lim),
			retry.WithBackoff(mustBackoff(t, backoff.Constant, time.Millisecond, time.Millisecond, 0)))
		start := time.Now()
		calls := 0
		err := p.Do(context.Background(), func(context.Context, int) error {
			calls++
			if calls < 3 {
				return err503
			}
			return nil
		})
		if err != nil || calls != 3 || lim.waits.Load() != 3 {
			t.Fatalf("Do = %v after %d calls and %d waits, want nil after 3 and 3", err, calls, lim.waits.Load())
		}
		// Tokens at 0, 100 ms and 200 ms: the 1 ms sleeps are inside them.
		if took := time.Since(start); took != 200*time.Millisecond {
			t.Errorf("3 attempts took %v, want 200ms (paced by the limiter)", took)
		}

		// Ten calls at once through a limiter of one per 100 ms, each with
		// 450 ms: five go (0, 100, ..., 400 ms), five are refused at once.
		lim = &tokens{every: 100 * time.Millisecond}
		p = mustNew(t, retry.WithMaxAttempts(1), retry.WithRateLimit(lim))
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 450*time.Millisecond)
				defer cancel()
				err := p.Do(ctx, func(context.Context, int) error { return nil })
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, retry.Deadline) && errors.Is(err, errTooLate) && errors.Is(err, context.DeadlineExceeded):
					if re := asError(t, err); re.Attempts != 0 || re.Err != nil {
						t.Errorf("refused: %+v, want 0 attempts and no operation error", re)
					}
					refused.Add(1)
				default:
					t.Errorf("Do = %v", err)
				}
			})
		}
		wg.Wait()
		if ok.Load() != 5 || refused.Load() != 5 {
			t.Errorf("%d calls went, %d refused; want 5 and 5", ok.Load(), refused.Load())
		}

		// A cancel during the wait ends it: Reason Canceled, nothing sent.
		lim = &tokens{every: time.Hour}
		p = mustNew(t, retry.WithRateLimit(lim))
		_ = p.Do(context.Background(), func(context.Context, int) error { return nil }) // takes the first token
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		calls = 0
		err = p.Do(ctx, func(context.Context, int) error { calls++; return nil })
		if !errors.Is(err, retry.Canceled) || calls != 0 {
			t.Errorf("Do canceled during the wait = %v after %d calls, want Canceled after 0", err, calls)
		}
	})
}

// TestRateLimitNil: WithRateLimit(nil) is no limit.
func TestRateLimitNil(t *testing.T) {
	p := mustNew(t, retry.WithRateLimit(nil))
	if err := p.Do(context.Background(), func(context.Context, int) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
