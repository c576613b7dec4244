package test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
)

// A call with time to spare waits behind an open breaker for its next probe
// round (a second, on the bubble's clock) and is admitted: the wait is
// recorded once, with its duration, and is an event on the caller's span.
func TestBreakerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		brk, err := breaker.New(breaker.Config{MinCalls: 1, OpenFor: time.Second, Probes: 1, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1),
			retry.WithClassifier(func(error) bool { return true }))
		if err != nil {
			t.Fatal(err)
		}
		down := errors.New("down")
		if err := p.Do(context.Background(), func(context.Context, int) error { return down }); !errors.Is(err, down) {
			t.Fatalf("first call: %v, want %v", err, down)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ctx, call := s.tracer.Start(ctx, "call")
		start := time.Now()
		if err := p.Do(ctx, func(context.Context, int) error { return nil }); err != nil {
			t.Fatalf("second call: %v, want success after the wait", err)
		}
		call.End()
		if waited := time.Since(start); waited != time.Second {
			t.Errorf("the call waited %v, want 1s", waited)
		}
		// The breaker's own state changes reach the observer only where it
		// is wired to report them (httpretry, fleet); a bare breaker does not.
		checkSeries(t, s.series(t), map[string]float64{
			"stormguard.attempts{server.address=db,stormguard.outcome=failure}":                     1,
			"stormguard.attempt.duration{server.address=db,stormguard.outcome=failure} count":       1,
			"stormguard.attempt.duration{server.address=db,stormguard.outcome=failure} sum":         0,
			"stormguard.give_ups{server.address=db,stormguard.give_up.reason=attempts-exhausted}":   1,
			"stormguard.breaker.wait.duration{server.address=db,stormguard.outcome=admitted} count": 1,
			"stormguard.breaker.wait.duration{server.address=db,stormguard.outcome=admitted} sum":   1,
			"stormguard.attempts{server.address=db,stormguard.outcome=success}":                     1,
			"stormguard.attempt.duration{server.address=db,stormguard.outcome=success} count":       1,
			"stormguard.attempt.duration{server.address=db,stormguard.outcome=success} sum":         0,
		})
		ended := s.spans.Ended()
		last := ended[len(ended)-1]
		if ev := last.Events(); last.Name() != "call" || len(ev) != 1 || ev[0].Name != "stormguard.breaker.wait" ||
			fmtAttrs(spanAttrs(ev[0].Attributes)) != "stormguard.breaker.wait=1 stormguard.outcome=admitted" {
			t.Errorf("the call's span %q has events %v, want one stormguard.breaker.wait of 1 s, admitted", last.Name(), ev)
		}
	})
}
