package otelstormguard

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// PrometheusHandler returns a meter provider whose metrics are exported
// through the OpenTelemetry Prometheus exporter, and the [http.Handler] that
// serves them in the Prometheus exposition format (mount it at /metrics).
// The exporter writes into a registry of its own, not Prometheus's global
// one. opts are passed to [sdkmetric.NewMeterProvider] after the exporter's
// reader (a resource, views, more readers).
//
// Give the provider to [NewObserver] with [WithMeterProvider] (or make it
// the global one), and call its Shutdown when the program ends:
//
//	h, mp, err := otelstormguard.PrometheusHandler()
//	obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp))
//	client, err := httpretry.NewClient(httpretry.WithObserver(obs))
//	http.Handle("/metrics", h)
//	defer mp.Shutdown(context.Background())
func PrometheusHandler(opts ...sdkmetric.Option) (http.Handler, *sdkmetric.MeterProvider, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("otelstormguard: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(append([]sdkmetric.Option{sdkmetric.WithReader(exp)}, opts...)...)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), mp, nil
}
