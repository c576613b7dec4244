package test_test

// Black-box attacks (area otel2026) on the recent changes of otelstormguard:
// the forgotten breaker's gauge, ObserveHTTP's attributes and concurrency.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

func zzoWith(m map[string]float64, prefix string) []string {
	var out []string
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			out = append(out, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return out
}

func zzoBreakerEvent(name, from, to string) observe.Event {
	return observe.Event{Kind: observe.BreakerState, Name: name, From: from, To: to}
}

// delayedForget forwards every event to next, but holds the "forgotten"
// event of one name until released: it stands for the goroutine that
// evicted the host being preempted between the table's unlock and the
// event (internal/guards.Table calls Forget outside its lock).
type delayedForget struct {
	next    observe.Observer
	name    string
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (d *delayedForget) Observe(ctx context.Context, e observe.Event) {
	if e.Kind == observe.BreakerState && e.Reason == "forgotten" && e.Name == d.name {
		d.once.Do(func() {
			close(d.held)
			<-d.release
		})
	}
	d.next.Observe(ctx, e)
}

// Package doc: the breaker state gauge is "1 for the state the breaker is
// in"; observe: To "" with Reason "forgotten" when the layer dropped the
// breaker it built for a destination. With WithMaxHosts(1) the old breaker
// of host a is evicted (by b) while a comes back with a new breaker that
// trips; the old breaker's forgetting must be told before the new one's
// change, or the gauge forgets the new, open breaker.
func TestAttackOtelLateForgetKeepsNewBreaker(t *testing.T) {
	s := a5New(t)
	wrap := &delayedForget{next: s.obs, name: "a.example:8080", held: make(chan struct{}), release: make(chan struct{})}
	downA := false
	var mu sync.Mutex
	base := a5RT(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		down := downA
		mu.Unlock()
		if r.URL.Host == "a.example:8080" && down {
			return a5Resp(r, 503), nil
		}
		return a5Resp(r, 200), nil
	})
	rt, err := httpretry.NewTransport(base,
		httpretry.WithObserver(wrap),
		httpretry.WithMaxHosts(1),
		httpretry.WithBudget(nil),
		httpretry.WithRetry(retry.WithMaxAttempts(1)),
		httpretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Hour, MaxWaiters: -1}),
	)
	if err != nil {
		t.Fatal(err)
	}
	if code, err := a5Get(context.Background(), rt, "http://a.example:8080/"); code != 200 {
		t.Fatalf("a: %d %v", code, err)
	}
	done := make(chan struct{})
	go func() { // evicts a's first breaker; its forgetting is held
		defer close(done)
		_, _ = a5Get(context.Background(), rt, "http://b.example:8080/")
	}()
	<-wrap.held
	mu.Lock()
	downA = true
	mu.Unlock()
	// a comes back (evicting b): a new breaker, which trips. Its change is
	// told after the old breaker's forgetting (the new breaker's first
	// change waits for it), so the requests run on a goroutine, and the
	// forgetting is let go once they are done or after 300 ms, whichever
	// comes first (without the ordering they are done at once, and the
	// late forgetting then removes the new breaker's state).
	aDone := make(chan error, 1)
	go func() {
		if code, _ := a5Get(context.Background(), rt, "http://a.example:8080/"); code != 503 {
			aDone <- fmt.Errorf("a's new breaker's first request: %d, want 503", code)
			return
		}
		if _, err := a5Get(context.Background(), rt, "http://a.example:8080/"); err == nil {
			aDone <- errors.New("a's new breaker is not open")
			return
		}
		aDone <- nil
	}()
	var aErr error
	waited := false
	select {
	case aErr = <-aDone:
		waited = true
	case <-time.After(300 * time.Millisecond):
	}
	close(wrap.release)
	if !waited {
		aErr = <-aDone
	}
	if aErr != nil {
		t.Fatal(aErr)
	}
	<-done
	openKey := "stormguard.breaker.state{server.address=a.example,server.port=8080,stormguard.breaker.state=open}"
	if _, err := a5Get(context.Background(), rt, "http://a.example:8080/"); err == nil {
		t.Fatalf("a's breaker closed meanwhile: the test's premise is gone")
	}
	got := s.series(t)
	if got[openKey] != 1 {
		t.Errorf("a's current breaker is open (its requests are refused), but the state gauge reports %s = %v (series: %v): "+
			"the forgetting of a's evicted breaker, told after the new breaker's change, removed the new breaker's state",
			openKey, got[openKey], zzoWith(got, "stormguard.breaker.state"))
	}
}

// Package doc: "The breaker state gauge of "_OTHER" is then the latest
// change of any of those names' breakers, not a count of them." Past the
// bound, c's breaker opens last; b's breaker (past the bound too, and
// closed again earlier) is then forgotten by its layer. The latest change
// of any of those breakers is c's: open. The gauge of _OTHER drops.
func TestAttackOtelForgottenNameKeepsOther(t *testing.T) {
	s := a5New(t, otelstormguard.WithMaxDependencies(1))
	ctx := context.Background()
	s.obs.Observe(ctx, zzoBreakerEvent("kept:1", "closed", "open"))
	s.obs.Observe(ctx, zzoBreakerEvent("b:1", "closed", "open"))
	s.obs.Observe(ctx, zzoBreakerEvent("c:1", "closed", "open"))
	s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: "b:1", From: "open", Reason: "forgotten"})
	got := s.series(t)
	k := "stormguard.breaker.state{server.address=_OTHER,stormguard.breaker.state=open}"
	if got[k] != 1 {
		t.Errorf("%s = %v, want 1 (c's breaker, past the bound, opened last and is open; b's forgetting is no change of c's): %v",
			k, got[k], zzoWith(got, "stormguard.breaker.state"))
	}
}

// Package doc: "An empty Name ... leaves the attribute out"; every client
// metric "carries the dependency as server.address". A request recorded
// with ObserveHTTP whose URL has no host (a relative URL: the base
// transport refuses it) must not carry server.address="".
func TestAttackOtelEmptyHostNoServerAddress(t *testing.T) {
	s := a5New(t)
	req, err := http.NewRequest(http.MethodGet, "/relative", nil)
	if err != nil {
		t.Fatal(err)
	}
	s.obs.ObserveHTTP(req, nil, errors.New("http: no Host in request URL"), time.Millisecond)
	got := s.series(t)
	for _, k := range zzoWith(got, "http.client.request.duration") {
		if strings.Contains(k, "server.address=,") || strings.Contains(k, "server.address=}") {
			t.Errorf("series with an empty server.address: %s", k)
		}
	}
}

// observe: a forgotten breaker (To "", Reason "forgotten") tells no
// transition; the gauge drops it (the state gauges report a breaker from
// its first change on). A later change of the same name shows again.
func TestAttackOtel6ForgottenGaugeAndReturn(t *testing.T) {
	s := a5New(t)
	ctx := context.Background()
	s.obs.Observe(ctx, zzoBreakerEvent("h:1", "closed", "open"))
	s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: "h:1", From: "open", Reason: "forgotten"})
	got := s.series(t)
	if g := zzoWith(got, "stormguard.breaker.state{"); len(g) != 0 {
		t.Errorf("gauge after forgetting: %v", g)
	}
	if g := zzoWith(got, "stormguard.breaker.transitions"); len(g) != 1 {
		t.Errorf("transitions: %v (want the one change, closed->open)", g)
	}
	// a forgetting told twice, or of a name never seen: no panic, nothing shown
	s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: "h:1", From: "closed", Reason: "forgotten"})
	s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: "never:2", From: "closed", Reason: "forgotten"})
	s.obs.Observe(ctx, zzoBreakerEvent("h:1", "closed", "half-open"))
	got = s.series(t)
	if got["stormguard.breaker.state{server.address=h,server.port=1,stormguard.breaker.state=half-open}"] != 1 {
		t.Errorf("return after forgetting: %v", zzoWith(got, "stormguard.breaker.state{"))
	}
}

// ObserveHTTP: method "" is GET (known), with and without the
// environment's list; url.full redacts credentials and the named query
// keys (escaped spellings included), keeps the rest.
func TestAttackOtel6MethodAndURL(t *testing.T) {
	t.Setenv("OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS", "POST, get")
	s := a5New(t)
	p, err := retry.New(retry.WithName("api.example:443"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	_ = p.Do(ctx, func(ctx context.Context, _ int) error {
		u, _ := url.Parse("https://user@API.example/p?Signatur%65=s1&x=1&sig=s2&AWSAccessKeyId")
		req := (&http.Request{URL: u, Header: http.Header{}}).WithContext(ctx)
		s.obs.ObserveHTTP(req, a5Resp(req, 200), nil, time.Millisecond)
		return nil
	})
	call.End()
	var attrs map[string]string
	for _, sp := range s.spans.Ended() {
		if sp.Name() == "stormguard.attempt" {
			attrs = map[string]string{}
			for _, kv := range sp.Attributes() {
				attrs[string(kv.Key)] = kv.Value.String()
			}
		}
	}
	if attrs == nil {
		t.Fatal("no attempt span")
	}
	if attrs["http.request.method"] != "_OTHER" || attrs["http.request.method_original"] != "GET" {
		t.Errorf("method %q original %q: want _OTHER and GET (the list names get, not GET)", attrs["http.request.method"], attrs["http.request.method_original"])
	}
	full := attrs["url.full"]
	for _, secret := range []string{"user", "s1", "s2"} {
		if strings.Contains(full, secret) {
			t.Errorf("url.full %q keeps %q", full, secret)
		}
	}
	if !strings.Contains(full, "x=1") || attrs["server.port"] != "443" {
		t.Errorf("url.full %q server.port %q", full, attrs["server.port"])
	}
	got := s.series(t)
	k := "http.client.request.duration{http.request.method=_OTHER,http.response.status_code=200,server.address=api.example,server.port=443} count"
	if got[k] != 1 {
		t.Errorf("%s = %v; %v", k, got[k], zzoWith(got, "http.client"))
	}
}

// ObserveHTTP "is safe for concurrent use": many requests of one attempt,
// while forgetting events and collections run; the attempt span ends once
// with the last request's outcome (any of them), no race.
func TestAttackOtel6ConcurrentObserveHTTPAndForget(t *testing.T) {
	s := a5New(t, otelstormguard.WithMaxDependencies(3))
	p, err := retry.New(retry.WithName("fan:1"), retry.WithObserver(s.obs), retry.WithMaxAttempts(1))
	if err != nil {
		t.Fatal(err)
	}
	ctx, call := s.tracer.Start(context.Background(), "call")
	_ = p.Do(ctx, func(ctx context.Context, _ int) error {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 50 {
					req, _ := http.NewRequestWithContext(ctx, "", fmt.Sprintf("http://h%d.example/", j%5), nil)
					code := 200
					if (i+j)%3 == 0 {
						code = 500
					}
					s.obs.ObserveHTTP(req, a5Resp(req, code), nil, time.Millisecond)
					name := fmt.Sprintf("h%d.example", j%5)
					s.obs.Observe(ctx, zzoBreakerEvent(name, "closed", "open"))
					s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: name, From: "open", Reason: "forgotten"})
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				var rm metricdata.ResourceMetrics
				_ = s.reader.Collect(context.Background(), &rm)
			}
		}()
		wg.Wait()
		return nil
	})
	call.End()
	n := 0
	for _, sp := range s.spans.Ended() {
		if sp.Name() == "stormguard.attempt" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d attempt spans ended, want 1", n)
	}
	got := s.series(t)
	total := 0.0
	for k, v := range got {
		if strings.HasPrefix(k, "http.client.request.duration{") {
			total += v
		}
	}
	if total != 400 {
		t.Errorf("http.client.request.duration counts %v requests, want 400", total)
	}
}
