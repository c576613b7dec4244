package test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

// Found by a black-box attack on the documentation, each failing before
// its fix.

// TestOverflowHasNoPort: past WithMaxDependencies, requests to "_OTHER"
// make one series of http.client.request.duration, not one per port (the
// port of each arbitrary host made the series unbounded again).
func TestOverflowHasNoPort(t *testing.T) {
	s := newSDK(t, otelstormguard.WithMaxDependencies(1))
	for i := range 200 {
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://h%d.example:%d/", i, 1000+i), nil)
		s.obs.ObserveHTTP(req, &http.Response{StatusCode: http.StatusOK}, nil, 0)
	}
	h := s.metric(t, "http.client.request.duration").Data.(metricdata.Histogram[float64])
	if len(h.DataPoints) > 2 {
		t.Errorf("%d series of http.client.request.duration, want at most 2 (one host and _OTHER)", len(h.DataPoints))
	}
}

// TestIPv6AddressUnbracketed: server.address of an IPv6 literal is the
// address without its brackets, with or without a port.
func TestIPv6AddressUnbracketed(t *testing.T) {
	s := newSDK(t)
	for _, u := range []string{"http://[::1]/", "http://[::1]:8080/"} {
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		s.obs.ObserveHTTP(req, &http.Response{StatusCode: http.StatusOK}, nil, 0)
	}
	p, _ := retry.New(retry.WithName("[::1]"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	_ = p.Do(context.Background(), func(context.Context, int) error { return nil })
	for k := range s.series(t) {
		if strings.Contains(k, "server.address=[") {
			t.Errorf("series %s: server.address in brackets", k)
		}
	}
}

// TestNestedCallLeavesTheAttemptSpan: the AttemptEnd of a call made inside
// an attempt by a policy whose observer does not tag (a forwarding
// logger) does not end the outer attempt's span; it ends once, with the
// outer attempt's outcome.
func TestNestedCallLeavesTheAttemptSpan(t *testing.T) {
	s := newSDK(t)
	outer, _ := retry.New(retry.WithName("outer"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	fwd := observe.Func(func(ctx context.Context, e observe.Event) { s.obs.Observe(ctx, e) })
	inner, _ := retry.New(retry.WithName("inner"), retry.WithObserver(fwd), retry.WithMaxAttempts(1))
	ctx, call := s.tracer.Start(context.Background(), "call")
	_ = outer.Do(ctx, func(ctx context.Context, _ int) error {
		_ = inner.Do(ctx, func(context.Context, int) error { return errors.New("inner failed") })
		if !trace.SpanFromContext(ctx).IsRecording() {
			t.Error("the outer attempt's span ended inside the attempt")
		}
		return nil
	})
	call.End()
	for _, sp := range s.spans.Ended() {
		if sp.Name() != "stormguard.attempt" {
			continue
		}
		for _, kv := range sp.Attributes() {
			if kv.Key == "stormguard.outcome" && kv.Value.AsString() != "success" {
				t.Errorf("attempt span's outcome %q, want the outer attempt's success", kv.Value.AsString())
			}
		}
	}
}
