package test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// A scripted outage through the real components, scraped from the
// OpenTelemetry Prometheus exporter's handler: a call that exhausts its
// attempts, one that meets the breaker it tripped, a probe that closes it,
// and admission decisions at a provider. The exposition carries exact
// values; run with -v to see the stormguard lines (docs/metrics.md shows
// them).
func TestPrometheusScrape(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(reg))
		if err != nil {
			t.Fatal(err)
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
		obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp))
		if err != nil {
			t.Fatal(err)
		}

		// The client side: a dependency that is down, then back.
		srv := newServer(t)
		rt, err := httpretry.NewTransport(srv,
			httpretry.WithRetry(retry.WithBackoff(noJitter(t))),
			httpretry.WithBreaker(&breaker.Config{MinCalls: 4, OpenFor: time.Second, Probes: 1, MaxWaiters: -1, Rand: func() float64 { return 0.5 }}),
			httpretry.WithObserver(obs))
		if err != nil {
			t.Fatal(err)
		}
		srv.down.Store(true)
		if code, err := get(t, context.Background(), rt, srv.URL); err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("first call: %d, %v, want 503 after 3 attempts", code, err)
		}
		if code, err := get(t, context.Background(), rt, srv.URL); err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("second call: %d, %v, want 503 (it trips the breaker)", code, err)
		}
		srv.down.Store(false)
		time.Sleep(time.Second)
		if code, err := get(t, context.Background(), rt, srv.URL); err != nil || code != http.StatusOK {
			t.Fatalf("probe: %d, %v, want 200", code, err)
		}

		// The provider side: admission control named "checkout", which admits
		// no retry.
		ctl, err := admission.New(admission.Config{Name: "checkout", RetryRatio: -1, MinRetriesPerSecond: -1, RetryAfterSpread: -1, Observer: obs})
		if err != nil {
			t.Fatal(err)
		}
		provider := ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		for _, attempt := range []int{1, 1, 2} {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if attempt > 1 {
				req.Header.Set(wire.AttemptHeader, strconv.Itoa(attempt))
			}
			provider.ServeHTTP(httptest.NewRecorder(), req)
		}

		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		body, _ := io.ReadAll(rec.Body)
		var lines []string
		for line := range strings.Lines(string(body)) {
			if strings.Contains(line, "stormguard_") || strings.Contains(line, "http_client_request_duration") {
				lines = append(lines, strings.TrimSuffix(line, "\n"))
			}
		}
		text := strings.Join(lines, "\n")
		t.Logf("/metrics, the stormguard series:\n%s", text)

		host, port := strings.TrimPrefix(srv.URL, "http://"), ""
		host, port = host[:strings.LastIndexByte(host, ':')], host[strings.LastIndexByte(host, ':')+1:]
		scope := `otel_scope_name="github.com/stormguard/stormguard/otelstormguard",otel_scope_schema_url="https://opentelemetry.io/schemas/1.43.0",otel_scope_version="` + releaseVersion(t) + `",`
		dep := `server_address="` + host + `",server_port="` + port + `"`
		for _, want := range []string{
			`stormguard_attempts_total{` + scope + dep + `,stormguard_outcome="failure"} 4`,
			`stormguard_attempts_total{` + scope + dep + `,stormguard_outcome="success"} 1`,
			`stormguard_retries_total{` + scope + dep + `,stormguard_retry_delay_source="backoff"} 2`,
			`stormguard_retry_delay_seconds_sum{` + scope + dep + `,stormguard_retry_delay_source="backoff"} 0.6000000000000001`,
			`stormguard_give_ups_total{` + scope + dep + `,stormguard_give_up_reason="attempts-exhausted"} 1`,
			`stormguard_give_ups_total{` + scope + dep + `,stormguard_give_up_reason="circuit-open"} 1`,
			`stormguard_breaker_transitions_total{` + scope + dep + `,stormguard_breaker_from="closed",stormguard_breaker_to="open"} 1`,
			`stormguard_breaker_transitions_total{` + scope + dep + `,stormguard_breaker_from="open",stormguard_breaker_to="half-open"} 1`,
			`stormguard_breaker_transitions_total{` + scope + dep + `,stormguard_breaker_from="half-open",stormguard_breaker_to="closed"} 1`,
			`stormguard_breaker_state{` + scope + dep + `,stormguard_breaker_state="closed"} 1`,
			`stormguard_breaker_state{` + scope + dep + `,stormguard_breaker_state="open"} 0`,
			`stormguard_admission_decisions_total{` + scope + `stormguard_name="checkout",stormguard_outcome="admitted"} 2`,
			`stormguard_admission_decisions_total{` + scope + `stormguard_admission_reason="retry-refused",stormguard_name="checkout",stormguard_outcome="shed-retry"} 1`,
			`stormguard_admission_retry_after_seconds_sum{` + scope + `stormguard_admission_reason="retry-refused",stormguard_name="checkout",stormguard_outcome="shed-retry"} 1`,
			`http_client_request_duration_seconds_count{error_type="503",http_request_method="GET",http_response_status_code="503",` + scope + dep + `} 4`,
			`http_client_request_duration_seconds_count{http_request_method="GET",http_response_status_code="200",` + scope + dep + `} 1`,
		} {
			if !strings.Contains(text+"\n", want+"\n") {
				t.Errorf("/metrics lacks the line\n%s", want)
			}
		}
	})
}
