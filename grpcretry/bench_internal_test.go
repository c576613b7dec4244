package grpcretry

import (
	"context"
	"testing"
	"time"

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

// BenchmarkUnaryInterceptorHedgeNotNeeded is the interceptor alone around
// an invoker that answers at once, for a method declared for hedging with
// a delay no call reaches: every call runs a race its first copy wins
// (the "no hedging" row is the same call undeclared).
func BenchmarkUnaryInterceptorHedgeNotNeeded(b *testing.B) {
	const method = testpb.TestService_UnaryCall_FullMethodName
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"no hedging", nil},
		{"race won by the first copy", []Option{WithHedging(time.Hour, 0, 1, method)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := newClient(append(bc.opts, WithIdempotentMethods(method))...)
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
		})
	}
}
