package grpcretry_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/wire"
)

// hangsFirst hangs the first attempt of every call (one without
// grpc-previous-rpc-attempts) until the client cancels it, reporting the
// cancel on canceled, and answers the others at once.
type hangsFirst struct {
	testpb.UnimplementedTestServiceServer
	canceled chan struct{}
}

func (s *hangsFirst) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	prev := metadata.ValueFromIncomingContext(ctx, wire.PreviousAttemptsMetadata)
	if len(prev) == 0 {
		<-ctx.Done()
		close(s.canceled)
		return nil, ctx.Err()
	}
	return &testpb.SimpleResponse{Username: "hedge after " + prev[0] + " attempt"}, nil
}

// A call whose first attempt hangs: after 20 ms the client sends a hedge
// (grpc-previous-rpc-attempts 1 on the wire, paid from the target's retry
// budget), whose answer wins; the hung attempt is canceled, and its server
// sees it go.
func ExampleWithHedging() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	srv := &hangsFirst{canceled: make(chan struct{})}
	s := grpc.NewServer()
	testpb.RegisterTestServiceServer(s, srv)
	go func() { _ = s.Serve(ln) }()
	defer s.Stop()

	// A fixed delay of 20 ms; 0 would learn it per target (the p95 of the
	// method's recent answers, with q = 0).
	opts, err := grpcretry.DialOptions(grpcretry.WithHedging(20*time.Millisecond, 0, 1, "/grpc.testing.TestService/UnaryCall"))
	if err != nil {
		panic(err)
	}
	conn, err := grpc.NewClient(ln.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		panic(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := testpb.NewTestServiceClient(conn).UnaryCall(ctx, &testpb.SimpleRequest{})
	fmt.Println(resp.GetUsername(), err)
	select {
	case <-srv.canceled:
		fmt.Println("the first attempt was canceled")
	case <-time.After(5 * time.Second):
		fmt.Println("the first attempt is still running")
	}
	// Output:
	// hedge after 1 attempt <nil>
	// the first attempt was canceled
}
