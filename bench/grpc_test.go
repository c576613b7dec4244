package bench

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	mwretry "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// The gRPC benchmarks compare, on loopback against one grpc-go server of
// the interop test service, a bare connection with the three ways to retry
// a unary call: stormguard's grpcretry (its DialOptions: grpc-go's
// retry off, the interceptors on, UnaryCall declared idempotent, per-target
// budget and breaker on), grpc-go's own retry (a service config with a
// retryPolicy of 3 attempts on UNAVAILABLE) and go-grpc-middleware v2's
// retry interceptor (WithMax(3), UNAVAILABLE). Each iteration is one
// UnaryCall on one shared connection. The server runs in the same process,
// so B/op and allocs/op include its side; it is the same for every setup,
// and the differences are the retry layers' own cost.
//
// The one-retry benchmarks make the server fail the first attempt of every
// call with UNAVAILABLE (an attempt is a first one when it carries neither
// grpc-previous-rpc-attempts nor go-grpc-middleware's x-retry-attempt) and
// answer the retry; every setup waits (almost) zero between them: a 1 ms
// backoff with its random source at 0 for stormguard (and a budget and a
// breaker that allow one retry per call: Ratio 1, FailureRatio 1), an
// initialBackoff of 1 µs for grpc-go (it sleeps a random fraction of it),
// BackoffLinear(0) for go-grpc-middleware.

// grpcServer is the benchmarks' server; failFirst makes it answer the first
// attempt of every call with UNAVAILABLE.
type grpcServer struct {
	testpb.UnimplementedTestServiceServer
	failFirst bool
	calls     atomic.Int64
}

func (s *grpcServer) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.calls.Add(1)
	if s.failFirst && firstAttempt(ctx) {
		return nil, status.Error(codes.Unavailable, "first attempt")
	}
	return &testpb.SimpleResponse{}, nil
}

// firstAttempt reports whether a server call is a first attempt for every
// retry layer compared.
func firstAttempt(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md[wire.PreviousAttemptsMetadata]) == 0 && len(md[mwretry.AttemptMetadataKey]) == 0
}

// startGRPC serves s on a loopback port until the test ends.
func startGRPC(tb testing.TB, s testpb.TestServiceServer, opts ...grpc.ServerOption) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// grpcSetup is one way to call the server; dial returns its dial options,
// retry says whether it is set up for the one-retry benchmark (zero
// delays).
type grpcSetup struct {
	name string
	how  string
	dial func(tb testing.TB, retry bool) []grpc.DialOption
}

// grpcServiceConfig is grpc-go's own retry: 3 attempts on UNAVAILABLE.
func grpcServiceConfig(initialBackoff string) string {
	return `{"methodConfig":[{"name":[{"service":"grpc.testing.TestService"}],"retryPolicy":{` +
		`"maxAttempts":3,"initialBackoff":"` + initialBackoff + `","maxBackoff":"1s","backoffMultiplier":2,` +
		`"retryableStatusCodes":["UNAVAILABLE"]}}]}`
}

var grpcSetups = []grpcSetup{
	{"bare", "a grpc.NewClient connection with no retry configured", func(testing.TB, bool) []grpc.DialOption { return nil }},
	{"stormguard", "grpcretry.DialOptions(WithIdempotentMethods(UnaryCall))", func(tb testing.TB, fast bool) []grpc.DialOption {
		opts := []grpcretry.Option{grpcretry.WithIdempotentMethods(testpb.TestService_UnaryCall_FullMethodName)}
		if fast {
			opts = append(opts, grpcretry.WithRetry(retry.WithBackoff(zeroBackoff(tb))),
				grpcretry.WithBudget(&budget.Config{Ratio: 1}), grpcretry.WithBreaker(&breaker.Config{FailureRatio: 1}))
		}
		c, err := grpcretry.DialOptions(opts...)
		if err != nil {
			tb.Fatal(err)
		}
		return c
	}},
	{"grpc-go", "grpc.WithDefaultServiceConfig: retryPolicy maxAttempts 3 on UNAVAILABLE", func(_ testing.TB, fast bool) []grpc.DialOption {
		backoff := "0.1s"
		if fast {
			backoff = "0.000001s"
		}
		return []grpc.DialOption{grpc.WithDefaultServiceConfig(grpcServiceConfig(backoff))}
	}},
	{"go-grpc-middleware", "retry.UnaryClientInterceptor(WithMax(3), WithCodes(UNAVAILABLE))", func(_ testing.TB, fast bool) []grpc.DialOption {
		opts := []mwretry.CallOption{mwretry.WithMax(3), mwretry.WithCodes(codes.Unavailable)}
		if fast {
			opts = append(opts, mwretry.WithBackoff(mwretry.BackoffLinear(0)))
		}
		return []grpc.DialOption{grpc.WithChainUnaryInterceptor(mwretry.UnaryClientInterceptor(opts...))}
	}},
}

// dialGRPC connects to addr with opts and returns a test service client.
func dialGRPC(tb testing.TB, addr string, opts []grpc.DialOption) testpb.TestServiceClient {
	tb.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

// TestGRPCSetupsBehave checks every benchmarked setup: one attempt for a
// success, and a failed first attempt retried to success (so the retry
// layers really retry); the bare connection does not retry.
func TestGRPCSetupsBehave(t *testing.T) {
	for _, s := range grpcSetups {
		t.Run(s.name, func(t *testing.T) {
			for _, fast := range []bool{false, true} {
				srv := &grpcServer{failFirst: true}
				client := dialGRPC(t, startGRPC(t, srv), s.dial(t, fast))
				_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
				wantCalls, wantCode := int64(2), codes.OK
				if s.name == "bare" {
					wantCalls, wantCode = 1, codes.Unavailable
				}
				if status.Code(err) != wantCode || srv.calls.Load() != wantCalls {
					t.Errorf("fast=%v: failing first attempt: %v after %d attempts, want %v after %d", fast, err, srv.calls.Load(), wantCode, wantCalls)
				}
				srv.failFirst = false
				srv.calls.Store(0)
				if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil || srv.calls.Load() != 1 {
					t.Errorf("fast=%v: success: %v after %d attempts, want nil after 1", fast, err, srv.calls.Load())
				}
			}
		})
	}
}

func benchmarkGRPC(b *testing.B, failFirst bool) {
	for _, s := range grpcSetups {
		if failFirst && s.name == "bare" {
			continue
		}
		b.Run(s.name, func(b *testing.B) {
			srv := &grpcServer{failFirst: failFirst}
			client := dialGRPC(b, startGRPC(b, srv), s.dial(b, failFirst))
			ctx := context.Background()
			req := &testpb.SimpleRequest{}
			if _, err := client.UnaryCall(ctx, req); err != nil { // connect
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := client.UnaryCall(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkGRPCUnary is one successful unary call per iteration.
func BenchmarkGRPCUnary(b *testing.B) { benchmarkGRPC(b, false) }

// BenchmarkGRPCUnaryOneRetry is one call per iteration whose first attempt
// fails with UNAVAILABLE and whose retry succeeds.
func BenchmarkGRPCUnaryOneRetry(b *testing.B) { benchmarkGRPC(b, true) }

// BenchmarkGRPCUnaryInterleaved makes one successful call through every
// setup per iteration, in a rotating order, and reports each setup's mean
// time per call (metric "<setup>-ns/call") and its overhead over the bare
// call ("<setup>-over-bare-ns/call"). The setups share the machine's load
// call by call, which separate benchmarks run one after another do not: on
// a busy machine this is the fair comparison of their speed.
func BenchmarkGRPCUnaryInterleaved(b *testing.B) {
	type live struct {
		name   string
		client testpb.TestServiceClient
		total  time.Duration
	}
	var setups []*live
	ctx := context.Background()
	req := &testpb.SimpleRequest{}
	for _, s := range grpcSetups {
		l := &live{name: s.name, client: dialGRPC(b, startGRPC(b, &grpcServer{}), s.dial(b, false))}
		if _, err := l.client.UnaryCall(ctx, req); err != nil { // connect
			b.Fatal(err)
		}
		setups = append(setups, l)
	}
	n := 0
	for b.Loop() {
		for i := range setups {
			l := setups[(i+n)%len(setups)]
			start := time.Now()
			if _, err := l.client.UnaryCall(ctx, req); err != nil {
				b.Fatal(err)
			}
			l.total += time.Since(start)
		}
		n++
	}
	bare := float64(setups[0].total) / float64(n)
	for _, l := range setups {
		mean := float64(l.total) / float64(n)
		b.ReportMetric(mean, l.name+"-ns/call")
		if l != setups[0] {
			b.ReportMetric(mean-bare, l.name+"-over-bare-ns/call")
		}
	}
}

// BenchmarkGRPCInterceptorOnly runs each retry interceptor's success path
// on a connection whose last interceptor answers at once: the layer's own
// cost (and grpc-go's call setup, the same for both), without the network.
func BenchmarkGRPCInterceptorOnly(b *testing.B) {
	c, err := grpcretry.DialOptions(grpcretry.WithIdempotentMethods(testpb.TestService_UnaryCall_FullMethodName))
	if err != nil {
		b.Fatal(err)
	}
	answer := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return nil
	})
	dialOpts := map[string][]grpc.DialOption{
		"stormguard":         append(c, answer),
		"go-grpc-middleware": {grpc.WithChainUnaryInterceptor(mwretry.UnaryClientInterceptor(mwretry.WithMax(3), mwretry.WithCodes(codes.Unavailable))), answer},
	}
	for _, name := range []string{"stormguard", "go-grpc-middleware"} {
		conn, err := grpc.NewClient("127.0.0.1:1", append(dialOpts[name], grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			req, reply := &testpb.SimpleRequest{}, &testpb.SimpleResponse{}
			b.ReportAllocs()
			for b.Loop() {
				if err := conn.Invoke(ctx, testpb.TestService_UnaryCall_FullMethodName, req, reply, grpc.StaticMethod()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
