package grpcretry_test

import (
	"context"
	"testing"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/stormguard/stormguard/grpcretry"
)

// staticServer answers every call with the same response: no allocation of
// its own, so that allocation counts compare the clients.
type staticServer struct {
	testpb.UnimplementedTestServiceServer
	resp *testpb.SimpleResponse
}

func (s *staticServer) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return s.resp, nil
}

// TestSuccessPathAllocs: a successful unary call through the interceptor
// (budget and breaker on) allocates at most 2 objects more than a bare
// call: the call's options with the trailer they read into, and grpc-go's
// copy of the (empty) trailer.
func TestSuccessPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts over a live connection")
	}
	addr := serve(t, &staticServer{resp: &testpb.SimpleResponse{}})
	bare := dial(t, addr)
	guarded := dial(t, addr, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod))...)
	req := &testpb.SimpleRequest{}
	allocs := func(c testpb.TestServiceClient) float64 {
		ctx := context.Background()
		for range 100 { // connect and warm up
			if _, err := c.UnaryCall(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(1000, func() { _, _ = c.UnaryCall(ctx, req) })
	}
	b, g := allocs(bare), allocs(guarded)
	if g-b > 2 {
		t.Errorf("a successful call allocates %v objects through the interceptor, %v bare: %v more, want at most 2", g, b, g-b)
	}
	t.Logf("allocs per call: bare %v, through grpcretry %v", b, g)
}
