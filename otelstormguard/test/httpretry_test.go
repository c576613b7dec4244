package test

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// noJitter is a backoff without jitter, base 100 ms: retry n sleeps
// 100 ms·2^n (200 ms, then 400 ms).
func noJitter(t testing.TB) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// get sends one GET through rt to url under ctx, reads and closes the body,
// and returns the status (0 and the error if there is no response).
func get(t testing.TB, ctx context.Context, rt http.RoundTripper, url string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// A call that fails three times and gives up: three CLIENT attempt spans
// under the caller's span with the HTTP attributes (resend counts absent,
// 1, 2), two retries and the give-up as events on the caller's span, and
// the exact counts, http.client.request.duration's among them.
func TestHTTPAttemptsExhausted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		srv := newServer(t)
		srv.down.Store(true)
		rt, err := httpretry.NewTransport(srv,
			httpretry.WithRetry(retry.WithBackoff(noJitter(t))),
			httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}

		ctx, call := s.tracer.Start(context.Background(), "call")
		code, err := get(t, ctx, rt, srv.URL)
		call.End()
		if err != nil || code != http.StatusServiceUnavailable || srv.hits.Load() != 3 {
			t.Fatalf("GET = %d, %v after %d requests, want the last 503 after 3", code, err, srv.hits.Load())
		}

		a := srv.attrs()
		checkSeries(t, s.series(t), map[string]float64{
			"stormguard.attempts{" + a + ",stormguard.outcome=failure}":                                                          3,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=failure} count":                                            3,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=failure} sum":                                              0, // the synctest bubble's clock stands still during an attempt
			"stormguard.retries{" + a + ",stormguard.retry.delay_source=backoff}":                                                2,
			"stormguard.retry.delay{" + a + ",stormguard.retry.delay_source=backoff} count":                                      2,
			"stormguard.retry.delay{" + a + ",stormguard.retry.delay_source=backoff} sum":                                        0.6, // 200 ms + 400 ms
			"stormguard.give_ups{" + a + ",stormguard.give_up.reason=attempts-exhausted}":                                        1,
			"http.client.request.duration{error.type=503,http.request.method=GET,http.response.status_code=503," + a + "} count": 3,
			"http.client.request.duration{error.type=503,http.request.method=GET,http.response.status_code=503," + a + "} sum":   0,
		})

		ended := s.spans.Ended()
		if len(ended) != 4 {
			t.Fatalf("%d spans ended, want 3 attempts and the call", len(ended))
		}
		callSpan := ended[3]
		if callSpan.Name() != "call" {
			t.Fatalf("last span ended is %q, want the call", callSpan.Name())
		}
		for i, sp := range ended[:3] {
			n := i + 1
			if sp.Name() != "stormguard.attempt" || sp.SpanKind() != trace.SpanKindClient ||
				sp.Parent().SpanID() != callSpan.SpanContext().SpanID() || sp.SpanContext().TraceID() != callSpan.SpanContext().TraceID() {
				t.Errorf("attempt %d: span %q kind %v parent %v, want stormguard.attempt, client, under the call", n, sp.Name(), sp.SpanKind(), sp.Parent().SpanID())
			}
			got := spanAttrs(sp.Attributes())
			want := map[string]string{
				"server.address": got["server.address"], "server.port": got["server.port"],
				"stormguard.attempt": strconv.Itoa(n), "stormguard.outcome": "failure", "error.type": "503",
				"http.request.method": "GET", "http.response.status_code": "503", "url.full": srv.URL,
			}
			if n > 1 {
				want["http.request.resend_count"] = strconv.Itoa(n - 1)
			}
			if !maps.Equal(got, want) || a != "server.address="+got["server.address"]+",server.port="+got["server.port"] {
				t.Errorf("attempt %d: attributes %v, want %v (%s)", n, got, want, a)
			}
			if st := sp.Status(); st.Code != codes.Error || st.Description != "HTTP 503" {
				t.Errorf("attempt %d: status %v %q, want Error \"HTTP 503\"", n, st.Code, st.Description)
			}
		}
		var events []string
		for _, ev := range callSpan.Events() {
			events = append(events, ev.Name+" "+fmtAttrs(spanAttrs(ev.Attributes)))
		}
		wantEvents := []string{
			"stormguard.retry stormguard.attempt=1 stormguard.retry.delay=0.2 stormguard.retry.delay_source=backoff",
			"stormguard.retry stormguard.attempt=2 stormguard.retry.delay=0.4 stormguard.retry.delay_source=backoff",
			"stormguard.give_up stormguard.attempts=3 stormguard.give_up.reason=attempts-exhausted",
		}
		if !slices.Equal(events, wantEvents) {
			t.Errorf("events on the call's span:\n%q\nwant\n%q", events, wantEvents)
		}
		if callSpan.Status().Code != codes.Unset {
			t.Errorf("the call's span status = %v: the observer must not set it", callSpan.Status())
		}
	})
}

// A retry the budget refuses: one attempt, no retry, one give-up with
// reason "budget-exhausted" (the budget refusal counter).
func TestHTTPBudgetRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		srv := newServer(t)
		srv.down.Store(true)
		rt, err := httpretry.NewTransport(srv,
			httpretry.WithBudget(&budget.Config{Ratio: -1, MinPerSecond: -1}), // no retry allowed
			httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if code, err := get(t, context.Background(), rt, srv.URL); err != nil || code != http.StatusServiceUnavailable {
				t.Fatalf("GET = %d, %v, want 503", code, err)
			}
		}
		if srv.hits.Load() != 2 {
			t.Fatalf("server got %d requests, want 2 (no retry)", srv.hits.Load())
		}
		a := srv.attrs()
		checkSeries(t, s.series(t), map[string]float64{
			"stormguard.attempts{" + a + ",stormguard.outcome=failure}":                                                          2,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=failure} count":                                            2,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=failure} sum":                                              0,
			"stormguard.give_ups{" + a + ",stormguard.give_up.reason=budget-exhausted}":                                          2,
			"http.client.request.duration{error.type=503,http.request.method=GET,http.response.status_code=503," + a + "} count": 2,
			"http.client.request.duration{error.type=503,http.request.method=GET,http.response.status_code=503," + a + "} sum":   0,
		})
		// Without a span of the caller's, each attempt span is a root span.
		for _, sp := range s.spans.Ended() {
			if sp.Parent().IsValid() {
				t.Errorf("span %q has parent %v, want a root span", sp.Name(), sp.Parent())
			}
		}
		if n := len(s.spans.Ended()); n != 2 {
			t.Errorf("%d spans ended, want 2 attempts", n)
		}
	})
}

// A breaker that opens, rejects a call, probes and closes: three
// transitions, the state gauge at each step, and the calls' outcomes.
func TestHTTPBreakerOpenProbeClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		srv := newServer(t)
		rt, err := httpretry.NewTransport(srv,
			httpretry.WithRetry(retry.WithMaxAttempts(1)),
			httpretry.WithBreaker(&breaker.Config{
				MinCalls: 2, FailureRatio: 0.5, OpenFor: time.Second, Probes: 1, MaxWaiters: -1,
				Rand: func() float64 { return 0.5 }, // open for exactly OpenFor
			}),
			httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		a := srv.attrs()
		state := func(closed, halfOpen, open float64) map[string]float64 {
			return map[string]float64{
				"stormguard.breaker.state{" + a + ",stormguard.breaker.state=closed}":    closed,
				"stormguard.breaker.state{" + a + ",stormguard.breaker.state=half-open}": halfOpen,
				"stormguard.breaker.state{" + a + ",stormguard.breaker.state=open}":      open,
			}
		}

		// Two failures trip the breaker.
		srv.down.Store(true)
		for range 2 {
			if code, err := get(t, context.Background(), rt, srv.URL); err != nil || code != http.StatusServiceUnavailable {
				t.Fatalf("GET = %d, %v, want 503", code, err)
			}
		}
		// The next call is refused at once: no request, no attempt.
		if _, err := get(t, context.Background(), rt, srv.URL); !errors.Is(err, retry.CircuitOpen) || srv.hits.Load() != 2 {
			t.Fatalf("GET with the breaker open: %v after %d requests, want CircuitOpen after 2", err, srv.hits.Load())
		}
		want := map[string]float64{
			"stormguard.attempts{" + a + ",stormguard.outcome=failure}":                                                          2,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=failure} count":                                            2,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=failure} sum":                                              0,
			"stormguard.give_ups{" + a + ",stormguard.give_up.reason=attempts-exhausted}":                                        2,
			"stormguard.give_ups{" + a + ",stormguard.give_up.reason=circuit-open}":                                              1,
			"stormguard.breaker.transitions{" + a + ",stormguard.breaker.from=closed,stormguard.breaker.to=open}":                1,
			"http.client.request.duration{error.type=503,http.request.method=GET,http.response.status_code=503," + a + "} count": 2,
			"http.client.request.duration{error.type=503,http.request.method=GET,http.response.status_code=503," + a + "} sum":   0,
		}
		maps.Copy(want, state(0, 0, 1))
		checkSeries(t, s.series(t), want)

		// A second later the dependency is back: the probe succeeds and closes
		// the breaker.
		srv.down.Store(false)
		time.Sleep(time.Second)
		if code, err := get(t, context.Background(), rt, srv.URL); err != nil || code != http.StatusOK {
			t.Fatalf("probe GET = %d, %v, want 200", code, err)
		}
		maps.Copy(want, map[string]float64{
			"stormguard.attempts{" + a + ",stormguard.outcome=success}":                                                1,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=success} count":                                  1,
			"stormguard.attempt.duration{" + a + ",stormguard.outcome=success} sum":                                    0,
			"stormguard.breaker.transitions{" + a + ",stormguard.breaker.from=open,stormguard.breaker.to=half-open}":   1,
			"stormguard.breaker.transitions{" + a + ",stormguard.breaker.from=half-open,stormguard.breaker.to=closed}": 1,
			"http.client.request.duration{http.request.method=GET,http.response.status_code=200," + a + "} count":      1,
			"http.client.request.duration{http.request.method=GET,http.response.status_code=200," + a + "} sum":        0,
		})
		maps.Copy(want, state(1, 0, 0))
		checkSeries(t, s.series(t), want)

		// Three attempt spans (the refused call sent none), the probe's a
		// success with status unset.
		ended := s.spans.Ended()
		if len(ended) != 3 {
			t.Fatalf("%d spans ended, want 3 attempts", len(ended))
		}
		if st := ended[2].Status(); st.Code != codes.Unset || spanAttrs(ended[2].Attributes())["stormguard.outcome"] != "success" {
			t.Errorf("probe span: status %v, attributes %v, want unset and outcome success", st, spanAttrs(ended[2].Attributes()))
		}
	})
}
