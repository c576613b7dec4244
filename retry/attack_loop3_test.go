package retry_test

// Black-box attacks on retry, budget and backoff against their docs.
// Only the exported API; fake time from testing/synctest;
// seeded randomness.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// zzErr is an error of the test's own: kind "retry" (Temporary true),
// "perm" (Temporary false), with an optional server hint.
type zzErr struct {
	kind string
	hint time.Duration
	id   int
}

func (e *zzErr) Error() string             { return fmt.Sprintf("zz %s #%d hint=%v", e.kind, e.id, e.hint) }
func (e *zzErr) Temporary() bool           { return e.kind == "retry" }
func (e *zzErr) RetryAfter() time.Duration { return e.hint }
func zzSeeded(seed uint64) func() float64  { r := rand.New(rand.NewPCG(seed, 7)); return r.Float64 }
func zzPolicy(t *testing.T, o ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(o...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// zzRec records attempt times in the bubble.
type zzAttempt struct {
	start, end time.Time
	err        error
}

// TestAttackLoop3DoMatchesPlan: "[Policy.Do] makes exactly these decisions"
// (plan.go): run Do on fake time with random schedules, then replay the
// attempts' errors through Plan with a twin random source: every sleep Do
// slept must be Plan's, every stop Plan's reason; no sleep ends at or after
// the deadline; no attempt starts at or after it; attempts never above max.
func TestAttackLoop3DoMatchesPlan(t *testing.T) {
	r := rand.New(rand.NewPCG(20260501, 1))
	strategies := []backoff.Strategy{backoff.FullJitter, backoff.NoJitter, backoff.EqualJitter, backoff.Decorrelated, backoff.Constant, backoff.Linear}
	for trial := range 400 {
		st := strategies[r.IntN(len(strategies))]
		base := time.Duration(1+r.IntN(400)) * time.Millisecond
		capd := base + time.Duration(r.IntN(5000))*time.Millisecond
		seed := r.Uint64()
		maxAtt := 1 + r.IntN(6)
		var maxRA time.Duration
		if r.IntN(2) == 0 {
			maxRA = time.Duration(1+r.IntN(4000)) * time.Millisecond
		}
		var dl time.Duration
		if r.IntN(4) != 0 {
			dl = time.Duration(1+r.IntN(12000)) * time.Millisecond
		}
		// the script of errors and durations
		type step struct {
			err error
			dur time.Duration
		}
		script := make([]step, 8)
		for i := range script {
			var e error
			switch k := r.IntN(10); {
			case k < 5:
				e = &zzErr{kind: "retry", id: i}
			case k < 7:
				e = &zzErr{kind: "retry", id: i, hint: time.Duration(r.IntN(3000)) * time.Millisecond}
			case k == 7:
				e = &zzErr{kind: "perm", id: i}
			case k == 8:
				e = retry.Permanent(&zzErr{kind: "retry", id: i})
			default:
				e = nil
			}
			script[i] = step{e, time.Duration(r.IntN(600)) * time.Millisecond}
		}
		mk := func() *backoff.Backoff {
			b, err := backoff.New(backoff.Config{Strategy: st, Base: base, Cap: capd, Rand: zzSeeded(seed)})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		opts := []retry.Option{retry.WithMaxAttempts(maxAtt), retry.WithBackoff(mk())}
		if maxRA > 0 {
			opts = append(opts, retry.WithMaxRetryAfter(maxRA))
		}
		p := zzPolicy(t, opts...)
		var atts []zzAttempt
		var doErr error
		var t0, deadline time.Time
		synctest.Test(t, func(t *testing.T) {
			ctx := context.Background()
			t0 = time.Now()
			if dl > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, dl)
				defer cancel()
				deadline, _ = ctx.Deadline()
			}
			doErr = p.Do(ctx, func(ctx context.Context, n int) error {
				if n != len(atts)+1 {
					t.Errorf("attempt number %d after %d attempts", n, len(atts))
				}
				a := zzAttempt{start: time.Now()}
				s := script[n-1]
				tm := time.NewTimer(s.dur)
				select {
				case <-tm.C:
					a.err = s.err
				case <-ctx.Done():
					tm.Stop()
					a.err = ctx.Err()
				}
				a.end = time.Now()
				atts = append(atts, a)
				return a.err
			})
		})
		_ = t0
		name := fmt.Sprintf("trial %d (%v base %v cap %v max %d maxRA %v dl %v)", trial, st, base, capd, maxAtt, maxRA, dl)
		if len(atts) > maxAtt {
			t.Fatalf("%s: %d attempts > max %d", name, len(atts), maxAtt)
		}
		for i, a := range atts {
			if dl > 0 && !a.start.Before(deadline) {
				t.Fatalf("%s: attempt %d started at/after the deadline", name, i+1)
			}
		}
		// Replay through Plan with a twin random source.
		p2opts := []retry.Option{retry.WithMaxAttempts(maxAtt), retry.WithBackoff(mk())}
		if maxRA > 0 {
			p2opts = append(p2opts, retry.WithMaxRetryAfter(maxRA))
		}
		next := zzPolicy(t, p2opts...).Plan()
		var re *retry.Error
		for i, a := range atts {
			if a.err == nil {
				if doErr != nil || i != len(atts)-1 {
					t.Fatalf("%s: success at attempt %d but Do returned %v with %d attempts", name, i+1, doErr, len(atts))
				}
				break
			}
			if dl > 0 && !a.end.Before(deadline) {
				if !errors.As(doErr, &re) || re.Reason != retry.Deadline || re.Attempts != i+1 || i != len(atts)-1 {
					t.Fatalf("%s: attempt %d ended at the deadline; Do returned %v", name, i+1, doErr)
				}
				break
			}
			var left time.Duration
			if dl > 0 {
				left = deadline.Sub(a.end)
			}
			sleep, stop := next(a.err, left)
			if stop == 0 {
				if i == len(atts)-1 {
					t.Fatalf("%s: Plan says sleep %v after attempt %d, Do stopped: %v", name, sleep, i+1, doErr)
				}
				if got := atts[i+1].start.Sub(a.end); got != sleep {
					t.Fatalf("%s: Do slept %v after attempt %d, Plan says %v", name, got, i+1, sleep)
				}
				if dl > 0 && !a.end.Add(sleep).Before(deadline) {
					t.Fatalf("%s: sleep %v after attempt %d ends at/after the deadline", name, sleep, i+1)
				}
				continue
			}
			if i != len(atts)-1 {
				t.Fatalf("%s: Plan stops (%v) after attempt %d, Do went on", name, stop, i+1)
			}
			if !errors.As(doErr, &re) || re.Reason != stop || re.Attempts != i+1 {
				t.Fatalf("%s: Plan stops with %v after %d attempts, Do returned %v", name, stop, i+1, doErr)
			}
			if stop == retry.Deadline && sleep > 0 && retry.RetryAfter(doErr) != sleep {
				t.Fatalf("%s: Deadline stop refused sleep %v, RetryAfter(err) = %v (%v)", name, sleep, retry.RetryAfter(doErr), doErr)
			}
			if !errors.Is(doErr, stop) {
				t.Fatalf("%s: errors.Is(err, %v) false", name, stop)
			}
			if stop == retry.Deadline && !errors.Is(doErr, context.DeadlineExceeded) {
				t.Fatalf("%s: Deadline stop not DeadlineExceeded", name)
			}
			// The last error reachable; Permanent mark removed at the top.
			var ze *zzErr
			if !errors.As(doErr, &ze) {
				t.Fatalf("%s: last error not reachable: %v", name, doErr)
			}
			if _, ok := re.Err.(*zzErr); !ok {
				t.Fatalf("%s: Err %T %v: Permanent mark not removed or wrong", name, re.Err, re.Err)
			}
		}
	}
}

// TestAttackLoop3HintFloorAndCap: a hint is a floor, the sleep in
// [hint, 1.5·hint) (0 from the source: exactly the hint); a hint above
// WithMaxRetryAfter gives up at once with Deadline and RetryAfter the hint;
// a hint equal to the maximum is honoured.
func TestAttackLoop3HintFloorAndCap(t *testing.T) {
	for _, tc := range []struct {
		name    string
		u       float64
		hint    time.Duration
		maxRA   time.Duration
		wantMin time.Duration
		wantMax time.Duration // exclusive
		stop    bool
	}{
		{"u0", 0, 2 * time.Second, 0, 2 * time.Second, 2*time.Second + 1, false},
		{"u-near-1", 1 - 0x1p-53, 2 * time.Second, 0, 2 * time.Second, 3 * time.Second, false},
		{"u1-clamped", 1, 2 * time.Second, 0, 2 * time.Second, 3 * time.Second, false},
		{"at-max", 0.5, time.Minute, 0, time.Minute, 90 * time.Second, false},
		{"over-default-max", 0.5, time.Minute + 1, 0, 0, 0, true},
		{"over-custom-max", 0.5, 2*time.Second + 1, 2 * time.Second, 0, 0, true},
		{"huge", 0.5, 484289 * time.Hour, 0, 0, 0, true},
		{"over-150y", 0.5, 151 * 365 * 24 * time.Hour, 200 * 365 * 24 * time.Hour, 0, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond, Rand: func() float64 { return tc.u }})
				opts := []retry.Option{retry.WithBackoff(b), retry.WithMaxAttempts(2)}
				if tc.maxRA > 0 {
					opts = append(opts, retry.WithMaxRetryAfter(tc.maxRA))
				}
				p := zzPolicy(t, opts...)
				var ends, starts []time.Time
				herr := &zzErr{kind: "retry", hint: tc.hint}
				err := p.Do(context.Background(), func(ctx context.Context, n int) error {
					starts = append(starts, time.Now())
					ends = append(ends, time.Now())
					return herr
				})
				var re *retry.Error
				if !errors.As(err, &re) {
					t.Fatalf("not *Error: %v", err)
				}
				if tc.stop {
					if re.Reason != retry.Deadline || re.Attempts != 1 || len(starts) != 1 {
						t.Fatalf("hint %v: got %v attempts %d", tc.hint, err, len(starts))
					}
					if got := retry.RetryAfter(err); got != tc.hint {
						t.Fatalf("RetryAfter = %v want hint %v", got, tc.hint)
					}
					if !errors.Is(err, context.DeadlineExceeded) || re.Err != herr {
						t.Fatalf("errors.Is Deadline / Err: %v", err)
					}
					return
				}
				if len(starts) != 2 {
					t.Fatalf("attempts %d: %v", len(starts), err)
				}
				d := starts[1].Sub(ends[0])
				if d < tc.wantMin || d >= tc.wantMax {
					t.Fatalf("slept %v, want [%v, %v)", d, tc.wantMin, tc.wantMax)
				}
				if re.Reason != retry.AttemptsExhausted {
					t.Fatalf("reason %v", re.Reason)
				}
			})
		})
	}
}

// TestAttackLoop3HintWithDeadlineNeverPasses: the hint's spread never passes
// the deadline; a hint that does not fit stops at once with Deadline.
func TestAttackLoop3HintWithDeadlineNeverPasses(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for i := range 300 {
		hint := time.Duration(1+r.IntN(4000)) * time.Millisecond
		dl := time.Duration(1+r.IntN(6000)) * time.Millisecond
		u := r.Float64()
		synctest.Test(t, func(t *testing.T) {
			b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Nanosecond, Rand: func() float64 { return u }})
			p := zzPolicy(t, retry.WithBackoff(b), retry.WithMaxAttempts(2))
			ctx, cancel := context.WithTimeout(context.Background(), dl)
			defer cancel()
			deadline, _ := ctx.Deadline()
			var starts []time.Time
			err := p.Do(ctx, func(ctx context.Context, n int) error {
				starts = append(starts, time.Now())
				return &zzErr{kind: "retry", hint: hint}
			})
			if hint >= dl {
				if len(starts) != 1 || !errors.Is(err, retry.Deadline) || time.Since(starts[0]) != 0 {
					t.Fatalf("%d: hint %v dl %v: %d attempts, %v, slept %v", i, hint, dl, len(starts), err, time.Since(starts[0]))
				}
				if retry.RetryAfter(err) != hint {
					t.Fatalf("%d: RetryAfter %v want %v", i, retry.RetryAfter(err), hint)
				}
				return
			}
			if len(starts) != 2 {
				t.Fatalf("%d: hint %v < dl %v but %d attempts: %v", i, hint, dl, len(starts), err)
			}
			d := starts[1].Sub(starts[0])
			if d < hint || d >= hint+hint/2+1 || !starts[1].Before(deadline) {
				t.Fatalf("%d: slept %v for hint %v, dl %v", i, d, hint, dl)
			}
		})
	}
}

// TestAttackLoop3SleepAtDeadlineExactly: a sleep that would end exactly at
// the deadline is not started (Reason Deadline, no time passes), one ending
// 1 ns before is slept.
func TestAttackLoop3SleepAtDeadlineExactly(t *testing.T) {
	for _, extra := range []time.Duration{0, 1} {
		synctest.Test(t, func(t *testing.T) {
			b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Second})
			p := zzPolicy(t, retry.WithBackoff(b))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second+extra)
			defer cancel()
			start := time.Now()
			n := 0
			err := p.Do(ctx, func(ctx context.Context, _ int) error { n++; return io.ErrUnexpectedEOF })
			var re *retry.Error
			errors.As(err, &re)
			if extra == 0 {
				if n != 1 || re.Reason != retry.Deadline || time.Since(start) != 0 || retry.RetryAfter(err) != time.Second {
					t.Fatalf("exact: n=%d %v elapsed %v RA %v", n, err, time.Since(start), retry.RetryAfter(err))
				}
				if !strings.Contains(err.Error(), "next sleep 1s would end past the deadline") {
					t.Fatalf("message: %q", err)
				}
			} else if n != 2 || re.Reason != retry.Deadline {
				// 2nd sleep of 1s would end past: stop after 2
				t.Fatalf("1ns more: n=%d %v", n, err)
			}
		})
	}
}

// TestAttackLoop3Reasons: each Reason exactly when documented, with
// errors.Is / errors.As through the *Error and the message's words.
func TestAttackLoop3Reasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		p := zzPolicy(t, retry.WithMaxAttempts(3))
		// AttemptsExhausted
		n := 0
		err := p.Do(ctx, func(context.Context, int) error { n++; return io.ErrUnexpectedEOF })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 3 || n != 3 ||
			!errors.Is(err, io.ErrUnexpectedEOF) || !errors.Is(err, retry.AttemptsExhausted) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("exhausted: %v n=%d", err, n)
		}
		if got := err.Error(); got != "retry: attempts exhausted after 3 attempts: unexpected EOF" {
			t.Fatalf("message %q", got)
		}
		// NotRetryable on the last attempt beats AttemptsExhausted
		n = 0
		err = p.Do(ctx, func(context.Context, int) error {
			n++
			if n == 3 {
				return retry.Permanent(io.ErrUnexpectedEOF)
			}
			return io.ErrUnexpectedEOF
		})
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 3 || re.Err != io.ErrUnexpectedEOF {
			t.Fatalf("permanent last: %v", err)
		}
		// plain error: NotRetryable with the classifier hint in the message
		plain := errors.New("plain")
		err = p.Do(ctx, func(context.Context, int) error { return plain })
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 1 || !strings.Contains(err.Error(), "retry.WithClassifier") {
			t.Fatalf("plain: %v", err)
		}
		// the same with WithClassifier(IsRetryable): no hint
		p2 := zzPolicy(t, retry.WithClassifier(retry.IsRetryable))
		err = p2.Do(ctx, func(context.Context, int) error { return plain })
		if strings.Contains(err.Error(), "WithClassifier") {
			t.Fatalf("explicit IsRetryable has the hint: %q", err)
		}
		// Canceled before the first attempt: Attempts 0, op not called
		cctx, cancel := context.WithCancelCause(ctx)
		cause := errors.New("my cause")
		cancel(cause)
		called := false
		err = p.Do(cctx, func(context.Context, int) error { called = true; return nil })
		if called || !errors.As(err, &re) || re.Reason != retry.Canceled || re.Attempts != 0 || re.Err != nil ||
			!errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
			t.Fatalf("canceled early: %v called=%v", err, called)
		}
		// Cancel during a sleep ends it at once
		cctx2, cancel2 := context.WithCancel(ctx)
		go func() { time.Sleep(50 * time.Millisecond); cancel2() }()
		b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Hour})
		p3 := zzPolicy(t, retry.WithBackoff(b))
		start := time.Now()
		err = p3.Do(cctx2, func(context.Context, int) error { return io.ErrUnexpectedEOF })
		if !errors.As(err, &re) || re.Reason != retry.Canceled || re.Attempts != 1 || time.Since(start) != 50*time.Millisecond {
			t.Fatalf("cancel mid-sleep: %v after %v", err, time.Since(start))
		}
		// Deadline passed during the attempt: Deadline, classifier not asked
		asked := 0
		p4 := zzPolicy(t, retry.WithClassifier(func(error) bool { asked++; return true }))
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		defer dcancel()
		err = p4.Do(dctx, func(ctx context.Context, _ int) error { <-ctx.Done(); return errors.New("late") })
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 1 || asked != 0 {
			t.Fatalf("late: %v asked=%d", err, asked)
		}
		// Deadline cause reachable
		dctx2, dcancel2 := context.WithDeadlineCause(ctx, time.Now().Add(time.Second), cause)
		defer dcancel2()
		err = p.Do(dctx2, func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() })
		if !errors.Is(err, cause) || !errors.Is(err, retry.Deadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("deadline cause: %v", err)
		}
		// nested: the inner *Error not retried; errors.As gives the outer
		inner := &retry.Error{Reason: retry.BudgetExhausted, Attempts: 2, Err: io.ErrUnexpectedEOF}
		err = p.Do(ctx, func(context.Context, int) error { return inner })
		if !errors.As(err, &re) || re.Reason != retry.NotRetryable || re.Attempts != 1 || !errors.Is(err, retry.BudgetExhausted) {
			t.Fatalf("nested: %v", err)
		}
		var rr retry.Reason
		if !errors.As(err, &rr) || rr != retry.NotRetryable {
			t.Fatalf("errors.As Reason = %v, want this call's NotRetryable", rr)
		}
	})
}

// TestAttackLoop3BudgetExhausted: a refusal ends the call at once, Attempts
// the attempts that ran, Err the last real error; no sleep.
func TestAttackLoop3BudgetExhausted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bud, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: 0.2}) // floor 2 per 10 s
		if err != nil {
			t.Fatal(err)
		}
		b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: time.Millisecond})
		p := zzPolicy(t, retry.WithGuards(retry.Guards{Budget: bud}), retry.WithBackoff(b), retry.WithMaxAttempts(10))
		var last time.Time
		n := 0
		err = p.Do(context.Background(), func(context.Context, int) error {
			n++
			last = time.Now()
			return &zzErr{kind: "retry", id: n}
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.BudgetExhausted || re.Attempts != 3 || n != 3 {
			t.Fatalf("got %v n=%d", err, n)
		}
		if ze, ok := re.Err.(*zzErr); !ok || ze.id != 3 {
			t.Fatalf("Err %v", re.Err)
		}
		if time.Since(last) != 0 {
			t.Fatalf("slept after refusal")
		}
		if s := bud.Stats(); s.Requests != 1 || s.Retries != 2 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// TestAttackLoop3Panics: a classifier or operation that panics: the panic
// goes on with its value; the observer hears GiveUp "panic"; the budget
// deposit/withdrawal counts stay sane.
func TestAttackLoop3Panics(t *testing.T) {
	type ev struct {
		kind    observe.Kind
		reason  string
		outcome string
	}
	for _, tc := range []struct {
		name     string
		observer bool
		opPanic  bool
	}{
		{"op-bare", false, true}, {"op-observer", true, true},
		{"classifier-bare", false, false}, {"classifier-observer", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var evs []ev
			opts := []retry.Option{retry.WithClassifier(func(err error) bool {
				if !tc.opPanic {
					panic("classifier boom")
				}
				return true
			})}
			if tc.observer {
				opts = append(opts, retry.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
					mu.Lock()
					evs = append(evs, ev{e.Kind, e.Reason, e.Outcome})
					mu.Unlock()
				})))
			}
			p := zzPolicy(t, opts...)
			var got any
			n := 0
			func() {
				defer func() { got = recover() }()
				_ = p.Do(context.Background(), func(context.Context, int) error {
					n++
					if tc.opPanic {
						panic("op boom")
					}
					return errors.New("x")
				})
			}()
			want := "op boom"
			if !tc.opPanic {
				want = "classifier boom"
			}
			if got != want || n != 1 {
				t.Fatalf("recovered %v (n=%d), want %q", got, n, want)
			}
			if tc.observer {
				gu := 0
				for _, e := range evs {
					if e.kind == observe.GiveUp {
						gu++
						if e.reason != "panic" {
							t.Fatalf("GiveUp reason %q", e.reason)
						}
					}
				}
				if gu != 1 {
					t.Fatalf("GiveUp events %d: %+v", gu, evs)
				}
			}
		})
	}
}

// TestAttackLoop3DoValueIf: the predicate's "again" is retried like a
// retryable error (custom classifier that says no to everything not
// consulted), the last value returned with the *Error.
func TestAttackLoop3DoValueIf(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		asked := 0
		p := zzPolicy(t, retry.WithMaxAttempts(4), retry.WithClassifier(func(error) bool { asked++; return false }))
		v, err := retry.DoValueIf(context.Background(), p, func(_ context.Context, n int) (int, error) { return n * 10, nil },
			func(v int) bool { return true })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.AttemptsExhausted || re.Attempts != 4 || v != 40 {
			t.Fatalf("v=%d err=%v", v, err)
		}
		if asked != 0 {
			t.Fatalf("classifier asked %d times about the predicate's error", asked)
		}
		if re.Err == nil || re.Err.Error() != "retry: the result asked for another attempt" {
			t.Fatalf("Err %v", re.Err)
		}
		// succeeds on the 3rd
		v, err = retry.DoValueIf(context.Background(), p, func(_ context.Context, n int) (int, error) { return n, nil },
			func(v int) bool { return v < 3 })
		if err != nil || v != 3 {
			t.Fatalf("v=%d err=%v", v, err)
		}
		// deadline: value of the last attempt with Deadline
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		defer cancel()
		b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 100 * time.Millisecond})
		p2 := zzPolicy(t, retry.WithBackoff(b), retry.WithMaxAttempts(10))
		v, err = retry.DoValueIf(ctx, p2, func(_ context.Context, n int) (int, error) { return n, nil }, func(int) bool { return true })
		if !errors.As(err, &re) || re.Reason != retry.Deadline || v != 3 || re.Attempts != 3 {
			t.Fatalf("deadline: v=%d err=%v", v, err)
		}
		// error beats predicate: a non-nil error is judged as DoValue does
		pred := 0
		_, err = retry.DoValueIf(context.Background(), zzPolicy(t), func(context.Context, int) (int, error) { return 1, errors.New("plain") }, func(int) bool { pred++; return true })
		if !errors.Is(err, retry.NotRetryable) || pred != 0 {
			t.Fatalf("err=%v pred=%d", err, pred)
		}
	})
}

// zzLimiter is a rate limiter whose Wait returns errs in turn.
type zzLimiter struct {
	mu    sync.Mutex
	calls int
	errs  []error
	wait  time.Duration
}

func (l *zzLimiter) Wait(ctx context.Context) error {
	l.mu.Lock()
	i := l.calls
	l.calls++
	l.mu.Unlock()
	if l.wait > 0 {
		select {
		case <-time.After(l.wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if i < len(l.errs) {
		return l.errs[i]
	}
	return nil
}

var errZZRate = errors.New("rate: would exceed context deadline")

// TestAttackLoop3RateLimit: the Wait error stops with Deadline, the
// limiter's error reachable, Err the last error of the op (nil if none),
// Attempts the attempts that ran; the budget is not deposited into when
// attempt 1 is refused.
func TestAttackLoop3RateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bud, _ := budget.New(budget.Config{})
		l := &zzLimiter{errs: []error{errZZRate}}
		p := zzPolicy(t, retry.WithRateLimit(l), retry.WithGuards(retry.Guards{Budget: bud}))
		n := 0
		err := p.Do(context.Background(), func(context.Context, int) error { n++; return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 || re.Err != nil || n != 0 ||
			!errors.Is(err, errZZRate) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("first refused: %v n=%d", err, n)
		}
		if s := bud.Stats(); s.Requests != 0 {
			t.Fatalf("deposit for a refused call: %+v", s)
		}
		// refused before the 3rd attempt
		l2 := &zzLimiter{errs: []error{nil, nil, errZZRate}}
		p2 := zzPolicy(t, retry.WithRateLimit(l2), retry.WithMaxAttempts(5))
		err = p2.Do(context.Background(), func(_ context.Context, n int) error { return &zzErr{kind: "retry", id: n} })
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 2 || !errors.Is(err, errZZRate) {
			t.Fatalf("third refused: %v", err)
		}
		if ze, ok := re.Err.(*zzErr); !ok || ze.id != 2 {
			t.Fatalf("Err %v", re.Err)
		}
		// Wait ends with the caller's cancel: Canceled
		ctx, cancel := context.WithCancel(context.Background())
		l3 := &zzLimiter{wait: time.Hour}
		go func() { time.Sleep(time.Second); cancel() }()
		err = zzPolicy(t, retry.WithRateLimit(l3)).Do(ctx, func(context.Context, int) error { return nil })
		if !errors.As(err, &re) || re.Reason != retry.Canceled || re.Attempts != 0 {
			t.Fatalf("cancel in wait: %v", err)
		}
		// Wait that takes past the deadline: Deadline
		dctx, dcancel := context.WithTimeout(context.Background(), time.Second)
		defer dcancel()
		err = zzPolicy(t, retry.WithRateLimit(l3)).Do(dctx, func(context.Context, int) error { return nil })
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 0 {
			t.Fatalf("deadline in wait: %v", err)
		}
		// Wait that panics: panic goes on; observer hears GiveUp "panic"
		var gu []string
		obs := observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.GiveUp {
				gu = append(gu, e.Reason)
			}
		})
		pp := zzPolicy(t, retry.WithRateLimit(panicLimiter{}), retry.WithObserver(obs))
		var rec any
		func() {
			defer func() { rec = recover() }()
			_ = pp.Do(context.Background(), func(context.Context, int) error { return nil })
		}()
		if rec != "wait boom" || len(gu) != 1 || gu[0] != "panic" {
			t.Fatalf("panic wait: rec=%v giveups=%v", rec, gu)
		}
	})
}

type panicLimiter struct{}

func (panicLimiter) Wait(context.Context) error { panic("wait boom") }

// TestAttackLoop3AttemptTimeout: the attempt's context ends at the earlier
// of the cap and the call's deadline; an attempt cut off by its own timeout
// is retried; one cut by the call's deadline stops with Deadline.
func TestAttackLoop3AttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 10 * time.Millisecond})
		p := zzPolicy(t, retry.WithAttemptTimeout(300*time.Millisecond), retry.WithBackoff(b), retry.WithMaxAttempts(10))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		deadline, _ := ctx.Deadline()
		var dls []time.Duration
		err := p.Do(ctx, func(actx context.Context, n int) error {
			d, _ := actx.Deadline()
			dls = append(dls, time.Until(d))
			if d.After(deadline) {
				t.Errorf("attempt %d deadline after the call's", n)
			}
			<-actx.Done()
			return actx.Err()
		})
		var re *retry.Error
		// 300 +10 +300 +10 +300 = 920; +10 = 930: 70ms left -> attempt 4 cut by the call's deadline
		if !errors.As(err, &re) || re.Reason != retry.Deadline || re.Attempts != 4 {
			t.Fatalf("%v dls=%v", err, dls)
		}
		if dls[3] != 70*time.Millisecond || dls[0] != 300*time.Millisecond {
			t.Fatalf("attempt deadlines %v", dls)
		}
	})
}

// TestAttackLoop3BudgetThroughPolicyConcurrent: many goroutines calling
// through one policy and one budget on fake time: at every admission the
// window's retries are at most Ratio·requests + floor (deposits logged are
// at least the counted ones), and over any window of whole slices at most
// Ratio times the requests of it and the window before, plus the floor.
func TestAttackLoop3BudgetThroughPolicyConcurrent(t *testing.T) {
	for _, cfg := range []budget.Config{
		{},
		{Ratio: 0.2, MinPerSecond: 0.5, Window: time.Second, Slices: 4},
		{Ratio: -1, MinPerSecond: 10, Window: 300 * time.Millisecond, Slices: 3},
		{Ratio: 1, MinPerSecond: -1, Window: 100 * time.Millisecond, Slices: 1},
	} {
		synctest.Test(t, func(t *testing.T) {
			bud, err := budget.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			c := bud.Config()
			t0 := time.Now()
			slice := c.Window / time.Duration(c.Slices)
			S := int64(c.Slices)
			ratio := max(c.Ratio, 0)
			floor := max(c.MinPerSecond, 0) * c.Window.Seconds()
			b, _ := backoff.New(backoff.Config{Base: 7 * time.Millisecond, Cap: 300 * time.Millisecond, Rand: lockedRandZZ(5)})
			p := zzPolicy(t, retry.WithGuards(retry.Guards{Budget: bud}), retry.WithBackoff(b), retry.WithMaxAttempts(5))
			var mu sync.Mutex
			deps := map[int64]float64{}
			wds := map[int64]float64{}
			sl := func(tm time.Time) int64 { return int64(tm.Sub(t0) / slice) }
			var wg sync.WaitGroup
			for g := range 40 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 3))
					for range 30 {
						time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
						failUntil := r.IntN(6)
						var lastEnd int64
						_ = p.Do(context.Background(), func(_ context.Context, n int) error {
							now := sl(time.Now())
							mu.Lock()
							if n == 1 {
								deps[now]++
							} else {
								wds[lastEnd]++ // withdrawn when the previous attempt returned
							}
							mu.Unlock()
							time.Sleep(time.Duration(r.IntN(30)) * time.Millisecond)
							lastEnd = sl(time.Now())
							if n <= failUntil {
								return &zzErr{kind: "retry"}
							}
							return nil
						})
					}
				}()
			}
			wg.Wait()
			total := 0.0
			for k := range wds {
				total += wds[k]
				var w, d float64
				for s := k - S + 1; s <= k; s++ {
					w += wds[s]
					d += deps[s]
				}
				if w > ratio*d+floor+1e-9 {
					t.Errorf("cfg %+v: window ending in slice %d: %v retries > %v·%v + %v", cfg, k, w, ratio, d, floor)
				}
			}
			if total == 0 {
				t.Errorf("cfg %+v: no retries at all; stats %+v deps %d", cfg, bud.Stats(), len(deps))
			}
		})
	}
}

func lockedRandZZ(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, 0))
	return func() float64 { mu.Lock(); defer mu.Unlock(); return r.Float64() }
}

var _ = atomic.Int64{}
var _ = json.Marshal
var _ = math.MaxInt64

// TestAttackLoop3BudgetModel: one goroutine, a fake clock that only goes
// forward: every Withdraw decision and every Stats must be the package
// doc's admission rule exactly (slices aligned to New, a window of the
// current slice and Slices-1 before, counts saturating at 16,777,215, the
// right-hand side in float64).
func TestAttackLoop3BudgetModel(t *testing.T) {
	const maxCount = 16777215
	r := rand.New(rand.NewPCG(77, 1))
	for trial := range 300 {
		slices := 1 + r.IntN(12)
		sliceD := time.Duration(1+r.IntN(1000)) * time.Millisecond
		win := sliceD * time.Duration(slices)
		ratio := []float64{-1, 0.05, 0.1, 0.29, 0.5, 1}[r.IntN(6)]
		mps := []float64{-1, 0.5, 1, 3, 15}[r.IntN(5)]
		base := time.Unix(1e9, 0)
		var now atomic.Int64
		clock := func() time.Time { return base.Add(time.Duration(now.Load())) }
		b, err := budget.New(budget.Config{Ratio: ratio, MinPerSecond: mps, Window: win, Slices: slices, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		effR := ratio
		if effR < 0 {
			effR = 0
		}
		effF := mps
		if effF < 0 {
			effF = 0
		}
		reserve := effF * win.Seconds()
		req := map[int64]uint64{}
		ret := map[int64]uint64{}
		S := int64(slices)
		window := func(k int64) (rq, rt uint64) {
			for s := k - S + 1; s <= k; s++ {
				rq += req[s]
				rt += ret[s]
			}
			return
		}
		for step := range 400 {
			switch k := r.IntN(10); {
			case k < 3:
				now.Add(int64(r.IntN(int(sliceD) * 3 / 2)))
			case k == 3:
				if r.IntN(20) == 0 {
					now.Add(int64(win) * int64(1+r.IntN(3)))
				}
			}
			cur := int64(time.Duration(now.Load()) / sliceD)
			switch k := r.IntN(10); {
			case k < 4:
				b.Deposit()
				req[cur] = min(req[cur]+1, maxCount)
			case k == 4:
				n := r.IntN(5)
				if r.IntN(50) == 0 {
					n = maxCount + r.IntN(3)
				}
				b.DepositN(n)
				if n > 0 {
					req[cur] = min(req[cur]+uint64(n), maxCount)
				}
			default:
				rq, rt := window(cur)
				want := float64(rt+1) <= effR*float64(rq)+reserve && ret[cur] < maxCount
				got := b.Withdraw()
				if got != want {
					t.Fatalf("trial %d step %d (ratio %v mps %v win %v slices %d): Withdraw at slice %d = %v, model %v (window req %d ret %d, rhs %v)",
						trial, step, ratio, mps, win, slices, cur, got, want, rq, rt, effR*float64(rq)+reserve)
				}
				if got {
					ret[cur]++
				}
			}
			rq, rt := window(cur)
			st := b.Stats()
			if st.Requests != int(rq) || st.Retries != int(rt) || st.Limit != effR*float64(rq)+reserve {
				t.Fatalf("trial %d step %d: Stats %+v, model req %d ret %d limit %v", trial, step, st, rq, rt, effR*float64(rq)+reserve)
			}
		}
	}
}

// TestAttackLoop3BudgetRatioPerRequest: Config.Ratio "is the number of
// retries allowed per request deposited in the window": 0.29 per request,
// 100 requests, no floor: 29 retries.
func TestAttackLoop3BudgetRatioPerRequest(t *testing.T) {
	for _, tc := range []struct {
		ratio, mps float64
		win        time.Duration
		deposits   int
		want       int
	}{
		{0.29, -1, 10 * time.Second, 100, 29},
		{0.35, -1, 10 * time.Second, 180, 63},
		{-1, 15, 8200 * time.Millisecond, 0, 123}, // MinPerSecond·Window.Seconds() = 123 per window, "always allowed"
	} {
		t.Run(fmt.Sprintf("%v_%v_%v", tc.ratio, tc.mps, tc.win), func(t *testing.T) {
			b, err := budget.New(budget.Config{Ratio: tc.ratio, MinPerSecond: tc.mps, Window: tc.win, Slices: 10 * int(tc.win/(100*time.Millisecond)) / 10})
			if err != nil {
				t.Fatal(err)
			}
			b.DepositN(tc.deposits)
			got := 0
			for b.Withdraw() {
				got++
			}
			if got != tc.want {
				t.Errorf("Ratio %v MinPerSecond %v Window %v, %d requests: %d retries admitted, want %d (Stats %+v)",
					tc.ratio, tc.mps, tc.win, tc.deposits, got, tc.want, b.Stats())
			}
		})
	}
}

// TestAttackLoop3BackoffFormulas: every strategy's documented formula and
// bounds, for random and extreme bases and caps (up to the largest
// Duration), random n up to 200, and a scripted random source; the
// Decorrelated recurrence min(c, b + U·(prev·3 − b)), prev starting at b.
func TestAttackLoop3BackoffFormulas(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	big2 := func(b time.Duration, n int) float64 { return math.Ldexp(float64(b), n) }
	expExact := func(b, c time.Duration, n int) time.Duration {
		// min(c, b·2^n) in integers, no overflow
		if n >= 63 {
			return c
		}
		if b > math.MaxInt64>>n {
			return c
		}
		return min(c, b<<n)
	}
	durs := []time.Duration{1, 2, 3, 7, time.Microsecond, time.Millisecond, 100 * time.Millisecond, time.Second, time.Hour,
		1 << 53, 1<<53 + 1, 1<<62 + 12345, math.MaxInt64 / 3, math.MaxInt64 - 1, math.MaxInt64}
	for trial := range 3000 {
		var b, c time.Duration
		if r.IntN(2) == 0 {
			b = durs[r.IntN(len(durs))]
			c = durs[r.IntN(len(durs))]
		} else {
			b = time.Duration(1 + r.Int64N(int64(time.Hour)))
			c = b + time.Duration(r.Int64N(int64(24*time.Hour)))
		}
		if c < b {
			b, c = c, b
		}
		st := backoff.Strategy(r.IntN(6))
		us := []float64{}
		var ui int
		src := func() float64 {
			var u float64
			switch r.IntN(5) {
			case 0:
				u = 0
			case 1:
				u = 1 - 0x1p-53
			default:
				u = r.Float64()
			}
			us = append(us, u)
			ui++
			return u
		}
		bo, err := backoff.New(backoff.Config{Strategy: st, Base: b, Cap: c, Rand: src})
		if err != nil {
			t.Fatalf("New(%v, %v, %v): %v", st, b, c, err)
		}
		seq := bo.Sequence()
		prev := b
		for n := 1; n <= 70; n++ {
			before := len(us)
			d := seq.Next()
			var u float64
			if len(us) > before {
				u = us[len(us)-1]
			}
			name := fmt.Sprintf("trial %d %v b=%d c=%d n=%d u=%v", trial, st, b, c, n, u)
			if d < 0 || d > c {
				t.Fatalf("%s: %d outside [0, cap]", name, d)
			}
			e := expExact(b, c, n)
			ef := math.Min(float64(c), big2(b, n))
			tol := func(x float64) float64 { return 2 + math.Abs(x)*0x1p-50 }
			switch st {
			case backoff.NoJitter:
				if d != e {
					t.Fatalf("%s: none %d want exp %d", name, d, e)
				}
			case backoff.FullJitter:
				want := u * ef
				if d >= e && e > 0 || math.Abs(float64(d)-want) > tol(want) {
					t.Fatalf("%s: full %d want U·exp = %v (exp %d)", name, d, want, e)
				}
			case backoff.EqualJitter:
				want := ef/2 + u*ef/2
				if (e > 1 && (d < e/2 || d >= e)) || math.Abs(float64(d)-want) > tol(want)+1 {
					t.Fatalf("%s: equal %d want %v in [exp/2, exp) exp=%d", name, d, want, e)
				}
			case backoff.Decorrelated:
				want := math.Min(float64(c), float64(b)+u*(float64(prev)*3-float64(b)))
				if d < b || math.Abs(float64(d)-want) > tol(want) {
					t.Fatalf("%s: decorrelated %d want %v (prev %d)", name, d, want, prev)
				}
			case backoff.Constant:
				if d != b {
					t.Fatalf("%s: constant %d", name, d)
				}
			case backoff.Linear:
				var want time.Duration
				if int64(c)/int64(b) < int64(n) {
					want = c
				} else {
					want = min(c, b*time.Duration(n))
				}
				if d != want {
					t.Fatalf("%s: linear %d want %d", name, d, want)
				}
			}
			prev = d
		}
	}
}

// TestAttackLoop3BackoffText: MarshalText/UnmarshalText round trips for the
// six strategies (names as String prints them), through encoding/json too;
// unknown values and other spellings are refused.
func TestAttackLoop3BackoffText(t *testing.T) {
	for s := backoff.Strategy(0); s < 6; s++ {
		txt, err := s.MarshalText()
		if err != nil || string(txt) != s.String() {
			t.Fatalf("%d: MarshalText %q %v", s, txt, err)
		}
		var back backoff.Strategy = 5 - s
		if err := back.UnmarshalText(txt); err != nil || back != s {
			t.Fatalf("%q: UnmarshalText %v %v", txt, back, err)
		}
		j, err := json.Marshal(struct{ S backoff.Strategy }{s})
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ S backoff.Strategy }
		v.S = 5 - s
		if err := json.Unmarshal(j, &v); err != nil || v.S != s {
			t.Fatalf("json %s: %v %v", j, v.S, err)
		}
		if _, err := json.Marshal(backoff.Strategy(6 + s)); err == nil {
			t.Fatalf("Strategy(%d) marshalled", 6+s)
		}
	}
	for _, bad := range []string{"", "Full", "FULL", "Strategy(1)", "full ", "1", "jitter"} {
		s := backoff.Decorrelated
		if err := s.UnmarshalText([]byte(bad)); err == nil || s != backoff.Decorrelated {
			t.Fatalf("%q accepted (%v) or changed the value", bad, s)
		}
	}
	if got := backoff.Strategy(200).String(); got != "Strategy(200)" {
		t.Fatalf("String %q", got)
	}
}

// TestAttackLoop3BackoffJitter: Jitter's [d, d+spread) and saturation.
func TestAttackLoop3BackoffJitter(t *testing.T) {
	for _, u := range []float64{0, 0.5, 1 - 0x1p-53, 1, 2, -1, math.NaN()} {
		b, _ := backoff.New(backoff.Config{Rand: func() float64 { return u }})
		for _, tc := range []struct{ d, s time.Duration }{
			{0, 1}, {5, 1}, {time.Second, time.Second / 2}, {math.MaxInt64 - 10, 100}, {math.MaxInt64, math.MaxInt64},
			{1 << 54, 1<<54 + 3}, {0, math.MaxInt64}, {-5, 3}, {7, 0}, {7, -1},
		} {
			got := b.Jitter(tc.d, tc.s)
			if tc.s <= 0 {
				if got != tc.d {
					t.Fatalf("u %v Jitter(%d,%d) = %d", u, tc.d, tc.s, got)
				}
				continue
			}
			sat := tc.d > math.MaxInt64-tc.s
			if got < tc.d || (!sat && got >= tc.d+tc.s) {
				t.Fatalf("u %v Jitter(%d,%d) = %d outside [d, d+spread)", u, tc.d, tc.s, got)
			}
		}
	}
}

// TestAttackLoop3HugeHintNeverSleeps: WithMaxRetryAfter: "With the default
// d, a hint of 484289 hours never puts a goroutine to sleep" (an attack
// found the sentence without "with the default d": with a maximum above
// the hint, the hint is slept, as the rest of the doc says).
func TestAttackLoop3HugeHintNeverSleeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := zzPolicy(t)
		done := make(chan error, 1)
		go func() {
			done <- p.Do(context.Background(), func(context.Context, int) error { return &zzErr{kind: "retry", hint: 484289 * time.Hour} })
		}()
		synctest.Wait()
		select {
		case err := <-done:
			if !errors.Is(err, retry.Deadline) {
				t.Errorf("gave up with %v, want Reason Deadline", err)
			}
		default:
			t.Fatal("a hint of 484289h put the call's goroutine to sleep with the default maximum")
		}
	})
}

// TestAttackLoop3QuarterMillenniumSleep: WithBackoff: "A delay of 250 years
// or more ... lasts until the call's context ends"; 249 years is slept.
func TestAttackLoop3QuarterMillenniumSleep(t *testing.T) {
	const year = 365 * 24 * time.Hour
	synctest.Test(t, func(t *testing.T) {
		b, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 260 * year})
		p := zzPolicy(t, retry.WithBackoff(b))
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(time.Hour); cancel() }()
		start := time.Now()
		err := p.Do(ctx, func(context.Context, int) error { return io.ErrUnexpectedEOF })
		if !errors.Is(err, retry.Canceled) || time.Since(start) != time.Hour {
			t.Fatalf("260y: %v after %v", err, time.Since(start))
		}
		b2, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 249 * year})
		p2 := zzPolicy(t, retry.WithBackoff(b2), retry.WithMaxAttempts(2))
		start = time.Now()
		n := 0
		err = p2.Do(context.Background(), func(context.Context, int) error { n++; return io.ErrUnexpectedEOF })
		if n != 2 || time.Since(start) != 249*year || !errors.Is(err, retry.AttemptsExhausted) {
			t.Fatalf("249y: n=%d %v after %v", n, err, time.Since(start))
		}
	})
}

// TestAttackLoop3IsRetryableRules: the documented first-match rules.
func TestAttackLoop3IsRetryableRules(t *testing.T) {
	canceledWithHint := fmt.Errorf("%w %w", context.Canceled, &zzErr{kind: "perm", hint: time.Second})
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"canceled beats hint", canceledWithHint, false},
		{"hint beats Temporary false", &zzErr{kind: "perm", hint: time.Second}, true},
		{"zero hint, Temporary false", &zzErr{kind: "perm"}, false},
		{"deadline", context.DeadlineExceeded, true},
		{"wrapped EOF in join", errors.Join(errors.New("a"), io.ErrUnexpectedEOF), true},
		{"plain", errors.New("x"), false},
		{"give-up", &retry.Error{Reason: retry.AttemptsExhausted, Err: io.ErrUnexpectedEOF}, false},
		{"bare reason", fmt.Errorf("w: %w", retry.Deadline), false},
		{"permanent timeout", retry.Permanent(context.DeadlineExceeded), false},
		{"io.EOF", io.EOF, false},
	} {
		if got := retry.IsRetryable(tc.err); got != tc.want {
			t.Errorf("%s: IsRetryable = %v, want %v", tc.name, got, tc.want)
		}
	}
	var none context.Context // IsProbe: "false for every other context, nil included"
	if retry.IsProbe(none) || retry.IsProbe(context.Background()) {
		t.Errorf("IsProbe true outside a probe")
	}
	var np *retry.Policy
	n := 0
	err := np.Do(context.Background(), func(context.Context, int) error { n++; return io.ErrUnexpectedEOF })
	if n != 3 || !errors.Is(err, retry.AttemptsExhausted) {
		t.Errorf("nil policy: n=%d %v", n, err)
	}
}
