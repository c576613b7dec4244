package grpcretry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// Once a hedge has won the race, no further hedge goes, even while a first
// copy that does not heed its cancel (an interceptor below grpcretry's, or
// a transport, that returns only when its call ends) has not returned:
// WithHedging(50ms, 0, 2), the first copy held for 1 s whatever its
// context, the first hedge answering in 10 ms. Before, the race's timer
// sent the second hedge at 100 ms, after the race was decided.
func TestHedgeNoneAfterAHedgeWon(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second, 10*time.Millisecond, 10*time.Millisecond)}
		var n atomic.Int64
		deaf := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if n.Add(1) == 1 { // the first copy: answered at 1 s, its cancel unheeded
				return invoker(context.WithoutCancel(ctx), method, req, reply, cc, opts...)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		opts := append(newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 2, unaryMethod), withGuards(retry.Guards{Budget: newBudget(t)})),
			grpc.WithChainUnaryInterceptor(deaf))
		c := serveInMemory(t, srv, opts...)
		// The reply is the first copy's (it answered OK, and the caller's
		// reply holds a first copy's good answer: see settle); the
		// question here is what was sent.
		if _, _, err := hedgeCall(t.Context(), c); err != nil {
			t.Errorf("UnaryCall: %v", err)
		}
		srv.settle(t)
		if got := srv.n(); got != 2 {
			t.Errorf("the server got %d calls (attempt metadata %q), want 2: the first copy and the hedge that won", got, srv.calls())
		}
	})
}
