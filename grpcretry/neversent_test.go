package grpcretry_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// droppingListener closes the first drop connections it accepts before
// the server sees them: the client's calls on them are never sent.
type droppingListener struct {
	net.Listener
	drop int64
	seen atomic.Int64
}

func (l *droppingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.seen.Add(1) > l.drop {
			return c, err
		}
		_ = c.Close()
	}
}

// TestNeverSentIsRetried: gRPC reports a call that never reached the
// server (its connection closed before the server's preface, twice) as
// UNAVAILABLE, which the client retries for a call safe to repeat (an
// idempotent method, a keyed call) until the third connection serves it,
// and does not retry for one that is not. No change was needed for this:
// the rule that HTTP needed (retry a request that got no response,
// whatever the error says) already holds here, since every such failure
// of grpc-go's transport reads as UNAVAILABLE.
func TestNeverSentIsRetried(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []grpcretry.Option
		ctx  func(context.Context) context.Context
		safe bool
	}{
		{"idempotent method", []grpcretry.Option{grpcretry.WithIdempotentMethods(unaryMethod)}, nil, true},
		{"keyed call", nil, func(ctx context.Context) context.Context {
			return metadata.AppendToOutgoingContext(ctx, idempotency.Header, "k-1")
		}, true},
		{"neither", nil, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := &testServer{}
			gs := grpc.NewServer()
			testpb.RegisterTestServiceServer(gs, srv)
			go func() { _ = gs.Serve(&droppingListener{Listener: ln, drop: 2}) }()
			t.Cleanup(gs.Stop)
			var log eventLog
			opts := append([]grpcretry.Option{grpcretry.WithObserver(&log),
				grpcretry.WithRetry(retry.WithMaxAttempts(10), retry.WithBackoff(quick()))}, tt.opts...)
			c := newClient(t, opts...)
			// Reconnect at once after a failed connection, so that the
			// retries meet the next connection rather than the wait.
			fast := grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: time.Millisecond, Multiplier: 1, MaxDelay: time.Millisecond},
				MinConnectTimeout: time.Second})
			client := dial(t, ln.Addr().String(), append(c, fast)...)
			ctx := t.Context()
			if tt.ctx != nil {
				ctx = tt.ctx(ctx)
			}
			_, err = client.UnaryCall(ctx, &testpb.SimpleRequest{})
			var failed []codes.Code
			for _, e := range log.take() {
				if e.Kind == observe.AttemptEnd && e.Err != nil {
					failed = append(failed, status.Code(e.Err))
					t.Logf("attempt %d: %v", e.Attempt, e.Err)
				}
			}
			if len(failed) == 0 {
				t.Fatalf("UnaryCall = %v with no failed attempt, want the first connections' failures", err)
			}
			for i, code := range failed {
				if code != codes.Unavailable {
					t.Errorf("failed attempt %d: %v, want UNAVAILABLE (never sent)", i+1, code)
				}
			}
			if tt.safe {
				if err != nil || srv.Calls() != 1 {
					t.Errorf("UnaryCall = %v after %d failed attempts, %d at the server; want success, 1 at the server", err, len(failed), srv.Calls())
				}
				return
			}
			if !errors.Is(err, retry.NotRetryable) || status.Code(err) != codes.Unavailable || len(failed) != 1 || srv.Calls() != 0 {
				t.Errorf("UnaryCall = %v after %d failed attempts; want UNAVAILABLE, not retried", err, len(failed))
			}
		})
	}
}
