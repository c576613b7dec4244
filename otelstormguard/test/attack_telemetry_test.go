// Black-box attack (area: telemetry): what otelstormguard records for what
// the producers emit, against its documented instruments and attributes.

package test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

func ztResp(r *http.Request, code int, hdr ...string) *http.Response {
	rec := httptest.NewRecorder()
	for i := 0; i+1 < len(hdr); i += 2 {
		rec.Header().Set(hdr[i], hdr[i+1])
	}
	rec.WriteHeader(code)
	_, _ = io.WriteString(rec, "x")
	resp := rec.Result()
	resp.Request = r
	return resp
}

type ztRT func(*http.Request) (*http.Response, error)

func (f ztRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func ztBackoff(t testing.TB) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Base: 100 * time.Millisecond, Rand: func() float64 { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stormguard.outcome of an attempt takes "success, failure, rejected,
// canceled" ("Every other attribute takes values from a fixed set"): a
// hedge answered 409 with Retry-After.
func TestAttackTelHedgeOutcomeSeries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		var n atomic.Int64
		base := ztRT(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			if n.Add(1) == 1 {
				d = 200 * time.Millisecond
			}
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			if d == 10*time.Millisecond {
				return ztResp(r, 409, "Retry-After", "1"), nil
			}
			return ztResp(r, 200), nil
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1),
			httpretry.WithObserver(s.obs), httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:8080/x", nil)
		req.Header.Set("Idempotency-Key", "k1")
		if resp, err := rt.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
		synctest.Wait()
		ok := map[string]bool{"success": true, "failure": true, "rejected": true, "canceled": true}
		for k, v := range s.series(t) {
			if !strings.HasPrefix(k, "stormguard.attempts{") {
				continue
			}
			i := strings.Index(k, "stormguard.outcome=")
			out := strings.TrimSuffix(k[i+len("stormguard.outcome="):], "}")
			if j := strings.IndexByte(out, ','); j >= 0 {
				out = out[:j]
			}
			if !ok[out] {
				t.Errorf("series %s = %v: stormguard.outcome %q is not a documented value", k, v, out)
			}
		}
	})
}

// Cost: "a steady state of metrics allocates nothing of the observer's
// own". A failing call (three attempts, two retries, a give-up) through the
// metrics SDK allocates no more than the same call with an observer that
// does nothing (observe.Func): the loop's own allocations (its *Error)
// are in both.
func TestAttackTelFailurePathAllocs(t *testing.T) {
	zero, err := backoff.New(backoff.Config{Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	errTemp := ztTemp{}
	run := func(obs observe.Observer) float64 {
		p, err := retry.New(retry.WithObserver(obs), retry.WithName("dep"), retry.WithBackoff(zero))
		if err != nil {
			t.Fatal(err)
		}
		op := func(context.Context, int) error { return errTemp }
		ctx := context.Background()
		_ = p.Do(ctx, op)
		return testing.AllocsPerRun(200, func() { _ = p.Do(ctx, op) })
	}
	base := run(observe.Func(func(context.Context, observe.Event) {}))
	mp := sdkMeterProvider(t)
	obs := mustObserver(t, otelstormguard.WithMeterProvider(mp), otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()))
	got := run(obs)
	if got > base {
		t.Errorf("failing call: %v allocs with the metrics SDK, %v with a do-nothing observer", got, base)
	}
}

type ztTemp struct{}

func (ztTemp) Error() string   { return "temporary" }
func (ztTemp) Temporary() bool { return true }

// "An Observer is safe for concurrent use": hedged races through the
// tracing and metrics SDK from many goroutines, under -race, with the
// first copy losing (canceled) while the hedge wins.
func TestAttackTelConcurrentHedgedRaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		var n atomic.Int64
		base := ztRT(func(r *http.Request) (*http.Response, error) {
			d := 5 * time.Millisecond
			if n.Add(1)%2 == 1 {
				d = time.Hour
			}
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return ztResp(r, 200), nil
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithHedging(20*time.Millisecond, 0, 1), httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, call := s.tracer.Start(context.Background(), "call")
				defer call.End()
				_, _ = get(t, ctx, rt, "http://127.0.0.1:8080/x")
			}()
		}
		wg.Wait()
		synctest.Wait()
		_ = s.series(t)
	})
}

// Traces: the loop's decisions are events on the caller's span:
// "stormguard.retry (stormguard.attempt that failed, stormguard.retry.delay
// in seconds, stormguard.retry.delay_source)" and "stormguard.give_up
// (stormguard.give_up.reason, stormguard.attempts)"; attempt spans whose
// failure is an attempt timeout carry error.type and status Error.
func TestAttackTelAttemptTimeoutTrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		p, err := retry.New(retry.WithObserver(s.obs), retry.WithName("pay.example:443"),
			retry.WithAttemptTimeout(100*time.Millisecond), retry.WithMaxAttempts(2), retry.WithBackoff(ztBackoff(t)))
		if err != nil {
			t.Fatal(err)
		}
		ctx, call := s.tracer.Start(context.Background(), "call")
		_ = p.Do(ctx, func(ctx context.Context, _ int) error { <-ctx.Done(); return ctx.Err() })
		call.End()
		var got []string
		for _, sp := range s.spans.Ended() {
			a := spanAttrs(sp.Attributes())
			got = append(got, sp.Name()+" "+fmtAttrs(a)+" status="+sp.Status().Code.String())
			for _, ev := range sp.Events() {
				got = append(got, "  event "+ev.Name+" "+fmtAttrs(spanAttrs(ev.Attributes)))
			}
		}
		want := []string{
			"stormguard.attempt error.type=context.deadlineExceededError server.address=pay.example server.port=443 stormguard.attempt=1 stormguard.outcome=failure status=Error",
			"stormguard.attempt error.type=context.deadlineExceededError http.request.resend_count=1 server.address=pay.example server.port=443 stormguard.attempt=2 stormguard.outcome=failure status=Error",
			"call  status=Unset",
			"  event stormguard.retry stormguard.attempt=1 stormguard.retry.delay=0.199999999 stormguard.retry.delay_source=backoff",
			"  event stormguard.give_up stormguard.attempts=2 stormguard.give_up.reason=attempts-exhausted",
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("spans\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		// and the metrics: attempt durations of 0.1 s each, failure.
		ser := s.series(t)
		if v := ser["stormguard.attempt.duration{server.address=pay.example,server.port=443,stormguard.outcome=failure} sum"]; !closeTo(v, 0.2) {
			t.Errorf("attempt.duration sum %v, want 0.2; series %v", v, ser)
		}
	})
}

// docs: http.client.request.duration is recorded "in the buckets the
// conventions advise (5 ms to 10 s)"; the stormguard durations are in s.
func TestAttackTelHTTPBuckets(t *testing.T) {
	s := newSDK(t)
	base := ztRT(func(r *http.Request) (*http.Response, error) { return ztResp(r, 200), nil })
	rt, err := httpretry.NewTransport(base, httpretry.WithObserver(s.obs))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, context.Background(), rt, "http://127.0.0.1:8080/x"); err != nil {
		t.Fatal(err)
	}
	m := s.metric(t, "http.client.request.duration")
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok || len(h.DataPoints) != 1 {
		t.Fatalf("data %T %v", m.Data, m.Data)
	}
	want := []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	if got := h.DataPoints[0].Bounds; len(got) != len(want) || m.Unit != "s" {
		t.Errorf("bounds %v unit %q, want %v, s", got, m.Unit, want)
	}
}

var (
	_ = errors.New
	_ = attribute.Key("")
	_ sdkmetric.Reader
)

// Traces: "a hedge's first copy that the race canceled has none either"
// (no error.type, no status Error), and "A success leaves the status
// unset". The hedge wins with a 200; the race cancels the first copy,
// whose 503 was already on its way and arrives 1 ms after the cancel.
// Also run with -race: the late copy is recorded on its own goroutine.
func TestAttackTelCanceledFirstCopyLateAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		var n atomic.Int64
		base := ztRT(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 1 {
				<-r.Context().Done()
				time.Sleep(time.Millisecond) // the answer was already on the wire
				return ztResp(r, 503), nil
			}
			time.Sleep(5 * time.Millisecond)
			return ztResp(r, 200), nil
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithHedging(20*time.Millisecond, 0, 1), httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		ctx, call := s.tracer.Start(context.Background(), "call")
		if code, err := get(t, ctx, rt, "http://127.0.0.1:8080/x"); err != nil || code != 200 {
			t.Fatalf("GET = %d, %v", code, err)
		}
		call.End()
		time.Sleep(time.Second)
		synctest.Wait()
		for _, sp := range s.spans.Ended() {
			a := spanAttrs(sp.Attributes())
			if sp.Name() != "stormguard.attempt" {
				continue
			}
			if a["stormguard.outcome"] == "success" && (a["error.type"] != "" || sp.Status().Code == codes.Error) {
				t.Errorf("attempt span %s: outcome success but error.type=%q status %v", fmtAttrs(a), a["error.type"], sp.Status())
			}
		}
	})
}

// "An Observer is safe for concurrent use": breaker and fleet state
// changes of new and known names, attempts past the cached attempt numbers
// and the overflow name, while the reader collects (the gauges' callback)
// and ObserveHTTP records. Run with -race.
func TestAttackTelConcurrentStatesAndCollect(t *testing.T) {
	s := newSDK(t, otelstormguard.WithMaxDependencies(8))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 300; i++ {
				name := "dep" + string(rune('a'+(i+g)%12)) + ":80"
				s.obs.Observe(context.Background(), observe.Event{Kind: observe.BreakerState, Name: name, From: "closed", To: "open"})
				s.obs.Observe(context.Background(), observe.Event{Kind: observe.FleetMode, Name: name, From: "fleet", To: "local"})
				ctx := s.obs.TagAttempt(context.Background(), observe.Event{Kind: observe.AttemptStart, Name: name, Attempt: 30 + i%5})
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+name+"/x?sig=1", nil)
				s.obs.ObserveHTTP(req, &http.Response{StatusCode: 500, Body: http.NoBody}, nil, time.Millisecond)
				s.obs.Observe(ctx, observe.Event{Kind: observe.AttemptEnd, Name: name, Attempt: 30 + i%5, Outcome: "failure", Err: errors.New("x")})
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				_ = s.collect(t)
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	close(stop)
	wg.Wait()
	ser := s.series(t)
	open := 0.0
	for k, v := range ser {
		if strings.HasPrefix(k, "stormguard.breaker.state{") && strings.Contains(k, "stormguard.breaker.state=open") {
			open += v
		}
	}
	// 12 names, 8 kept, 4 (and more) in _OTHER: 9 series with open = 1.
	if open != 9 {
		t.Errorf("open breakers %v, want 9 (8 names and _OTHER)", open)
	}
}
