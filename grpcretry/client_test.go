package grpcretry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// noJitter is a backoff whose delays are exact and short: 10 ms, 20 ms...,
// so that recorded sleeps show the hints; u is its random source, which
// spreads a hint above itself (0: the hint exactly).
func noJitter(u float64) *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond,
		Rand: func() float64 { return u }})
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
		{"pushback, U 0: exact", fail(codes.Unavailable).push("300"), 300 * time.Millisecond, 300 * time.Millisecond, true},
		{"pushback with a plus sign", fail(codes.Unavailable).push("+300"), 300 * time.Millisecond, 300 * time.Millisecond, true},
		{"pushback 0 keeps the backoff", fail(codes.Unavailable).push("0"), 10 * time.Millisecond, 10 * time.Millisecond, true},
		{"RetryInfo", fail(codes.Unavailable).info(250 * time.Millisecond), 250 * time.Millisecond, 250 * time.Millisecond, true},
		{"longer of both", fail(codes.Unavailable).push("100").info(400 * time.Millisecond), 400 * time.Millisecond, 400 * time.Millisecond, true},
		{"longer of both, pushback", fail(codes.Unavailable).push("700").info(400 * time.Millisecond), 700 * time.Millisecond, 700 * time.Millisecond, true},
		{"negative RetryInfo ignored", fail(codes.Unavailable).info(-time.Second), 10 * time.Millisecond, 10 * time.Millisecond, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testServer{script: []answer{tt.a, ok()}}
			clock := newTimeline()
			b := noJitter(0.5)
			if tt.exact {
				b = noJitter(0) // a hint is slept exactly
			}
			c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithObserver(clock), grpcretry.WithRetry(retry.WithBackoff(b)))
			client := dial(t, serve(t, srv), c...)
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
// call at once, without sleeping (one beyond 64 bits is malformed, a stop:
// TestCodeTable).
func TestHintPastMaximum(t *testing.T) {
	for _, v := range []string{"120000", "9223372036854775807"} {
		srv := &testServer{script: []answer{fail(codes.Unavailable).push(v), ok()}}
		clock := newTimeline()
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithObserver(clock), grpcretry.WithRetry(retry.WithMaxRetryAfter(time.Minute)))
		client := dial(t, serve(t, srv), c...)
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
// It runs in a synctest bubble over an in-memory connection: attempts take
// no time and sleeps end exactly when chosen, so every sleep the loop
// chose must be followed by an attempt the server sees (a sleep into the
// deadline would leave it none), whatever the load on the machine.
func TestDeadlineNeverOverslept(t *testing.T) {
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprintf("exact=%v", exact), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testServer{script: []answer{fail(codes.Unavailable).push("300")}}
				clock := newTimeline()
				ropts := []retry.ScheduleOption{retry.WithMaxAttempts(10)}
				if exact {
					ropts = append(ropts, retry.WithBackoff(noJitter(0))) // a hint is slept exactly
				}
				c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithObserver(clock), grpcretry.WithRetry(ropts...))
				client := serveInMemory(t, srv, c...)
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
					t.Errorf("exact=%v: %d attempts and sleeps %v, want at least one retry, each after its sleep", exact, srv.Calls(), clock.Sleeps())
				}
				if exact && len(clock.Sleeps()) != 3 {
					t.Errorf("exact=%v: sleeps %v, want the 3 that fit in %v", exact, clock.Sleeps(), deadline)
				}
			})
		})
	}
}

// TestAttemptMetadata: attempts after the first carry
// grpc-previous-rpc-attempts 1, 2...; the first carries none, even when the
// caller's outgoing metadata had one.
func TestAttemptMetadata(t *testing.T) {
	for _, inherited := range []bool{false, true} {
		srv := &testServer{script: []answer{fail(codes.Unavailable), fail(codes.Unavailable), ok()}}
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
		client := dial(t, serve(t, srv), c...)
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
	c := newClient(t, grpcretry.WithAutoIdempotencyKey(), grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
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
	client = dial(t, serve(t, srv2), c...)
	_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	var e *grpcretry.Error
	if !errors.As(err, &e) || e.IdempotencyKey == "" || e.IdempotencyKey != srv2.keys[0][0] {
		t.Errorf("give-up error key = %+v, want the key sent (%q)", e, srv2.keys)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), idempotency.Header, "mine")
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
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
		client := dial(t, serve(t, srv), c...)
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
		clock := newTimeline()
		clock.onRetry = cancel
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithObserver(clock))
		client := dial(t, serve(t, srv), c...)
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if !errors.Is(err, retry.Canceled) || status.Code(err) != codes.Unavailable {
			t.Errorf("UnaryCall = %v, want the last UNAVAILABLE, reason canceled", err)
		}
		if n := srv.Calls(); n != 1 {
			t.Errorf("server saw %d attempts, want 1", n)
		}
	})
}

// TestDialOptionsTurnGRPCRetryOff: a service config that gives the method a
// retry policy of grpc-go's does not multiply the attempts: DialOptions
// turns grpc-go's retry off, and the interceptor retries (3 attempts at the
// server, not 2 x 3).
func TestDialOptionsTurnGRPCRetryOff(t *testing.T) {
	const sc = `{"methodConfig":[{"name":[{"service":"grpc.testing.TestService"}],
		"retryPolicy":{"maxAttempts":2,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,
		"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
	srv := &testServer{script: []answer{fail(codes.Unavailable)}}
	client := dial(t, serve(t, srv), append(c, grpc.WithDefaultServiceConfig(sc))...)
	_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || srv.Calls() != 3 {
		t.Errorf("DialOptions: %v after %d attempts at the server, want UNAVAILABLE after 3", err, srv.Calls())
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
	client := dial(t, serve(t, srv), c...)
	_, err = client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.CircuitOpen) || !errors.Is(err, breaker.ErrOpen) {
		t.Errorf("UnaryCall = %v, want UNAVAILABLE, circuit open", err)
	}
	if pushed := grpcretry.PushBack(t.Context(), err); status.Code(pushed) != codes.Unavailable || pushed == err || srv.Calls() != 0 {
		t.Errorf("PushBack = %v, server calls %d; want the don't-retry UNAVAILABLE, 0", pushed, srv.Calls())
	}
}

// TestTargets: each target gets its own guards: a failing target's
// retries spend its own budget and trip its own breaker, not another's.
func TestTargets(t *testing.T) {
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(quick())),
		grpcretry.WithBreaker(&breaker.Config{MinCalls: 3, OpenFor: time.Hour}))
	a, b := serve(t, &testServer{}), serve(t, &testServer{script: []answer{fail(codes.Unavailable)}})
	ca, cb := dial(t, a, c...), dial(t, b, c...)
	if _, err := cb.UnaryCall(t.Context(), &testpb.SimpleRequest{}); !errors.Is(err, retry.AttemptsExhausted) {
		t.Fatalf("UnaryCall(b) = %v, want attempts exhausted", err)
	}
	if _, err := cb.UnaryCall(t.Context(), &testpb.SimpleRequest{}); !errors.Is(err, retry.CircuitOpen) {
		t.Errorf("UnaryCall(b) after 3 failures = %v, want b's breaker open", err)
	}
	if _, err := ca.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
		t.Errorf("UnaryCall(a) = %v, want a's own guards to let it through", err)
	}
}

// TestNewErrors: bad options are errors, never panics.
func TestNewErrors(t *testing.T) {
	bad := map[string][]grpcretry.Option{
		"negative attempt timeout": {grpcretry.WithAttemptTimeout(-1)},
		"bad retry option":         {grpcretry.WithRetry(retry.WithMaxAttempts(0))},
		"nil guards":               {grpcretry.WithGuards(nil)},
		"short method name":        {grpcretry.WithIdempotentMethods("UnaryCall")},
		"no method":                {grpcretry.WithIdempotentMethods("/grpc.testing.TestService/")},
		"no service":               {grpcretry.WithIdempotentMethods("/UnaryCall")},
		"three parts":              {grpcretry.WithIdempotentMethods("/a/b/c")},
		"zero buffer":              {grpcretry.WithBufferMessages(0)},
		"bad breaker":              {grpcretry.WithBreaker(&breaker.Config{FailureRatio: 2})},
		"bad budget":               {grpcretry.WithBudget(&budget.Config{Ratio: 2})},
	}
	for name, opts := range bad {
		if c, err := grpcretry.DialOptions(opts...); err == nil || !strings.HasPrefix(err.Error(), "grpcretry: ") || c != nil {
			t.Errorf("%s: DialOptions = %v, %v; want nil and a grpcretry error", name, c, err)
		}
	}
	if _, err := grpcretry.DialOptions(nil); err != nil {
		t.Errorf("DialOptions(nil) = %v, want nil (a nil Option is ignored)", err)
	}
}
