package grpcretry_test

// Black-box attacks on grpcretry against docs/grpc.md and the package
// documentation. Helpers (serveInMemory, testServer, legServer,
// delays, newClient, fail, ok) are the package's shared test helpers.

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// attack6Goid returns the id of the calling goroutine.
func attack6Goid() string {
	var buf [64]byte
	s := string(buf[:runtime.Stack(buf[:], false)])
	s = strings.TrimPrefix(s, "goroutine ")
	return s[:strings.IndexByte(s, ' ')]
}

// TestAttack6RacedFirstCopyOnCallersGoroutine: docs/grpc.md says the first
// copy of a call that races runs on the caller's goroutine (an attack found
// the page saying "on a goroutine", 7 allocations, from an older form). An
// interceptor chained after the client's runs inside each copy: the first
// copy's goroutine is recorded.
func TestAttack6RacedFirstCopyOnGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(10 * time.Millisecond)}
		var mu sync.Mutex
		var gids []string
		inner := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			mu.Lock()
			gids = append(gids, attack6Goid())
			mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		})
		opts := append(newClient(t, grpcretry.WithHedging(time.Second, 0, 1, unaryMethod)), inner)
		c := serveInMemory(t, srv, opts...)
		caller := attack6Goid()
		if _, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
		srv.settle(t)
		mu.Lock()
		defer mu.Unlock()
		if len(gids) != 1 {
			t.Fatalf("%d copies sent; want 1 (the first copy answers within the delay)", len(gids))
		}
		if gids[0] != caller {
			t.Errorf("the first copy of a raced call ran on goroutine %s, not the caller's %s", gids[0], caller)
		}
	})
}

// TestAttack6PushbackValues: grpc-retry-pushback-ms read as grpc-go's
// strconv.Atoi: a sign is read; a space, garbage, empty, a fraction, a
// number beyond 64 bits, several values, or a negative value: no retry.
func TestAttack6PushbackValues(t *testing.T) {
	for _, tt := range []struct {
		vals  []string
		retry bool
	}{
		{[]string{"0"}, true},
		{[]string{"+0"}, true},
		{[]string{"-0"}, true},
		{[]string{"007"}, true},
		{[]string{"+3"}, true},
		{[]string{"-1"}, false},
		{[]string{"-9223372036854775808"}, false},
		{[]string{"9223372036854775808"}, false},
		{[]string{" 5"}, false},
		{[]string{"5 "}, false},
		{[]string{""}, false},
		{[]string{"1.5"}, false},
		{[]string{"1e3"}, false},
		{[]string{"0x10"}, false},
		{[]string{"５"}, false}, // full-width digit
		{[]string{"1", "1"}, false},
		{[]string{"+"}, false},
		{[]string{"--1"}, false},
	} {
		t.Run(strings.Join(tt.vals, "|"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				for _, code := range []codes.Code{codes.Unavailable, codes.ResourceExhausted} {
					srv := &testServer{script: []answer{fail(code).push(tt.vals...), ok()}}
					c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
						grpcretry.WithRetry(retry.WithBackoff(quick())))...)
					_, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{})
					want := 1
					if tt.retry {
						want = 2
					}
					if srv.Calls() != want {
						t.Errorf("%v with pushback %q: %d attempts (err %v); want %d", code, tt.vals, srv.Calls(), err, want)
					}
					if !tt.retry && status.Code(err) != code {
						t.Errorf("%v with pushback %q: code %v; want the answer's", code, tt.vals, status.Code(err))
					}
				}
			})
		})
	}
}

// TestAttack6AttemptsAndNumbers: never more than the max attempts, each
// attempt after the first numbered, an inherited number removed; the code
// table's rows for a declared idempotent method.
func TestAttack6AttemptsAndNumbers(t *testing.T) {
	for _, tt := range []struct {
		name  string
		codes []codes.Code
		want  int
	}{
		{"unavailable", []codes.Code{codes.Unavailable}, 5},
		{"internal once", []codes.Code{codes.Internal}, 2},
		{"internal, unavailable, internal", []codes.Code{codes.Internal, codes.Unavailable, codes.Internal}, 3},
		{"aborted", []codes.Code{codes.Aborted}, 5},
		{"resource exhausted, no hint", []codes.Code{codes.ResourceExhausted}, 1},
		{"deadline from server", []codes.Code{codes.DeadlineExceeded}, 1},
		{"unknown", []codes.Code{codes.Unknown}, 1},
		{"canceled from server", []codes.Code{codes.Canceled}, 1},
		{"not found", []codes.Code{codes.NotFound}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var script []answer
				for _, c := range tt.codes {
					script = append(script, fail(c))
				}
				srv := &testServer{script: script}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithBudget(nil),
					grpcretry.WithRetry(retry.WithMaxAttempts(5), retry.WithBackoff(quick())))...)
				ctx := metadata.AppendToOutgoingContext(t.Context(), wire.PreviousAttemptsMetadata, "7")
				_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
				if srv.Calls() != tt.want {
					t.Fatalf("%d attempts (err %v); want %d", srv.Calls(), err, tt.want)
				}
				last := tt.codes[min(tt.want-1, len(tt.codes)-1)]
				if status.Code(err) != last {
					t.Errorf("status.Code = %v; want the last attempt's %v", status.Code(err), last)
				}
				var ge *grpcretry.Error
				if !errors.As(err, &ge) {
					t.Errorf("err %T is not a *grpcretry.Error", err)
				}
				srv.mu.Lock()
				defer srv.mu.Unlock()
				for i, p := range srv.prev {
					want := ""
					if i > 0 {
						want = strconv.Itoa(i)
					}
					if strings.Join(p, ",") != want {
						t.Errorf("attempt %d carried grpc-previous-rpc-attempts %q; want %q", i+1, p, want)
					}
				}
			})
		})
	}
}

// TestAttack6HintNearDeadline: a hint just below the time left, with a
// random source at its maximum: the spread must never take the sleep past
// the deadline; the call either retries before it or ends at once.
func TestAttack6HintNearDeadline(t *testing.T) {
	for _, hint := range []time.Duration{500 * time.Millisecond, 900 * time.Millisecond, 999 * time.Millisecond, time.Second} {
		t.Run(hint.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return 0.999999 }})
				if err != nil {
					t.Fatal(err)
				}
				ms := strconv.Itoa(int(hint / time.Millisecond))
				srv := &testServer{script: []answer{fail(codes.Unavailable).push(ms), fail(codes.Unavailable).push(ms), ok()}}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
					grpcretry.WithRetry(retry.WithBackoff(b)))...)
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				defer cancel()
				start := time.Now()
				_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{})
				took := time.Since(start)
				if took > time.Second {
					t.Errorf("call took %v with a 1s deadline", took)
				}
				if srv.Calls() >= 2 && took < hint {
					t.Errorf("retried after %v, below the hint %v", took, hint)
				}
				if hint >= time.Second && (srv.Calls() != 1 || !errors.Is(err, retry.Deadline) || took != 0) {
					t.Errorf("hint %v with 1s left: %d attempts, err %v after %v; want the call ended at once with retry.Deadline", hint, srv.Calls(), err, took)
				}
				t.Logf("hint %v: %d attempts, err %v, took %v", hint, srv.Calls(), err, took)
			})
		})
	}
}

// TestAttack6AutoKeySameOnEveryAttempt: WithAutoIdempotencyKey makes a
// key once per call, sent on every attempt; a new call, a new key; the
// *Error names it.
func TestAttack6AutoKeySameOnEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{script: []answer{fail(codes.Unavailable)}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithAutoIdempotencyKey(), grpcretry.WithBudget(nil),
			grpcretry.WithRetry(retry.WithMaxAttempts(4), retry.WithBackoff(quick())))...)
		_, err1 := c.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		_, err2 := c.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		var e1, e2 *grpcretry.Error
		if !errors.As(err1, &e1) || !errors.As(err2, &e2) {
			t.Fatalf("errors %v, %v; want *grpcretry.Error", err1, err2)
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if len(srv.keys) != 8 {
			t.Fatalf("%d attempts; want 4 per call", len(srv.keys))
		}
		for i, k := range srv.keys {
			want := e1.IdempotencyKey
			if i >= 4 {
				want = e2.IdempotencyKey
			}
			if len(k) != 1 || k[0] != want || want == "" {
				t.Errorf("attempt %d carried key %q; want [%q]", i, k, want)
			}
		}
		if e1.IdempotencyKey == e2.IdempotencyKey {
			t.Errorf("two calls shared key %q", e1.IdempotencyKey)
		}
	})
}
