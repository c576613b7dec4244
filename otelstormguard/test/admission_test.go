package test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// Admission decisions through the middleware on a loopback server, and a
// request that queues: exact counts by outcome and reason, and the
// Retry-After of every shed request.
func TestAdmissionDecisions(t *testing.T) {
	s := newSDK(t)
	ctl, err := admission.New(admission.Config{
		Name: "pay", MaxInFlight: 1, MaxQueue: 1, MaxQueueWait: time.Hour,
		RetryRatio: -1, MinRetriesPerSecond: -1, // no retry admitted
		RetryAfterSpread: -1, // every Retry-After is exactly 1 s
		Observer:         s.obs,
	})
	if err != nil {
		t.Fatal(err)
	}
	var armed atomic.Bool
	hold, held := make(chan struct{}), make(chan struct{})
	srv := newAdmissionServer(t, ctl, &armed, hold, held)

	send := func(attempt int) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
		if attempt > 1 {
			req.Header.Set(wire.AttemptHeader, strconv.Itoa(attempt))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err) // also called from other goroutines: no Fatal
			return 0
		}
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	// Two originals admitted, one retry refused by the ratio.
	for _, c := range []struct{ attempt, want int }{{1, 200}, {1, 200}, {2, 503}} {
		if got := send(c.attempt); got != c.want {
			t.Fatalf("attempt %d answered %d, want %d", c.attempt, got, c.want)
		}
	}
	// One request holds the only slot; one waits in the queue; the next
	// finds the queue full.
	done := make(chan int, 2)
	armed.Store(true)
	go func() { done <- send(1) }()
	<-held
	go func() { done <- send(1) }()
	for ctl.Stats().Queued != 1 {
		runtime.Gosched()
	}
	if got := send(1); got != 503 {
		t.Fatalf("with the queue full: %d, want 503", got)
	}
	close(hold) // both finish
	for range 2 {
		if got := <-done; got != 200 {
			t.Fatalf("held or queued request answered %d, want 200", got)
		}
	}

	checkSeries(t, s.series(t), map[string]float64{
		"stormguard.admission.decisions{stormguard.name=pay,stormguard.outcome=admitted}":                                                     4,
		"stormguard.admission.decisions{stormguard.name=pay,stormguard.outcome=queued}":                                                       1,
		"stormguard.admission.decisions{stormguard.admission.reason=retry-refused,stormguard.name=pay,stormguard.outcome=shed-retry}":         1,
		"stormguard.admission.decisions{stormguard.admission.reason=queue-full,stormguard.name=pay,stormguard.outcome=shed-busy}":             1,
		"stormguard.admission.retry_after{stormguard.admission.reason=retry-refused,stormguard.name=pay,stormguard.outcome=shed-retry} count": 1,
		"stormguard.admission.retry_after{stormguard.admission.reason=retry-refused,stormguard.name=pay,stormguard.outcome=shed-retry} sum":   1,
		"stormguard.admission.retry_after{stormguard.admission.reason=queue-full,stormguard.name=pay,stormguard.outcome=shed-busy} count":     1,
		"stormguard.admission.retry_after{stormguard.admission.reason=queue-full,stormguard.name=pay,stormguard.outcome=shed-busy} sum":       1,
	})
	if n := len(s.spans.Ended()); n != 0 {
		t.Errorf("%d spans ended, want none: admission makes no span", n)
	}
}

// newAdmissionServer serves 200 behind ctl on a loopback server; once
// armed is set, the next request clears it, signals held and waits for hold
// to close.
func newAdmissionServer(t *testing.T, ctl *admission.Controller, armed *atomic.Bool, hold, held chan struct{}) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(ctl.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		if armed.CompareAndSwap(true, false) {
			close(held)
			<-hold
		}
	})))
	t.Cleanup(srv.Close)
	return srv
}

// The events of the guards that do not run here yet (idempotency keys, a
// fleet's mode) feed their metrics exactly, as the packages report them.
func TestIdempotencyAndFleetEvents(t *testing.T) {
	s := newSDK(t)
	ctx := context.Background()
	for _, e := range idempotencyAndFleetEvents() {
		s.obs.Observe(ctx, e)
	}
	checkSeries(t, s.series(t), map[string]float64{
		"stormguard.idempotency.outcomes{stormguard.name=orders,stormguard.outcome=new}":                                   2,
		"stormguard.idempotency.outcomes{stormguard.name=orders,stormguard.outcome=replay}":                                1,
		"stormguard.idempotency.outcomes{stormguard.name=orders,stormguard.outcome=store-error}":                           1,
		"stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=new} count":                       2,
		"stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=new} sum":                         0.003,
		"stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=replay} count":                    1,
		"stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=replay} sum":                      0.0005,
		"stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=store-error} count":               1,
		"stormguard.idempotency.store.duration{stormguard.name=orders,stormguard.outcome=store-error} sum":                 0.25,
		"stormguard.fleet.mode.transitions{server.address=payments,stormguard.fleet.from=fleet,stormguard.fleet.to=local}": 1,
		"stormguard.fleet.mode.transitions{server.address=payments,stormguard.fleet.from=local,stormguard.fleet.to=fleet}": 1,
		"stormguard.fleet.mode{server.address=payments,stormguard.fleet.mode=fleet}":                                       1,
		"stormguard.fleet.mode{server.address=payments,stormguard.fleet.mode=local}":                                       0,
	})
}

// idempotencyAndFleetEvents are the events of an idempotency guard named
// "orders" (two new keys, a replay, a store failure, with the time spent in
// the store) and of a fleet named "payments" that falls back to local mode
// and returns.
func idempotencyAndFleetEvents() []observe.Event {
	errDown := errors.New("redis: connection refused")
	return []observe.Event{
		{Kind: observe.Idempotency, Name: "orders", Outcome: "new", Elapsed: time.Millisecond},
		{Kind: observe.Idempotency, Name: "orders", Outcome: "new", Elapsed: 2 * time.Millisecond},
		{Kind: observe.Idempotency, Name: "orders", Outcome: "replay", Elapsed: 500 * time.Microsecond},
		{Kind: observe.Idempotency, Name: "orders", Outcome: "store-error", Elapsed: 250 * time.Millisecond, Err: errDown},
		{Kind: observe.FleetMode, Name: "payments", From: "fleet", To: "local", Err: errDown},
		{Kind: observe.FleetMode, Name: "payments", From: "local", To: "fleet"},
	}
}
