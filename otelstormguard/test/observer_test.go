package test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
)

// The observer ends only the spans it started: an AttemptEnd whose context
// it did not tag (an observer wrapped so that it cannot tag, or an event
// from elsewhere) leaves the caller's span alone; TagAttempt of any other
// kind returns the context as it is.
func TestEndsOnlyItsOwnSpans(t *testing.T) {
	s := newSDK(t)
	ctx, call := s.tracer.Start(context.Background(), "call")
	s.obs.Observe(ctx, observe.Event{Kind: observe.AttemptStart, Name: "db", Attempt: 1})
	s.obs.Observe(ctx, observe.Event{Kind: observe.AttemptEnd, Name: "db", Attempt: 1, Outcome: "failure", Err: errors.New("boom")})
	if got := s.obs.TagAttempt(ctx, observe.Event{Kind: observe.Retry, Name: "db"}); got != ctx {
		t.Error("TagAttempt of a Retry event returned a new context")
	}
	if n := len(s.spans.Ended()); n != 0 {
		t.Fatalf("%d spans ended, want none (the caller's span is still open)", n)
	}
	call.End()
	if n := len(s.spans.Ended()); n != 1 || s.spans.Ended()[0].Status().Code != 0 {
		t.Errorf("after the caller ended its span: %d spans ended, want 1 with its status untouched", n)
	}
}

// Dependencies beyond WithMaxDependencies are reported as "_OTHER".
func TestMaxDependencies(t *testing.T) {
	s := newSDK(t, otelstormguard.WithMaxDependencies(2))
	ctx := context.Background()
	for _, name := range []string{"a", "b", "c", "d", "a"} {
		s.obs.Observe(ctx, observe.Event{Kind: observe.GiveUp, Name: name, Reason: "deadline"})
	}
	checkSeries(t, s.series(t), map[string]float64{
		"stormguard.give_ups{server.address=a,stormguard.give_up.reason=deadline}":      2,
		"stormguard.give_ups{server.address=b,stormguard.give_up.reason=deadline}":      1,
		"stormguard.give_ups{server.address=_OTHER,stormguard.give_up.reason=deadline}": 2,
	})
}

// How an event's Name becomes server.address and server.port, and a
// nameless event has neither.
func TestDependencyAttributes(t *testing.T) {
	tests := []struct{ name, want string }{
		{"api.example.com", "server.address=api.example.com"},
		{"api.example.com:8443", "server.address=api.example.com,server.port=8443"},
		{"[::1]:80", "server.address=::1,server.port=80"},
		{"::1", "server.address=::1"},
		{"payments", "server.address=payments"},
		{"dns:///pay.svc:443", "server.address=dns:///pay.svc:443"},
		{"host:0", "server.address=host:0"},
		{"host:99999", "server.address=host:99999"},
		{"host:+80", "server.address=host:+80"},
		{":80", "server.address=:80"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSDK(t)
			s.obs.Observe(context.Background(), observe.Event{Kind: observe.GiveUp, Name: tt.name, Reason: "canceled"})
			sep := ","
			if tt.want == "" {
				sep = ""
			}
			checkSeries(t, s.series(t), map[string]float64{
				"stormguard.give_ups{" + tt.want + sep + "stormguard.give_up.reason=canceled}": 1,
			})
		})
	}
}

// Close stops the state gauges; the counters go on.
func TestClose(t *testing.T) {
	s := newSDK(t)
	ctx := context.Background()
	s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: "db", From: "closed", To: "open"})
	if err := s.obs.Close(); err != nil {
		t.Fatal(err)
	}
	checkSeries(t, s.series(t), map[string]float64{
		"stormguard.breaker.transitions{server.address=db,stormguard.breaker.from=closed,stormguard.breaker.to=open}": 1,
	})
}

// Many goroutines report for a few dependencies while the reader collects:
// every event is counted once, the caches stay consistent (run with -race).
func TestConcurrentObserve(t *testing.T) {
	s := newSDK(t)
	const workers, each = 8, 300
	names := []string{"a:1", "b:2", "c:3"}
	stop := make(chan struct{})
	collected := make(chan struct{})
	go func() {
		defer close(collected)
		for {
			select {
			case <-stop:
				return
			default:
				s.series(t)
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			ctx := context.Background()
			for i := range each {
				name := names[(w+i)%len(names)]
				actx := s.obs.TagAttempt(ctx, observe.Event{Kind: observe.AttemptStart, Name: name, Attempt: 1 + i%3})
				s.obs.Observe(actx, observe.Event{Kind: observe.AttemptEnd, Name: name, Attempt: 1 + i%3, Outcome: "success"})
				s.obs.Observe(ctx, observe.Event{Kind: observe.BreakerState, Name: name, From: "closed", To: "open"})
			}
		})
	}
	wg.Wait()
	close(stop)
	<-collected
	got := s.series(t)
	for _, name := range names {
		host, port, _ := strings.Cut(name, ":")
		a := "server.address=" + host + ",server.port=" + port
		if n := got["stormguard.attempts{"+a+",stormguard.outcome=success}"]; n != workers*each/3 {
			t.Errorf("%s: %v attempts, want %d", name, n, workers*each/3)
		}
		if n := got["stormguard.breaker.state{"+a+",stormguard.breaker.state=open}"]; n != 1 {
			t.Errorf("%s: open state gauge %v, want 1", name, n)
		}
	}
	if n := len(s.spans.Ended()); n != workers*each {
		t.Errorf("%d spans ended, want %d", n, workers*each)
	}
}
