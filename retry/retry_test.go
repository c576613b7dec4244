package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// TestReferenceScenario: a 503 asking for 1500 ms, a plain 503, then
// success, with the backoff of the reference table in docs/backoff.md (full
// jitter, base 100 ms, cap 10 s, U pinned at 0.5). Retry 1 computes
// 0.5 × 200 ms = 100 ms, but the server's hint is a floor, spread above it
// by U·hint/2: 1.5 s + 0.5 × 750 ms. Retry 2 sleeps 0.5 × 400 ms = 200 ms. A
// 404 is not retried at all.
func TestReferenceScenario(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tl := newTimeline()
		p := mustNew(t, retry.WithObserver(tl), retry.WithMaxAttempts(5),
			retry.WithBackoff(mustBackoff(t, backoff.FullJitter, 100*time.Millisecond, 10*time.Second, 0.5)))
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		calls := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			calls++
			if attempt != calls {
				t.Errorf("attempt = %d on call %d", attempt, calls)
			}
			return []error{&statusErr{Code: 503, After: 1500 * time.Millisecond}, err503, nil}[attempt-1]
		})
		if err != nil || calls != 3 {
			t.Fatalf("Do = %v after %d calls, want nil after 3", err, calls)
		}
		if got, want := tl.Sleeps(), []time.Duration{1875 * time.Millisecond, 200 * time.Millisecond}; !slices.Equal(got, want) {
			t.Errorf("sleeps = %v, want %v", got, want)
		}

		calls = 0
		err = p.Do(ctx, func(ctx context.Context, attempt int) error {
			calls++
			return err404
		})
		if calls != 1 {
			t.Errorf("404: %d calls, want 1", calls)
		}
		re := checkStop(t, err, retry.NotRetryable, 1)
		if re.Err != err404 || !errors.Is(err, err404) {
			t.Errorf("404: Err = %v, want the 404 error itself", re.Err)
		}
	})
}

func TestSuccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, failures := range []int{0, 1, 2} {
			clock := newTimeline()
			p := mustNew(t, retry.WithObserver(clock), retry.WithBackoff(mustBackoff(t, backoff.FullJitter, time.Millisecond, time.Millisecond, 0)))
			calls := 0
			err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				calls++
				if calls <= failures {
					return err503
				}
				return nil
			})
			if err != nil || calls != failures+1 {
				t.Errorf("Do with %d failures = %v after %d calls, want nil after %d", failures, err, calls, failures+1)
			}
			if n := len(clock.Sleeps()); n != failures {
				t.Errorf("Do with %d failures slept %d times", failures, n)
			}
		}
	})
}

func TestMaxAttemptsCountsTheFirst(t *testing.T) {
	tests := []struct {
		name string
		opts []retry.Option
		want int
	}{
		{"default", nil, 3},
		{"1 means no retry", []retry.Option{retry.WithMaxAttempts(1)}, 1},
		{"5", []retry.Option{retry.WithMaxAttempts(5)}, 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newTimeline()
				p := mustNew(t, append(tt.opts, retry.WithObserver(clock), retry.WithBackoff(mustBackoff(t, backoff.FullJitter, time.Millisecond, time.Millisecond, 0)))...)
				calls := 0
				err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
					calls++
					return err503
				})
				if calls != tt.want {
					t.Errorf("calls = %d, want %d", calls, tt.want)
				}
				checkStop(t, err, retry.AttemptsExhausted, tt.want)
				if !errors.Is(err, err503) {
					t.Errorf("errors.Is(%v, 503) = false", err)
				}
				if n := len(clock.Sleeps()); n != tt.want-1 {
					t.Errorf("slept %d times, want %d", n, tt.want-1)
				}
			})
		})
	}
}

// TestLoopFollowsIsRetryable: with the default classifier the loop retries
// what IsRetryable calls transient (a hint, a timeout, a broken connection,
// an error that says it is Temporary) and nothing else, and the last error
// stays reachable with errors.As through any wrapping.
func TestLoopFollowsIsRetryable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tests := []struct {
			name  string
			err   error
			calls int
		}{
			{"temporary", fmt.Errorf("call: %w", &statusErr{Code: 503}), 3},
			{"not temporary", fmt.Errorf("call: %w", &statusErr{Code: 404}), 1},
			{"hint without Temporary", fmt.Errorf("call: %w", hintErr(time.Second)), 3},
			{"timeout", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), 3},
			{"dropped connection", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), 3},
			{"closed connection", fmt.Errorf("write: %w", net.ErrClosed), 3},
			{"plain error", errors.New("bad input"), 1},
			{"canceled attempt", fmt.Errorf("query: %w", context.Canceled), 1},
		}
		p := mustNew(t, retry.WithBackoff(mustBackoff(t, backoff.FullJitter, time.Millisecond, time.Millisecond, 0)))
		for _, tt := range tests {
			calls := 0
			err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				calls++
				return tt.err
			})
			if calls != tt.calls {
				t.Errorf("%s: %d calls, want %d", tt.name, calls, tt.calls)
			}
			if re := asError(t, err); re.Err != tt.err {
				t.Errorf("%s: Err = %v, want the last error %v", tt.name, re.Err, tt.err)
			}
		}
		var se *statusErr
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			return fmt.Errorf("call: %w", &statusErr{Code: 502})
		})
		if !errors.As(err, &se) || se.Code != 502 {
			t.Errorf("errors.As(%v, *statusErr) does not find the 502", err)
		}
	})
}

func TestPermanent(t *testing.T) {
	p := mustNew(t)
	calls := 0
	err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		calls++
		return retry.Permanent(err503)
	})
	if calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
	re := checkStop(t, err, retry.NotRetryable, 1)
	if re.Err != err503 {
		t.Errorf("Err = %#v, want the unmarked 503", re.Err)
	}
	if retry.Permanent(nil) != nil {
		t.Error("Permanent(nil) != nil")
	}
	// A mark wrapped deeper still stops the loop, and stays in the chain.
	calls = 0
	wrapped := fmt.Errorf("x: %w", retry.Permanent(io.ErrUnexpectedEOF))
	err = p.Do(context.Background(), script(&calls, wrapped))
	if re := checkStop(t, err, retry.NotRetryable, 1); calls != 1 || re.Err != wrapped || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("Do = %v after %d calls, want the wrapped mark after 1", err, calls)
	}
}

func TestRetryAfterIsAFloor(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name    string
		s       backoff.Strategy
		u       float64
		timeout time.Duration   // the call's deadline; 0: none
		hints   []time.Duration // hint of attempt i's error
		want    []time.Duration
	}{
		// Full jitter 0.5: computed delays 100 ms, 200 ms. The hint is
		// spread above itself: hint + U·hint/2, never below the hint.
		{"hint + U·hint/2", backoff.FullJitter, 0.5, 0,
			[]time.Duration{300 * ms, 0}, []time.Duration{375 * ms, 200 * ms}},
		// Jitter near 0 would sleep ~0; the hint still holds, and U 0
		// sleeps exactly the hint.
		{"U 0 sleeps the hint itself", backoff.FullJitter, 0, 0,
			[]time.Duration{time.Second, time.Second}, []time.Duration{time.Second, time.Second}},
		{"shorter hint does not lengthen the delay", backoff.FullJitter, 0.5, 0,
			[]time.Duration{50 * ms, 0}, []time.Duration{100 * ms, 200 * ms}},
		// Decorrelated 0.5: 100+0.5*(300-100) = 200 ms, below the 1 s hint,
		// then from prev=200 ms (the computed delay, not the hint):
		// 100+0.5*(600-100) = 350 ms.
		{"decorrelated prev is the computed delay", backoff.Decorrelated, 0.5, 0,
			[]time.Duration{time.Second, 0}, []time.Duration{1250 * ms, 350 * ms}},
		// 2.2 s left after the attempt: the spread is cut to end before the
		// deadline: 2 s + 0.5·(200 ms − 1 ns).
		{"never past the deadline", backoff.FullJitter, 0.5, 2200 * ms,
			[]time.Duration{2 * time.Second}, []time.Duration{2*time.Second + 100*ms - 1}},
		// U at its largest, 1 − 2⁻⁵³: (1 − 2⁻⁵³)·(200 ms − 1 ns) truncates to
		// 200 ms − 2 ns, and the sleep ends before the deadline.
		{"U near 1 still ends before the deadline", backoff.FullJitter, 1, 2200 * ms,
			[]time.Duration{2 * time.Second}, []time.Duration{2*time.Second + 200*ms - 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newTimeline()
				p := mustNew(t, retry.WithObserver(clock), retry.WithMaxAttempts(len(tt.hints)+1),
					retry.WithBackoff(mustBackoff(t, tt.s, 100*time.Millisecond, 10*time.Second, tt.u)))
				ctx := context.Background()
				if tt.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.timeout)
					defer cancel()
				}
				err := p.Do(ctx, func(ctx context.Context, attempt int) error {
					if attempt <= len(tt.hints) {
						return &statusErr{Code: 429, After: tt.hints[attempt-1]}
					}
					return nil
				})
				if err != nil {
					t.Fatalf("Do = %v", err)
				}
				got := clock.Sleeps()
				if !slices.Equal(got, tt.want) {
					t.Errorf("sleeps = %v, want %v", got, tt.want)
				}
				for i, h := range tt.hints {
					if i < len(got) && got[i] < h {
						t.Errorf("sleep %d = %v, below the server's hint %v", i+1, got[i], h)
					}
				}
			})
		})
	}
}

func TestDeadlineSleepNeverCrossed(t *testing.T) {
	tests := []struct {
		name      string
		base      time.Duration
		hint      time.Duration
		opTime    time.Duration // time each attempt takes
		wantSleep []time.Duration
		wantCalls int
		wantDelay time.Duration
	}{
		// NoJitter 300 ms: 600 ms fits in 1 s, then 1.2 s does not fit in 400 ms.
		{"second sleep would cross", 300 * time.Millisecond, 0, 0, []time.Duration{600 * time.Millisecond}, 2, 1200 * time.Millisecond},
		// 1 s sleep with exactly 1 s left would wake at the deadline: not started.
		{"sleep ending at the deadline", 500 * time.Millisecond, 0, 0, nil, 1, time.Second},
		// The attempt itself used 500 ms, so a 600 ms sleep no longer fits.
		{"time spent in the attempt counts", 300 * time.Millisecond, 0, 500 * time.Millisecond, nil, 1, 600 * time.Millisecond},
		// A hint beyond the deadline: give up now, do not wait for it.
		{"hint beyond the deadline", 10 * time.Millisecond, 2 * time.Second, 0, nil, 1, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newTimeline()
				p := mustNew(t, retry.WithObserver(clock), retry.WithMaxAttempts(10),
					retry.WithBackoff(mustBackoff(t, backoff.NoJitter, tt.base, time.Minute, 0)))
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				calls := 0
				last := &statusErr{Code: 503, After: tt.hint}
				err := p.Do(ctx, func(ctx context.Context, attempt int) error {
					calls++
					time.Sleep(tt.opTime)
					return last
				})
				re := checkStop(t, err, retry.Deadline, tt.wantCalls)
				if calls != tt.wantCalls {
					t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
				}
				if got := clock.Sleeps(); !slices.Equal(got, tt.wantSleep) {
					t.Errorf("sleeps = %v, want %v", got, tt.wantSleep)
				}
				if d := retry.RetryAfter(err); d != tt.wantDelay {
					t.Errorf("RetryAfter(give-up) = %v, want the refused sleep %v", d, tt.wantDelay)
				}
				if re.Err != last || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Do = %v: want the last 503 and context.DeadlineExceeded reachable", err)
				}
			})
		})
	}
}

func TestDeadlinePassedDuringAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		p := mustNew(t, retry.WithObserver(clock))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		calls := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			calls++
			time.Sleep(2 * time.Second)
			return err503
		})
		checkStop(t, err, retry.Deadline, 1)
		if calls != 1 || len(clock.Sleeps()) != 0 {
			t.Errorf("calls = %d, sleeps = %v; want 1 call, no sleep", calls, clock.Sleeps())
		}
	})
}

func TestMaxRetryAfter(t *testing.T) {
	tests := []struct {
		name      string
		hint      time.Duration
		wantErr   bool
		wantSleep []time.Duration
	}{
		{"hint at the max is honoured", time.Minute, false, []time.Duration{time.Minute}},
		{"484289h is refused, not slept", 484289 * time.Hour, true, nil},
		{"just over the max is refused", time.Minute + time.Nanosecond, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clock := newTimeline()
				p := mustNew(t, retry.WithObserver(clock), retry.WithMaxRetryAfter(time.Minute),
					retry.WithBackoff(mustBackoff(t, backoff.FullJitter, 100*time.Millisecond, 10*time.Second, 0)))
				err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
					if attempt == 1 {
						return &statusErr{Code: 429, After: tt.hint}
					}
					return nil
				})
				if got := clock.Sleeps(); !slices.Equal(got, tt.wantSleep) {
					t.Errorf("sleeps = %v, want %v", got, tt.wantSleep)
				}
				if !tt.wantErr {
					if err != nil {
						t.Errorf("Do = %v, want nil", err)
					}
					return
				}
				checkStop(t, err, retry.Deadline, 1)
				if d := retry.RetryAfter(err); d != tt.hint {
					t.Errorf("RetryAfter(give-up) = %v, want the hint %v", d, tt.hint)
				}
			})
		})
	}
	// The default limit is one minute.
	p := mustNew(t)
	err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
		return &statusErr{Code: 503, After: time.Minute + time.Second}
	})
	checkStop(t, err, retry.Deadline, 1)
}

func TestParentCancelMidSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// NoJitter 5 s: the first sleep is 10 s; cancel 50 ms into it.
		p := mustNew(t, retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 5*time.Second, time.Minute, 0)))
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		calls := 0
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			calls++
			return err503
		})
		elapsed := time.Since(start)
		if elapsed < 50*time.Millisecond || elapsed > 51*time.Millisecond {
			t.Errorf("Do returned %v after the start, want within 1 ms of the cancel at 50ms", elapsed)
		}
		re := checkStop(t, err, retry.Canceled, 1)
		if calls != 1 {
			t.Errorf("calls = %d, want 1", calls)
		}
		if re.Err != err503 || !errors.Is(err, context.Canceled) {
			t.Errorf("Do = %v: want the 503 and context.Canceled reachable", err)
		}
	})
}

func TestParentCancelNeverRetried(t *testing.T) {
	tests := []struct {
		name string
		ret  func(ctx context.Context) error
	}{
		{"op returns ctx error", func(ctx context.Context) error { return ctx.Err() }},
		{"op returns a retryable error", func(ctx context.Context) error { return err503 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				clock := newTimeline()
				p := mustNew(t, retry.WithObserver(clock), retry.WithMaxAttempts(5))
				calls := 0
				err := p.Do(ctx, func(actx context.Context, attempt int) error {
					calls++
					cancel()
					return tt.ret(actx)
				})
				checkStop(t, err, retry.Canceled, 1)
				if calls != 1 || len(clock.Sleeps()) != 0 {
					t.Errorf("calls = %d, sleeps = %v; want 1 call, no sleep", calls, clock.Sleeps())
				}
			})
		})
	}
}

func TestContextEndedBeforeStart(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	causeErr := errors.New("shutting down")
	withCause, cancel3 := context.WithCancelCause(context.Background())
	cancel3(causeErr)

	tests := []struct {
		name   string
		ctx    context.Context
		reason retry.Reason
		is     error
	}{
		{"canceled", canceled, retry.Canceled, context.Canceled},
		{"deadline passed", expired, retry.Deadline, context.DeadlineExceeded},
		{"cancel cause reachable", withCause, retry.Canceled, causeErr},
	}
	// A policy without options takes the short first-attempt path; one
	// with an observer takes the loop.
	policies := map[string]*retry.Policy{
		"short path": mustNew(t),
		"loop":       mustNew(t, retry.WithObserver(newTimeline())),
	}
	for pname, p := range policies {
		for _, tt := range tests {
			t.Run(pname+"/"+tt.name, func(t *testing.T) {
				calls := 0
				err := p.Do(tt.ctx, func(ctx context.Context, attempt int) error {
					calls++
					return nil
				})
				if calls != 0 {
					t.Errorf("op called %d times on an ended context", calls)
				}
				checkStop(t, err, tt.reason, 0)
				if !errors.Is(err, tt.is) {
					t.Errorf("errors.Is(%v, %v) = false", err, tt.is)
				}
			})
		}
	}
}

func TestParentDeadlineCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		// NoJitter 300 ms: sleep 600 ms, then 1.2 s would cross the parent's 1 s.
		p := mustNew(t, retry.WithMaxAttempts(10),
			retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 300*time.Millisecond, time.Minute, 0)))
		start := time.Now()
		err := p.Do(ctx, func(ctx context.Context, attempt int) error { return err503 })
		checkStop(t, err, retry.Deadline, 2)
		if d := retry.RetryAfter(err); d != 1200*time.Millisecond {
			t.Errorf("RetryAfter(give-up) = %v, want the refused 1.2s", d)
		}
		if elapsed := time.Since(start); elapsed != 600*time.Millisecond {
			t.Errorf("Do took %v of fake time, want exactly the one 600ms sleep", elapsed)
		}
	})
}

func TestAttemptContext(t *testing.T) {
	type call struct {
		at       time.Duration // since start
		deadline time.Duration // attempt ctx deadline since start; -1: none
	}
	tests := []struct {
		name           string
		parent         time.Duration // parent timeout; 0: none
		opts           []retry.Option
		block          bool // op waits for its context to end
		want           []call
		wantReason     retry.Reason
		wantIsParent   bool // attempt ctx is the parent itself
		wantIsDeadline bool
	}{
		{
			name: "no timeouts: the parent itself, no deadline",
			want: []call{{0, -1}, {200 * time.Millisecond, -1}, {600 * time.Millisecond, -1}}, wantReason: retry.AttemptsExhausted,
			wantIsParent: true,
		},
		{
			name: "parent deadline: the parent itself", parent: 5 * time.Second,
			want: []call{{0, 5 * time.Second}, {200 * time.Millisecond, 5 * time.Second}, {600 * time.Millisecond, 5 * time.Second}}, wantReason: retry.AttemptsExhausted,
			wantIsParent: true,
		},
		{
			// Attempt 1 times out on its own at 3 s and is retried; attempt 2
			// starts at 3.2 s capped by the parent's 5 s and hits it: Deadline.
			name: "attempt timeout retried, the call's deadline not", block: true, parent: 5 * time.Second,
			opts: []retry.Option{retry.WithAttemptTimeout(3 * time.Second)},
			want: []call{{0, 3 * time.Second}, {3200 * time.Millisecond, 5 * time.Second}}, wantReason: retry.Deadline,
		},
		{
			name: "attempt timeout alone: every attempt gets its own", block: true,
			opts:       []retry.Option{retry.WithAttemptTimeout(time.Second)},
			want:       []call{{0, time.Second}, {1200 * time.Millisecond, 2200 * time.Millisecond}, {2600 * time.Millisecond, 3600 * time.Millisecond}},
			wantReason: retry.AttemptsExhausted,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parent := context.Background()
				if tt.parent > 0 {
					var cancel context.CancelFunc
					parent, cancel = context.WithTimeout(parent, tt.parent)
					defer cancel()
				}
				// NoJitter 100 ms: sleeps of 200 ms, 400 ms.
				opts := append([]retry.Option{retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 100*time.Millisecond, time.Minute, 0))}, tt.opts...)
				p := mustNew(t, opts...)
				start := time.Now()
				var got []call
				err := p.Do(parent, func(ctx context.Context, attempt int) error {
					c := call{at: time.Since(start), deadline: -1}
					if dl, ok := ctx.Deadline(); ok {
						c.deadline = dl.Sub(start)
					}
					got = append(got, c)
					if (ctx == parent) != tt.wantIsParent {
						t.Errorf("attempt %d: ctx is parent = %v, want %v", attempt, ctx == parent, tt.wantIsParent)
					}
					if tt.block {
						<-ctx.Done()
						return ctx.Err()
					}
					return err503
				})
				if !slices.Equal(got, tt.want) {
					t.Errorf("attempts (start, deadline) = %v, want %v", got, tt.want)
				}
				checkStop(t, err, tt.wantReason, len(tt.want))
			})
		})
	}
}

func TestClassifier(t *testing.T) {
	errMine := errors.New("mine")
	tests := []struct {
		name     string
		classify func(error) bool
		err      error
		calls    int
	}{
		{"extended: own error retried", func(e error) bool { return errors.Is(e, errMine) || retry.IsRetryable(e) }, errMine, 3},
		{"extended: default still applies", func(e error) bool { return errors.Is(e, errMine) || retry.IsRetryable(e) }, err503, 3},
		{"default: own error not retried", nil, errMine, 1},
		{"replaced: 503 no longer retried", func(error) bool { return false }, err503, 1},
		{"replaced: Permanent still wins", func(error) bool { return true }, retry.Permanent(errMine), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []retry.Option{retry.WithBackoff(mustBackoff(t, backoff.FullJitter, time.Millisecond, time.Millisecond, 0))}
			if tt.classify != nil {
				opts = append(opts, retry.WithClassifier(tt.classify))
			}
			p := mustNew(t, opts...)
			calls := 0
			_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
				calls++
				return tt.err
			})
			if calls != tt.calls {
				t.Errorf("calls = %d, want %d", calls, tt.calls)
			}
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opt  retry.Option
	}{
		{"attempts 0", retry.WithMaxAttempts(0)},
		{"attempts negative", retry.WithMaxAttempts(-1)},
		{"nil backoff", retry.WithBackoff(nil)},
		{"negative attempt timeout", retry.WithAttemptTimeout(-time.Second)},
		{"nil classifier", retry.WithClassifier(nil)},
		{"zero max retry-after", retry.WithMaxRetryAfter(0)},
		{"negative max retry-after", retry.WithMaxRetryAfter(-1)},
	}
	for _, tt := range tests {
		p, err := retry.New(tt.opt)
		if p != nil || err == nil || !strings.HasPrefix(err.Error(), "retry: invalid option: ") {
			t.Errorf("New(%s) = %v, %v; want nil and an error that says so", tt.name, p, err)
		}
	}
	// nil Options, a nil observer, no guards and an empty name are fine.
	if _, err := retry.New(nil, retry.WithObserver(nil), retry.WithGuards(retry.Guards{}), retry.WithName(""),
		retry.WithAttemptTimeout(0)); err != nil {
		t.Errorf("New(nil options) = %v", err)
	}
}

func TestDoValue(t *testing.T) {
	p := mustNew(t, retry.WithBackoff(mustBackoff(t, backoff.FullJitter, time.Millisecond, time.Millisecond, 0)))
	v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (int, error) {
		if attempt < 3 {
			return -attempt, err503
		}
		return 42, nil
	})
	if v != 42 || err != nil {
		t.Errorf("DoValue = %v, %v; want 42, nil", v, err)
	}
	// On give-up, the last attempt's value comes back with the error.
	v, err = retry.DoValue(context.Background(), p, func(ctx context.Context, attempt int) (int, error) {
		return attempt * 10, err503
	})
	if v != 30 {
		t.Errorf("DoValue gave up with value %v, want the last attempt's 30", v)
	}
	checkStop(t, err, retry.AttemptsExhausted, 3)
}

// TestConcurrentShared runs one policy from many goroutines at once, with
// the system clock inside a synctest bubble (so sleeps are real timers on
// fake time). Run with -race.
func TestConcurrentShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var retries, giveUps atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		p := mustNew(t, retry.WithMaxAttempts(3),
			retry.WithObserver(observe.Func(func(ctx context.Context, e observe.Event) {
				switch e.Kind {
				case observe.Retry:
					retries.Add(1)
				case observe.GiveUp:
					giveUps.Add(1)
				}
			})),
		)
		const n = 64
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				// Even goroutines succeed on attempt 3, odd ones never do.
				errs[i] = p.Do(ctx, func(ctx context.Context, attempt int) error {
					if i%2 == 0 && attempt == 3 {
						return nil
					}
					return err503
				})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if (err == nil) != (i%2 == 0) {
				t.Errorf("goroutine %d: Do = %v", i, err)
			}
		}
		if retries.Load() != 2*n || giveUps.Load() != n/2 {
			t.Errorf("retries = %d, give-ups = %d; want %d, %d", retries.Load(), giveUps.Load(), 2*n, n/2)
		}
	})
}

// TestSystemClock: the loop runs on the system clock, here a synctest
// bubble's: it sleeps exactly the backoff delays on it, and a cancel ends a
// sleep at once.
func TestSystemClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := mustNew(t, retry.WithMaxAttempts(3),
			retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 500*time.Millisecond, time.Minute, 0)))
		start := time.Now()
		var at []time.Duration
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			at = append(at, time.Since(start))
			return err503
		})
		checkStop(t, err, retry.AttemptsExhausted, 3)
		if want := []time.Duration{0, time.Second, 3 * time.Second}; !slices.Equal(at, want) {
			t.Errorf("attempts at %v, want %v (sleeps of 1s and 2s on the bubble's clock)", at, want)
		}

		ctx, cancel := context.WithCancel(context.Background())
		start = time.Now()
		time.AfterFunc(300*time.Millisecond, cancel)
		err = p.Do(ctx, func(ctx context.Context, attempt int) error { return err503 })
		checkStop(t, err, retry.Canceled, 1)
		if d := time.Since(start); d != 300*time.Millisecond {
			t.Errorf("canceled mid-sleep: Do returned after %v, want 300ms", d)
		}
	})
}

func TestCancelCauseMidSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errShutdown := errors.New("shutting down")
		ctx, cancel := context.WithCancelCause(context.Background())
		p := mustNew(t)
		time.AfterFunc(time.Millisecond, func() { cancel(errShutdown) })
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			return &statusErr{Code: 503, After: time.Second}
		})
		checkStop(t, err, retry.Canceled, 1)
		for _, target := range []error{errShutdown, context.Canceled} {
			if !errors.Is(err, target) {
				t.Errorf("errors.Is(%v, %v) = false", err, target)
			}
		}
		if want := "retry: canceled after 1 attempt (cause: shutting down): HTTP 503 (retry after 1s)"; err.Error() != want {
			t.Errorf("Error() = %q, want %q", err.Error(), want)
		}
	})
}

// TestDeadlineEndsABlockedAttempt: an attempt that blocks until its
// context ends is cut off by the call's deadline, and the loop stops with
// Deadline at once, without a sleep.
func TestDeadlineEndsABlockedAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := newTimeline()
		p := mustNew(t, retry.WithObserver(clock), retry.WithMaxAttempts(5))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		calls := 0
		start := time.Now()
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			calls++
			<-ctx.Done()
			return ctx.Err()
		})
		checkStop(t, err, retry.Deadline, 1)
		if calls != 1 || len(clock.Sleeps()) != 0 || time.Since(start) != time.Second {
			t.Errorf("calls = %d, sleeps = %v after %v; want 1 call, no sleep, 1s", calls, clock.Sleeps(), time.Since(start))
		}
	})
}

func TestNilPolicyUsesDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var p *retry.Policy
		calls := 0
		err := p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			calls++
			return err503
		})
		checkStop(t, err, retry.AttemptsExhausted, 3)
		if calls != 3 {
			t.Errorf("nil Policy: %d calls, want the default 3", calls)
		}
	})
}

func TestNilOperation(t *testing.T) {
	p := mustNew(t)
	if err := p.Do(context.Background(), nil); err == nil || err.Error() != "retry: nil operation" {
		t.Errorf("Do(nil op) = %v, want an error that says so", err)
	}
	if _, err := retry.DoValue[int](context.Background(), p, nil); err == nil || err.Error() != "retry: nil operation" {
		t.Errorf("DoValue(nil op) = %v, want an error that says so", err)
	}
}
