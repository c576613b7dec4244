package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

func agBackoff(t *testing.T, c backoff.Config) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func agNew(t *testing.T, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type agRec struct {
	mu sync.Mutex
	ev []observe.Event
}

func (r *agRec) Observe(ctx context.Context, e observe.Event) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

func (r *agRec) kinds() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var s []string
	for _, e := range r.ev {
		k := string(e.Kind)
		if e.Kind == observe.GiveUp {
			k += "(" + e.Reason + ")"
		}
		s = append(s, k)
	}
	return strings.Join(s, ",")
}

// A plain error stops at once, NotRetryable after 1 attempt, and the
// message names retry.WithClassifier, on every path of the loop.
func TestAttackGapsPlainErrorEveryPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{})
		lim := agLimiter{}
		plain := errors.New("boom")
		cases := []struct {
			name string
			p    *retry.Policy
		}{
			{"nil policy", nil},
			{"default", agNew(t)},
			{"ratelimit", agNew(t, retry.WithRateLimit(lim))},
			{"breaker", agNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))},
			{"observer", agNew(t, retry.WithObserver(&agRec{}))},
			{"attempt timeout", agNew(t, retry.WithAttemptTimeout(time.Second))},
		}
		errs := []error{plain, fmt.Errorf("wrap: %w", plain), errors.Join(plain, errors.New("x")), fmt.Errorf("no wrap")}
		for _, c := range cases {
			for _, e := range errs {
				for _, dl := range []bool{false, true} {
					ctx := context.Background()
					var cancel context.CancelFunc = func() {}
					if dl {
						ctx, cancel = context.WithTimeout(ctx, time.Hour)
					}
					n := 0
					err := c.p.Do(ctx, func(ctx context.Context, a int) error { n++; return e })
					cancel()
					var re *retry.Error
					if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 1 || n != 1 {
						t.Errorf("%s/%v/dl=%v: %v after %d", c.name, e, dl, err, n)
						continue
					}
					if !strings.Contains(err.Error(), "retry.WithClassifier") {
						t.Errorf("%s/%v/dl=%v: message does not name WithClassifier: %q", c.name, e, dl, err)
					}
					if !errors.Is(err, e) {
						t.Errorf("%s: errors.Is lost the error", c.name)
					}
				}
			}
			// DoValue and DoValueIf too.
			v, err := retry.DoValue(context.Background(), c.p, func(ctx context.Context, a int) (int, error) { return 7, plain })
			if v != 7 || !strings.Contains(fmt.Sprint(err), "retry.WithClassifier") {
				t.Errorf("%s DoValue: %v, %v", c.name, v, err)
			}
			v, err = retry.DoValueIf(context.Background(), c.p, func(ctx context.Context, a int) (int, error) { return 8, plain }, func(int) bool { return true })
			if v != 8 || !strings.Contains(fmt.Sprint(err), "retry.WithClassifier") {
				t.Errorf("%s DoValueIf: %v, %v", c.name, v, err)
			}
		}
	})
}

// A plain error after retryable ones: stops at that attempt, names the way.
func TestAttackGapsPlainErrorAfterRetryable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := agNew(t, retry.WithMaxAttempts(5))
		err := p.Do(context.Background(), func(ctx context.Context, a int) error {
			if a < 3 {
				return io.ErrUnexpectedEOF
			}
			return errors.New("plain")
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 3 || !strings.Contains(err.Error(), "retry.WithClassifier") {
			t.Errorf("got %v", err)
		}
		// A custom classifier that says no: the message must not claim the default classifier.
		p = agNew(t, retry.WithClassifier(func(error) bool { return false }))
		err = p.Do(context.Background(), func(ctx context.Context, a int) error { return errors.New("plain") })
		if strings.Contains(err.Error(), "default classifier") {
			t.Errorf("custom classifier: message %q speaks of the default classifier", err)
		}
	})
}

type agLimiter struct{}

func (agLimiter) Wait(ctx context.Context) error { return nil }

// DoValueIf: a value that asks again is retried whatever the classifier,
// up to the attempts; the last value is returned with an *Error whose Err
// says so; the breaker counts each such attempt as a failure.
func TestAttackGapsDoValueIf(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 3, MinCalls: 1000})
		if err != nil {
			t.Fatal(err)
		}
		p := agNew(t, retry.WithMaxAttempts(3), retry.WithClassifier(func(error) bool { return false }),
			retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})),
			retry.WithGuards(retry.Guards{Breaker: brk}))
		start := time.Now()
		v, err := retry.DoValueIf(context.Background(), p, func(ctx context.Context, a int) (int, error) { return a * 10, nil }, func(v int) bool { return true })
		var re *retry.Error
		if v != 30 || !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 3 ||
			!strings.Contains(err.Error(), "retry: the result asked for another attempt") {
			t.Errorf("DoValueIf = %v, %v", v, err)
		}
		if d := time.Since(start); d != 2*time.Millisecond {
			t.Errorf("slept %v, want 2ms (two constant sleeps)", d)
		}
		if s := brk.State(); s != breaker.Open {
			t.Errorf("breaker %v after 3 asked-again attempts with ConsecutiveFailures 3, want open", s)
		}

		// again false on attempt 2: success with that value.
		p2 := agNew(t, retry.WithMaxAttempts(5), retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})))
		v, err = retry.DoValueIf(context.Background(), p2, func(ctx context.Context, a int) (int, error) { return a, nil }, func(v int) bool { return v < 2 })
		if v != 2 || err != nil {
			t.Errorf("second try: %v, %v", v, err)
		}
		// Deadline: the value of the last attempt is returned.
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Microsecond)
		v, err = retry.DoValueIf(ctx, p2, func(ctx context.Context, a int) (int, error) { return a, nil }, func(v int) bool { return true })
		cancel()
		if v != 2 || !errors.Is(err, retry.Deadline) {
			t.Errorf("deadline: %v, %v", v, err)
		}
		// A value that asks again, then a permanent error: NotRetryable with the permanent's value.
		v, err = retry.DoValueIf(context.Background(), p2, func(ctx context.Context, a int) (int, error) {
			if a == 2 {
				return -1, retry.Permanent(io.EOF)
			}
			return a, nil
		}, func(v int) bool { return true })
		if v != -1 || !errors.Is(err, retry.NotRetryable) || !errors.Is(err, io.EOF) {
			t.Errorf("permanent: %v, %v", v, err)
		}
	})
}

// A predicate that panics: the panic goes on, the breaker counts a
// failure (no probe stuck), the observer hears GiveUp "panic".
func TestAttackGapsDoValueIfPredicatePanics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{Probes: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
		brk.Trip(0)
		time.Sleep(2 * time.Second)
		if brk.State() != breaker.HalfOpen {
			t.Fatalf("state %v", brk.State())
		}
		rec := &agRec{}
		p := agNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithObserver(rec))
		func() {
			defer func() {
				if r := recover(); r != "pred" {
					t.Errorf("recovered %v", r)
				}
			}()
			retry.DoValueIf(context.Background(), p, func(ctx context.Context, a int) (int, error) { return 1, nil }, func(int) bool { panic("pred") })
		}()
		if k := rec.kinds(); k != "attempt-start,attempt-end,give-up(panic)" {
			t.Errorf("events %s", k)
		}
		// The probe failed: open again, not half-open with its only probe held.
		if s := brk.State(); s != breaker.Open {
			t.Errorf("breaker %v after a panicking predicate on its probe, want open", s)
		}
		// Nil policy, bare path: panics through.
		func() {
			defer func() {
				if r := recover(); r != "pred2" {
					t.Errorf("recovered %v", r)
				}
			}()
			retry.DoValueIf(context.Background(), nil, func(ctx context.Context, a int) (int, error) { return 1, nil }, func(int) bool { panic("pred2") })
		}()
	})
}

// agWaiter is a rate limiter scripted per call.
type agWaiter struct {
	n    atomic.Int64
	wait func(ctx context.Context, n int64) error
}

func (w *agWaiter) Wait(ctx context.Context) error { return w.wait(ctx, w.n.Add(1)) }

// Cancel during the limiter's Wait: stops for the caller at once, the last
// error kept, the attempt not sent.
func TestAttackGapsRateLimitCancelDuringWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, honour := range []bool{true, false} {
			w := &agWaiter{wait: func(ctx context.Context, n int64) error {
				if n == 1 {
					return nil
				}
				if honour {
					<-ctx.Done()
					return ctx.Err()
				}
				time.Sleep(time.Hour) // ignores ctx, then admits
				return nil
			}}
			p := agNew(t, retry.WithRateLimit(w), retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})))
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(time.Second, cancel)
			sent := 0
			start := time.Now()
			err := p.Do(ctx, func(ctx context.Context, a int) error { sent++; return io.ErrUnexpectedEOF })
			el := time.Since(start)
			var re *retry.Error
			if !errors.As(err, &re) || re.Reason != retry.Canceled || re.Attempts != 1 || re.Err != io.ErrUnexpectedEOF || sent != 1 || !errors.Is(err, context.Canceled) {
				t.Errorf("honour=%v: %v (attempts %v, sent %d)", honour, err, re, sent)
			}
			if honour && el != time.Second {
				t.Errorf("honour=%v: returned after %v, want 1s", honour, el)
			}
			cancel()
		}
	})
}

type agLimErr struct{ d time.Duration }

func (e agLimErr) Error() string { return "limiter says no" }

// A limiter that refuses: Deadline, the limiter's error reachable, Err the
// last error, also DeadlineExceeded; attempts counts what ran.
func TestAttackGapsRateLimitRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, at := range []int64{1, 2, 3} {
			w := &agWaiter{wait: func(ctx context.Context, n int64) error {
				if n == at {
					return agLimErr{5 * time.Second}
				}
				return nil
			}}
			rec := &agRec{}
			p := agNew(t, retry.WithRateLimit(w), retry.WithObserver(rec), retry.WithMaxAttempts(5),
				retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})))
			v, err := retry.DoValue(context.Background(), p, func(ctx context.Context, a int) (int, error) { return a, io.ErrUnexpectedEOF })
			var re *retry.Error
			var le agLimErr
			if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != int(at-1) {
				t.Errorf("refuse at %d: %v", at, err)
				continue
			}
			if !errors.As(err, &le) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("refuse at %d: limiter error not reachable: %v", at, err)
			}
			if at == 1 && (re.Err != nil || v != 0) {
				t.Errorf("refuse at 1: Err %v, v %d", re.Err, v)
			}
			if at > 1 && (re.Err != io.ErrUnexpectedEOF || v != int(at-1)) {
				t.Errorf("refuse at %d: Err %v, v %d", at, re.Err, v)
			}
			if !strings.HasSuffix(rec.kinds(), "give-up(deadline)") {
				t.Errorf("refuse at %d: events %s", at, rec.kinds())
			}
		}
	})
}

// The limiter waits before the breaker: while it waits no probe is held,
// and every attempt, probes included, waits for it. A limiter that panics
// holds nothing of the breaker's.
func TestAttackGapsRateLimitPanicHoldsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{Probes: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
		brk.Trip(0)
		time.Sleep(2 * time.Second)
		w := &agWaiter{wait: func(ctx context.Context, n int64) error { panic("limiter") }}
		rec := &agRec{}
		p := agNew(t, retry.WithRateLimit(w), retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithObserver(rec))
		func() {
			defer func() { recover() }()
			p.Do(context.Background(), func(ctx context.Context, a int) error { return nil })
		}()
		// The probe slot is free: Allow admits a probe.
		pm, err := brk.Allow()
		if err != nil || !pm.Probe() {
			t.Errorf("after a limiter panic, Allow = %v, %v; want a probe", pm, err)
		}
		brk.Done(pm, true)
		t.Logf("events on a limiter panic: %q", rec.kinds())
	})
}

// A limiter that panics on attempt 2, after an attempt was observed: the
// observer's call never ends (no GiveUp), unlike a panic of op, the
// classifier, the observer or the budget's Deposit.
func TestAttackGapsRateLimitPanicObserverGiveUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &agWaiter{wait: func(ctx context.Context, n int64) error {
			if n == 2 {
				panic("limiter")
			}
			return nil
		}}
		rec := &agRec{}
		p := agNew(t, retry.WithRateLimit(w), retry.WithObserver(rec),
			retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})))
		func() {
			defer func() { recover() }()
			p.Do(context.Background(), func(ctx context.Context, a int) error { return io.ErrUnexpectedEOF })
		}()
		if k := rec.kinds(); !strings.Contains(k, "give-up") {
			t.Errorf("limiter panic on attempt 2: events %q, no give-up", k)
		}
	})
}

// A limiter that ignores the deadline and admits after it: nothing is sent.
func TestAttackGapsRateLimitAdmitsPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &agWaiter{wait: func(ctx context.Context, n int64) error { time.Sleep(2 * time.Second); return nil }}
		p := agNew(t, retry.WithRateLimit(w))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		sent := 0
		err := p.Do(ctx, func(ctx context.Context, a int) error { sent++; return nil })
		if sent != 0 || !errors.Is(err, retry.Deadline) {
			t.Errorf("sent %d, %v", sent, err)
		}
	})
}

// Concurrency: a shared policy with a limiter, a breaker and a predicate,
// under -race.
func TestAttackGapsConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, _ := breaker.New(breaker.Config{ConsecutiveFailures: 1000, MinCalls: 1 << 30})
		var calls atomic.Int64
		w := &agWaiter{wait: func(ctx context.Context, n int64) error { calls.Add(1); return nil }}
		p := agNew(t, retry.WithRateLimit(w), retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithMaxAttempts(4),
			retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Linear, Base: time.Millisecond, Cap: 3 * time.Millisecond})))
		var wg sync.WaitGroup
		var sent atomic.Int64
		for i := range 50 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				v, err := retry.DoValueIf(ctx, p, func(ctx context.Context, a int) (int, error) { sent.Add(1); return a, nil }, func(v int) bool { return v < 1+i%4 })
				if i%4 == 3 {
					if v != 4 || err != nil {
						t.Errorf("call %d: %v, %v", i, v, err)
					}
				} else if v != 1+i%4 || err != nil {
					t.Errorf("call %d: %v, %v", i, v, err)
				}
			})
		}
		wg.Wait()
		if calls.Load() != sent.Load() {
			t.Errorf("limiter waited %d times for %d attempts", calls.Load(), sent.Load())
		}
	})
}

// A backoff of the largest Duration without a deadline: a retry must not
// come earlier than the backoff's delay. The runtime's timers fire early
// past about 292 years from the process's start (a 280-year backoff
// retried after 262.5 years); a delay of 250 years or more now lasts until
// the context ends, a shorter one is slept exactly.
func TestAttackGapsHugeBackoffNoDeadlineSleepsItAll(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for _, base := range []time.Duration{math.MaxInt64, math.MaxInt64 - 24*time.Hour, 290 * year, 280 * year, 250 * year, 200 * year, 150 * year, 100 * year} {
		t.Run(base.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := agNew(t, retry.WithBackoff(agBackoff(t, backoff.Config{Strategy: backoff.Constant, Base: base})))
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				const cancelAt = 240 * year // the bubble's clock starts 30 years in: a timer to 270 is exact
				done := make(chan struct{})
				defer close(done)
				go func() {
					select {
					case <-time.After(cancelAt):
						cancel()
					case <-done:
					}
				}()
				var at []time.Time
				start := time.Now()
				err := p.Do(ctx, func(ctx context.Context, a int) error {
					at = append(at, time.Now())
					if a == 1 {
						return io.ErrUnexpectedEOF
					}
					return nil
				})
				if base >= 250*year {
					// Longer than a runtime timer can be trusted with: the
					// sleep lasts until the context ends, never a retry early.
					if len(at) != 1 || !errors.Is(err, context.Canceled) || time.Since(start) != cancelAt {
						t.Errorf("backoff %.0f years: %d attempts, %v after %.1f years; want 1 attempt, canceled at %.0f years",
							base.Hours()/24/365, len(at), err, time.Since(start).Hours()/24/365, cancelAt.Hours()/24/365)
					}
					return
				}
				if err != nil || len(at) != 2 || at[1].Sub(at[0]) != base {
					t.Errorf("backoff %v: %v, %d attempts; want the retry after exactly the backoff", base, err, len(at))
				}
			})
		})
	}
}
