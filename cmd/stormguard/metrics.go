package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
)

// The CLI, not otelstormguard, brings the OpenTelemetry SDK and the
// Prometheus exporter: otelstormguard depends on the OpenTelemetry API only,
// so that its users choose their own SDK and exporters.

// serviceName is the demo's service.name (the target_info series).
const serviceName = "stormguard-demo"

// runKey labels every series with the run it belongs to.
const runKey = attribute.Key("stormguard.run")

// demoMetrics serves the demo's metrics for Prometheus: from the start, the
// board's figures of every run (calls offered, served and failed, the
// attempts that reached the provider, which run is running), and for each
// run the metrics of its clients (otelstormguard's, with
// http.client.request.duration for the naive client too), each series
// labelled with its run's name (stormguard_run), service.name
// stormguard-demo. Each run has a meter provider of its own, whose resource
// carries the run's name, exported to a registry of its own; the handler
// gathers them all.
type demoMetrics struct {
	srv *http.Server

	mu    sync.Mutex
	gs    prometheus.Gatherers
	h     http.Handler // serves gs
	mps   []*sdkmetric.MeterProvider
	runs  []*otelstormguard.Observer // by run index, once setRuns ran
	board *board
}

// serveMetrics starts serving the metrics on ln, at /metrics, until stop.
func serveMetrics(ln net.Listener) *demoMetrics {
	m := &demoMetrics{h: promhttp.HandlerFor(prometheus.Gatherers{}, promhttp.HandlerOpts{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		h := m.h
		m.mu.Unlock()
		h.ServeHTTP(w, r)
	})
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: log.New(io.Discard, "", 0)}
	go func() { _ = m.srv.Serve(ln) }()
	return m
}

// provider returns a meter provider exported to a registry of its own,
// which the handler gathers, with run's name in its resource (none if "")
// and as a label of every series.
func (m *demoMetrics) provider(run string) (*sdkmetric.MeterProvider, error) {
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg),
		otelprom.WithResourceAsConstantLabels(attribute.NewAllowKeysFilter(runKey)))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(serviceName)}
	if run != "" {
		attrs = append(attrs, runKey.String(run))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("metrics resource: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	m.mu.Lock()
	m.gs = append(m.gs, reg)
	m.h = promhttp.HandlerFor(m.gs, promhttp.HandlerOpts{})
	m.mps = append(m.mps, mp)
	m.mu.Unlock()
	return mp, nil
}

// setRuns makes the metrics of b's runs: the board's figures and an
// observer per run.
func (m *demoMetrics) setRuns(b *board) error {
	mp, err := m.provider("")
	if err != nil {
		return err
	}
	if err := boardInstruments(mp.Meter("github.com/stormguard/stormguard/cmd/stormguard"), b); err != nil {
		return err
	}
	var runs []*otelstormguard.Observer
	for _, w := range b.runs {
		mp, err := m.provider(w.name)
		if err != nil {
			return err
		}
		obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp),
			otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()))
		if err != nil {
			return err
		}
		runs = append(runs, obs)
	}
	m.mu.Lock()
	m.runs, m.board = runs, b
	m.mu.Unlock()
	return nil
}

// stop stops serving and shuts the meter providers down.
func (m *demoMetrics) stop() {
	_ = m.srv.Close()
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, o := range m.runs {
		_ = o.Close()
	}
	for _, mp := range m.mps {
		_ = mp.Shutdown(context.Background())
	}
}

// current returns the observer of the run that is running (the last one
// started), nil before the first.
func (m *demoMetrics) current() *otelstormguard.Observer {
	m.mu.Lock()
	runs, b := m.runs, m.board
	m.mu.Unlock()
	if b == nil {
		return nil
	}
	for i := len(b.runs) - 1; i >= 0; i-- {
		if b.runs[i].hasStarted() {
			return runs[i]
		}
	}
	return nil
}

// observer returns the observer of the stormguard transports: it passes
// each event on to the observer of the run under way (the runs follow
// one another, so an attempt starts and ends in one run).
func (m *demoMetrics) observer() *runObserver { return &runObserver{m} }

type runObserver struct{ m *demoMetrics }

func (r *runObserver) Observe(ctx context.Context, e observe.Event) {
	if o := r.m.current(); o != nil {
		o.Observe(ctx, e)
	}
}

func (r *runObserver) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	if o := r.m.current(); o != nil {
		return o.TagAttempt(ctx, e)
	}
	return ctx
}

func (r *runObserver) ObserveHTTP(req *http.Request, resp *http.Response, err error, d time.Duration) {
	if o := r.m.current(); o != nil {
		o.ObserveHTTP(req, resp, err, d)
	}
}

// observed returns base with each request recorded as the run's HTTP
// request (http.client.request.duration): the naive client's.
func (m *demoMetrics) observed(base http.RoundTripper) http.RoundTripper {
	return observedTransport{base: base, obs: m.observer()}
}

type observedTransport struct {
	base http.RoundTripper
	obs  *runObserver
}

func (t observedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.base.RoundTrip(req)
	t.obs.ObserveHTTP(req, resp, err, time.Since(start))
	return resp, err
}

// boardInstruments reports b's figures on meter: per run (stormguard.run),
// the calls its clients made so far by outcome (offered, succeeded,
// failed), the attempts that reached the provider, and 1 for the run under
// way (0 for the others).
func boardInstruments(meter metric.Meter, b *board) error {
	calls, err1 := meter.Int64ObservableCounter("stormguard.demo.calls", metric.WithUnit("{call}"),
		metric.WithDescription("Calls the run's clients made, by outcome: offered, succeeded, failed."))
	attempts, err2 := meter.Int64ObservableCounter("stormguard.demo.provider.attempts", metric.WithUnit("{attempt}"),
		metric.WithDescription("Attempts that reached the run's provider."))
	running, err3 := meter.Int64ObservableGauge("stormguard.demo.running", metric.WithUnit("{run}"),
		metric.WithDescription("1 for the run under way, 0 for the others."))
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("demo instruments: %w", err)
	}
	outcome := attribute.Key("stormguard.outcome")
	_, err := meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for _, w := range b.runs {
			f := w.figures()
			run := runKey.String(w.name)
			o.ObserveInt64(calls, f.offered, metric.WithAttributes(run, outcome.String("offered")))
			o.ObserveInt64(calls, f.succeeded, metric.WithAttributes(run, outcome.String("succeeded")))
			o.ObserveInt64(calls, f.failed, metric.WithAttributes(run, outcome.String("failed")))
			o.ObserveInt64(attempts, f.attempts, metric.WithAttributes(run))
			v := int64(0)
			if f.running {
				v = 1
			}
			o.ObserveInt64(running, v, metric.WithAttributes(run))
		}
		return nil
	}, calls, attempts, running)
	if err != nil {
		return fmt.Errorf("demo instruments: %w", err)
	}
	return nil
}

// runFigures are a run's figures so far.
type runFigures struct {
	offered, succeeded, failed, attempts int64
	running                              bool
}

// figures returns w's figures so far.
func (w *runWatch) figures() runFigures {
	w.mu.Lock()
	p, res := w.provider, w.result
	w.mu.Unlock()
	f := runFigures{offered: w.offered.Load(), succeeded: w.succeeded.Load(), failed: w.failed.Load()}
	switch {
	case res != nil:
		f.offered, f.succeeded, f.failed = res.Stats.Offered, res.Stats.Succeeded, res.Stats.Failed
		for _, win := range res.Windows {
			f.attempts += win.Attempts
		}
	case p != nil:
		f.running = true
		for _, win := range p.Windows() {
			f.attempts += win.Attempts
		}
	}
	return f
}

// hasStarted reports whether w's run has started.
func (w *runWatch) hasStarted() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.provider != nil
}
