package retry_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// outage is a dependency that fails with a 503 until end, then answers. It
// records when each attempt reached it and in what state the breaker was.
type outage struct {
	brk   *breaker.Breaker
	start time.Time
	end   time.Duration // since start

	mu       sync.Mutex
	attempts []attemptAt
}

type attemptAt struct {
	at    time.Duration // since start
	state breaker.State
}

func (a attemptAt) String() string { return a.at.String() + " " + a.state.String() }

func (o *outage) op(ctx context.Context, attempt int) error {
	at := time.Since(o.start)
	o.mu.Lock()
	o.attempts = append(o.attempts, attemptAt{at, o.brk.State()})
	o.mu.Unlock()
	if at < o.end {
		return err503
	}
	return nil
}

// tripDuringOutage opens brk the way traffic does: MinCalls failing calls,
// each of them one attempt through a policy of its own without a deadline.
func tripDuringOutage(t *testing.T, brk *breaker.Breaker, o *outage) {
	t.Helper()
	others := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithMaxAttempts(1))
	for range brk.Config().MinCalls {
		calls := 0
		_ = others.Do(context.Background(), script(&calls, err503))
	}
	if s := brk.State(); s != breaker.Open {
		t.Fatalf("breaker after %d failures = %v, want open", brk.Config().MinCalls, s)
	}
	o.mu.Lock()
	o.attempts = nil // the traffic that tripped it is not the call under test
	o.mu.Unlock()
}

// TestWaitOutTheOutage: a call with a 20 s deadline meets a breaker that
// opened during a 10 s outage (default probe settings: a round of 3 probes
// every OpenFor, 1 s). It sends no attempt while the breaker is open,
// succeeds within 1 s of the dependency's recovery (1.2 s when the open
// periods are jittered by ±20%), and spends at most its 3 attempts. The
// same call without a deadline fails fast.
//
// The call is the only one waiting, so every probe round of the outage is
// handed to it: those probes are the breaker's (one per round, whoever
// waits), and must not use up the call's attempts, or the call gives up
// three rounds into the outage. So the call's own attempts are counted as
// the ones it sent while the breaker was closed; probes are counted apart,
// and bounded by one per round.
func TestWaitOutTheOutage(t *testing.T) {
	for _, tt := range []struct {
		name  string
		rand  func() float64 // the breaker's; nil: the runtime's (open periods 0.8-1.2 s)
		after time.Duration  // success within this long of the recovery
	}{
		{"open periods exactly 1s", half, time.Second},
		{"open periods jittered", nil, 1200 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brk, err := breaker.New(breaker.Config{Rand: tt.rand})
				if err != nil {
					t.Fatal(err)
				}
				if c := brk.Config(); c.OpenFor != time.Second || c.Probes != 3 {
					t.Fatalf("default probe settings = OpenFor %v, Probes %d; want 1s, 3", c.OpenFor, c.Probes)
				}
				o := &outage{brk: brk, start: time.Now(), end: 10 * time.Second}
				tripDuringOutage(t, brk, o)
				p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: brk}))
				if err != nil {
					t.Fatal(err)
				}

				// Without a deadline: rejected at once, nothing sent.
				before := time.Now()
				err = p.Do(context.Background(), o.op)
				re := checkStop(t, err, retry.CircuitOpen, 0)
				var oe *breaker.OpenError
				if !errors.As(re.Err, &oe) {
					t.Errorf("Err = %v, want the *breaker.OpenError", re.Err)
				}
				if waited := time.Since(before); waited != 0 {
					t.Errorf("call without a deadline waited %v, want 0", waited)
				}
				if len(o.attempts) != 0 {
					t.Errorf("call without a deadline sent %v", o.attempts)
				}

				// With a 20 s deadline: waits, succeeds after the recovery.
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				err = p.Do(ctx, o.op)
				done := time.Since(o.start)
				var own, probes int
				for _, a := range o.attempts {
					switch a.state {
					case breaker.Open:
						t.Errorf("attempt at %v sent while the breaker was open", a.at)
					case breaker.HalfOpen:
						probes++
					default:
						own++
					}
				}
				t.Logf("attempts (since the outage began, breaker state): %v; done at %v", o.attempts, done)
				if err != nil {
					t.Errorf("Do with a 20s deadline = %v at %v, want success within %v of the recovery at %v",
						err, done, tt.after, o.end)
				} else if done < o.end || done > o.end+tt.after {
					t.Errorf("Do succeeded at %v, want within %v of the recovery at %v", done, tt.after, o.end)
				}
				if own > 3 {
					t.Errorf("Do spent %d attempts of its own (breaker closed), want at most 3", own)
				}
				if limit := int(done/(800*time.Millisecond)) + 1; probes > limit {
					t.Errorf("Do sent %d probes in %v, more than one per probe round (%d)", probes, done, limit)
				}
			})
		})
	}
}

// openBreaker returns a breaker with OpenFor 1 s exactly, one probe a
// round, tripped by one failure at the bubble's now.
func openBreaker(t *testing.T, edit func(*breaker.Config)) *breaker.Breaker {
	t.Helper()
	c := breaker.Config{MinCalls: 1, Probes: 1, Rand: half}
	if edit != nil {
		edit(&c)
	}
	brk, err := breaker.New(c)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := brk.Allow()
	if err != nil {
		t.Fatal(err)
	}
	brk.Done(pm, false)
	if s := brk.State(); s != breaker.Open {
		t.Fatalf("breaker after a failure = %v, want open", s)
	}
	return brk
}

// TestBreakerWaitCases: what a call with or without a deadline does when it
// meets an open breaker (probe round in 1 s).
func TestBreakerWaitCases(t *testing.T) {
	tests := []struct {
		name      string
		edit      func(*breaker.Config)
		timeout   time.Duration // the policy's; 0: none
		hold      bool          // another caller holds the round's only probe
		cancelAt  time.Duration // cancel the parent then; 0: never
		wantErr   retry.Reason  // 0: success
		wantAt    time.Duration // when Do returns
		wantCalls int
	}{
		{"no deadline: fails fast", nil, 0, false, 0, retry.CircuitOpen, 0, 0},
		{"deadline before the round: fails fast", nil, 999 * time.Millisecond, false, 0, retry.CircuitOpen, 0, 0},
		{"deadline at the round: fails fast", nil, time.Second, false, 0, retry.CircuitOpen, 0, 0},
		{"waiting turned off: fails fast", func(c *breaker.Config) { c.MaxWaiters = -1 }, 5 * time.Second, false, 0, retry.CircuitOpen, 0, 0},
		{"deadline after the round: waits, probes", nil, 5 * time.Second, false, 0, 0, time.Second, 1},
		{"probe taken: waits until the deadline", nil, 5 * time.Second, true, 0, retry.CircuitOpen, 5 * time.Second, 0},
		{"canceled while waiting", nil, 5 * time.Second, false, 500 * time.Millisecond, retry.Canceled, 500 * time.Millisecond, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brk := openBreaker(t, tt.edit)
				b := &countingBudget{inner: mustBudget(t, 0.1, 1)}
				p := mustNew(t, retry.WithGuards(retry.Guards{Budget: b, Breaker: brk}))
				if tt.hold {
					// Another caller, with more time left than ours (10 s
					// against 5 s), is handed the round's probe at 1 s and
					// holds it past our deadline.
					finished := make(chan struct{})
					defer close(finished)
					go func() {
						pm, err := brk.Wait(context.Background(), 10*time.Second)
						if err != nil || !pm.Probe() {
							t.Errorf("other caller's Wait = %+v, %v; want the probe", pm, err)
							return
						}
						<-finished
						brk.Cancel(pm)
					}()
					synctest.Wait()
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tt.timeout > 0 {
					var cancelDL context.CancelFunc
					ctx, cancelDL = context.WithTimeout(ctx, tt.timeout)
					defer cancelDL()
				}
				if tt.cancelAt > 0 {
					time.AfterFunc(tt.cancelAt, cancel)
				}
				start := time.Now()
				var state []breaker.State
				calls := 0
				err := p.Do(ctx, func(ctx context.Context, attempt int) error {
					calls++
					state = append(state, brk.State())
					return nil
				})
				if at := time.Since(start); at != tt.wantAt {
					t.Errorf("Do returned after %v, want %v", at, tt.wantAt)
				}
				if calls != tt.wantCalls {
					t.Errorf("op called %d times, want %d", calls, tt.wantCalls)
				}
				if d := b.deposits.Load(); d != int64(tt.wantCalls) {
					t.Errorf("deposits = %d, want %d: a call deposits when it sends, not while it waits", d, tt.wantCalls)
				}
				if tt.wantErr == 0 {
					if err != nil {
						t.Fatalf("Do = %v, want nil", err)
					}
					if state[0] != breaker.HalfOpen || brk.State() != breaker.Closed {
						t.Errorf("attempt in state %v, breaker after it %v; want a probe that closes it", state[0], brk.State())
					}
					return
				}
				re := checkStop(t, err, tt.wantErr, 0)
				if tt.wantErr == retry.CircuitOpen {
					var oe *breaker.OpenError
					if !errors.As(re.Err, &oe) || !errors.Is(err, breaker.ErrOpen) {
						t.Errorf("Do = %v: Err = %#v, want the *breaker.OpenError", err, re.Err)
					}
				}
			})
		})
	}
}

// TestWaitAfterAFailureThatOpens: a failure that opens the breaker does not
// end a call that has time for the next probe round: it waits, and its
// next attempt is the probe. Without the time, it stops at once.
func TestWaitAfterAFailureThatOpens(t *testing.T) {
	for _, tt := range []struct {
		timeout   time.Duration
		wantCalls int
		wantErr   retry.Reason // 0: success
		wantAt    time.Duration
	}{
		{5 * time.Second, 2, 0, time.Second},
		{900 * time.Millisecond, 1, retry.CircuitOpen, 0},
		{0, 1, retry.CircuitOpen, 0},
	} {
		synctest.Test(t, func(t *testing.T) {
			brk, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, Rand: half})
			if err != nil {
				t.Fatal(err)
			}
			b := &countingBudget{inner: mustBudget(t, 0.1, 1)}
			p := mustNew(t, retry.WithGuards(retry.Guards{Budget: b, Breaker: brk}),
				retry.WithBackoff(mustBackoff(t, 0, 100*time.Millisecond, time.Second, 0.5)))
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			start := time.Now()
			calls := 0
			var probe []bool
			err = p.Do(ctx, func(ctx context.Context, attempt int) error {
				calls++
				probe = append(probe, brk.State() == breaker.HalfOpen)
				if attempt == 1 {
					return err503 // opens the breaker for 1 s
				}
				return nil
			})
			at := time.Since(start)
			if calls != tt.wantCalls || at != tt.wantAt {
				t.Errorf("timeout %v: %d calls, returned at %v; want %d at %v", tt.timeout, calls, at, tt.wantCalls, tt.wantAt)
			}
			if tt.wantErr != 0 {
				re := checkStop(t, err, tt.wantErr, 1)
				if re.Err != err503 || !errors.Is(err, breaker.ErrOpen) {
					t.Errorf("timeout %v: Do = %v, want the 503 as Err and the breaker's rejection reachable", tt.timeout, err)
				}
				if n := b.withdraws.Load() + b.refused.Load(); n != 0 {
					t.Errorf("timeout %v: %d withdrawals asked for a retry that could not run", tt.timeout, n)
				}
				return
			}
			if err != nil {
				t.Fatalf("timeout %v: Do = %v, want success", tt.timeout, err)
			}
			if !slices.Equal(probe, []bool{false, true}) {
				t.Errorf("timeout %v: attempts were probes %v, want [false true]", tt.timeout, probe)
			}
			if w := b.withdraws.Load(); w != 1 {
				t.Errorf("timeout %v: withdrawals = %d, want 1 for the one retry", tt.timeout, w)
			}
		})
	}
}

// TestHintSetsTheEarliestProbe: a failure is reported with its server hint
// (breaker.Fail), so the breaker it opens probes no sooner than the hint
// (spread by U·hint/2: 5 s + 0.5 × 2.5 s here), not after its 1 s OpenFor.
func TestHintSetsTheEarliestProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, Rand: half})
		if err != nil {
			t.Fatal(err)
		}
		// U 0: the loop would sleep the 5 s hint itself, before the probe.
		p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithBackoff(mustBackoff(t, 0, 100*time.Millisecond, time.Second, 0)))
		calls := 0
		err = p.Do(context.Background(), script(&calls, &statusErr{Code: 503, After: 5 * time.Second}))
		re := checkStop(t, err, retry.CircuitOpen, 1)
		if got, want := brk.Snapshot().HalfOpenIn, 6250*time.Millisecond; got != want {
			t.Errorf("breaker half-opens in %v, want %v (the hint, spread)", got, want)
		}
		// The give-up's hint is when the breaker probes again, not the last
		// error's 5 s: that is when calling again can be admitted.
		if got := retry.RetryAfter(re); got != 6250*time.Millisecond {
			t.Errorf("RetryAfter(%v) = %v, want the breaker's 6.25s", err, got)
		}
		if got := retry.RetryAfter(re.Err); got != 5*time.Second {
			t.Errorf("RetryAfter(Err) = %v, want the last error's 5s", got)
		}
	})
}

// TestReleasedAfterClose: a call waiting behind an open breaker whose probe
// another caller holds is released when that probe succeeds and the breaker
// closes; its attempt is then an ordinary one.
func TestReleasedAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk := openBreaker(t, func(c *breaker.Config) { c.ReleaseRate = -1 }) // release all at once
		go func() {
			// A waiter with less time left (2 s against 5 s) is handed the
			// probe at 1 s; it succeeds 200 ms later and closes the
			// breaker.
			pm, err := brk.Wait(context.Background(), 10*time.Second)
			if err != nil || !pm.Probe() {
				t.Errorf("other caller's Wait = %+v, %v; want the probe", pm, err)
				return
			}
			time.Sleep(200 * time.Millisecond)
			brk.Done(pm, true)
		}()
		synctest.Wait()
		p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		var state breaker.State
		err := p.Do(ctx, func(ctx context.Context, attempt int) error {
			state = brk.State()
			return nil
		})
		if err != nil {
			t.Fatalf("Do = %v, want success after the close", err)
		}
		if at := time.Since(start); at != 1200*time.Millisecond || state != breaker.Closed {
			t.Errorf("attempt at %v in state %v, want at 1.2s (the close) in state closed", at, state)
		}
	})
}
