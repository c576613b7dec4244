package grpcretry_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// noJitter is a backoff whose delays are exact and short: 10 ms, 20 ms...
// (U fixed at 1 for "none"), so that recorded sleeps show the hints.
func noJitter() *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	return b
}

// TestServerHints checks each form of server hint against the recorded
// sleeps of the retry loop: a hint is a floor, spread by at most half of
// it again, and the longer of pushback and RetryInfo counts.
func TestServerHints(t *testing.T) {
	tests := []struct {
		name     string
		a        answer
		min, max time.Duration // bounds of the one sleep (exact: min == max)
		exact    bool
	}{
		{"pushback", fail(codes.Unavailable).push("300"), 300 * time.Millisecond, 450 * time.Millisecond, false},
		{"pushback exact", fail(codes.Unavailable).push("300"), 300 * time.Millisecond, 300 * time.Millisecond, true},
		{"pushback with spaces", fail(codes.Unavailable).push(" 300 "), 300 * time.Millisecond, 300 * time.Millisecond, true},
		{"pushback 0 keeps the backoff", fail(codes.Unavailable).push("0"), 10 * time.Millisecond, 10 * time.Millisecond, true},
		{"RetryInfo", fail(codes.Unavailable).info(250 * time.Millisecond), 250 * time.Millisecond, 250 * time.Millisecond, true},
		{"longer of both", fail(codes.Unavailable).push("100").info(400 * time.Millisecond), 400 * time.Millisecond, 400 * time.Millisecond, true},
		{"longer of both, pushback", fail(codes.Unavailable).push("700").info(400 * time.Millisecond), 700 * time.Millisecond, 700 * time.Millisecond, true},
		{"negative RetryInfo ignored", fail(codes.Unavailable).info(-time.Second), 10 * time.Millisecond, 10 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testServer{script: []answer{tt.a, ok()}}
			clock := newFakeClock()
			ropts := []retry.Option{retry.WithClock(clock), retry.WithBackoff(noJitter())}
			if tt.exact {
				ropts = append(ropts, retry.WithExactRetryAfter())
			}
			c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(ropts...))
			client := dial(t, serve(t, srv), c.DialOptions()...)
			if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("UnaryCall: %v", err)
			}
			s := clock.Sleeps()
			if len(s) != 1 || s[0] < tt.min || s[0] > tt.max {
				t.Errorf("sleeps = %v, want one in [%v, %v]", s, tt.min, tt.max)
			}
		})
	}
}

// TestHintPastMaximum: a pushback above retry.WithMaxRetryAfter ends the
// call at once, without sleeping.
func TestHintPastMaximum(t *testing.T) {
	for _, v := range []string{"120000", "99999999999999999999999"} {
		srv := &testServer{script: []answer{fail(codes.Unavailable).push(v), ok()}}
		clock := newFakeClock()
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithClock(clock), retry.WithMaxRetryAfter(time.Minute)))
		client := dial(t, serve(t, srv), c.DialOptions()...)
		_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if !errors.Is(err, retry.Deadline) || status.Code(err) != codes.Unavailable {
			t.Errorf("pushback %s: UnaryCall = %v, want UNAVAILABLE, reason deadline", v, err)
		}
		if s := clock.Sleeps(); len(s) != 0 || srv.Calls() != 1 {
			t.Errorf("pushback %s: %d attempts, sleeps %v; want 1 attempt, no sleep", v, srv.Calls(), s)
		}
	}
}

// TestDeadlineNeverOverslept: with pushbacks that add up to more than the
// caller's deadline, the loop stops before a sleep that would end past it.
func TestDeadlineNeverOverslept(t *testing.T) {
	for _, exact := range []bool{false, true} {
		srv := &testServer{script: []answer{fail(codes.Unavailable).push("300")}}
		clock := newFakeClock()
		ropts := []retry.Option{retry.WithClock(clock), retry.WithMaxAttempts(10)}
		if exact {
			ropts = append(ropts, retry.WithExactRetryAfter())
		}
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(ropts...))
		client := dial(t, serve(t, srv), c.DialOptions()...)
		const deadline = time.Second
		ctx, cancel := context.WithTimeout(t.Context(), deadline)
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		cancel()
		if !errors.Is(err, retry.Deadline) {
			t.Errorf("exact=%v: UnaryCall = %v, want reason deadline", exact, err)
		}
		var total time.Duration
		for _, s := range clock.Sleeps() {
			if s < 300*time.Millisecond {
				t.Errorf("exact=%v: slept %v, below the 300ms pushback", exact, s)
			}
			total += s
		}
		if total >= deadline {
			t.Errorf("exact=%v: slept %v in all (%v), past the %v deadline", exact, total, clock.Sleeps(), deadline)
		}
		if len(clock.Sleeps()) == 0 || srv.Calls() != len(clock.Sleeps())+1 {
			t.Errorf("exact=%v: %d attempts and sleeps %v, want at least one retry", exact, srv.Calls(), clock.Sleeps())
		}
	}
}

// TestAttemptMetadata: attempts after the first carry
// grpc-previous-rpc-attempts 1, 2...; the first carries none, even when the
// caller's outgoing metadata had one.
func TestAttemptMetadata(t *testing.T) {
	for _, inherited := range []bool{false, true} {
		srv := &testServer{script: []answer{fail(codes.Unavailable), fail(codes.Unavailable), ok()}}
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithClock(newFakeClock())))
		client := dial(t, serve(t, srv), c.DialOptions()...)
		ctx := t.Context()
		if inherited {
			ctx = metadata.AppendToOutgoingContext(ctx, wire.PreviousAttemptsMetadata, "7")
		}
		if _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
			t.Fatalf("UnaryCall: %v", err)
		}
		want := [][]string{nil, {"1"}, {"2"}}
		if !slices.EqualFunc(srv.prev, want, slices.Equal) {
			t.Errorf("inherited=%v: previous attempts seen = %q, want %q", inherited, srv.prev, want)
		}
	}
}

// TestAutoKey: a non-idempotent call gets one key, made before the first
// attempt and sent on every attempt; a caller's own key is kept.
func TestAutoKey(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), fail(codes.Unavailable), ok()}}
	c := newClient(t, grpcretry.WithAutoIdempotencyKey(), grpcretry.WithRetry(retry.WithClock(newFakeClock())))
	client := dial(t, serve(t, srv), c.DialOptions()...)
	if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
		t.Fatalf("UnaryCall: %v", err)
	}
	if len(srv.keys) != 3 || len(srv.keys[0]) != 1 || srv.keys[0][0] == "" {
		t.Fatalf("keys seen = %q, want one key on each of 3 attempts", srv.keys)
	}
	for _, k := range srv.keys {
		if !slices.Equal(k, srv.keys[0]) {
			t.Errorf("keys seen = %q, want the same key on every attempt", srv.keys)
		}
	}

	srv2 := &testServer{script: []answer{fail(codes.Unavailable)}}
	client = dial(t, serve(t, srv2), c.DialOptions()...)
	_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	var e *grpcretry.Error
	if !errors.As(err, &e) || e.Key == "" || e.Key != srv2.keys[0][0] {
		t.Errorf("give-up error key = %+v, want the key sent (%q)", e, srv2.keys)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), grpcretry.IdempotencyKeyMetadata, "mine")
	_, _ = client.UnaryCall(ctx, &testpb.SimpleRequest{})
	if last := srv2.keys[len(srv2.keys)-1]; !slices.Equal(last, []string{"mine"}) {
		t.Errorf("caller's key: server saw %q, want [mine]", last)
	}
}

// TestCancel: a call canceled while the server works, or during a sleep,
// is not retried.
func TestCancel(t *testing.T) {
	t.Run("during the attempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		srv := &testServer{handler: func(context.Context, int) error { cancel(); return nil }, hold: make(chan struct{})}
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithClock(newFakeClock())))
		client := dial(t, serve(t, srv), c.DialOptions()...)
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if status.Code(err) != codes.Canceled || !errors.Is(err, retry.Canceled) {
			t.Errorf("UnaryCall = %v, want CANCELED, reason canceled", err)
		}
		if n := srv.Calls(); n != 1 {
			t.Errorf("server saw %d attempts, want 1", n)
		}
	})
	t.Run("during the sleep", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		srv := &testServer{script: []answer{fail(codes.Unavailable)}}
		clock := newFakeClock()
		clock.onSleep = cancel
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithClock(clock)))
		client := dial(t, serve(t, srv), c.DialOptions()...)
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if !errors.Is(err, retry.Canceled) || status.Code(err) != codes.Unavailable {
			t.Errorf("UnaryCall = %v, want the last UNAVAILABLE, reason canceled", err)
		}
		if n := srv.Calls(); n != 1 {
			t.Errorf("server saw %d attempts, want 1", n)
		}
	})
}

// TestStackedGRPCRetry: when the service config gives the method a retry
// policy of grpc-go's and grpc-go's retry is on, the interceptor makes one
// attempt and grpc-go retries (2 attempts at the server, not 2 x 3); with
// Client.DialOptions grpc-go's retry is off and the interceptor retries.
func TestStackedGRPCRetry(t *testing.T) {
	const sc = `{"methodConfig":[{"name":[{"service":"grpc.testing.TestService"}],
		"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,
		"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithClock(newFakeClock())))

	srv := &testServer{script: []answer{fail(codes.Unavailable)}}
	client := dial(t, serve(t, srv), grpc.WithDefaultServiceConfig(sc), grpc.WithUnaryInterceptor(c.UnaryInterceptor()))
	_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || srv.Calls() != 2 {
		t.Errorf("grpc-go retry on: %v after %d attempts at the server, want UNAVAILABLE after 2", err, srv.Calls())
	}

	srv = &testServer{script: []answer{fail(codes.Unavailable)}}
	client = dial(t, serve(t, srv), append(c.DialOptions(), grpc.WithDefaultServiceConfig(sc))...)
	_, err = client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || srv.Calls() != 3 {
		t.Errorf("DialOptions: %v after %d attempts at the server, want UNAVAILABLE after 3", err, srv.Calls())
	}
}

// TestFallback: a call the target's failure defeated gets the fallback's
// reply; a call that was not retryable does not.
func TestFallback(t *testing.T) {
	var got *grpcretry.Error
	fb := func(ctx context.Context, method string, req, reply any, err *grpcretry.Error) error {
		got = err
		reply.(*testpb.SimpleResponse).Username = "cached"
		return nil
	}
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithFallback(fb), grpcretry.WithRetry(retry.WithClock(newFakeClock())))
	srv := &testServer{script: []answer{fail(codes.Unavailable)}}
	client := dial(t, serve(t, srv), c.DialOptions()...)
	resp, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if err != nil || resp.GetUsername() != "cached" {
		t.Errorf("UnaryCall = %v, %v; want the fallback's reply", resp, err)
	}
	if got == nil || !errors.Is(got, retry.AttemptsExhausted) || got.Retry.Attempts != 3 {
		t.Errorf("fallback got %v, want attempts exhausted after 3", got)
	}

	got = nil
	srv = &testServer{script: []answer{fail(codes.NotFound)}}
	client = dial(t, serve(t, srv), c.DialOptions()...)
	if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); status.Code(err) != codes.NotFound || got != nil {
		t.Errorf("NOT_FOUND: UnaryCall = %v, fallback called: %v; want NOT_FOUND without fallback", err, got != nil)
	}
}

// TestOpenBreaker: a tripped breaker refuses the call before any attempt,
// with UNAVAILABLE, and nothing reaches the server.
func TestOpenBreaker(t *testing.T) {
	b, err := breaker.New(breaker.Config{OpenFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b.Trip(time.Hour)
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
		grpcretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Breaker: b}, nil }))
	srv := &testServer{}
	client := dial(t, serve(t, srv), c.DialOptions()...)
	_, err = client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.CircuitOpen) || !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("UnaryCall = %v, want UNAVAILABLE, circuit open", err)
	}
	if !grpcretry.Overloaded(err) || srv.Calls() != 0 {
		t.Errorf("Overloaded = %v, server calls %d; want true, 0", grpcretry.Overloaded(err), srv.Calls())
	}
}

// TestTargets: each target gets its own guards, reported by Targets.
func TestTargets(t *testing.T) {
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithClock(newFakeClock())))
	a, b := serve(t, &testServer{}), serve(t, &testServer{script: []answer{fail(codes.Unavailable)}})
	_, _ = dial(t, a, c.DialOptions()...).UnaryCall(t.Context(), &testpb.SimpleRequest{})
	_, _ = dial(t, b, c.DialOptions()...).UnaryCall(t.Context(), &testpb.SimpleRequest{})
	ts := c.Targets()
	if len(ts) != 2 {
		t.Fatalf("Targets() = %+v, want 2", ts)
	}
	for _, s := range ts {
		if !s.HasBudget || !s.HasBreaker {
			t.Errorf("target %s has budget %v, breaker %v; want both", s.Target, s.HasBudget, s.HasBreaker)
		}
		wantRetries := 0
		if strings.HasSuffix(s.Target, b) {
			wantRetries = 2
		}
		if s.Budget.Retries != wantRetries {
			t.Errorf("target %s: budget retries %d, want %d", s.Target, s.Budget.Retries, wantRetries)
		}
	}
}

// TestNewErrors: bad options are errors, never panics.
func TestNewErrors(t *testing.T) {
	bad := map[string][]grpcretry.Option{
		"negative timeout":         {grpcretry.WithTimeout(-1)},
		"negative attempt timeout": {grpcretry.WithAttemptTimeout(-1)},
		"retry timeout":            {grpcretry.WithRetry(retry.WithTimeout(time.Second))},
		"retry attempt timeout":    {grpcretry.WithRetry(retry.WithAttemptTimeout(time.Second))},
		"bad retry option":         {grpcretry.WithRetry(retry.WithMaxAttempts(0))},
		"too many attempts":        {grpcretry.WithRetry(retry.WithMaxAttempts(101))},
		"nil guards":               {grpcretry.WithGuards(nil)},
		"short method name":        {grpcretry.WithIdempotentMethods("UnaryCall")},
		"zero buffer":              {grpcretry.WithBufferMessages(0)},
		"zero targets":             {grpcretry.WithMaxTargets(0)},
		"bad breaker":              {grpcretry.WithBreakerConfig(breaker.Config{FailureRatio: 2})},
	}
	for name, opts := range bad {
		if _, err := grpcretry.New(opts...); !errors.Is(err, grpcretry.ErrInvalidOption) {
			t.Errorf("%s: New error = %v, want ErrInvalidOption", name, err)
		}
		if _, err := grpcretry.UnaryClientInterceptor(opts...); err == nil {
			t.Errorf("%s: UnaryClientInterceptor error = nil", name)
		}
		if _, err := grpcretry.StreamClientInterceptor(opts...); err == nil {
			t.Errorf("%s: StreamClientInterceptor error = nil", name)
		}
	}
	if _, err := grpcretry.New(nil); err != nil {
		t.Errorf("New(nil) = %v, want nil (a nil Option is ignored)", err)
	}
}
