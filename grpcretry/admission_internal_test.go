package grpcretry

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// TestAttemptFromContext reads the attempt number a server call carries.
func TestAttemptFromContext(t *testing.T) {
	tests := []struct {
		vals []string
		n    int
	}{
		{nil, 1},
		{[]string{"1"}, 2},
		{[]string{"2", "1"}, 3},
		{[]string{"x"}, 1},
		{[]string{"0"}, 1},
		{[]string{"-3"}, 1},
	}
	for _, tt := range tests {
		md := metadata.MD{}
		if tt.vals != nil {
			md[wire.PreviousAttemptsMetadata] = tt.vals
		}
		ctx := metadata.NewIncomingContext(context.Background(), md)
		if n := attemptFromContext(ctx); n != tt.n {
			t.Errorf("attemptFromContext(%q) = %d, want %d", tt.vals, n, tt.n)
		}
	}
}

// TestAdmissionAllocs: an admitted call costs the admission interceptor no
// allocation.
func TestAdmissionAllocs(t *testing.T) {
	ctl, err := admission.New(admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	in := admissionUnary(ctl)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{"content-type": {"application/grpc"}})
	info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_UnaryCall_FullMethodName}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	req := &testpb.SimpleRequest{}
	if n := testing.AllocsPerRun(1000, func() { _, _ = in(ctx, req, info, handler) }); n != 0 {
		t.Errorf("admitted call: %v allocations, want 0", n)
	}
}
