package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/otelstormguard"
)

// The CLI, not otelstormguard, brings the OpenTelemetry SDK and the
// Prometheus exporter: otelstormguard depends on the OpenTelemetry API only,
// so that its users choose their own SDK and exporters.

// serveMetrics serves the OpenTelemetry metrics of the stormguard
// transports for Prometheus on ln until the returned stop is called, and
// returns the option that reports to them.
func serveMetrics(ln net.Listener) (httpretry.Option, func(), error) {
	h, mp, err := prometheusHandler()
	if err != nil {
		return nil, nil, err
	}
	obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp),
		otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()))
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = srv.Serve(ln) }()
	stop := func() {
		_ = srv.Close()
		obs.Close()
		_ = mp.Shutdown(context.Background())
	}
	return httpretry.WithObserver(obs), stop, nil
}

// prometheusHandler returns a meter provider whose metrics are exported
// through the OpenTelemetry Prometheus exporter, and the [http.Handler] that
// serves them in the Prometheus exposition format. The exporter writes into
// a registry of its own, not Prometheus's global one.
func prometheusHandler() (http.Handler, *sdkmetric.MeterProvider, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), mp, nil
}
