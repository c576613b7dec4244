package test_test

import (
	"context"

	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

// ---- harness (own copy: external package) ----

type a5SDK struct {
	obs    *otelstormguard.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tracer trace.Tracer
}

func a5New(t testing.TB, opts ...otelstormguard.Option) *a5SDK {
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
	return &a5SDK{obs: obs, reader: reader, spans: spans, tracer: tp.Tracer("zz")}
}

// series flattens the collected metrics: "name{attrs}" (counters, gauges)
// and "name{attrs} count" (histograms).
func (s *a5SDK) series(t testing.TB) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("Collect: %v", err)
	}
	out := map[string]float64{}
	key := func(n string, set attribute.Set) string {
		return n + "{" + set.Encoded(attribute.DefaultEncoder()) + "}"
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
				}
			}
		}
	}
	return out
}

func a5Dump(t testing.TB, m map[string]float64, prefix string) {
	t.Helper()
	var ks []string
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	for _, k := range ks {
		t.Logf("  %s = %v", k, m[k])
	}
}

func a5Attrs(kvs []attribute.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.String()
	}
	return m
}

type a5RT func(*http.Request) (*http.Response, error)

func (f a5RT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func a5Resp(r *http.Request, code int) *http.Response {
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: http.Header{},
		Body: io.NopCloser(strings.NewReader("x")), Request: r, ProtoMajor: 1, ProtoMinor: 1}
}

func a5ZeroBackoff(t testing.TB) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func a5Get(ctx context.Context, rt http.RoundTripper, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// ---- attacks ----

// "Observer is safe for concurrent use" / ObserveHTTP "is safe for
// concurrent use": a retry.Policy attempt (tagged by the observer) whose
// operation sends several requests at once, each recorded with
// ObserveHTTP (a program records its own requests; httpretry only records
// the ones it sends). Run under -race.
func TestAttack5ConcurrentObserveHTTPInOneAttempt(t *testing.T) {
	s := a5New(t)
	p, err := retry.New(retry.WithName("fanout"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	err = p.Do(ctx, func(actx context.Context, _ int) error {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(actx, http.MethodGet, fmt.Sprintf("http://shard%d.example:8080/x", i), nil)
				code := 200
				if i%2 == 1 {
					code = 503
				}
				s.obs.ObserveHTTP(req, a5Resp(req, code), nil, time.Millisecond)
			}()
		}
		wg.Wait()
		return nil
	})
	call.End()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, sp := range s.spans.Ended() {
		if sp.Name() == "stormguard.attempt" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("attempt spans ended = %d, want 1", n)
	}
}

// The methods known are those of OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS
// when set: with "POST,PUT", a GET is a method the conventions (as
// overridden) do not know, "_OTHER". A request whose Method is "" is a GET
// in net/http: the same request, and it must get the same label.
func TestAttack5KnownMethodsEmptyMethod(t *testing.T) {
	t.Setenv("OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS", "POST,PUT")
	s := a5New(t)
	base := a5RT(func(r *http.Request) (*http.Response, error) { return a5Resp(r, 200), nil })
	rt, err := httpretry.NewTransport(base, httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"GET", ""} {
		req, _ := http.NewRequest(http.MethodGet, "http://m.example:8080/", nil)
		req.Method = m
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	got := s.series(t)
	a5Dump(t, got, "http.client.request.duration")
	for k := range got {
		if strings.HasPrefix(k, "http.client.request.duration") && strings.Contains(k, "http.request.method=GET") {
			t.Errorf("GET is not among OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS=POST,PUT but a request with Method \"\" is labelled GET: %s", k)
		}
	}
	for _, sp := range s.spans.Ended() {
		if a := a5Attrs(sp.Attributes()); a["http.request.method"] == "GET" {
			t.Errorf("span %s: http.request.method=GET (method_original %q), want _OTHER", sp.Name(), a["http.request.method_original"])
		}
	}
}

// The breaker state gauge: "1 for the state the breaker is in, 0 for the
// other two". httpretry with WithMaxHosts(1): host a's breaker trips
// (gauge a: open), host b evicts a, a comes back with a new, closed
// breaker and is served. Which state does the gauge report for a?
func TestAttack5BreakerGaugeAfterHostEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := a5New(t)
		downA := true
		base := a5RT(func(r *http.Request) (*http.Response, error) {
			if r.URL.Host == "a.example:8080" && downA {
				return a5Resp(r, 503), nil
			}
			return a5Resp(r, 200), nil
		})
		rt, err := httpretry.NewTransport(base,
			httpretry.WithObserver(s.obs),
			httpretry.WithMaxHosts(1),
			httpretry.WithBudget(nil),
			httpretry.WithRetry(retry.WithMaxAttempts(1)),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Minute, MaxWaiters: -1}),
		)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			code, _ := a5Get(context.Background(), rt, "http://a.example:8080/")
			t.Logf("a: %d", code)
		}
		if !strings.Contains(fmt.Sprint(s.series(t)), "stormguard.breaker.state=open}:1") {
			a5Dump(t, s.series(t), "stormguard.breaker")
			t.Fatalf("a's breaker did not trip")
		}
		if code, err := a5Get(context.Background(), rt, "http://b.example:8080/"); code != 200 {
			t.Fatalf("b: %d %v", code, err)
		}
		downA = false
		for range 3 {
			if code, err := a5Get(context.Background(), rt, "http://a.example:8080/"); code != 200 {
				t.Fatalf("a after eviction: %d %v (breaker still open?)", code, err)
			}
		}
		got := s.series(t)
		a5Dump(t, got, "stormguard.breaker")
		a5Dump(t, got, "stormguard.attempts")
		k := "stormguard.breaker.state{server.address=a.example,server.port=8080,stormguard.breaker.state=open}"
		if got[k] == 1 {
			t.Errorf("gauge reports a's breaker open (%s = 1) while a's breaker is closed and a is served 200 (3 successes after its host entry was renewed)", k)
		}
	})
}

// ---- spans always ended, metrics agree with spans, through httpretry ----

type a5Scenario struct {
	name string
	opts []httpretry.Option
	// base answers the n-th request (1-based) the transport sends.
	base func(r *http.Request, n int) (*http.Response, error)
	// run makes the call(s) on ctx (the caller's span in it).
	run func(ctx context.Context, rt http.RoundTripper)
}

func a5PlainGet(url string) func(ctx context.Context, rt http.RoundTripper) {
	return func(ctx context.Context, rt http.RoundTripper) {
		func() {
			defer func() { _ = recover() }()
			_, _ = a5Get(ctx, rt, url)
		}()
	}
}

// TestAttack5SpansEndedMatrix runs many outcomes through the real
// transport and checks, for each: every span started was ended; the
// attempt spans are CLIENT, named stormguard.attempt, with
// http.request.resend_count = stormguard.attempt-1 from the second on
// (absent on the first), stormguard.hedge on hedges only, error.type iff
// status Error; stormguard.attempts counts one per attempt span; and
// http.client.request.duration one per request the base was handed.
func TestAttack5SpansEndedMatrix(t *testing.T) {
	const url = "http://svc.example:8080/r"
	ok := func(r *http.Request, _ int) (*http.Response, error) { return a5Resp(r, 200), nil }
	down := func(r *http.Request, _ int) (*http.Response, error) { return a5Resp(r, 503), nil }
	retries := httpretry.WithRetry(retry.WithMaxAttempts(3), retry.WithBackoff(a5ZeroBackoff(t)))
	scenarios := []a5Scenario{
		{name: "success", opts: []httpretry.Option{retries}, base: ok, run: a5PlainGet(url)},
		{name: "exhausted", opts: []httpretry.Option{retries}, base: down, run: a5PlainGet(url)},
		{name: "404", opts: []httpretry.Option{retries}, base: func(r *http.Request, _ int) (*http.Response, error) { return a5Resp(r, 404), nil }, run: a5PlainGet(url)},
		{name: "connerr", opts: []httpretry.Option{retries}, base: func(r *http.Request, _ int) (*http.Response, error) {
			return nil, errors.New("dial: refused")
		}, run: a5PlainGet(url)},
		{name: "panic-2nd", opts: []httpretry.Option{retries}, base: func(r *http.Request, n int) (*http.Response, error) {
			if n == 2 {
				panic("boom")
			}
			return a5Resp(r, 503), nil
		}, run: a5PlainGet(url)},
		{name: "goexit-1st", opts: []httpretry.Option{retries}, base: func(r *http.Request, n int) (*http.Response, error) {
			if n == 1 {
				a5Goexit()
			}
			return a5Resp(r, 200), nil
		}, run: func(ctx context.Context, rt http.RoundTripper) {
			done := make(chan struct{})
			go func() { defer close(done); _, _ = a5Get(ctx, rt, url) }()
			<-done
		}},
		{name: "cancel-in-attempt", opts: []httpretry.Option{retries}, base: func(r *http.Request, n int) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}, run: func(ctx context.Context, rt http.RoundTripper) {
			ctx, cancel := context.WithCancel(ctx)
			go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			_, _ = a5Get(ctx, rt, url)
		}},
		{name: "deadline-in-attempt", opts: []httpretry.Option{retries, httpretry.WithTimeout(time.Second)}, base: func(r *http.Request, n int) (*http.Response, error) {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}, run: a5PlainGet(url)},
		{name: "attempt-timeout", opts: []httpretry.Option{retries, httpretry.WithAttemptTimeout(100 * time.Millisecond)}, base: func(r *http.Request, n int) (*http.Response, error) {
			if n < 3 {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}
			return a5Resp(r, 200), nil
		}, run: a5PlainGet(url)},
		{name: "breaker-open", opts: []httpretry.Option{retries, httpretry.WithBudget(nil),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Minute, MaxWaiters: -1})},
			base: down, run: func(ctx context.Context, rt http.RoundTripper) {
				for range 3 {
					_, _ = a5Get(ctx, rt, url)
				}
			}},
		{name: "breaker-wait-probe", opts: []httpretry.Option{retries, httpretry.WithBudget(nil), httpretry.WithTimeout(5 * time.Second),
			httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Second, Probes: 1})},
			base: func(r *http.Request, n int) (*http.Response, error) {
				if n <= 2 {
					return a5Resp(r, 503), nil
				}
				return a5Resp(r, 200), nil
			}, run: func(ctx context.Context, rt http.RoundTripper) {
				for range 2 {
					_, _ = a5Get(ctx, rt, url)
				}
			}},
		{name: "budget-refused", opts: []httpretry.Option{retries},
			base: down, run: func(ctx context.Context, rt http.RoundTripper) {
				for range 5 {
					_, _ = a5Get(ctx, rt, url)
				}
			}},
		{name: "hedge-wins", opts: []httpretry.Option{retries, httpretry.WithHedging(10*time.Millisecond, 0, 2)},
			base: func(r *http.Request, n int) (*http.Response, error) {
				if n == 1 {
					select {
					case <-r.Context().Done():
						return nil, r.Context().Err()
					case <-time.After(time.Second):
					}
				}
				return a5Resp(r, 200), nil
			}, run: a5PlainGet(url)},
		{name: "hedge-loses", opts: []httpretry.Option{retries, httpretry.WithHedging(10*time.Millisecond, 0, 2)},
			base: func(r *http.Request, n int) (*http.Response, error) {
				if n == 1 {
					time.Sleep(15 * time.Millisecond)
					return a5Resp(r, 200), nil
				}
				select {
				case <-r.Context().Done():
					return nil, r.Context().Err()
				case <-time.After(time.Second):
				}
				return a5Resp(r, 200), nil
			}, run: a5PlainGet(url)},
		{name: "hedge-all-fail", opts: []httpretry.Option{retries, httpretry.WithHedging(10*time.Millisecond, 0, 2)},
			base: func(r *http.Request, n int) (*http.Response, error) {
				time.Sleep(20 * time.Millisecond)
				return a5Resp(r, 503), nil
			}, run: a5PlainGet(url)},
		{name: "hedge-panics", opts: []httpretry.Option{retries, httpretry.WithHedging(10*time.Millisecond, 0, 1)},
			base: func(r *http.Request, n int) (*http.Response, error) {
				if n == 2 {
					panic("hedge boom")
				}
				time.Sleep(30 * time.Millisecond)
				return a5Resp(r, 200), nil
			}, run: a5PlainGet(url)},
		{name: "hedge-cancel", opts: []httpretry.Option{retries, httpretry.WithHedging(10*time.Millisecond, 0, 2)},
			base: func(r *http.Request, n int) (*http.Response, error) {
				<-r.Context().Done()
				return nil, r.Context().Err()
			}, run: func(ctx context.Context, rt http.RoundTripper) {
				ctx, cancel := context.WithCancel(ctx)
				go func() { time.Sleep(50 * time.Millisecond); cancel() }()
				_, _ = a5Get(ctx, rt, url)
			}},
		{name: "refresh-401", opts: []httpretry.Option{retries, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			r.Header.Set("Authorization", "new")
			return r, nil
		})}, base: func(r *http.Request, n int) (*http.Response, error) {
			if r.Header.Get("Authorization") != "new" {
				return a5Resp(r, 401), nil
			}
			return a5Resp(r, 200), nil
		}, run: a5PlainGet(url)},
		{name: "refresh-401-panics", opts: []httpretry.Option{retries, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			panic("refresh boom")
		})}, base: func(r *http.Request, n int) (*http.Response, error) { return a5Resp(r, 401), nil }, run: a5PlainGet(url)},
		{name: "fallback", opts: []httpretry.Option{retries, httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			return a5Resp(r, 299), nil
		})}, base: down, run: a5PlainGet(url)},
		{name: "fallback-panics", opts: []httpretry.Option{retries, httpretry.WithFallback(func(r *http.Request, e *retry.Error) (*http.Response, error) {
			panic("fallback boom")
		})}, base: down, run: a5PlainGet(url)},
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := a5New(t)
				var mu sync.Mutex
				sent, calls := 0, 0
				base := a5RT(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					calls++
					n := calls
					mu.Unlock()
					resp, err := sc.base(r, n)
					mu.Lock()
					sent++ // returned (a panic or Goexit is no request sent)
					mu.Unlock()
					return resp, err
				})
				rt, err := httpretry.NewTransport(base, append([]httpretry.Option{httpretry.WithObserver(s.obs)}, sc.opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				ctx, call := s.tracer.Start(context.Background(), "call")
				func() {
					defer func() { _ = recover() }()
					sc.run(ctx, rt)
				}()
				time.Sleep(10 * time.Second) // fake: let every leg end
				synctest.Wait()
				call.End()
				a5CheckSpans(t, s, sent)
			})
		})
	}
}

func a5CheckSpans(t *testing.T, s *a5SDK, sent int) {
	t.Helper()
	started, ended := s.spans.Started(), s.spans.Ended()
	endedIDs := map[trace.SpanID]bool{}
	for _, sp := range ended {
		endedIDs[sp.SpanContext().SpanID()] = true
	}
	for _, sp := range started {
		if !endedIDs[sp.SpanContext().SpanID()] {
			t.Errorf("span %s %v never ended", sp.Name(), a5Attrs(sp.Attributes()))
		}
	}
	attemptSpans := 0
	for _, sp := range ended {
		if sp.Name() != "stormguard.attempt" {
			continue
		}
		attemptSpans++
		a := a5Attrs(sp.Attributes())
		t.Logf("attempt span %v status=%v %q", a, sp.Status().Code, sp.Status().Description)
		if sp.SpanKind() != trace.SpanKindClient {
			t.Errorf("attempt span kind %v, want CLIENT", sp.SpanKind())
		}
		n := 0
		fmt.Sscan(a["stormguard.attempt"], &n)
		rc, has := a["http.request.resend_count"]
		switch {
		case n < 1:
			t.Errorf("stormguard.attempt = %q", a["stormguard.attempt"])
		case n == 1 && has:
			t.Errorf("first attempt carries http.request.resend_count=%s", rc)
		case n > 1 && rc != fmt.Sprint(n-1):
			t.Errorf("attempt %d: http.request.resend_count=%q, want %d", n, rc, n-1)
		}
		if _, ok := a["stormguard.outcome"]; !ok {
			t.Errorf("attempt span without stormguard.outcome: %v", a)
		}
		_, hasET := a["error.type"]
		isErr := sp.Status().Code == 1 // codes.Error
		if hasET != isErr {
			t.Errorf("error.type present=%v but status Error=%v: %v", hasET, isErr, a)
		}
		for _, k := range []string{"server.address", "http.request.method", "url.full"} {
			if _, ok := a[k]; !ok && k != "http.request.method" && k != "url.full" {
				t.Errorf("attempt span lacks %s: %v", k, a)
			}
		}
	}
	got := s.series(t)
	var attempts, httpReqs float64
	for k, v := range got {
		if strings.HasPrefix(k, "stormguard.attempts{") {
			attempts += v
		}
		if strings.HasPrefix(k, "http.client.request.duration{") && strings.HasSuffix(k, " count") {
			httpReqs += v
		}
	}
	a5Dump(t, got, "stormguard.")
	if int(attempts) != attemptSpans {
		t.Errorf("stormguard.attempts = %v, attempt spans = %d", attempts, attemptSpans)
	}
	if int(httpReqs) != sent {
		t.Errorf("http.client.request.duration count = %v, requests handed to the base = %d", httpReqs, sent)
	}
}

func a5Goexit() { runtime.Goexit() }

// WithMaxDependencies(1): breakers of two names beyond the bound, one open
// and one that opened and closed again. The package documents the gauge of
// "_OTHER" as the latest change of any name past the bound, not a count
// (an attack found the gauge's "1 for the state the breaker is in" read as
// a count): kept:1 open, _OTHER closed.
func TestAttack5OverflowBreakerGauge(t *testing.T) {
	s := a5New(t, otelstormguard.WithMaxDependencies(1))
	ctx := context.Background()
	ev := func(name, from, to string) {
		s.obs.Observe(ctx, a5Event(name, from, to))
	}
	ev("kept:1", "closed", "open")
	ev("b:1", "closed", "open") // stays open
	ev("c:1", "closed", "open")
	ev("c:1", "open", "half-open")
	ev("c:1", "half-open", "closed")
	got := s.series(t)
	a5Dump(t, got, "stormguard.breaker.state")
	open, other := 0.0, ""
	for k, v := range got {
		if !strings.HasPrefix(k, "stormguard.breaker.state{") || v != 1 {
			continue
		}
		if strings.HasSuffix(k, "stormguard.breaker.state=open}") {
			open += v
		}
		if strings.Contains(k, "_OTHER") {
			other = k
		}
	}
	if open != 1 || !strings.HasSuffix(other, "state=closed}") {
		t.Errorf("open series sum %v (want 1: kept:1), _OTHER's state %q (want the latest change, closed)", open, other)
	}
}

// Close: "o may still be used; its gauges then report nothing. Close is
// safe to call more than once." A program that shuts its meter provider
// down first (defer order) and closes the observer after.
func TestAttack5CloseAfterShutdown(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := otelstormguard.NewObserver(otelstormguard.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	obs.Observe(context.Background(), a5Event("x:1", "closed", "open"))
	if err := mp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := obs.Close(); err != nil {
		t.Errorf("Close after the provider's Shutdown: %v", err)
	}
	if err := obs.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	obs.Observe(context.Background(), a5Event("x:1", "open", "half-open"))
}

// Concurrent Close and Collect and events: no race, no deadlock.
func TestAttack5ConcurrentClose(t *testing.T) {
	s := a5New(t)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 200 {
				s.obs.Observe(context.Background(), a5Event(fmt.Sprintf("h%d:%d", i, j%5+1), "closed", "open"))
			}
		}()
	}
	for range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.obs.Close() }()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			var rm metricdata.ResourceMetrics
			_ = s.reader.Collect(context.Background(), &rm)
		}
	}()
	wg.Wait()
	for k := range s.series(t) {
		if strings.HasPrefix(k, "stormguard.breaker.state") {
			t.Errorf("after Close the gauge still reports %s", k)
		}
	}
}

// More attempts than the observer caches span options for (32): every
// span ended, resend_count right, and the same through DoValueIf.
func TestAttack5ManyAttemptsSpans(t *testing.T) {
	s := a5New(t)
	p, err := retry.New(retry.WithName("db:5432"), retry.WithObserver(s.obs), retry.WithClassifier(func(error) bool { return true }), retry.WithMaxAttempts(40), retry.WithBackoff(a5ZeroBackoff(t)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	_, err = retry.DoValueIf(ctx, p, func(ctx context.Context, n int) (int, error) {
		if n%2 == 0 {
			return n, errors.New("again")
		}
		return n, nil
	}, func(v int) bool { return v < 39 })
	call.End()
	t.Logf("err %v", err)
	a5CheckSpans(t, s, 0)
}

func a5Event(name, from, to string) observe.Event {
	return observe.Event{Kind: observe.BreakerState, Name: name, From: from, To: to}
}

// "An empty Name ... counts as one dependency among WithMaxDependencies";
// "the events of further names are reported with the name _OTHER".
func TestAttack5EmptyNameCountsAndOverflow(t *testing.T) {
	s := a5New(t, otelstormguard.WithMaxDependencies(2))
	ctx := context.Background()
	for _, name := range []string{"", "a:1", "b:2", "c:3"} {
		s.obs.Observe(ctx, observe.Event{Kind: observe.GiveUp, Name: name, Reason: "attempts-exhausted", Attempt: 1})
	}
	got := s.series(t)
	want := map[string]float64{
		"stormguard.give_ups{stormguard.give_up.reason=attempts-exhausted}":                                1,
		"stormguard.give_ups{server.address=a,server.port=1,stormguard.give_up.reason=attempts-exhausted}": 1,
		"stormguard.give_ups{server.address=_OTHER,stormguard.give_up.reason=attempts-exhausted}":          2,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		a5Dump(t, got, "")
		t.Errorf("%d series, want %d", len(got), len(want))
	}
}

// Past the bound through httpretry: the attempt span of a host beyond it
// is reported with the name _OTHER, and every span still ends.
func TestAttack5OverflowHTTPSpans(t *testing.T) {
	s := a5New(t, otelstormguard.WithMaxDependencies(1))
	base := a5RT(func(r *http.Request) (*http.Response, error) { return a5Resp(r, 200), nil })
	rt, err := httpretry.NewTransport(base, httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"http://a.example:8080/", "http://b.example:9090/", "http://c.example:7070/"} {
		if code, err := a5Get(context.Background(), rt, u); code != 200 {
			t.Fatal(code, err)
		}
	}
	a5CheckSpans(t, s, 3)
	got := s.series(t)
	for k := range got {
		if strings.Contains(k, "b.example") || strings.Contains(k, "c.example") {
			t.Errorf("series of a host beyond the bound: %s", k)
		}
	}
}
