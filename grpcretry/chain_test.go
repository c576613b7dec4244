package grpcretry_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// relay is a middle service: its UnaryCall calls the next service through
// its own retrying client and, with pushBack, tells its caller not to
// retry when that call gave up.
type relay struct {
	testpb.UnimplementedTestServiceServer
	next     testpb.TestServiceClient
	pushBack bool
}

func (r *relay) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	resp, err := r.next.UnaryCall(ctx, req)
	if err != nil {
		if r.pushBack {
			return nil, grpcretry.PushBack(ctx, err)
		}
		return nil, err
	}
	return resp, nil
}

// TestOneLayerRetries: three services in a chain above a failing one, each
// client retrying up to 3 times. With PushBack the bottom sees 3 attempts
// for one user request; without it (and without budgets, which would
// otherwise cap it) every layer multiplies: 27.
func TestOneLayerRetries(t *testing.T) {
	for _, tt := range []struct {
		pushBack bool
		want     int
	}{{true, 3}, {false, 27}} {
		bottom := &testServer{script: []answer{fail(codes.Unavailable)}}
		addr := serve(t, bottom)
		opts := []grpcretry.Option{
			grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil),
			grpcretry.WithRetry(retry.WithBackoff(quick())),
		}
		for range 2 { // two relays: top -> r1 -> r2 -> bottom
			next := dial(t, addr, newClient(t, opts...)...)
			addr = serve(t, &relay{next: next, pushBack: tt.pushBack})
		}
		top := dial(t, addr, newClient(t, opts...)...)
		_, err := top.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("pushBack=%v: UnaryCall = %v, want UNAVAILABLE", tt.pushBack, err)
		}
		if n := bottom.Calls(); n != tt.want {
			t.Errorf("pushBack=%v: the bottom service saw %d attempts, want %d", tt.pushBack, n, tt.want)
		}
	}
}

// TestPushBackPassesOtherErrors: PushBack leaves alone an error that is
// not an overload (a NOT_FOUND answered once) and nil.
func TestPushBackPassesOtherErrors(t *testing.T) {
	bottom := &testServer{script: []answer{fail(codes.NotFound)}}
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod))
	client := dial(t, serve(t, bottom), c...)
	_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	if got := grpcretry.PushBack(t.Context(), err); got != err {
		t.Errorf("PushBack(NOT_FOUND) = %v; want the error unchanged", got)
	}
	if grpcretry.PushBack(t.Context(), nil) != nil {
		t.Errorf("PushBack(nil) not nil")
	}
}
