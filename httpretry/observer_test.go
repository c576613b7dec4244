package httpretry_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
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
	s := fmt.Sprintf("%v name=%s attempt=%d delay=%v elapsed=%v reason=%q from=%q to=%q outcome=%q err=%v",
		e.Kind, e.Name, e.Attempt, e.Delay, e.Elapsed, e.Reason, e.From, e.To, e.Outcome, e.Err)
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

// TestObserverEvents checks the exact events of a call: every attempt's
// start and end, the retries with their delays (and why that long), the
// give-up with its reason, each named with the host.
func TestObserverEvents(t *testing.T) {
	seq := smallBackoff(t).Sequence()
	d1, d2 := seq.Next(), seq.Next()
	tests := []struct {
		name    string
		handler func(w http.ResponseWriter, r *http.Request, n int)
		want    func(host string) []observe.Event
	}{
		{"503 503 200", failThenOK(2), func(host string) []observe.Event {
			e503 := &httpretry.StatusError{Code: 503}
			return []observe.Event{
				{Kind: observe.AttemptStart, Name: host, Attempt: 1},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "failure", Err: e503},
				{Kind: observe.Retry, Name: host, Attempt: 1, Delay: d1, Outcome: "backoff", Err: e503},
				{Kind: observe.AttemptStart, Name: host, Attempt: 2},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 2, Outcome: "failure", Err: e503},
				{Kind: observe.Retry, Name: host, Attempt: 2, Delay: d2, Outcome: "backoff", Err: e503},
				{Kind: observe.AttemptStart, Name: host, Attempt: 3},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 3, Outcome: "success"},
			}
		}},
		{"503 with Retry-After, 502 502", func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				w.Header().Set("Retry-After", "2")
				w.WriteHeader(503)
				return
			}
			w.WriteHeader(502)
		}, func(host string) []observe.Event {
			e503 := &httpretry.StatusError{Code: 503, After: 2 * time.Second}
			e502 := &httpretry.StatusError{Code: 502}
			return []observe.Event{
				{Kind: observe.AttemptStart, Name: host, Attempt: 1},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "failure", Err: e503},
				// The hint of 2 s, spread by the pinned 0.5 of half of it.
				{Kind: observe.Retry, Name: host, Attempt: 1, Delay: 2500 * time.Millisecond, Outcome: "hint", Err: e503},
				{Kind: observe.AttemptStart, Name: host, Attempt: 2},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 2, Outcome: "failure", Err: e502},
				{Kind: observe.Retry, Name: host, Attempt: 2, Delay: d2, Outcome: "backoff", Err: e502},
				{Kind: observe.AttemptStart, Name: host, Attempt: 3},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 3, Outcome: "failure", Err: e502},
				{Kind: observe.GiveUp, Name: host, Attempt: 3, Reason: "attempts-exhausted", Err: e502},
			}
		}},
		{"404", func(w http.ResponseWriter, r *http.Request, n int) { http.NotFound(w, r) }, func(host string) []observe.Event {
			return []observe.Event{
				{Kind: observe.AttemptStart, Name: host, Attempt: 1},
				{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "success"},
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv, _ := serveMem(t, tt.handler)
				log := &eventLog{}
				tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithObserver(log))
				if _, err := getClose(t, tr, srv.URL); err != nil {
					t.Fatal(err)
				}
				var want []string
				for _, e := range tt.want(hostOf(t, srv.URL)) {
					want = append(want, ev(e))
				}
				if got := log.take(); !slices.Equal(got, want) {
					t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
				}
			})
		})
	}
}

// TestObserverBreakerState: each state change of a host's breaker is an
// event with the host, in order.
func TestObserverBreakerState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv, endOutage := outage(t)
		host := hostOf(t, srv.URL)
		log := &eventLog{}
		tr, _ := newTransport(t, srv.Client().Transport, httpretry.WithObserver(log), httpretry.WithBreaker(tripFast()))
		_, _ = getClose(t, tr, srv.URL)
		e503 := &httpretry.StatusError{Code: 503}
		want := []string{
			ev(observe.Event{Kind: observe.AttemptStart, Name: host, Attempt: 1}),
			ev(observe.Event{Kind: observe.AttemptEnd, Name: host, Attempt: 1, Outcome: "failure", Err: e503}),
			ev(observe.Event{Kind: observe.BreakerState, Name: host, From: "closed", To: "open"}),
			ev(observe.Event{Kind: observe.GiveUp, Name: host, Attempt: 1, Reason: "circuit-open", Err: e503}),
		}
		if got := log.take(); !slices.Equal(got, want) {
			t.Errorf("events of the call that tripped the breaker:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
		}

		// The host is back; an hour later the breaker probes with 3 calls and
		// closes.
		endOutage()
		time.Sleep(time.Hour)
		for range 3 {
			_, _ = getClose(t, tr, srv.URL)
		}
		var states []string
		for _, e := range log.take() {
			if strings.HasPrefix(e, string(observe.BreakerState)+" ") {
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
	})
}
