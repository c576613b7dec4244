package grpcretry_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
)

// flaky answers UNAVAILABLE twice, then OK.
type flaky struct {
	testpb.UnimplementedTestServiceServer
	calls atomic.Int32
}

func (f *flaky) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if n := f.calls.Add(1); n < 3 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &testpb.SimpleResponse{Username: "ok"}, nil
}

// startFlaky serves a flaky service on a loopback port.
func startFlaky() (addr string, srv *flaky, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv = &flaky{}
	s := grpc.NewServer()
	testpb.RegisterTestServiceServer(s, srv)
	go func() { _ = s.Serve(ln) }()
	return ln.Addr().String(), srv, s.Stop
}

func Example() {
	addr, srv, stop := startFlaky()
	defer stop()

	opts, err := grpcretry.DialOptions(grpcretry.WithIdempotentMethods("/grpc.testing.TestService/UnaryCall"))
	if err != nil {
		panic(err)
	}
	conn, err := grpc.NewClient(addr, append(opts,
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the call's deadline, retries included
	defer cancel()
	resp, err := testpb.NewTestServiceClient(conn).UnaryCall(ctx, &testpb.SimpleRequest{})
	fmt.Println(resp.GetUsername(), err, "after", srv.calls.Load(), "attempts")
	// Output: ok <nil> after 3 attempts
}
