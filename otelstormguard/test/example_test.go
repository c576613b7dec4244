package test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

// An HTTP client whose retries, give-ups and breakers show as OpenTelemetry
// metrics (and its attempts as spans, with a tracer provider installed).
// Here the metrics go to an in-memory reader of the SDK; the server always
// answers 503, so the call makes three attempts and gives up.
func Example_metrics() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	client, err := httpretry.NewClient(httpretry.WithObserver(obs),
		httpretry.WithRetry(retry.WithBackoff(zeroDelays()))) // no sleeps in the example
	if err != nil {
		panic(err)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	resp, err := client.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
			for _, p := range sum.DataPoints {
				for _, kv := range p.Attributes.ToSlice() {
					if strings.HasPrefix(string(kv.Key), "stormguard.") {
						fmt.Printf("%s %s=%q: %d\n", m.Name, kv.Key, kv.Value.AsString(), p.Value)
					}
				}
			}
		}
	}
	// Output:
	// stormguard.attempts stormguard.outcome="failure": 3
	// stormguard.retries stormguard.retry.delay_source="backoff": 2
	// stormguard.give_ups stormguard.give_up.reason="attempts-exhausted": 1
}

// Serve the metrics of every guard at /metrics in the Prometheus format,
// through the OpenTelemetry Prometheus exporter (a registry of its own, not
// Prometheus's global one). Here a policy named "payments" makes a call
// that succeeds on its second attempt, and the example scrapes the handler
// once.
func Example_prometheus() {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	defer mp.Shutdown(context.Background())
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}
	// http.Handle("/metrics", h) in a program; and httpretry.WithObserver(obs),
	// admission.Config{Observer: obs}, ... for the guards.

	p, err := retry.New(retry.WithName("payments"), retry.WithObserver(obs),
		retry.WithBackoff(zeroDelays()), retry.WithClassifier(func(error) bool { return true }))
	if err != nil {
		panic(err)
	}
	_ = p.Do(context.Background(), func(_ context.Context, attempt int) error {
		if attempt == 1 {
			return errors.New("connection reset")
		}
		return nil
	})

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "stormguard_attempts_total") || strings.HasPrefix(line, "stormguard_retries_total") {
			fmt.Println(line)
		}
	}
	// Output:
	// stormguard_attempts_total{otel_scope_name="github.com/stormguard/stormguard/otelstormguard",otel_scope_schema_url="https://opentelemetry.io/schemas/1.43.0",otel_scope_version="v0.1.0",server_address="payments",stormguard_outcome="failure"} 1
	// stormguard_attempts_total{otel_scope_name="github.com/stormguard/stormguard/otelstormguard",otel_scope_schema_url="https://opentelemetry.io/schemas/1.43.0",otel_scope_version="v0.1.0",server_address="payments",stormguard_outcome="success"} 1
	// stormguard_retries_total{otel_scope_name="github.com/stormguard/stormguard/otelstormguard",otel_scope_schema_url="https://opentelemetry.io/schemas/1.43.0",otel_scope_version="v0.1.0",server_address="payments",stormguard_retry_delay_source="backoff"} 1
}
