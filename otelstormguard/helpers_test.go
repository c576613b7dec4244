package otelstormguard_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/otelstormguard"
)

// sdk is an observer on the OpenTelemetry SDK with an in-memory metric
// reader and span recorder, and a tracer for the callers' own spans.
type sdk struct {
	obs    *otelstormguard.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer
}

// newSDK builds an sdk with opts added to the observer's options.
func newSDK(t testing.TB, opts ...otelstormguard.Option) *sdk {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	obs, err := otelstormguard.NewObserver(append([]otelstormguard.Option{
		otelstormguard.WithMeterProvider(mp), otelstormguard.WithTracerProvider(tp)}, opts...)...)
	if err != nil {
		t.Fatalf("NewObserver: %v", err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	return &sdk{obs: obs, reader: reader, spans: spans, tracer: tp.Tracer("test")}
}

// series collects the metrics and flattens them to one value per series:
// "name{k=v,...}" for counters and gauges, and "name{...} count" and
// "name{...} sum" for histograms.
func (s *sdk) series(t testing.TB) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]float64{}
	key := func(name string, set attribute.Set) string {
		return name + "{" + set.Encoded(attribute.DefaultEncoder()) + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)] = float64(p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[key(m.Name, p.Attributes)+" count"] = float64(p.Count)
					out[key(m.Name, p.Attributes)+" sum"] = p.Sum
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// checkSeries compares the collected series with want exactly: every
// series of want with its value, and no other series.
func checkSeries(t testing.TB, got, want map[string]float64) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("missing series %s (want %v)", k, want[k])
		case !closeTo(g, want[k]):
			t.Errorf("series %s = %v, want %v", k, g, want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected series %s = %v", k, got[k])
		}
	}
}

func closeTo(a, b float64) bool {
	d := a - b
	return d < 1e-9 && d > -1e-9
}

// spanAttrs returns a span's attributes as a map of their values as
// strings.
func spanAttrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

// fakeClock is a retry.Clock whose Sleep advances its time at once; safe
// for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.advance(d)
	return nil
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(max(d, 0))
	c.mu.Unlock()
}

// server is a loopback HTTP server that answers 503 while down is set and
// 200 otherwise, and counts the requests it gets.
type server struct {
	*httptest.Server
	down atomic.Bool
	hits atomic.Int64
}

func newServer(t testing.TB) *server {
	t.Helper()
	s := new(server)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if s.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "ok")
	}))
	t.Cleanup(s.Close)
	return s
}

// hostPort returns the server's address split for the attributes:
// "server.address=127.0.0.1,server.port=NNNN".
func (s *server) attrs() string {
	host := strings.TrimPrefix(s.URL, "http://")
	i := strings.LastIndexByte(host, ':')
	return "server.address=" + host[:i] + ",server.port=" + host[i+1:]
}

// fmtAttrs formats attributes as "k=v" pairs sorted by key, separated by
// spaces.
func fmtAttrs(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, " ")
}
