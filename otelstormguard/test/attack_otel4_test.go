package test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// ot4RT is a RoundTripper of a func.
type ot4RT func(*http.Request) (*http.Response, error)

func (f ot4RT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func ot4Resp(r *http.Request, code int, hdr ...string) *http.Response {
	rec := httptest.NewRecorder()
	for i := 0; i+1 < len(hdr); i += 2 {
		rec.Header().Set(hdr[i], hdr[i+1])
	}
	rec.WriteHeader(code)
	_, _ = io.WriteString(rec, "body")
	resp := rec.Result()
	resp.Request = r
	return resp
}

// ot4AttemptSpans returns the attempt spans that started and those that
// ended.
func ot4AttemptSpans(s *sdk) (started, ended []sdktrace.ReadOnlySpan) {
	for _, sp := range s.spans.Started() {
		if sp.Name() == "stormguard.attempt" {
			started = append(started, sp)
		}
	}
	for _, sp := range s.spans.Ended() {
		if sp.Name() == "stormguard.attempt" {
			ended = append(ended, sp)
		}
	}
	return started, ended
}

// ot4Sum adds the values of the series whose key starts with prefix.
func ot4Sum(series map[string]float64, prefix string) float64 {
	var n float64
	for k, v := range series {
		if strings.HasPrefix(k, prefix) && !strings.HasSuffix(k, " sum") {
			n += v
		}
	}
	return n
}

// WithStaleCache serves a kept response at once for an open breaker and
// reports the give-up (circuit-open, 0 attempts). Through the observer: one
// give-up with reason circuit-open, an event on the caller's span with
// stormguard.attempts=0, no attempt span (none was started), no attempt
// counted, no HTTP request recorded.
func TestAttackOtel4StaleAtOnceTelemetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		var down atomic.Bool
		var hits atomic.Int64
		base := ot4RT(func(r *http.Request) (*http.Response, error) {
			hits.Add(1)
			if down.Load() {
				return ot4Resp(r, 503), nil
			}
			return ot4Resp(r, 200, "Cache-Control", "max-age=1"), nil
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithObserver(s.obs),
			httpretry.WithStaleCache(1<<20, time.Hour, false), httpretry.WithRetry(retry.WithBackoff(zeroDelays())))
		if err != nil {
			t.Fatal(err)
		}
		const url = "http://api.example:8080/users/12345"
		if code, err := get(t, context.Background(), rt, url); err != nil || code != 200 {
			t.Fatalf("first GET = %d, %v", code, err)
		}
		down.Store(true)
		time.Sleep(2 * time.Second)
		rt.Hosts()["api.example:8080"].Breaker.Trip(0)
		before := s.series(t)
		_, endedBefore := ot4AttemptSpans(s)

		ctx, call := s.tracer.Start(context.Background(), "call")
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := rt.RoundTrip(req)
		call.End()
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if st := resp.Header.Get("Stormguard-Stale"); !strings.HasPrefix(st, "circuit-open;attempts=0") {
			t.Fatalf("Stormguard-Stale %q: not served at once", st)
		}
		if hits.Load() != 1 {
			t.Fatalf("%d requests, want 1", hits.Load())
		}
		after := s.series(t)
		const a = "server.address=api.example,server.port=8080"
		if d := after["stormguard.give_ups{"+a+",stormguard.give_up.reason=circuit-open}"] - before["stormguard.give_ups{"+a+",stormguard.give_up.reason=circuit-open}"]; d != 1 {
			t.Errorf("give_ups circuit-open grew by %v, want 1", d)
		}
		if d := ot4Sum(after, "stormguard.attempts{") - ot4Sum(before, "stormguard.attempts{"); d != 0 {
			t.Errorf("attempts grew by %v, want 0", d)
		}
		if d := ot4Sum(after, "http.client.request.duration{") - ot4Sum(before, "http.client.request.duration{"); d != 0 {
			t.Errorf("http.client.request.duration count grew by %v, want 0", d)
		}
		for k := range after {
			if strings.Contains(k, "12345") || strings.Contains(k, "/users") {
				t.Errorf("series with the URL's path: %s", k)
			}
		}
		started, ended := ot4AttemptSpans(s)
		if len(started) != len(ended) || len(ended) != len(endedBefore) {
			t.Errorf("attempt spans: %d started, %d ended (before the call %d): the stale answer must start none", len(started), len(ended), len(endedBefore))
		}
		var got []string
		for _, ev := range s.spans.Ended()[len(s.spans.Ended())-1].Events() {
			got = append(got, ev.Name+" "+fmtAttrs(spanAttrs(ev.Attributes)))
		}
		if len(got) != 1 || got[0] != "stormguard.give_up stormguard.attempts=0 stormguard.give_up.reason=circuit-open" {
			t.Errorf("events on the caller's span: %q", got)
		}
	})
}

// ot4Wrapped is an observer wrapped as a program wraps one to add its own
// (observe.Func): it cannot tag attempts, which the docs allow ("an
// AttemptEnd whose context it did not tag ... leaves the caller's span
// alone").
func ot4Wrapped(o observe.Observer) observe.Observer {
	return observe.Func(func(ctx context.Context, e observe.Event) { o.Observe(ctx, e) })
}

// Traces: each attempt's span is "ended when the attempt ends" and
// carries its outcome; the observer "never ends a span it did not start".
// A policy (Name "" as both are unnamed, or the same name) whose observer is
// wrapped, called inside another policy's attempt: the inner attempt 1's
// AttemptEnd finds the outer attempt 1's span in its context and ends it
// with the inner's outcome and error, while the outer attempt is still
// running and then succeeds.
func TestAttackOtel4WrappedInnerEndsOuterAttemptSpan(t *testing.T) {
	for _, name := range []string{"payments", ""} {
		t.Run("name="+name, func(t *testing.T) { ot4WrappedInner(t, name) })
	}
}

func ot4WrappedInner(t *testing.T, name string) {
	s := newSDK(t)
	outer, err := retry.New(retry.WithName(name), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := retry.New(retry.WithName(name), retry.WithObserver(ot4Wrapped(s.obs)), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	boom := errors.New("inner lookup failed")
	err = outer.Do(ctx, func(ctx context.Context, _ int) error {
		_ = inner.Do(ctx, func(context.Context, int) error { return boom }) // the outer attempt handles it and succeeds
		return nil
	})
	call.End()
	if err != nil {
		t.Fatal(err)
	}
	_, ended := ot4AttemptSpans(s)
	if len(ended) != 1 {
		t.Fatalf("%d attempt spans, want the outer's 1", len(ended))
	}
	sp := ended[0]
	a := spanAttrs(sp.Attributes())
	if a["stormguard.outcome"] != "success" || sp.Status().Code == codes.Error || a["error.type"] != "" {
		t.Errorf("the outer attempt succeeded; its span says outcome=%q error.type=%q status %v %q (the inner call's)",
			a["stormguard.outcome"], a["error.type"], sp.Status().Code, sp.Status().Description)
	}
}

// A call waiting behind an open breaker whose caller cancels: the wait is
// recorded with an outcome of the documented set (admitted, rejected), the
// give-up is "canceled" with 0 attempts, and no attempt span or count.
func TestAttackOtel4BreakerWaitCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		brk, err := breaker.New(breaker.Config{MinCalls: 1, OpenFor: 10 * time.Second, Probes: 1, Rand: func() float64 { return 0.5 }})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithName("db"), retry.WithObserver(s.obs),
			retry.WithMaxAttempts(1), retry.WithClassifier(func(error) bool { return true }))
		if err != nil {
			t.Fatal(err)
		}
		_ = p.Do(context.Background(), func(context.Context, int) error { return errors.New("down") })
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		ctx, call := s.tracer.Start(ctx, "call")
		time.AfterFunc(3*time.Second, cancel)
		err = p.Do(ctx, func(context.Context, int) error { return nil })
		call.End()
		if !errors.Is(err, retry.Canceled) {
			t.Fatalf("err = %v, want Canceled", err)
		}
		series := s.series(t)
		for k := range series {
			if strings.HasPrefix(k, "stormguard.breaker.wait.duration{") &&
				!strings.Contains(k, "stormguard.outcome=admitted") && !strings.Contains(k, "stormguard.outcome=rejected") {
				t.Errorf("breaker wait outcome outside the set: %s", k)
			}
		}
		if v := series["stormguard.give_ups{server.address=db,stormguard.give_up.reason=canceled}"]; v != 1 {
			t.Errorf("give_ups canceled = %v, want 1; series %v", v, series)
		}
		if v := ot4Sum(series, "stormguard.attempts{"); v != 1 {
			t.Errorf("attempts = %v, want 1 (the first call's)", v)
		}
		started, ended := ot4AttemptSpans(s)
		if len(started) != 1 || len(ended) != 1 {
			t.Errorf("attempt spans %d started %d ended, want 1 and 1", len(started), len(ended))
		}
		last := s.spans.Ended()[len(s.spans.Ended())-1]
		var got []string
		for _, ev := range last.Events() {
			got = append(got, ev.Name+" "+fmtAttrs(spanAttrs(ev.Attributes)))
		}
		t.Logf("events: %q", got)
		if len(got) == 0 || got[len(got)-1] != "stormguard.give_up stormguard.attempts=0 stormguard.give_up.reason=canceled" {
			t.Errorf("events on the caller's span: %q", got)
		}
	})
}

// Counts match what was sent: under a mix of 503s, 500s, errors without
// a response, 404s and successes, with retries, every request the base
// got is one http.client.request.duration recording and one attempt (one
// span started and ended), and attribute values stay in the documented
// sets (no URL path, no id).
func TestAttackOtel4CountsMatchRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		var hits atomic.Int64
		base := ot4RT(func(r *http.Request) (*http.Response, error) {
			n := hits.Add(1)
			switch n % 5 {
			case 0:
				return ot4Resp(r, 503), nil
			case 1:
				return nil, errors.New("connection reset for /orders/" + r.URL.Path)
			case 2:
				return ot4Resp(r, 404), nil
			case 3:
				return ot4Resp(r, 500), nil
			}
			return ot4Resp(r, 200), nil
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithObserver(s.obs), httpretry.WithRetry(retry.WithBackoff(zeroDelays())))
		if err != nil {
			t.Fatal(err)
		}
		ctx, call := s.tracer.Start(context.Background(), "call")
		for i := range 40 {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://Shop.Example:8080/orders/"+string(rune('a'+i%26))+"?id=42", nil)
			if resp, err := rt.RoundTrip(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
		}
		call.End()
		series := s.series(t)
		h := float64(hits.Load())
		if v := ot4Sum(series, "http.client.request.duration{"); v != h {
			t.Errorf("http.client.request.duration count %v, want %v requests", v, h)
		}
		if v := ot4Sum(series, "stormguard.attempts{"); v != h {
			t.Errorf("attempts %v, want %v", v, h)
		}
		started, ended := ot4AttemptSpans(s)
		if float64(len(started)) != h || len(ended) != len(started) {
			t.Errorf("attempt spans %d started, %d ended, want %v", len(started), len(ended), h)
		}
		for k := range series {
			if strings.Contains(k, "orders") || strings.Contains(k, "42") || strings.Contains(k, "Shop") {
				t.Errorf("unbounded attribute value: %s", k)
			}
		}
	})
}

// A hedge whose base transport panics on its timer goroutine: the panic
// goes on in the caller's goroutine; every attempt span that started ends,
// the attempts counted match the spans, and the give-up is "panic".
func TestAttackOtel4HedgePanicSpans(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newSDK(t)
		var n atomic.Int64
		base := ot4RT(func(r *http.Request) (*http.Response, error) {
			if n.Add(1) == 2 {
				panic("hedge base boom")
			}
			select {
			case <-time.After(time.Second):
				return ot4Resp(r, 200), nil
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		rt, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithObserver(s.obs))
		if err != nil {
			t.Fatal(err)
		}
		ctx, call := s.tracer.Start(context.Background(), "call")
		var rec any
		func() {
			defer func() { rec = recover() }()
			_, _ = get(t, ctx, rt, "http://127.0.0.1:8080/x")
		}()
		call.End()
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if rec == nil {
			t.Fatalf("no panic reached the caller")
		}
		started, ended := ot4AttemptSpans(s)
		for _, sp := range ended {
			t.Logf("%s status=%v %q", fmtAttrs(spanAttrs(sp.Attributes())), sp.Status().Code, sp.Status().Description)
		}
		if len(started) != len(ended) {
			t.Errorf("attempt spans: %d started, %d ended", len(started), len(ended))
		}
		series := s.series(t)
		if v := ot4Sum(series, "stormguard.attempts{"); v != float64(len(started)) {
			t.Errorf("attempts %v, spans %d", v, len(started))
		}
		if v := ot4Sum(series, "stormguard.give_ups{"); v != 1 {
			t.Errorf("give_ups %v, want 1: %v", v, series)
		}
	})
}
