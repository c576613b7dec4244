// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package observe_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

type atkTemp struct{}

func (atkTemp) Error() string   { return "temporary" }
func (atkTemp) Temporary() bool { return true }

type atkHint struct{ d time.Duration }

func (h atkHint) Error() string             { return "hint" }
func (h atkHint) RetryAfter() time.Duration { return h.d }

type atkRec struct {
	mu sync.Mutex
	ev []observe.Event
	at []time.Time
}

func (r *atkRec) Observe(ctx context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ev = append(r.ev, e)
	r.at = append(r.at, time.Now())
}

// Event: "Which fields are set depends on Kind (see the constants); the
// others are zero." GiveUp: Attempt, Reason, Err; Delay is not one of them.
func TestAttackGiveUpDeadlineCarriesOnlyDocumentedFields(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bo, err := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rec := &atkRec{}
		p, err := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(5), retry.WithObserver(rec))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err = p.Do(ctx, func(ctx context.Context, attempt int) error { return atkTemp{} })
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Deadline {
			t.Fatalf("err = %v", err)
		}
		last := rec.ev[len(rec.ev)-1]
		if last.Kind != observe.GiveUp {
			t.Fatalf("last event %+v", last)
		}
		// The refused sleep (Constant 2 s) is the give-up's Delay: the doc
		// did not say so when a black-box attack found it; it does now.
		want := observe.Event{Kind: observe.GiveUp, Attempt: 1, Reason: "deadline", Err: last.Err, Delay: 2 * time.Second}
		if last != want {
			t.Errorf("GiveUp event = %+v; want only Kind, Attempt, Reason, Err and Delay (the refused sleep) set (%+v)", last, want)
		}
	})
}

// Ordering and contents of a full call: start, end, retry, ..., give-up;
// Retry.Delay equals the sleep that follows; Elapsed is the attempt's time.
func TestAttackOrderingAndDelays(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.Linear, Base: time.Second})
		rec := &atkRec{}
		p, err := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(3), retry.WithObserver(rec), retry.WithName("dep"))
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			time.Sleep(300 * time.Millisecond)
			if attempt == 2 {
				return atkHint{5 * time.Second}
			}
			return atkTemp{}
		})
		kinds := []observe.Kind{}
		for _, e := range rec.ev {
			kinds = append(kinds, e.Kind)
			if e.Name != "dep" {
				t.Errorf("Name %q", e.Name)
			}
		}
		wantK := []observe.Kind{observe.AttemptStart, observe.AttemptEnd, observe.Retry, observe.AttemptStart, observe.AttemptEnd, observe.Retry, observe.AttemptStart, observe.AttemptEnd, observe.GiveUp}
		if len(kinds) != len(wantK) {
			t.Fatalf("kinds %v", kinds)
		}
		for i := range wantK {
			if kinds[i] != wantK[i] {
				t.Fatalf("kinds %v", kinds)
			}
		}
		for i, e := range rec.ev {
			switch e.Kind {
			case observe.AttemptEnd:
				if e.Elapsed != 300*time.Millisecond || e.Outcome != "failure" && e.Outcome != "rejected" {
					t.Errorf("AttemptEnd %+v", e)
				}
			case observe.Retry:
				gap := rec.at[i+1].Sub(rec.at[i])
				if gap != e.Delay {
					t.Errorf("Retry Delay %v but slept %v", e.Delay, gap)
				}
				if e.Attempt == 1 && (e.Delay != time.Second || e.Outcome != "backoff") {
					t.Errorf("retry 1 %+v", e)
				}
				if e.Attempt == 2 && (e.Delay < 5*time.Second || e.Delay >= 7500*time.Millisecond || e.Outcome != "hint") {
					t.Errorf("retry 2 %+v", e)
				}
				if e.Err == nil {
					t.Errorf("retry without Err")
				}
			case observe.GiveUp:
				if e.Attempt != 3 || e.Reason != "attempts-exhausted" || e.Err == nil || e.Delay != 0 {
					t.Errorf("GiveUp %+v", e)
				}
			case observe.AttemptStart:
				if e.Attempt < 1 || e.Err != nil || e.Outcome != "" || e.Elapsed != 0 {
					t.Errorf("AttemptStart %+v", e)
				}
			}
		}
	})
}

type atkKey struct{}

type atkTagger struct {
	atkRec
}

func (z *atkTagger) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	if e.Kind != observe.AttemptStart {
		panic("TagAttempt with " + string(e.Kind))
	}
	return context.WithValue(ctx, atkKey{}, e.Attempt)
}

func (z *atkTagger) Observe(ctx context.Context, e observe.Event) {
	if e.Kind == observe.AttemptStart {
		panic("Observe called for AttemptStart on a tagger")
	}
	if e.Kind == observe.AttemptEnd {
		if v, _ := ctx.Value(atkKey{}).(int); v != e.Attempt {
			panic("AttemptEnd context not the tagged one")
		}
	}
	z.atkRec.Observe(ctx, e)
}

func TestAttackTagger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tg := &atkTagger{}
		p, _ := retry.New(retry.WithMaxAttempts(3), retry.WithObserver(tg))
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			if v, _ := ctx.Value(atkKey{}).(int); v != attempt {
				t.Errorf("attempt %d ran with ctx tagged %d", attempt, v)
			}
			return atkTemp{}
		})
		var keyedEnds int
		for _, e := range tg.ev {
			if e.Kind == observe.AttemptEnd {
				keyedEnds++
			}
		}
		if keyedEnds != 3 {
			t.Errorf("ends %d", keyedEnds)
		}
	})
}

// Panic: AttemptEnd failure, GiveUp panic, then the panic goes on.
func TestAttackPanic(t *testing.T) {
	rec := &atkRec{}
	p, _ := retry.New(retry.WithObserver(rec))
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v", r)
			}
		}()
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { panic("boom") })
	}()
	if len(rec.ev) != 3 || rec.ev[1].Kind != observe.AttemptEnd || rec.ev[1].Outcome != "failure" || rec.ev[1].Err == nil ||
		rec.ev[2].Kind != observe.GiveUp || rec.ev[2].Reason != "panic" || rec.ev[2].Err == nil || rec.ev[2].Attempt != 1 {
		t.Errorf("events %+v", rec.ev)
	}
}

// An attempt that failed after the call's context ended: Outcome canceled.
func TestAttackLateCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &atkRec{}
		p, _ := retry.New(retry.WithObserver(rec))
		ctx, cancel := context.WithCancel(context.Background())
		_ = p.Do(ctx, func(ctx context.Context, attempt int) error {
			cancel()
			return atkTemp{}
		})
		var end, gu observe.Event
		for _, e := range rec.ev {
			switch e.Kind {
			case observe.AttemptEnd:
				end = e
			case observe.GiveUp:
				gu = e
			}
		}
		if end.Outcome != "canceled" || gu.Reason != "canceled" || gu.Attempt != 1 {
			t.Errorf("end %+v giveup %+v", end, gu)
		}
	})
}

func TestAttackFuncAdapter(t *testing.T) {
	var got observe.Event
	var o observe.Observer = observe.Func(func(ctx context.Context, e observe.Event) { got = e })
	o.Observe(context.Background(), observe.Event{Kind: observe.Retry, Attempt: 2})
	if got.Kind != "retry" || got.Attempt != 2 {
		t.Errorf("%+v", got)
	}
	for k, s := range map[observe.Kind]string{observe.AttemptStart: "attempt-start", observe.AttemptEnd: "attempt-end", observe.Retry: "retry", observe.GiveUp: "give-up", observe.BreakerWait: "breaker-wait", observe.BreakerState: "breaker-state", observe.Idempotency: "idempotency", observe.Admission: "admission", observe.FleetMode: "fleet-mode"} {
		if string(k) != s {
			t.Errorf("%q != %q", k, s)
		}
	}
}

// Concurrency: many calls of one policy, observer sees consistent sequences.
func TestAttackConcurrentCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &atkRec{}
		p, _ := retry.New(retry.WithMaxAttempts(3), retry.WithObserver(rec))
		var wg sync.WaitGroup
		for g := 0; g < 20; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return atkTemp{} })
			}()
		}
		wg.Wait()
		counts := map[observe.Kind]int{}
		for _, e := range rec.ev {
			counts[e.Kind]++
		}
		if counts[observe.AttemptStart] != 60 || counts[observe.AttemptEnd] != 60 || counts[observe.Retry] != 40 || counts[observe.GiveUp] != 20 {
			t.Errorf("counts %v", counts)
		}
	})
}

// observe.Admission: "Reason is the controller's own outcome name
// ("retry-refused", "queue-full", "queue-timeout", "canceled")".
func TestAttackAdmissionReasonIsOutcomeName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &atkRec{}
		c, err := admission.New(admission.Config{MaxInFlight: 1, Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		time.Sleep(2 * time.Millisecond) // the caller's deadline has passed
		_, d := c.Acquire(ctx, 1)
		if d.Outcome != admission.Canceled {
			t.Fatalf("outcome %v", d.Outcome)
		}
		// "deadline" (a request dropped for its caller's deadline, outcome
		// canceled) was missing from observe's list when a black-box attack
		// found it.
		for _, e := range rec.ev {
			if e.Kind == observe.Admission && e.Outcome != "admitted" && e.Outcome != "queued" {
				if e.Reason != "deadline" || d.Outcome.String() != "canceled" {
					t.Errorf("Admission event Reason %q for outcome %q; observe documents \"deadline\" for a request dropped for its caller's deadline (outcome canceled)", e.Reason, d.Outcome.String())
				}
			}
		}
	})
}

// Admission events: admitted carries no Delay/Reason; queued then final.
func TestAttackAdmissionQueuedThenFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &atkRec{}
		c, err := admission.New(admission.Config{MaxInFlight: 1, Observer: rec, Name: "svc"})
		if err != nil {
			t.Fatal(err)
		}
		p1, d1 := c.Acquire(context.Background(), 1)
		if d1.Outcome != admission.Admitted {
			t.Fatal(d1)
		}
		done := make(chan admission.Decision)
		go func() {
			p2, d2 := c.Acquire(context.Background(), 1)
			p2.Release()
			done <- d2
		}()
		time.Sleep(100 * time.Millisecond)
		p1.Release()
		d2 := <-done
		if d2.Outcome != admission.Admitted {
			t.Fatalf("d2 %+v", d2)
		}
		if len(rec.ev) != 3 {
			t.Fatalf("events %+v", rec.ev)
		}
		if e := rec.ev[0]; e.Outcome != "admitted" || e.Delay != 0 || e.Reason != "" || e.Elapsed != 0 || e.Name != "svc" {
			t.Errorf("first %+v", e)
		}
		if e := rec.ev[1]; e.Outcome != "queued" {
			t.Errorf("second %+v", e)
		}
		if e := rec.ev[2]; e.Outcome != "admitted" || e.Elapsed != 100*time.Millisecond || e.Delay != 0 || e.Reason != "" {
			t.Errorf("third %+v", e)
		}
	})
}

func TestAttackNoObserverNoAlloc(t *testing.T) {
	p, _ := retry.New()
	ctx := context.Background()
	op := func(ctx context.Context, attempt int) error { return nil }
	if a := testing.AllocsPerRun(200, func() { _ = p.Do(ctx, op) }); a != 0 {
		t.Errorf("retry success path without observer allocates %v", a)
	}
	c, _ := admission.New(admission.Config{})
	if a := testing.AllocsPerRun(200, func() {
		pm, _ := c.Acquire(ctx, 1)
		pm.Release()
	}); a != 0 {
		t.Errorf("admission admitted path allocates %v", a)
	}
}

// Retry Outcome "backoff" when the hint is shorter than the backoff delay.
func TestAttackRetryOutcomeShortHint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 3 * time.Second})
		rec := &atkRec{}
		p, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(2), retry.WithObserver(rec))
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return atkHint{time.Second} })
		for _, e := range rec.ev {
			if e.Kind == observe.Retry && (e.Outcome != "backoff" || e.Delay != 3*time.Second) {
				t.Errorf("retry %+v", e)
			}
		}
	})
}

// docs/backoff.md: the hint is a floor, spread in [hint, 1.5·hint), drawn
// from the backoff's random source: one that returns 0 sleeps exactly the hint.
func TestAttackHintSpreadFromBackoffRand(t *testing.T) {
	for _, tc := range []struct {
		u        float64
		strategy backoff.Strategy
		base     time.Duration
		hint     time.Duration
		lo, hi   time.Duration // [lo, hi]
		outcome  string
	}{
		{0, backoff.FullJitter, 100 * time.Millisecond, 5 * time.Second, 5 * time.Second, 5 * time.Second, "hint"},
		{1, backoff.FullJitter, 100 * time.Millisecond, 5 * time.Second, 5 * time.Second, 7500*time.Millisecond - 1, "hint"},
		{0, backoff.Constant, 2 * time.Second, 2 * time.Second, 2 * time.Second, 2 * time.Second, "backoff"},
		{0, backoff.Constant, 2 * time.Second, time.Second, 2 * time.Second, 2 * time.Second, "backoff"},
	} {
		synctest.Test(t, func(t *testing.T) {
			u := tc.u
			bo, _ := backoff.New(backoff.Config{Strategy: tc.strategy, Base: tc.base, Rand: func() float64 { return u }})
			rec := &atkRec{}
			p, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(2), retry.WithObserver(rec))
			_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error { return atkHint{tc.hint} })
			found := false
			for i, e := range rec.ev {
				if e.Kind != observe.Retry {
					continue
				}
				found = true
				gap := rec.at[i+1].Sub(rec.at[i])
				if e.Delay < tc.lo || e.Delay > tc.hi || gap != e.Delay || e.Outcome != tc.outcome {
					t.Errorf("%+v: Retry %+v, slept %v", tc, e, gap)
				}
			}
			if !found {
				t.Errorf("no retry event")
			}
		})
	}
}

// BreakerWait: a call waited Elapsed behind an open breaker; Outcome
// admitted; it precedes the AttemptStart of the attempt it admitted.
func TestAttackBreakerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		brk, err := breaker.New(breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		rec := &atkRec{}
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.Constant, Base: 10 * time.Millisecond})
		p, _ := retry.New(retry.WithBackoff(bo), retry.WithMaxAttempts(2), retry.WithObserver(rec), retry.WithGuards(retry.Guards{Breaker: brk}))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err = p.Do(ctx, func(ctx context.Context, attempt int) error {
			if attempt == 1 {
				return atkTemp{}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("err %v", err)
		}
		var kinds []observe.Kind
		for _, e := range rec.ev {
			kinds = append(kinds, e.Kind)
		}
		t.Logf("kinds %v", kinds)
		for i, e := range rec.ev {
			if e.Kind == observe.BreakerWait {
				if e.Outcome != "admitted" || e.Elapsed <= 0 || e.Err != nil {
					t.Errorf("BreakerWait %+v", e)
				}
				if i+1 >= len(rec.ev) || rec.ev[i+1].Kind != observe.AttemptStart {
					t.Errorf("BreakerWait not followed by AttemptStart: %v", kinds)
				}
				total := rec.at[i].Sub(rec.at[i-1])
				if e.Elapsed > total {
					t.Errorf("Elapsed %v > time since Retry %v", e.Elapsed, total)
				}
				return
			}
		}
		t.Errorf("no BreakerWait: %v", kinds)
	})
}

type atkCtxRec struct {
	mu   sync.Mutex
	ev   []observe.Event
	ctxs []context.Context
}

func (r *atkCtxRec) Observe(ctx context.Context, e observe.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ev = append(r.ev, e)
	r.ctxs = append(r.ctxs, ctx)
}

type atkCallKey struct{}

// "ctx is the caller's context (for AttemptStart and AttemptEnd, the attempt's)".
func TestAttackEventContexts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &atkCtxRec{}
		p, _ := retry.New(retry.WithMaxAttempts(2), retry.WithObserver(rec), retry.WithAttemptTimeout(time.Second))
		caller := context.WithValue(context.Background(), atkCallKey{}, "caller")
		var attemptDL []time.Time
		_ = p.Do(caller, func(ctx context.Context, attempt int) error {
			dl, _ := ctx.Deadline()
			attemptDL = append(attemptDL, dl)
			return atkTemp{}
		})
		ai := 0
		for i, e := range rec.ev {
			ctx := rec.ctxs[i]
			if ctx.Value(atkCallKey{}) != "caller" {
				t.Errorf("%v: ctx is not derived from the caller's", e.Kind)
			}
			dl, has := ctx.Deadline()
			switch e.Kind {
			case observe.AttemptStart: // the attempt's (the doc said the caller's when a black-box attack found it)
				if !has || !dl.Equal(attemptDL[ai]) {
					t.Errorf("AttemptStart %d ctx deadline %v %v; attempt's %v", e.Attempt, dl, has, attemptDL[ai])
				}
			case observe.AttemptEnd:
				if !has || !dl.Equal(attemptDL[ai]) {
					t.Errorf("AttemptEnd %d ctx deadline %v %v; attempt's %v", e.Attempt, dl, has, attemptDL[ai])
				}
				ai++
			default:
				if has {
					t.Errorf("%v ctx has a deadline %v; want the caller's (none)", e.Kind, dl)
				}
			}
		}
	})
}

// Event.Attempt: "the attempt number (1 for the first)"; admission's
// Acquire takes "1 (or anything below 2) for an original".
func TestAttackAdmissionAttemptOfOriginal(t *testing.T) {
	rec := &atkRec{}
	c, _ := admission.New(admission.Config{Observer: rec})
	for _, a := range []int{0, -7, 1} {
		pm, d := c.Acquire(context.Background(), a)
		if d.Outcome != admission.Admitted {
			t.Fatal(d)
		}
		pm.Release()
	}
	for i, e := range rec.ev {
		if e.Attempt != 1 {
			t.Errorf("event %d for an original: Attempt %d, want 1", i, e.Attempt)
		}
	}
}
