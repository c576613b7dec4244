package grpcretry_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/test/bufconn"
)

// serveInMemory starts s on an in-memory listener (bufconn) and returns a
// test service client connected to it with opts. Unlike [serve] and [dial]
// it uses no socket: every goroutine of the client and the server blocks on
// in-memory state only, so that inside a testing/synctest bubble the fake
// clock advances exactly when the call waits on a timer (an RPC takes no
// fake time), and sleeps and deadlines are checked without the real clock.
// The server and the connection stop when the test ends.
func serveInMemory(t testing.TB, s testpb.TestServiceServer, opts ...grpc.DialOption) testpb.TestServiceClient {
	t.Helper()
	ln := bufconn.Listen(1 << 16)
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) })
	return dial(t, "passthrough:///bufconn", append(opts, dialer)...)
}
