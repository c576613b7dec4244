package test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

// TestHTTPSemanticConventions sends requests through httpretry over a real
// loopback server and checks what the HTTP semantic conventions ask of a
// client: the histogram http.client.request.duration (unit s, the advised
// buckets, one recording per request sent, with http.request.method,
// http.response.status_code, server.address, server.port and error.type)
// and CLIENT attempt spans with the method, url.full without credentials
// or signatures, the status code, error.type and http.request.resend_count
// on resends only.
func TestHTTPSemanticConventions(t *testing.T) {
	s := newSDK(t)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/missing":
			http.NotFound(w, r)
		case r.Method == "FOO":
			w.WriteHeader(http.StatusNoContent)
		case hits.Add(1) == 1: // the first payment attempt
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	host, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	rt, err := httpretry.NewTransport(srv.Client().Transport,
		httpretry.WithRetry(retry.WithBackoff(zeroDelays())), httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	send := func(method, url string) int {
		t.Helper()
		req, err := http.NewRequest(method, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	secret := "http://user:pass@" + host + ":" + port + "/pay?q=1&sig=abc&Signature=x%2F&SIG=kept#frag"
	if code := send(http.MethodPost, secret); code != http.StatusCreated {
		t.Fatalf("POST = %d, want 201 after a 503", code)
	}
	if code := send(http.MethodGet, srv.URL+"/missing"); code != http.StatusNotFound {
		t.Fatalf("GET /missing = %d, want 404", code)
	}
	if code := send("FOO", srv.URL+"/other"); code != http.StatusNoContent {
		t.Fatalf("FOO = %d, want 204", code)
	}

	// The metric: one recording per request sent.
	a := "server.address=" + host + ",server.port=" + port
	got := s.series(t)
	for k, want := range map[string]float64{
		"http.client.request.duration{error.type=503,http.request.method=POST,http.response.status_code=503," + a + "} count": 1,
		"http.client.request.duration{http.request.method=POST,http.response.status_code=201," + a + "} count":                1,
		"http.client.request.duration{error.type=404,http.request.method=GET,http.response.status_code=404," + a + "} count":  1,
		"http.client.request.duration{http.request.method=_OTHER,http.response.status_code=204," + a + "} count":              1,
	} {
		if got[k] != want {
			t.Errorf("series %s = %v, want %v", k, got[k], want)
		}
	}
	var n int
	for k := range got {
		if strings.HasPrefix(k, "http.client.request.duration{") && strings.HasSuffix(k, " count") {
			n++
		}
	}
	if n != 4 {
		t.Errorf("%d series of http.client.request.duration, want 4", n)
	}
	m := s.metric(t, "http.client.request.duration")
	wantBounds := []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	if h, ok := m.Data.(metricdata.Histogram[float64]); m.Unit != "s" || !ok || len(h.DataPoints) == 0 || !slices.Equal(h.DataPoints[0].Bounds, wantBounds) {
		t.Errorf("http.client.request.duration: unit %q, data %T, want s and a histogram with bounds %v", m.Unit, m.Data, wantBounds)
	}

	// The spans: four attempts, all CLIENT.
	ended := s.spans.Ended()
	if len(ended) != 4 {
		t.Fatalf("%d spans ended, want 4 attempts", len(ended))
	}
	redacted := "http://REDACTED:REDACTED@" + host + ":" + port + "/pay?q=1&sig=REDACTED&Signature=REDACTED&SIG=kept#frag"
	common := "server.address=" + host + " server.port=" + port
	wants := []struct {
		attrs  string
		status codes.Code
	}{
		{"error.type=503 http.request.method=POST http.response.status_code=503 " + common + " stormguard.attempt=1 stormguard.outcome=failure url.full=" + redacted, codes.Error},
		{"http.request.method=POST http.request.resend_count=1 http.response.status_code=201 " + common + " stormguard.attempt=2 stormguard.outcome=success url.full=" + redacted, codes.Unset},
		{"error.type=404 http.request.method=GET http.response.status_code=404 " + common + " stormguard.attempt=1 stormguard.outcome=success url.full=" + srv.URL + "/missing", codes.Error},
		{"http.request.method=_OTHER http.request.method_original=FOO http.response.status_code=204 " + common + " stormguard.attempt=1 stormguard.outcome=success url.full=" + srv.URL + "/other", codes.Unset},
	}
	for i, sp := range ended {
		if sp.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %d: kind %v, want client", i, sp.SpanKind())
		}
		if got := fmtAttrs(spanAttrs(sp.Attributes())); got != wants[i].attrs {
			t.Errorf("span %d: attributes\n%s\nwant\n%s", i, got, wants[i].attrs)
		}
		if sp.Status().Code != wants[i].status {
			t.Errorf("span %d: status %v, want %v", i, sp.Status().Code, wants[i].status)
		}
	}
}

// A request that gets no response: error.type is the error's type, no
// status code, on the metric and on the span (status Error, the error's
// message).
func TestHTTPNoResponse(t *testing.T) {
	s := newSDK(t)
	rt, err := httpretry.NewTransport(failing{}, httpretry.WithRetry(retry.WithMaxAttempts(1)), httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, context.Background(), rt, "https://pay.example/charge"); !errors.Is(err, errNoRoute) {
		t.Fatalf("GET = %v, want %v", err, errNoRoute)
	}
	key := "http.client.request.duration{error.type=github.com/stormguard/stormguard/otelstormguard/test.routeError,http.request.method=GET,server.address=pay.example,server.port=443} count"
	if got := s.series(t)[key]; got != 1 {
		t.Errorf("series %s = %v, want 1 (all: %v)", key, got, s.series(t))
	}
	ended := s.spans.Ended()
	if len(ended) != 1 {
		t.Fatalf("%d spans ended, want 1", len(ended))
	}
	attrs := spanAttrs(ended[0].Attributes())
	if _, ok := attrs["http.response.status_code"]; ok || attrs["error.type"] != "github.com/stormguard/stormguard/otelstormguard/test.routeError" ||
		attrs["url.full"] != "https://pay.example/charge" || ended[0].Status().Code != codes.Error {
		t.Errorf("span: attributes %v, status %v; want error.type routeError, no status code, status Error", attrs, ended[0].Status())
	}
}

type routeError struct{}

func (routeError) Error() string { return "no route to pay.example" }

var errNoRoute error = routeError{}

// failing is a base RoundTripper whose every request gets errNoRoute.
type failing struct{}

func (failing) RoundTrip(r *http.Request) (*http.Response, error) { return nil, errNoRoute }

// The instrumentation scope of the metrics and the spans is the module's
// path with a version: the release in the build information, or, as in
// this test binary (whose build information lists no dependency), the
// version the source is released as, the Makefile's RELEASE_VERSION.
func TestScopeVersion(t *testing.T) {
	want := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, d := range info.Deps {
			if d.Path == otelstormguard.ScopeName && strings.HasPrefix(d.Version, "v") && d.Replace == nil {
				want = d.Version
			}
		}
	}
	if want == "" {
		want = releaseVersion(t)
	}
	s := newSDK(t)
	rt, err := httpretry.NewTransport(newServer(t), httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	if code, err := get(t, context.Background(), rt, "http://127.0.0.1:8080"); err != nil || code != http.StatusOK {
		t.Fatalf("GET = %d, %v", code, err)
	}
	rm := s.collect(t)
	if len(rm.ScopeMetrics) != 1 || rm.ScopeMetrics[0].Scope.Name != otelstormguard.ScopeName || rm.ScopeMetrics[0].Scope.Version != want {
		t.Errorf("metric scopes %+v, want one, %s %s", scopes(rm), otelstormguard.ScopeName, want)
	}
	for _, sp := range s.spans.Ended() {
		if sc := sp.InstrumentationScope(); sc.Name != otelstormguard.ScopeName || sc.Version != want {
			t.Errorf("span scope %s %q, want %s %q", sc.Name, sc.Version, otelstormguard.ScopeName, want)
		}
	}
}

func scopes(rm metricdata.ResourceMetrics) []string {
	var out []string
	for _, sm := range rm.ScopeMetrics {
		out = append(out, sm.Scope.Name+" "+strconv.Quote(sm.Scope.Version))
	}
	return out
}

// Recording an HTTP request that succeeds allocates nothing of the
// observer's own once its attribute set is built.
func TestObserveHTTPAllocs(t *testing.T) {
	s := newSDK(t)
	resp := &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}
	req, err := http.NewRequest(http.MethodGet, "https://pay.example/charge", nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { s.obs.ObserveHTTP(req, resp, nil, time.Millisecond) }); n != 0 {
		t.Errorf("ObserveHTTP: %v allocs per request, want 0", n)
	}
}
