package otelstormguard_test

// The tests here need the OpenTelemetry API only, as the package does. The
// tests that record through the SDK (metrics, spans, the Prometheus
// exposition) and the benchmarks are in the test-only module
// otelstormguard/test, so that this module's go.mod requires no SDK.

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
)

// With no-op providers the observer records nothing, tags nothing and
// costs nothing; Close is safe without metrics and twice.
func TestNoopProviders(t *testing.T) {
	obs, err := otelstormguard.NewObserver(
		otelstormguard.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if got := obs.TagAttempt(ctx, observe.Event{Kind: observe.AttemptStart, Attempt: 1}); got != ctx {
		t.Error("TagAttempt with a no-op tracer returned a new context")
	}
	events := []observe.Event{
		{Kind: observe.Idempotency, Name: "orders", Outcome: "new", Elapsed: time.Millisecond},
		{Kind: observe.FleetMode, Name: "payments", From: "fleet", To: "local", Err: errors.New("redis: connection refused")},
		{Kind: observe.AttemptEnd, Outcome: "success"},
		{Kind: observe.Retry, Delay: time.Second, Outcome: "backoff"},
		{Kind: observe.GiveUp, Reason: "deadline"},
		{Kind: observe.BreakerState, From: "closed", To: "open"},
		{Kind: observe.BreakerWait, Outcome: "admitted"},
		{Kind: observe.Admission, Outcome: "admitted"},
	}
	req, err := http.NewRequest(http.MethodGet, "https://pay.example/", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := &http.Response{StatusCode: http.StatusServiceUnavailable}
	if n := testing.AllocsPerRun(100, func() {
		for _, e := range events {
			obs.Observe(ctx, e)
		}
		obs.ObserveHTTP(req, resp, nil, time.Millisecond)
	}); n != 0 {
		t.Errorf("Observe with no-op providers: %v allocs, want 0", n)
	}
	for range 2 {
		if err := obs.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
}

// A meter provider that refuses an instrument makes NewObserver fail with
// its error.
func TestNewObserverError(t *testing.T) {
	_, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(refusing{}))
	if !errors.Is(err, errRefused) {
		t.Errorf("NewObserver = %v, want an error wrapping %v", err, errRefused)
	}
}

var errRefused = errors.New("instrument refused")

// refusing is a meter provider whose meters refuse int64 counters.
type refusing struct{ metricnoop.MeterProvider }

func (refusing) Meter(string, ...metric.MeterOption) metric.Meter { return refusingMeter{} }

type refusingMeter struct{ metricnoop.Meter }

func (refusingMeter) Int64Counter(string, ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return metricnoop.Int64Counter{}, errRefused
}
