package httpretry_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/observe"
)

// eventLog is an observer that records every event, with the error
// reduced to its text.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) Observe(_ context.Context, e observe.Event) {
	s := fmt.Sprintf("%v name=%s attempt=%d delay=%v hint=%v elapsed=%v reason=%q from=%q to=%q outcome=%q err=%v",
		e.Kind, e.Name, e.Attempt, e.Delay, e.Hint, e.Elapsed, e.Reason, e.From, e.To, e.Outcome, e.Err)
	l.mu.Lock()
	l.events = append(l.events, s)
	l.mu.Unlock()
}

func (l *eventLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.events
	l.events = nil
	return ev
}

// ev formats an expected event like eventLog does.
func ev(e observe.Event) string {
	var l eventLog
	l.Observe(context.Background(), e)
	return l.events[0]
}

// advance moves the fake clock forward by d without a sleep.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestObserverEvents checks the exact events of a call that gets 503, 503,
// 200: every attempt's start and end, the retries with their delays, each
// named with the host.
func TestObserverEvents(t *testing.T) {
	srv, _ := serve(t, failThenOK(2))
	host := hostOf(t, srv.URL)
	log := &eventLog{}
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithObserver(log))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	readClose(t, resp)

	seq := smallBackoff(t).Sequence()
	d1, d2 := seq.Next(), seq.Next()
	e503 := &httpretry.StatusError{Code: 503}
	want := []string{
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 1}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "failure", Err: e503}),
		ev(observe.Event{Kind: observe.Retry, Name: host, Attempt: 1, Delay: d1, Outcome: "backoff", Err: e503}),
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 2}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 2, Outcome: "failure", Err: e503}),
		ev(observe.Event{Kind: observe.Retry, Name: host, Attempt: 2, Delay: d2, Outcome: "backoff", Err: e503}),
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 3}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 3, Outcome: "success"}),
	}
	if got := log.take(); !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestObserverHintAndGiveUp: a retry after a Retry-After says so, and a
// give-up reports its reason and last error.
func TestObserverHintAndGiveUp(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(502)
	})
	host := hostOf(t, srv.URL)
	log := &eventLog{}
	tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithObserver(log))
	resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
	if err != nil {
		t.Fatal(err)
	}
	readClose(t, resp)

	seq := smallBackoff(t).Sequence()
	_, d2 := seq.Next(), seq.Next()
	e503 := &httpretry.StatusError{Code: 503, After: 2 * time.Second}
	e502 := &httpretry.StatusError{Code: 502}
	want := []string{
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 1}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "failure", Err: e503}),
		// The hint of 2 s, spread by the pinned 0.5 of half of it: 2.5 s.
		ev(observe.Event{Kind: observe.Retry, Name: host, Attempt: 1, Delay: 2500 * time.Millisecond, Hint: 2 * time.Second, Outcome: "hint", Err: e503}),
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 2}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 2, Outcome: "failure", Err: e502}),
		ev(observe.Event{Kind: observe.Retry, Name: host, Attempt: 2, Delay: d2, Outcome: "backoff", Err: e502}),
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 3}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 3, Outcome: "failure", Err: e502}),
		ev(observe.Event{Kind: observe.GiveUp, Name: host, Attempt: 3, Reason: "attempts exhausted", Err: e502}),
	}
	if got := log.take(); !slices.Equal(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestObserverBreakerState: each state change of a host's breaker is an
// event with the host, in order.
func TestObserverBreakerState(t *testing.T) {
	var down sync.Mutex
	failing := true
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request, n int) {
		down.Lock()
		defer down.Unlock()
		if failing {
			w.WriteHeader(503)
		}
	})
	host := hostOf(t, srv.URL)
	log := &eventLog{}
	tr, clock := newTransport(t, srv.Client().Transport, httpretry.WithObserver(log), httpretry.WithBreakerConfig(tripFast()))
	get := func() {
		t.Helper()
		resp, err := tr.RoundTrip(newRequest(t, context.Background(), "GET", srv.URL, nil))
		if err != nil {
			t.Fatal(err)
		}
		readClose(t, resp)
	}
	get()
	e503 := &httpretry.StatusError{Code: 503}
	want := []string{
		ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 1}),
		ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "failure", Err: e503}),
		ev(observe.Event{Kind: observe.BreakerState, Name: host, From: "closed", To: "open"}),
		ev(observe.Event{Kind: observe.GiveUp, Name: host, Attempt: 1, Reason: "circuit open", Err: e503}),
	}
	if got := log.take(); !slices.Equal(got, want) {
		t.Errorf("events of the call that tripped the breaker:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// The host is back; an hour later the breaker probes with 3 calls and
	// closes.
	down.Lock()
	failing = false
	down.Unlock()
	clock.advance(time.Hour)
	for range 3 {
		get()
	}
	var states []string
	for _, e := range log.take() {
		if strings.HasPrefix(e, observe.BreakerState.String()+" ") {
			states = append(states, e)
		}
	}
	want = []string{
		ev(observe.Event{Kind: observe.BreakerState, Name: host, From: "open", To: "half-open"}),
		ev(observe.Event{Kind: observe.BreakerState, Name: host, From: "half-open", To: "closed"}),
	}
	if !slices.Equal(states, want) {
		t.Errorf("state changes on recovery:\n%s\nwant:\n%s", strings.Join(states, "\n"), strings.Join(want, "\n"))
	}
}
