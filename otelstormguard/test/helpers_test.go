package test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/backoff"
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

// collect collects the metrics.
func (s *sdk) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	return rm
}

// metric collects the metrics and returns the one named name.
func (s *sdk) metric(t testing.TB, name string) metricdata.Metrics {
	t.Helper()
	for _, sm := range s.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m
			}
		}
	}
	t.Fatalf("no metric %s", name)
	return metricdata.Metrics{}
}

// series collects the metrics and flattens them to one value per series:
// "name{k=v,...}" for counters and gauges, and "name{...} count" and
// "name{...} sum" for histograms.
func (s *sdk) series(t testing.TB) map[string]float64 {
	t.Helper()
	rm := s.collect(t)
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

// zeroDelays is a backoff whose delays are all 0: a retry costs only the
// loop.
func zeroDelays() *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Rand: func() float64 { return 0 }})
	if err != nil {
		panic(err)
	}
	return b
}

// server is an HTTP server in memory, a RoundTripper that serves its
// requests in the calling goroutine (so that it can serve a test in a
// synctest bubble, where a socket would keep the bubble's time from
// moving): it answers 503 while down is set and 200 otherwise, and counts
// the requests it gets.
type server struct {
	URL  string
	down atomic.Bool
	hits atomic.Int64
}

func newServer(t testing.TB) *server {
	t.Helper()
	return &server{URL: "http://127.0.0.1:8080"}
}

func (s *server) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	s.hits.Add(1)
	rec := httptest.NewRecorder()
	if s.down.Load() {
		rec.WriteHeader(http.StatusServiceUnavailable)
	} else {
		fmt.Fprint(rec, "ok")
	}
	resp := rec.Result()
	resp.Request = r
	return resp, nil
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

// releaseVersion is the version every module is released as, the
// Makefile's RELEASE_VERSION: the scope's version in a test binary, whose
// build information lists no release of otelstormguard.
func releaseVersion(t testing.TB) string {
	t.Helper()
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RELEASE_VERSION \?= (v\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no RELEASE_VERSION in the Makefile")
	}
	return string(m[1])
}
