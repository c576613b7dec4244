package grpcretry

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkUnaryInterceptorSuccess is the client's unary interceptor alone
// (the one DialOptions installs), around an invoker that answers at once:
// its success path, without grpc-go or the network.
func BenchmarkUnaryInterceptorSuccess(b *testing.B) {
	const method = testpb.TestService_UnaryCall_FullMethodName
	c, err := newClient(WithIdempotentMethods(method))
	if err != nil {
		b.Fatal(err)
	}
	invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		return nil
	}
	ctx := context.Background()
	req, reply := &testpb.SimpleRequest{}, &testpb.SimpleResponse{}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.unary(ctx, method, req, reply, nil, invoker); err != nil {
			b.Fatal(err)
		}
	}
}
