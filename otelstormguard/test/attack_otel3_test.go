package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

// A policy called inside another policy's attempt (one observer serves
// every guard): the inner attempt's span must be a child of the span in
// its caller's context, i.e. of the outer attempt span, not its sibling.
func TestAttackOtel3NestedCallAttemptParent(t *testing.T) {
	s := newSDK(t)
	outer, err := retry.New(retry.WithName("outer"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := retry.New(retry.WithName("inner"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	err = outer.Do(ctx, func(ctx context.Context, _ int) error {
		return inner.Do(ctx, func(context.Context, int) error { return nil })
	})
	call.End()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range s.spans.Ended() {
		a := spanAttrs(sp.Attributes())
		key := sp.Name()
		if a["server.address"] != "" {
			key = a["server.address"]
		}
		byName[key] = sp
	}
	o, i := byName["outer"], byName["inner"]
	if o == nil || i == nil {
		t.Fatalf("spans: %v", byName)
	}
	if i.Parent().SpanID() != o.SpanContext().SpanID() {
		t.Errorf("inner attempt's parent = %s, want the outer attempt span %s (caller span %s)",
			i.Parent().SpanID(), o.SpanContext().SpanID(), call.SpanContext().SpanID())
	}
}

// An attempt that ends with Outcome "failure" but no Err: a failed attempt,
// which the docs say carries error.type and the status Error.
func TestAttackOtel3FailureWithoutErr(t *testing.T) {
	s := newSDK(t)
	ctx, call := s.tracer.Start(context.Background(), "call")
	actx := s.obs.TagAttempt(ctx, observe.Event{Kind: observe.AttemptStart, Name: "dep", Attempt: 1})
	s.obs.Observe(actx, observe.Event{Kind: observe.AttemptEnd, Name: "dep", Attempt: 1, Outcome: "failure"})
	call.End()
	for _, sp := range s.spans.Ended() {
		if sp.Name() != "stormguard.attempt" {
			continue
		}
		a := spanAttrs(sp.Attributes())
		if a["error.type"] == "" || sp.Status().Code != codes.Error {
			t.Errorf("failed attempt span: error.type=%q status=%v %q", a["error.type"], sp.Status().Code, sp.Status().Description)
		}
	}
	_ = errors.New
}

// The realistic form: an httpretry client used inside a retry.Do operation
// with the same observer. Each HTTP attempt span must be a child of the
// operation's attempt span (the span in the HTTP call's context).
func TestAttackOtel3HTTPInsideRetryAttemptParent(t *testing.T) {
	s := newSDK(t)
	srv := newServer(t)
	rt, err := httpretry.NewTransport(srv, httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	outer, err := retry.New(retry.WithName("checkout"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	err = outer.Do(ctx, func(ctx context.Context, _ int) error {
		_, err := get(t, ctx, rt, srv.URL)
		return err
	})
	call.End()
	if err != nil {
		t.Fatal(err)
	}
	var o, h sdktrace.ReadOnlySpan
	for _, sp := range s.spans.Ended() {
		switch spanAttrs(sp.Attributes())["server.address"] {
		case "checkout":
			o = sp
		case "127.0.0.1":
			h = sp
		}
	}
	if o == nil || h == nil {
		t.Fatalf("missing spans: outer %v http %v", o, h)
	}
	if h.Parent().SpanID() != o.SpanContext().SpanID() {
		t.Errorf("HTTP attempt's parent = %s (the caller's span is %s), want the retry.Do attempt span %s",
			h.Parent().SpanID(), call.SpanContext().SpanID(), o.SpanContext().SpanID())
	}
}

// Odd and concurrent events under -race: many names past the bound, unknown
// kinds, empty names, huge and negative durations, collections and Close
// running alongside.
func TestAttackOtel3ConcurrentOddEvents(t *testing.T) {
	s := newSDK(t, otelstormguard.WithMaxDependencies(3))
	ctx, call := s.tracer.Start(context.Background(), "call")
	defer call.End()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprintf("d%d-%d", g, i%7)
				if i%5 == 0 {
					name = ""
				}
				a := s.obs.TagAttempt(ctx, observe.Event{Kind: observe.AttemptStart, Name: name, Attempt: i%40 + 1})
				s.obs.Observe(a, observe.Event{Kind: observe.AttemptEnd, Name: name, Attempt: i%40 + 1, Outcome: "failure", Err: errors.Join(errors.New("x"), nil), Elapsed: 1<<63 - 1})
				s.obs.Observe(ctx, observe.Event{Kind: observe.Retry, Name: name, Delay: -1, Outcome: "weird"})
				s.obs.Observe(ctx, observe.Event{Kind: observe.Kind("nonsense"), Name: name})
				s.obs.Observe(ctx, observe.Event{Kind: ""})
				s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: name, From: "closed", To: []string{"open", "half-open", "", "ot3z"}[i%4]})
				s.obs.Observe(ctx, observe.Event{Kind: observe.FleetMode, Name: name, From: "fleet", To: "local"})
				s.obs.Observe(ctx, observe.Event{Kind: observe.Admission, Name: name, Outcome: "shed-busy", Delay: 1<<63 - 1})
				_ = s.obs.TagAttempt(ctx, observe.Event{Kind: observe.Kind("nonsense")})
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			s.collect(t)
		}
	})
	wg.Wait()
	if err := s.obs.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.obs.Close(); err != nil {
		t.Fatal(err)
	}
	for k, v := range s.series(t) {
		if strings.HasPrefix(k, "stormguard.breaker.state") || strings.HasPrefix(k, "stormguard.fleet.mode{") {
			t.Errorf("after Close, gauge series %s = %v", k, v)
		}

	}
	call.End()
	if len(s.spans.Started()) != len(s.spans.Ended()) {
		t.Errorf("started %d spans, ended %d", len(s.spans.Started()), len(s.spans.Ended()))
	}
}

// A call that waits behind an open breaker, is handed a probe that fails,
// waits again and succeeds on the next probe: two requests were sent
// within one call. Each attempt span must say which it is; the second is a
// resend (http.request.resend_count on every attempt after the first).
func TestAttackOtel3FailedProbeResendCount(t *testing.T) {
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
		_ = p.Do(context.Background(), func(context.Context, int) error { return down })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx, call := s.tracer.Start(ctx, "call")
		n := 0
		var nums []int
		err = p.Do(ctx, func(_ context.Context, attempt int) error {
			n++
			nums = append(nums, attempt)
			if n == 1 {
				return down
			}
			return nil
		})
		call.End()
		t.Logf("Do = %v, op ran %d times with attempt numbers %v", err, n, nums)
		var got []string
		for _, sp := range s.spans.Ended() {
			if sp.Name() != "stormguard.attempt" || sp.Parent().SpanID() != call.SpanContext().SpanID() {
				continue
			}
			a := spanAttrs(sp.Attributes())
			got = append(got, fmt.Sprintf("attempt=%s resend=%q outcome=%s", a["stormguard.attempt"], a["http.request.resend_count"], a["stormguard.outcome"]))
		}
		t.Log(got)
		seen := map[string]int{}
		for _, g := range got {
			seen[g[:strings.Index(g, " ")]]++
		}
		for k, v := range seen {
			if v > 1 {
				t.Errorf("%d attempt spans of one call carry %s: %v", v, k, got)
			}
		}
	})
}

// A budget refusal is one give-up with reason budget-exhausted: no retry is
// counted for the refused retry, and the call is counted once.
func TestAttackOtel3BudgetRefusalCountedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		b, err := budget.New(budget.Config{Ratio: -1, MinPerSecond: -1})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: b}), retry.WithName("db"), retry.WithObserver(s.obs),
			retry.WithBackoff(zeroDelays()), retry.WithClassifier(func(error) bool { return true }))
		if err != nil {
			t.Fatal(err)
		}
		ctx, call := s.tracer.Start(context.Background(), "call")
		err = p.Do(ctx, func(context.Context, int) error { return errors.New("down") })
		call.End()
		t.Log(err)
		checkSeries(t, s.series(t), map[string]float64{
			"stormguard.attempts{server.address=db,stormguard.outcome=failure}":                 1,
			"stormguard.attempt.duration{server.address=db,stormguard.outcome=failure} count":   1,
			"stormguard.attempt.duration{server.address=db,stormguard.outcome=failure} sum":     0,
			"stormguard.give_ups{server.address=db,stormguard.give_up.reason=budget-exhausted}": 1,
		})
		ended := s.spans.Ended()
		last := ended[len(ended)-1]
		var evs []string
		for _, e := range last.Events() {
			evs = append(evs, e.Name+" "+fmtAttrs(spanAttrs(e.Attributes)))
		}
		if want := []string{"stormguard.give_up stormguard.attempts=1 stormguard.give_up.reason=budget-exhausted"}; fmt.Sprint(evs) != fmt.Sprint(want) {
			t.Errorf("call span events %q, want %q", evs, want)
		}
	})
}

// "a steady state of metrics allocates nothing of the observer's own": every
// kind of event, on the metrics SDK without traces, for a known name and for
// a name past the bound ("_OTHER").
func TestAttackOtel3SteadyStateAllocsPerKind(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp), otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()),
		otelstormguard.WithMaxDependencies(1))
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	errDown := errors.New("down")
	ctx := context.Background()
	for _, name := range []string{"db", "beyond-the-bound"} {
		for _, e := range []observe.Event{
			{Kind: observe.AttemptEnd, Attempt: 1, Outcome: "failure", Err: errDown, Elapsed: time.Millisecond},
			{Kind: observe.Retry, Attempt: 1, Outcome: "backoff", Delay: time.Second, Err: errDown},
			{Kind: observe.GiveUp, Attempt: 3, Reason: "attempts-exhausted", Err: errDown},
			{Kind: observe.BreakerWait, Outcome: "admitted", Elapsed: time.Second},
			{Kind: observe.BreakerState, From: "closed", To: "open"},
			{Kind: observe.Idempotency, Outcome: "replay", Elapsed: time.Millisecond},
			{Kind: observe.Admission, Outcome: "shed-busy", Reason: "queue-full", Delay: time.Second},
			{Kind: observe.FleetMode, From: "fleet", To: "local", Err: errDown},
		} {
			e.Name = name
			obs.Observe(ctx, e)
			if n := testing.AllocsPerRun(50, func() { obs.Observe(ctx, e) }); n != 0 {
				t.Errorf("%s %s: %v allocs per event, want 0", name, e.Kind, n)
			}
		}
	}
}
