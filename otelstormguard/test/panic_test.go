package test

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/codes"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// A base RoundTripper that answers 503 and then panics: both attempt spans
// end (the second with an error status naming the panic), the call's span
// gets the give-up (reason panic) and the give-up is counted, and the
// panic leaves RoundTrip. Before, the second attempt's span was never
// ended and nothing was counted.
func TestPanicEndsAttemptSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		srv := newServer(t)
		srv.down.Store(true)
		n := 0
		base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if n++; n == 2 {
				panic("transport bug")
			}
			return srv.RoundTrip(r)
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithRetry(retry.WithBackoff(zeroDelays())), httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		ctx, call := s.tracer.Start(context.Background(), "call")
		got := func() (v any) {
			defer func() { v = recover() }()
			_, _ = get(t, ctx, rt, srv.URL)
			return nil
		}()
		call.End()
		if got != "transport bug" {
			t.Fatalf("RoundTrip panicked with %v, want the base's value", got)
		}

		ended := s.spans.Ended()
		if len(ended) != 3 || ended[2].Name() != "call" {
			t.Fatalf("%d spans ended, want the 2 attempts and the call", len(ended))
		}
		for i, sp := range ended[:2] {
			if sp.Name() != "stormguard.attempt" || sp.Parent().SpanID() != ended[2].SpanContext().SpanID() {
				t.Errorf("span %d: %q under %v, want an attempt under the call", i, sp.Name(), sp.Parent().SpanID())
			}
		}
		if st := ended[1].Status(); st.Code != codes.Error || st.Description != "retry: operation panicked: transport bug" {
			t.Errorf("the panicking attempt's status = %v %q, want Error naming the panic", st.Code, st.Description)
		}
		if got := spanAttrs(ended[1].Attributes()); got["stormguard.outcome"] != "failure" || got["error.type"] == "" {
			t.Errorf("the panicking attempt's attributes %v, want outcome failure and an error.type", got)
		}
		var events []string
		for _, ev := range ended[2].Events() {
			events = append(events, ev.Name+" "+fmtAttrs(spanAttrs(ev.Attributes)))
		}
		if want := "stormguard.give_up stormguard.attempts=2 stormguard.give_up.reason=panic"; !slices.Contains(events, want) {
			t.Errorf("events on the call's span %q, want %q", events, want)
		}
		if v := s.series(t)["stormguard.give_ups{"+srv.attrs()+",stormguard.give_up.reason=panic}"]; v != 1 {
			t.Errorf("give-ups for a panic = %v, want 1", v)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
