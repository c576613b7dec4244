package retry_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// checkEvents compares events one by one, naming the first difference.
func checkEvents(t *testing.T, got, want []observe.Event) {
	t.Helper()
	for i := range max(len(got), len(want)) {
		switch {
		case i >= len(got):
			t.Errorf("event %d missing: want %+v", i, want[i])
		case i >= len(want):
			t.Errorf("event %d extra: %+v", i, got[i])
		case got[i] != want[i]:
			t.Errorf("event %d = %+v\n          want %+v", i, got[i], want[i])
		}
	}
}

// TestObserverEvents: the exact events of scripted calls. Each attempt
// takes 10 ms of the synctest bubble's time; NoJitter base 100 ms with U 0.5: delays 200 ms,
// 400 ms; a 1 s hint is spread to 1.25 s.
func TestObserverEvents(t *testing.T) {
	const ms = time.Millisecond
	hint := &statusErr{Code: 429, After: time.Second}
	const name = "payments"
	start := func(n int) observe.Event { return observe.Event{Kind: observe.AttemptStart, Name: name, Attempt: n} }
	end := func(n int, err error, outcome string) observe.Event {
		return observe.Event{Kind: observe.AttemptEnd, Name: name, Attempt: n, Elapsed: 10 * ms, Err: err, Outcome: outcome}
	}
	tests := []struct {
		name     string
		deadline time.Duration // the call's; 0: none
		budget   *countingBudget
		errs     []error
		want     []observe.Event
	}{
		{"3 attempts then give-up", 0, nil, []error{hint, err503, err503}, []observe.Event{
			start(1), end(1, hint, "failure"),
			{Kind: observe.Retry, Name: name, Attempt: 1, Delay: 1250 * ms, Outcome: "hint", Err: hint},
			start(2), end(2, err503, "failure"),
			{Kind: observe.Retry, Name: name, Attempt: 2, Delay: 400 * ms, Outcome: "backoff", Err: err503},
			start(3), end(3, err503, "failure"),
			{Kind: observe.GiveUp, Name: name, Attempt: 3, Reason: "attempts-exhausted", Err: err503},
		}},
		{"success on a retry", 0, nil, []error{err503}, []observe.Event{
			start(1), end(1, err503, "failure"),
			{Kind: observe.Retry, Name: name, Attempt: 1, Delay: 200 * ms, Outcome: "backoff", Err: err503},
			start(2), end(2, nil, "success"),
		}},
		{"hint shorter than the backoff", 0, nil, []error{&statusErr{Code: 503, After: 50 * ms}}, []observe.Event{
			start(1), end(1, &statusErr{Code: 503, After: 50 * ms}, "failure"),
			{Kind: observe.Retry, Name: name, Attempt: 1, Delay: 200 * ms, Outcome: "backoff", Err: &statusErr{Code: 503, After: 50 * ms}},
			start(2), end(2, nil, "success"),
		}},
		{"budget refusal", 0, &countingBudget{inner: mustBudget(t, 0, 0)}, []error{err503}, []observe.Event{
			start(1), end(1, err503, "failure"),
			{Kind: observe.GiveUp, Name: name, Attempt: 1, Reason: "budget-exhausted", Err: err503},
		}},
		{"rejected: a caller's error", 0, nil, []error{err404}, []observe.Event{
			start(1), end(1, err404, "rejected"),
			{Kind: observe.GiveUp, Name: name, Attempt: 1, Reason: "not-retryable", Err: err404},
		}},
		{"Permanent 503: a failure", 0, nil, []error{retry.Permanent(err503)}, []observe.Event{
			start(1), end(1, retry.Permanent(err503), "failure"),
			{Kind: observe.GiveUp, Name: name, Attempt: 1, Reason: "not-retryable", Err: err503},
		}},
		{"Permanent 404: rejected", 0, nil, []error{retry.Permanent(err404)}, []observe.Event{
			start(1), end(1, retry.Permanent(err404), "rejected"),
			{Kind: observe.GiveUp, Name: name, Attempt: 1, Reason: "not-retryable", Err: err404},
		}},
		{"deadline: the refused sleep", time.Second, nil, []error{hint}, []observe.Event{
			start(1), end(1, hint, "failure"),
			{Kind: observe.GiveUp, Name: name, Attempt: 1, Reason: "deadline", Delay: time.Second, Err: hint},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var ev events
				opts := []retry.Option{retry.WithName(name), retry.WithObserver(ev.observer()),
					retry.WithBackoff(mustBackoff(t, backoff.NoJitter, 100*ms, time.Minute, 0.5))}
				if tt.budget != nil {
					opts = append(opts, retry.WithGuards(retry.Guards{Budget: tt.budget}))
				}
				p := mustNew(t, opts...)
				ctx := context.Background()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				_ = p.Do(ctx, func(ctx context.Context, attempt int) error {
					time.Sleep(10 * ms)
					if attempt <= len(tt.errs) {
						return tt.errs[attempt-1]
					}
					return nil
				})
				got := ev.take()
				// Errors built per case compare by identity; compare their text.
				for i := range got {
					if i < len(tt.want) && got[i].Err != nil && tt.want[i].Err != nil && got[i].Err.Error() == tt.want[i].Err.Error() {
						got[i].Err = tt.want[i].Err
					}
				}
				checkEvents(t, got, tt.want)
			})
		})
	}
}

// TestObserverCanceled: a call whose context ended before it started
// reports only its give-up; one canceled during its sleep reports the
// attempt, the retry and the give-up.
func TestObserverCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ev events
		p := mustNew(t, retry.WithObserver(ev.observer()))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = p.Do(ctx, succeed)
		checkEvents(t, ev.take(), []observe.Event{{Kind: observe.GiveUp, Reason: "canceled"}})

		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		record := ev.observer()
		p = mustNew(t, retry.WithObserver(observe.Func(func(ctx context.Context, e observe.Event) {
			record(ctx, e)
			if e.Kind == observe.Retry {
				cancel()
			}
		})))
		_ = p.Do(ctx, func(ctx context.Context, attempt int) error { return err503 })
		var kinds []observe.Kind
		for _, e := range ev.take() {
			kinds = append(kinds, e.Kind)
		}
		if want := []observe.Kind{observe.AttemptStart, observe.AttemptEnd, observe.Retry, observe.GiveUp}; !slices.Equal(kinds, want) {
			t.Errorf("events %v, want %v", kinds, want)
		}
	})
}

// tagger is an observer that tags each attempt's context.
type tagger struct{ events }

type attemptKey struct{}

func (tg *tagger) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	tg.observer()(ctx, observe.Event{Kind: e.Kind, Attempt: e.Attempt, Outcome: "tagged"})
	return context.WithValue(ctx, attemptKey{}, e.Attempt)
}

func (tg *tagger) Observe(ctx context.Context, e observe.Event) {
	if e.Kind == observe.AttemptEnd {
		e.Outcome += ", tag " + tagOf(ctx)
	}
	tg.observer()(ctx, e)
}

func tagOf(ctx context.Context) string {
	if n, ok := ctx.Value(attemptKey{}).(int); ok {
		return string(rune('0' + n))
	}
	return "none"
}

// TestObserverTagsAttempts: an observer that tags attempts is asked for each attempt's
// context instead of observing AttemptStart; the attempt runs on that
// context, and its AttemptEnd gets it.
func TestObserverTagsAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tg := &tagger{}
		p := mustNew(t, retry.WithObserver(tg))
		var seen []string
		_ = p.Do(context.Background(), func(ctx context.Context, attempt int) error {
			seen = append(seen, tagOf(ctx))
			if attempt == 1 {
				return err503
			}
			return nil
		})
		if want := []string{"1", "2"}; !slices.Equal(seen, want) {
			t.Errorf("attempts ran with tags %v, want %v", seen, want)
		}
		var got []string
		for _, e := range tg.take() {
			got = append(got, string(e.Kind)+" "+e.Outcome)
		}
		want := []string{"attempt-start tagged", "attempt-end failure, tag 1", "retry backoff", "attempt-start tagged", "attempt-end success, tag 2"}
		if !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
	})
}

// TestObserverBreakerWait: a call waiting behind an open breaker (probe
// round in 1 s) reports its wait: admitted when handed the probe, rejected
// when its deadline came first, in either case before any attempt.
func TestObserverBreakerWait(t *testing.T) {
	t.Run("admitted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ev events
			brk := openBreaker(t, nil)
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db"), retry.WithObserver(ev.observer()))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := p.Do(ctx, succeed); err != nil {
				t.Fatalf("Do = %v", err)
			}
			checkEvents(t, ev.take(), []observe.Event{
				{Kind: observe.BreakerWait, Name: "db", Elapsed: time.Second, Outcome: "admitted"},
				{Kind: observe.AttemptStart, Name: "db", Attempt: 1},
				{Kind: observe.AttemptEnd, Name: "db", Attempt: 1, Outcome: "success"},
			})
		})
	})
	t.Run("rejected at the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ev events
			brk := openBreaker(t, nil)
			finished := make(chan struct{})
			defer close(finished)
			go func() { // a waiter with more time left takes the round's probe and holds it
				pm, err := brk.Wait(context.Background(), 10*time.Second)
				if err == nil {
					<-finished
					brk.Cancel(pm)
				}
			}()
			synctest.Wait()
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db"), retry.WithObserver(ev.observer()))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			err := p.Do(ctx, succeed)
			re := checkStop(t, err, retry.CircuitOpen, 0)
			var oe *breaker.OpenError
			if !errors.As(re.Err, &oe) {
				t.Fatalf("Err = %v, want the *breaker.OpenError", re.Err)
			}
			checkEvents(t, ev.take(), []observe.Event{
				{Kind: observe.BreakerWait, Name: "db", Elapsed: 3 * time.Second, Outcome: "rejected", Err: re.Err},
				{Kind: observe.GiveUp, Name: "db", Reason: "circuit-open", Err: re.Err},
			})
		})
	})
	t.Run("deadline before the round: no wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ev events
			brk := openBreaker(t, nil)
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db"), retry.WithObserver(ev.observer()))
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			err := p.Do(ctx, succeed)
			re := checkStop(t, err, retry.CircuitOpen, 0)
			// The call could not wait, and did not: a BreakerWait here would
			// count a fail-fast rejection as a wait.
			checkEvents(t, ev.take(), []observe.Event{
				{Kind: observe.GiveUp, Name: "db", Reason: "circuit-open", Err: re.Err},
			})
		})
	})
	t.Run("no deadline: no wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var ev events
			brk := openBreaker(t, nil)
			p := mustNew(t, retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db"), retry.WithObserver(ev.observer()))
			err := p.Do(context.Background(), succeed)
			re := checkStop(t, err, retry.CircuitOpen, 0)
			checkEvents(t, ev.take(), []observe.Event{
				{Kind: observe.GiveUp, Name: "db", Reason: "circuit-open", Err: re.Err},
			})
		})
	})
}

// TestNoObserverNoCost: a policy without an observer reports nothing and
// its success path allocates nothing, with a breaker and a budget attached
// too; with an observer, the same calls report.
func TestNoObserverNoCost(t *testing.T) {
	var ev events
	bud, brk := mustBudget(t, 0.1, 1), mustBreaker(t)
	quiet := mustNew(t, retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk}), retry.WithName("db"))
	withDeadline, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), withDeadline} {
		if n := testing.AllocsPerRun(1000, func() { _ = quiet.Do(ctx, succeed) }); n != 0 {
			t.Errorf("no observer, budget and breaker: %v allocs per successful call, want 0", n)
		}
	}
	loud := mustNew(t, retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk}), retry.WithObserver(ev.observer()))
	_ = loud.Do(context.Background(), succeed)
	if got := len(ev.take()); got != 2 {
		t.Errorf("with an observer: %d events for a first-try success, want 2 (attempt start and end)", got)
	}
}

// TestLateAttemptEndsCanceled: an attempt that fails after the call's
// deadline is given back to the breaker (WithGuards); with an observer too
// the classifier is not asked about it (WithClassifier), and its
// AttemptEnd says "canceled", not a failure the breaker counted.
func TestLateAttemptEndsCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		asked := 0
		var outcomes []string
		p, err := retry.New(retry.WithClassifier(func(error) bool { asked++; return true }),
			retry.WithObserver(observe.Func(func(_ context.Context, e observe.Event) {
				if e.Kind == observe.AttemptEnd {
					outcomes = append(outcomes, e.Outcome)
				}
			})))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Do(ctx, func(context.Context, int) error {
			time.Sleep(1500 * time.Millisecond) // past the call's deadline
			return errors.New("503")
		})
		if asked != 0 || len(outcomes) != 1 || outcomes[0] != "canceled" {
			t.Errorf("classifier asked %d times, AttemptEnd outcomes %q; want 0 and [canceled]", asked, outcomes)
		}
	})
}
