// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package grpcretry_test

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// atkhShedServer is a legServer whose EmptyCall (a method not named for
// hedging) is shed with RESOURCE_EXHAUSTED.
type atkhShedServer struct {
	*legServer
}

func (s atkhShedServer) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return nil, status.Error(codes.ResourceExhausted, "shed")
}

// A RESOURCE_EXHAUSTED from the target, to any of its methods, is a
// pushback: no hedge to that target for 5 s (docs/hedging.md, gRPC).
func TestAttackHedgePushbackFromOtherMethod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
		c := serveInMemory(t, atkhShedServer{srv}, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithRetry(retry.WithMaxAttempts(1)))...)
		if _, err := c.EmptyCall(t.Context(), &testpb.Empty{}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("EmptyCall: %v", err)
		}
		time.Sleep(time.Second) // within the 5 s hold
		reply, took, err := hedgeCall(t.Context(), c)
		t.Logf("UnaryCall = %q after %v, %v; server calls %q", reply, took, err, srv.calls())
		if reply != "call-0" || srv.n() != 1 {
			t.Errorf("a hedge went within 5 s of the target's RESOURCE_EXHAUSTED: %d calls on the server, reply %q", srv.n(), reply)
		}
		srv.settle(t)
	})
}

// atkhOneToken lets one attempt through, then makes every later one wait for
// its context.
type atkhOneToken struct{ n atomic.Int64 }

func (l *atkhOneToken) Wait(ctx context.Context) error {
	if l.n.Add(1) == 1 {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

// WithRetry: retry.WithRateLimit paces "the attempts to every target; a
// hedge does not wait for it". A black-box attack found the hedge going
// past a limiter with one token, where the doc did not say so; it does
// now.
func TestAttackHedgeRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
		l := &atkhOneToken{}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithRetry(retry.WithRateLimit(l)))...)
		reply, took, err := hedgeCall(t.Context(), c)
		t.Logf("UnaryCall = %q after %v, %v", reply, took, err)
		if srv.n() != 2 || l.n.Load() != 1 {
			t.Errorf("%d calls on the server, limiter asked %d times; want 2 (the call and its hedge), asked once", srv.n(), l.n.Load())
		}
		srv.settle(t)
	})
}
