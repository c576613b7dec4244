package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// rlRig is a limiter of 10 slots, 9 of them held from outside, so that a
// slot given back twice shows (the in-flight count would fall below what
// is really held) and so does one never given back. With at least half the
// limit in flight, every attempt is a latency sample (package limit), so
// SetRate's sample count tells a sample from a drop.
type rlRig struct {
	lim  *limit.Limiter
	held []limit.Permit
}

func rlDone() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func rlNewRig(t *testing.T, c limit.Config) *rlRig {
	t.Helper()
	if c.Max == 0 {
		c.Max = 10
	}
	lim, err := limit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	r := &rlRig{lim: lim}
	for range lim.Limit() - 1 {
		p, err := lim.Acquire(rlDone())
		if err != nil {
			t.Fatalf("hold: %v", err)
		}
		r.held = append(r.held, p)
	}
	r.samples() // reset
	return r
}

// free counts the free slots (up to 3) with Acquire on a done context, and
// gives them back.
// giveBack releases p, the slot a test held, and checks that every slot
// of the rig's limiter is free then.
func (r *rlRig) giveBack(t *testing.T, p limit.Permit) {
	t.Helper()
	r.lim.Release(p, false)
	if f := r.free(); f != 1 {
		t.Errorf("free %d", f)
	}
}

func (r *rlRig) free() int {
	var ps []limit.Permit
	for range 3 {
		p, err := r.lim.Acquire(rlDone())
		if err != nil {
			break
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		r.lim.Release(p, false)
	}
	return len(ps)
}

func (r *rlRig) samples() int {
	_, _, _, _, _, n := r.lim.SetRate(math.NaN(), 0)
	return n
}

type rlBudget struct{ dep, wd atomic.Int32 }

func (b *rlBudget) Deposit()       { b.dep.Add(1) }
func (b *rlBudget) Withdraw() bool { b.wd.Add(1); return true }

type rlObs struct {
	mu sync.Mutex
	ev []observe.Event
}

func (o *rlObs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.ev = append(o.ev, e)
	o.mu.Unlock()
}

func (o *rlObs) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := ""
	for _, e := range o.ev {
		s += fmt.Sprintf("[%s #%d %s %s] ", e.Kind, e.Attempt, e.Outcome, e.Reason)
	}
	return s
}

type rlTemp struct{}

func (rlTemp) Error() string   { return "transient" }
func (rlTemp) Temporary() bool { return true }

var errPlainAnswer = errors.New("plain answer")

func rlPolicy(t *testing.T, g retry.Guards, opts ...retry.Option) *retry.Policy {
	t.Helper()
	p, err := retry.New(append([]retry.Option{retry.WithGuards(g), retry.WithBackoff(rlBackoff(t))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func rlBackoff(t *testing.T) *backoff.Backoff {
	return mustBackoff(t, 0, time.Millisecond, time.Millisecond, 0.99)
}

// TestAttackLimitSlotGivenBackOnceAsDocumented: every way an attempt ends, in the
// table of docs/limit.md, "Where it sits": the slot comes back exactly once,
// as a sample or a drop as the table says.
func TestAttackLimitSlotGivenBackOnceAsDocumented(t *testing.T) {
	type tc struct {
		name    string
		opts    []retry.Option
		ctx     func() (context.Context, context.CancelFunc)
		run     func(ctx context.Context, p *retry.Policy, cancel context.CancelFunc) error
		samples int
	}
	bg := func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }
	dl := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Second)
	}
	do := func(op func(context.Context, int) error) func(context.Context, *retry.Policy, context.CancelFunc) error {
		return func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error { return p.Do(ctx, op) }
	}
	cases := []tc{
		{"success", nil, bg, do(func(context.Context, int) error { return nil }), 1},
		{"plain error", nil, bg, do(func(context.Context, int) error { return errPlainAnswer }), 1},
		{"retryable once", []retry.Option{retry.WithMaxAttempts(1)}, bg, do(func(context.Context, int) error { return rlTemp{} }), 0},
		{"retryable then success", nil, bg, do(func(_ context.Context, a int) error {
			if a == 1 {
				return io.ErrUnexpectedEOF
			}
			return nil
		}), 1},
		{"permanent retryable", nil, bg, do(func(context.Context, int) error { return retry.Permanent(rlTemp{}) }), 0},
		{"permanent plain", nil, bg, do(func(context.Context, int) error { return retry.Permanent(errPlainAnswer) }), 1},
		{"attempt timeout", []retry.Option{retry.WithMaxAttempts(1), retry.WithAttemptTimeout(10 * time.Millisecond)}, bg,
			do(func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() }), 0},
		{"attempt timeout plain", []retry.Option{retry.WithMaxAttempts(1), retry.WithAttemptTimeout(10 * time.Millisecond)}, bg,
			do(func(ctx context.Context, _ int) error { <-ctx.Done(); return errPlainAnswer }), 0},
		{"attempt timeout, classifier says no", []retry.Option{retry.WithAttemptTimeout(10 * time.Millisecond), retry.WithClassifier(func(error) bool { return false })}, bg,
			do(func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() }), 0},
		{"call deadline plain", nil, dl, do(func(ctx context.Context, _ int) error { <-ctx.Done(); return errPlainAnswer }), 0},
		{"call deadline plain, attempt timeout", []retry.Option{retry.WithAttemptTimeout(time.Hour)}, dl, do(func(ctx context.Context, _ int) error { <-ctx.Done(); return errPlainAnswer }), 0},
		{"call deadline passes, op ignores ctx", nil, dl, do(func(ctx context.Context, _ int) error { time.Sleep(2 * time.Second); return errPlainAnswer }), 0},
		{"canceled during attempt", nil, bg, func(ctx context.Context, p *retry.Policy, cancel context.CancelFunc) error {
			return p.Do(ctx, func(context.Context, int) error { cancel(); return errPlainAnswer })
		}, 0},
		{"canceled during attempt, deadline", nil, dl, func(ctx context.Context, p *retry.Policy, cancel context.CancelFunc) error {
			return p.Do(ctx, func(context.Context, int) error { cancel(); return errPlainAnswer })
		}, 0},
		{"canceled during sleep", []retry.Option{retry.WithBackoff(mustBackoff(t, 0, time.Second, time.Second, 0.99))}, bg, func(ctx context.Context, p *retry.Policy, cancel context.CancelFunc) error {
			go func() { time.Sleep(100 * time.Millisecond); cancel() }()
			return p.Do(ctx, func(context.Context, int) error { return rlTemp{} })
		}, 0},
		{"DoValueIf again", []retry.Option{retry.WithMaxAttempts(1)}, bg, func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error {
			_, err := retry.DoValueIf(ctx, p, func(context.Context, int) (int, error) { return 1, nil }, func(int) bool { return true })
			return err
		}, 0},
		{"DoValueIf again then ok", nil, bg, func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error {
			_, err := retry.DoValueIf(ctx, p, func(_ context.Context, a int) (int, error) { return a, nil }, func(v int) bool { return v == 1 })
			return err
		}, 1},
		{"DoValueIf plain error", nil, bg, func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error {
			_, err := retry.DoValueIf(ctx, p, func(context.Context, int) (int, error) { return 0, errPlainAnswer }, func(int) bool { return true })
			return err
		}, 1},
		{"DoValue success", nil, bg, func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error {
			_, err := retry.DoValue(ctx, p, func(context.Context, int) (int, error) { return 1, nil })
			return err
		}, 1},
		{"panic", nil, bg, do(func(context.Context, int) error { panic("boom") }), 0},
		{"panic error", nil, bg, do(func(context.Context, int) error { panic(io.EOF) }), 0},
		{"goexit", nil, bg, func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error {
			done := make(chan struct{})
			go func() {
				defer close(done)
				_ = p.Do(ctx, func(context.Context, int) error { runtime.Goexit(); return nil })
			}()
			<-done
			return nil
		}, 0},
		{"DoValueIf predicate panics", nil, bg, func(ctx context.Context, p *retry.Policy, _ context.CancelFunc) error {
			_, err := retry.DoValueIf(ctx, p, func(context.Context, int) (int, error) { return 1, nil }, func(int) bool { panic("pred") })
			return err
		}, 0},
		{"panic after a retry", nil, bg, do(func(_ context.Context, a int) error {
			if a == 1 {
				return rlTemp{}
			}
			panic("boom 2")
		}), 0},
	}
	for _, withObs := range []bool{false, true} {
		for _, withBrk := range []bool{false, true} {
			for _, c := range cases {
				name := fmt.Sprintf("%s/obs=%v/brk=%v", c.name, withObs, withBrk)
				t.Run(name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						r := rlNewRig(t, limit.Config{})
						g := retry.Guards{Limiter: r.lim, Budget: &rlBudget{}}
						if withBrk {
							brk, err := breaker.New(breaker.Config{})
							if err != nil {
								t.Fatal(err)
							}
							g.Breaker = brk
						}
						opts := append([]retry.Option(nil), c.opts...)
						if withObs {
							opts = append(opts, retry.WithObserver(&rlObs{}))
						}
						p := rlPolicy(t, g, opts...)
						ctx, cancel := c.ctx()
						defer cancel()
						func() {
							defer func() { recover() }()
							_ = c.run(ctx, p, cancel)
						}()
						if f := r.free(); f != 1 {
							t.Errorf("free slots after the call = %d, want 1 (0: not given back, 2: given back twice)", f)
						}
						if s := r.samples(); s != c.samples {
							t.Errorf("latency samples = %d, want %d", s, c.samples)
						}
					})
				})
			}
		}
	}
}

// TestAttackLimitRefusalFirstAttempt: a full limiter with waiting off refuses the
// first attempt: nothing sent, no deposit, the breaker's probe given back,
// Reason Limited, Err the limiter's error, a GiveUp "limited" and no
// attempt events.
func TestAttackLimitRefusalFirstAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := rlNewRig(t, limit.Config{Waiting: -1})
		hold, err := r.lim.Acquire(rlDone())
		if err != nil {
			t.Fatal(err)
		}
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1})
		brk.Trip(0)
		time.Sleep(2 * time.Second) // half-open: one probe
		b := &rlBudget{}
		o := &rlObs{}
		p := rlPolicy(t, retry.Guards{Limiter: r.lim, Breaker: brk, Budget: b}, retry.WithObserver(o), retry.WithName("d"))
		sent := 0
		err = p.Do(context.Background(), func(context.Context, int) error { sent++; return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Limited || re.Attempts != 0 || !errors.Is(err, limit.ErrLimited) || !errors.Is(re.Err, limit.ErrLimited) {
			t.Errorf("err = %#v", err)
		}
		if sent != 0 || b.dep.Load() != 0 || b.wd.Load() != 0 {
			t.Errorf("sent %d deposits %d withdrawals %d", sent, b.dep.Load(), b.wd.Load())
		}
		if got := o.String(); got != "[give-up #0  limited] " {
			t.Errorf("events %s", got)
		}
		if pm, err := brk.Allow(); err != nil {
			t.Errorf("the probe was not given back: %v", err)
		} else {
			brk.Cancel(pm)
		}
		r.lim.Release(hold, false)
	})
}

// TestAttackLimitRefusalLaterAttempt: the limiter refuses the retry: Reason Limited,
// Attempts 1, Err the operation's last error, ErrLimited reachable; the
// budget: one deposit, one withdrawal; events: start, end, retry, give-up
// limited.
func TestAttackLimitRefusalLaterAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := rlNewRig(t, limit.Config{Waiting: -1})
		brk, _ := breaker.New(breaker.Config{})
		b := &rlBudget{}
		o := &rlObs{}
		took := make(chan limit.Permit, 1)
		// Take the last free slot during the backoff sleep.
		p3 := rlPolicy(t, retry.Guards{Limiter: r.lim, Breaker: brk, Budget: b}, retry.WithObserver(o),
			retry.WithBackoff(mustBackoff(t, 0, time.Second, time.Second, 0.99)))
		go func() {
			time.Sleep(10 * time.Millisecond)
			pm, err := r.lim.Acquire(rlDone())
			if err != nil {
				t.Errorf("take: %v", err)
			}
			took <- pm
		}()
		sent := 0
		err := p3.Do(context.Background(), func(_ context.Context, a int) error {
			sent++
			return io.ErrUnexpectedEOF
		})
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Limited || re.Attempts != 1 || re.Err != io.ErrUnexpectedEOF || !errors.Is(err, limit.ErrLimited) {
			t.Errorf("err = %v (%#v)", err, re)
		}
		if sent != 1 || b.dep.Load() != 1 || b.wd.Load() != 1 {
			t.Errorf("sent %d deposits %d withdrawals %d", sent, b.dep.Load(), b.wd.Load())
		}
		if got := o.String(); got != "[attempt-start #1  ] [attempt-end #1 failure ] [retry #1 backoff ] [give-up #1  limited] " {
			t.Errorf("events %s", got)
		}
		r.giveBack(t, <-took)
	})
}

// TestAttackLimitCancelWhileWaitingForSlot: a call canceled while it waits for a
// slot ends with Canceled, nothing sent, nothing deposited, the breaker's
// permit given back; with and without a deadline; first attempt and retry.
func TestAttackLimitCancelWhileWaitingForSlot(t *testing.T) {
	for _, withDL := range []bool{false, true} {
		for _, retryAttempt := range []bool{false, true} {
			t.Run(fmt.Sprintf("deadline=%v/retry=%v", withDL, retryAttempt), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					r := rlNewRig(t, limit.Config{})
					brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1})
					b := &rlBudget{}
					o := &rlObs{}
					p := rlPolicy(t, retry.Guards{Limiter: r.lim, Breaker: brk, Budget: b}, retry.WithObserver(o),
						retry.WithBackoff(mustBackoff(t, 0, 100*time.Millisecond, 100*time.Millisecond, 0.99)))
					ctx, cancel := context.WithCancel(context.Background())
					if withDL {
						ctx, cancel = context.WithTimeout(context.Background(), time.Hour)
					}
					held := make(chan limit.Permit, 1)
					if !retryAttempt {
						hold, _ := r.lim.Acquire(rlDone())
						held <- hold
					} else {
						go func() {
							time.Sleep(10 * time.Millisecond) // during the backoff sleep
							hold, _ := r.lim.Acquire(rlDone())
							held <- hold
						}()
					}
					go func() {
						time.Sleep(time.Second)
						cancel()
					}()
					sent := 0
					err := p.Do(ctx, func(_ context.Context, a int) error {
						sent++
						return io.ErrUnexpectedEOF
					})
					want := 0
					if retryAttempt {
						want = 1
					}
					var re *retry.Error
					if !errors.As(err, &re) || re.Reason != retry.Canceled || re.Attempts != want || !errors.Is(err, context.Canceled) {
						t.Errorf("err = %v (%+v)", err, re)
					}
					if sent != want || int(b.dep.Load()) != want {
						t.Errorf("sent %d deposits %d", sent, b.dep.Load())
					}
					time.Sleep(2 * time.Second)
					r.giveBack(t, <-held)
					t.Logf("events %s", o)
				})
			})
		}
	}
}

// TestAttackLimitDeadlineWhileWaitingForSlot: a call that waits for a slot until
// its deadline ends with Reason Limited, errors.Is ErrLimited.
func TestAttackLimitDeadlineWhileWaitingForSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := rlNewRig(t, limit.Config{})
		hold, _ := r.lim.Acquire(rlDone())
		brk, _ := breaker.New(breaker.Config{})
		b := &rlBudget{}
		o := &rlObs{}
		p := rlPolicy(t, retry.Guards{Limiter: r.lim, Breaker: brk, Budget: b}, retry.WithObserver(o))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		sent := 0
		err := p.Do(ctx, func(context.Context, int) error { sent++; return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Limited || re.Attempts != 0 || !errors.Is(err, limit.ErrLimited) {
			t.Errorf("err = %v (%+v)", err, re)
		}
		if sent != 0 || b.dep.Load() != 0 {
			t.Errorf("sent %d deposits %d", sent, b.dep.Load())
		}
		if got := o.String(); got != "[give-up #0  limited] " {
			t.Errorf("events %s", got)
		}
		r.giveBack(t, hold)
	})
}

// TestAttackLimitCancelBeforeGrantSendsNothing: the caller cancels, and only then
// is a slot released to its waiting call. The call was canceled while it
// waited; docs/limit.md: it ends with retry.Canceled; Guards.Budget: a
// call whose context ended before it started sends nothing and deposits
// nothing; Do: canceling the context stops the loop at once.
func TestAttackLimitCancelBeforeGrantSendsNothing(t *testing.T) {
	sentAfterCancel := 0
	for i := range 40 {
		synctest.Test(t, func(t *testing.T) {
			r := rlNewRig(t, limit.Config{})
			hold, _ := r.lim.Acquire(rlDone())
			b := &rlBudget{}
			p := rlPolicy(t, retry.Guards{Limiter: r.lim, Budget: b})
			ctx, cancel := context.WithCancel(context.Background())
			var canceled atomic.Bool
			released := make(chan struct{})
			go func() {
				defer close(released)
				time.Sleep(time.Second)
				canceled.Store(true)
				cancel()
				r.lim.Release(hold, false) // after the cancel
			}()
			var sentCanceled bool
			err := p.Do(ctx, func(actx context.Context, _ int) error {
				sentCanceled = canceled.Load()
				return actx.Err()
			})
			if sentCanceled {
				sentAfterCancel++
				if i < 40 && sentAfterCancel == 1 {
					t.Logf("run %d: op called after its caller canceled while waiting for a slot: err %v, deposits %d", i, err, b.dep.Load())
				}
			}
			// Do may return on the cancel before the goroutine gives the
			// held slot back: count the free slots after it did.
			<-released
			if f := r.free(); f != 1 {
				t.Errorf("free %d", f)
			}
		})
	}
	if sentAfterCancel > 0 {
		t.Errorf("%d of 40 calls canceled while waiting for a slot sent their attempt anyway (and deposited)", sentAfterCancel)
	}
}

// TestAttackLimitTurnRuleRefusesWithLimited: the new turn rule: a waiting call whose
// slot comes with less than twice the destination's latency left fails when
// a later call has the time; through the retry loop it ends with Reason
// Limited, sends nothing, deposits nothing, and the slot goes to the later call.
func TestAttackLimitTurnRuleRefusesWithLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		// teach it a latency of 100 ms
		for range 20 {
			pm, err := lim.Acquire(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			lim.Release(pm, false)
		}
		hold, _ := lim.Acquire(context.Background())
		b := &rlBudget{}
		o := &rlObs{}
		brk, _ := breaker.New(breaker.Config{})
		p := rlPolicy(t, retry.Guards{Limiter: lim, Budget: b, Breaker: brk}, retry.WithObserver(o))
		ctxA, cA := context.WithTimeout(context.Background(), 550*time.Millisecond)
		defer cA()
		ctxB, cB := context.WithTimeout(context.Background(), 5*time.Second)
		defer cB()
		var errA, errB error
		var sentA, sentB int
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			errA = p.Do(ctxA, func(context.Context, int) error { sentA++; return nil })
		}()
		go func() {
			defer wg.Done()
			errB = p.Do(ctxB, func(context.Context, int) error { sentB++; time.Sleep(100 * time.Millisecond); return nil })
		}()
		time.Sleep(400 * time.Millisecond) // A has 100 ms left < 2*100 ms
		lim.Release(hold, false)
		wg.Wait()
		var re *retry.Error
		if !errors.As(errA, &re) || re.Reason != retry.Limited || re.Attempts != 0 || !errors.Is(errA, limit.ErrLimited) || sentA != 0 {
			t.Errorf("A: err %v sent %d", errA, sentA)
		}
		if errB != nil || sentB != 1 {
			t.Errorf("B: err %v sent %d", errB, sentB)
		}
		if b.dep.Load() != 1 {
			t.Errorf("deposits %d, want 1 (B only)", b.dep.Load())
		}
		t.Logf("A: %v; events %s", errA, o)
		if pm, err := lim.Acquire(rlDone()); err != nil {
			t.Errorf("slot not back: %v", err)
		} else {
			lim.Release(pm, false)
		}
	})
}

// TestAttackLimitRateLimitBeforeBreakerAndSlot: WithRateLimit waits before the
// breaker and the slot; a refusal by it ends with Deadline and holds no slot.
type rlRate struct {
	err error
	lim *limit.Limiter
	n   int
}

func (z *rlRate) Wait(ctx context.Context) error {
	z.n++
	if z.lim != nil {
		// no slot is held while the rate limiter waits
		p, err := z.lim.Acquire(rlDone())
		if err != nil {
			return fmt.Errorf("slot held during rate wait: %w", err)
		}
		z.lim.Release(p, false)
	}
	return z.err
}

func TestAttackLimitRateLimitBeforeBreakerAndSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1, Waiting: -1})
		rl := &rlRate{lim: lim}
		b := &rlBudget{}
		p := rlPolicy(t, retry.Guards{Limiter: lim, Budget: b}, retry.WithRateLimit(rl))
		err := p.Do(context.Background(), func(_ context.Context, a int) error {
			if a < 3 {
				return io.ErrUnexpectedEOF
			}
			return nil
		})
		if err != nil || rl.n != 3 {
			t.Errorf("err %v waits %d", err, rl.n)
		}
		rl.err = errors.New("rate refused")
		err = p.Do(context.Background(), func(context.Context, int) error { return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline || !errors.Is(err, rl.err) {
			t.Errorf("err %v", err)
		}
		if pm, err := lim.Acquire(rlDone()); err != nil {
			t.Errorf("slot not back: %v", err)
		} else {
			lim.Release(pm, false)
		}
	})
}

// TestAttackLimitSlotAtDeadlineSendsNothing: a slot released to a waiting call at
// the instant its deadline passes. docs/limit.md: a slot is taken by waiting
// "within the call's deadline"; retry.Limited: "or it waited until its
// deadline"; Guards.Budget: a call refused by the limiter sends nothing and
// deposits nothing. The loop checks the deadline after the breaker's wait
// and the rate limiter's (sending nothing at the deadline), but after a
// wait for a slot?
func TestAttackLimitSlotAtDeadlineSendsNothing(t *testing.T) {
	bad := 0
	var last string
	for range 40 {
		synctest.Test(t, func(t *testing.T) {
			r := rlNewRig(t, limit.Config{})
			hold, _ := r.lim.Acquire(rlDone())
			b := &rlBudget{}
			p := rlPolicy(t, retry.Guards{Limiter: r.lim, Budget: b})
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			deadline, _ := ctx.Deadline()
			go func() {
				time.Sleep(time.Second) // the deadline
				r.lim.Release(hold, false)
			}()
			sent := 0
			var left time.Duration
			err := p.Do(ctx, func(actx context.Context, _ int) error {
				sent++
				left = time.Until(deadline)
				if dl, ok := actx.Deadline(); ok && !time.Now().Before(dl) {
					return context.DeadlineExceeded // what a real send with no time left returns
				}
				return actx.Err()
			})
			if sent > 0 {
				bad++
				last = fmt.Sprintf("op called with %v left; err %v; deposits %d", left, err, b.dep.Load())
			}
			time.Sleep(time.Second)
			if f := r.free(); f != 1 {
				t.Errorf("free %d", f)
			}
		})
	}
	if bad > 0 {
		t.Errorf("%d of 40 calls sent an attempt with no time left after waiting for a slot until the deadline: %s", bad, last)
	}
}

type rlPanicObs struct{ kind observe.Kind }

func (o rlPanicObs) Observe(_ context.Context, e observe.Event) {
	if e.Kind == o.kind {
		panic("observer")
	}
}

// TestAttackLimitPanicOutsideOpKeepsSlot: panics on the call's goroutine while an
// attempt holds its slot, but not in op: in the classifier (asked to judge
// the attempt's error) and in the observer's AttemptEnd. Guards.Limiter:
// "Every slot is released exactly once, when the attempt ends, panics
// included".
func TestAttackLimitPanicOutsideOpKeepsSlot(t *testing.T) {
	cases := []struct {
		name string
		opt  retry.Option
	}{
		{"classifier", retry.WithClassifier(func(error) bool { panic("classifier") })},
		{"observer attempt-end", retry.WithObserver(rlPanicObs{observe.AttemptEnd})},
		{"observer attempt-start", retry.WithObserver(rlPanicObs{observe.AttemptStart})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rlNewRig(t, limit.Config{})
			p := rlPolicy(t, retry.Guards{Limiter: r.lim}, c.opt)
			var v any
			func() {
				defer func() { v = recover() }()
				_ = p.Do(context.Background(), func(context.Context, int) error { return errPlainAnswer })
			}()
			if f := r.free(); f != 1 {
				t.Errorf("panicked with %v; free slots after = %d, want 1", v, f)
			}
		})
	}
}

// TestAttackLimitTurnRuleLaterCallWithoutDeadline: the turn rule with the later
// call one without a deadline ("or a call without a deadline waits").
func TestAttackLimitTurnRuleLaterCallWithoutDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		for range 20 {
			pm, _ := lim.Acquire(context.Background())
			time.Sleep(100 * time.Millisecond)
			lim.Release(pm, false)
		}
		hold, _ := lim.Acquire(context.Background())
		b := &rlBudget{}
		brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Probes: 1})
		p := rlPolicy(t, retry.Guards{Limiter: lim, Budget: b, Breaker: brk})
		ctxA, cA := context.WithTimeout(context.Background(), 550*time.Millisecond)
		defer cA()
		var errA, errB error
		var sentA, sentB int
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			errA = p.Do(ctxA, func(context.Context, int) error { sentA++; return nil })
		}()
		time.Sleep(time.Millisecond)
		go func() {
			defer wg.Done()
			errB = p.Do(context.Background(), func(context.Context, int) error { sentB++; time.Sleep(100 * time.Millisecond); return nil })
		}()
		time.Sleep(400 * time.Millisecond)
		lim.Release(hold, false)
		wg.Wait()
		var re *retry.Error
		if !errors.As(errA, &re) || re.Reason != retry.Limited || sentA != 0 || !strings.Contains(errA.Error(), "twice") {
			t.Errorf("A: err %v sent %d", errA, sentA)
		}
		if errB != nil || sentB != 1 || b.dep.Load() != 1 {
			t.Errorf("B: err %v sent %d deposits %d", errB, sentB, b.dep.Load())
		}
	})
}

// TestAttackLimitTurnRuleEnoughSlotsForAll: the turn rule skips a call only when
// the free slots are fewer than the calls waiting: a lifted cap that frees
// a slot for each waiter serves the short one too.
func TestAttackLimitTurnRuleEnoughSlotsForAll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 2})
		for range 20 {
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pm, _ := lim.Acquire(context.Background())
					time.Sleep(100 * time.Millisecond)
					lim.Release(pm, false)
				}()
			}
			wg.Wait()
		}
		lim.SetCap(0)
		p := rlPolicy(t, retry.Guards{Limiter: lim})
		ctxA, cA := context.WithTimeout(context.Background(), 550*time.Millisecond)
		defer cA()
		ctxB, cB := context.WithTimeout(context.Background(), 5*time.Second)
		defer cB()
		var errA, errB error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); errA = p.Do(ctxA, func(context.Context, int) error { return nil }) }()
		go func() { defer wg.Done(); errB = p.Do(ctxB, func(context.Context, int) error { return nil }) }()
		time.Sleep(400 * time.Millisecond)
		lim.SetCap(-1)
		wg.Wait()
		if errA != nil || errB != nil {
			t.Errorf("limit %d: A %v, B %v", lim.Limit(), errA, errB)
		}
	})
}

// TestAttackLimitWaitingFullLimited: Config.Waiting calls wait already: the next
// is refused at once with Reason Limited, nothing sent, nothing deposited.
func TestAttackLimitWaitingFullLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := rlNewRig(t, limit.Config{Waiting: 1})
		hold, _ := r.lim.Acquire(rlDone())
		b := &rlBudget{}
		o := &rlObs{}
		p := rlPolicy(t, retry.Guards{Limiter: r.lim, Budget: b}, retry.WithObserver(o))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Do(ctx, func(context.Context, int) error { return nil }) }()
		time.Sleep(time.Millisecond)
		sent := 0
		err := p.Do(context.Background(), func(context.Context, int) error { sent++; return nil })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Limited || re.Attempts != 0 || !errors.Is(err, limit.ErrLimited) || sent != 0 || b.dep.Load() != 0 {
			t.Errorf("err %v sent %d deposits %d", err, sent, b.dep.Load())
		}
		cancel()
		if err := <-done; !errors.Is(err, retry.Canceled) {
			t.Errorf("waiter: %v", err)
		}
		if got := o.String(); got != "[give-up #0  limited] [give-up #0  canceled] " {
			t.Errorf("events %s", got)
		}
		r.giveBack(t, hold)
	})
}

// TestAttackLimitDoValueIfLimitedKeepsValue: the limiter refuses the retry that
// the value asked for: DoValueIf returns that attempt's value, Reason
// Limited, Err the "asked for another attempt" error, ErrLimited reachable.
func TestAttackLimitDoValueIfLimitedKeepsValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := rlNewRig(t, limit.Config{Waiting: -1})
		took := make(chan limit.Permit, 1)
		p := rlPolicy(t, retry.Guards{Limiter: r.lim}, retry.WithBackoff(mustBackoff(t, 0, time.Second, time.Second, 0.99)))
		go func() {
			time.Sleep(10 * time.Millisecond)
			pm, _ := r.lim.Acquire(rlDone())
			took <- pm
		}()
		v, err := retry.DoValueIf(context.Background(), p, func(context.Context, int) (int, error) { return 7, nil }, func(int) bool { return true })
		var re *retry.Error
		if v != 7 || !errors.As(err, &re) || re.Reason != retry.Limited || re.Attempts != 1 || !errors.Is(err, limit.ErrLimited) ||
			!strings.Contains(fmt.Sprint(re.Err), "asked for another attempt") {
			t.Errorf("v %d err %v", v, err)
		}
		r.giveBack(t, <-took)
	})
}

// TestAttackLimitSlotAtDeadlineSendsNothingOnRetry: as TestAttackLimitSlotAtDeadlineSendsNothing,
// for the retry's slot: the retry is sent with no time left.
func TestAttackLimitSlotAtDeadlineSendsNothingOnRetry(t *testing.T) {
	bad := 0
	var last string
	for range 40 {
		synctest.Test(t, func(t *testing.T) {
			r := rlNewRig(t, limit.Config{})
			b := &rlBudget{}
			p := rlPolicy(t, retry.Guards{Limiter: r.lim, Budget: b}, retry.WithBackoff(mustBackoff(t, 0, 100*time.Millisecond, 100*time.Millisecond, 0.99)))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			go func() {
				time.Sleep(10 * time.Millisecond) // during the backoff sleep
				hold, _ := r.lim.Acquire(rlDone())
				time.Sleep(990 * time.Millisecond) // the deadline
				r.lim.Release(hold, false)
			}()
			sent := 0
			err := p.Do(ctx, func(actx context.Context, a int) error {
				sent++
				if a == 1 {
					return io.ErrUnexpectedEOF
				}
				if dl, ok := actx.Deadline(); ok && !time.Now().Before(dl) {
					return context.DeadlineExceeded
				}
				return actx.Err()
			})
			if sent > 1 {
				bad++
				last = fmt.Sprintf("retry sent at the deadline; err %v", err)
			}
			time.Sleep(time.Second)
			if f := r.free(); f != 1 {
				t.Errorf("free %d", f)
			}
		})
	}
	if bad > 0 {
		t.Errorf("%d of 40 calls sent their retry with no time left after waiting for its slot until the deadline: %s", bad, last)
	}
}
