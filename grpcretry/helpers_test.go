package grpcretry_test

import (
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

// keyMD is the metadata key an idempotency key travels under:
// idempotency.Header as gRPC writes metadata keys, in lower case.
var keyMD = strings.ToLower(idempotency.Header)

// sharedKeyScope puts every caller of a test interceptor in one scope.
var sharedKeyScope = grpcretry.WithKeyScope(func(context.Context) (string, error) { return "shared", nil })

// Full method names of the test service.
const (
	unaryMethod  = testpb.TestService_UnaryCall_FullMethodName
	outMethod    = testpb.TestService_StreamingOutputCall_FullMethodName
	inMethod     = testpb.TestService_StreamingInputCall_FullMethodName
	duplexMethod = testpb.TestService_FullDuplexCall_FullMethodName
)

// answer is one scripted server answer: a status code (OK for success), a
// pushback trailer (nil: none) and a RetryInfo delay (negative: none).
type answer struct {
	code      codes.Code
	pushback  []string
	retryInfo time.Duration
}

func ok() answer               { return answer{code: codes.OK, retryInfo: -1} }
func fail(c codes.Code) answer { return answer{code: c, retryInfo: -1} }
func (a answer) push(v ...string) answer {
	a.pushback = v
	return a
}
func (a answer) info(d time.Duration) answer {
	a.retryInfo = d
	return a
}

// err returns the answer as a handler's error (nil for OK), setting its
// trailer on ctx.
func (a answer) err(ctx context.Context) error {
	if a.pushback != nil {
		md := metadata.MD{wire.PushbackMetadata: a.pushback}
		_ = grpc.SetTrailer(ctx, md)
	}
	if a.code == codes.OK {
		return nil
	}
	st := status.New(a.code, "scripted "+a.code.String())
	if a.retryInfo >= 0 {
		st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(a.retryInfo)})
	}
	return st.Err()
}

// testServer is the test service: each call takes the next scripted
// answer (the last one repeats) and records its metadata.
type testServer struct {
	testpb.UnimplementedTestServiceServer

	mu      sync.Mutex
	script  []answer
	calls   int
	prev    [][]string // grpc-previous-rpc-attempts of each call
	keys    [][]string // idempotency-key of each call
	msgs    []int      // messages a client-streaming call received
	handler func(ctx context.Context, n int) error
	// streamMsgs is how many messages StreamingOutputCall sends before
	// answering with its scripted status.
	streamMsgs int
	// handlerStream, if set, says how many messages call n sends instead.
	handlerStream func(n int) int
	// hold, if not nil, is waited on by every call before it answers.
	hold chan struct{}
}

// next records a call and returns its number (0 for the first) and answer.
func (s *testServer) next(ctx context.Context) (int, answer) {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.calls
	s.calls++
	s.prev = append(s.prev, md[wire.PreviousAttemptsMetadata])
	s.keys = append(s.keys, md[keyMD])
	a := ok()
	if len(s.script) > 0 {
		a = s.script[min(n, len(s.script)-1)]
	}
	return n, a
}

func (s *testServer) Calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

func (s *testServer) wait(ctx context.Context) error {
	if s.hold == nil {
		return nil
	}
	select {
	case <-s.hold:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

func (s *testServer) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	n, a := s.next(ctx)
	if s.handler != nil {
		if err := s.handler(ctx, n); err != nil {
			return nil, err
		}
	}
	if err := s.wait(ctx); err != nil {
		return nil, err
	}
	if err := a.err(ctx); err != nil {
		return nil, err
	}
	return &testpb.SimpleResponse{Username: "call-" + strconv.Itoa(n)}, nil
}

func (s *testServer) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	n, a := s.next(ss.Context())
	if err := s.wait(ss.Context()); err != nil {
		return err
	}
	msgs := s.streamMsgs
	if s.handlerStream != nil {
		msgs = s.handlerStream(n)
	}
	for i := range msgs {
		body := []byte(strconv.Itoa(n) + "/" + strconv.Itoa(i) + "/" + strconv.Itoa(len(req.GetResponseParameters())))
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: body}}); err != nil {
			return err
		}
	}
	if a.pushback != nil {
		ss.SetTrailer(metadata.MD{wire.PushbackMetadata: a.pushback})
	}
	a.pushback = nil
	return a.err(ss.Context())
}

func (s *testServer) StreamingInputCall(ss testpb.TestService_StreamingInputCallServer) error {
	_, a := s.next(ss.Context())
	total := 0
	for {
		m, err := ss.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		total += len(m.GetPayload().GetBody())
	}
	s.mu.Lock()
	s.msgs = append(s.msgs, total)
	s.mu.Unlock()
	if err := a.err(ss.Context()); err != nil {
		return err
	}
	return ss.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
}

func (s *testServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	_, a := s.next(ss.Context())
	m, err := ss.Recv()
	if err != nil {
		return err
	}
	if err := a.err(ss.Context()); err != nil {
		return err
	}
	for {
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
		if m, err = ss.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
	}
}

// serve starts s on a loopback TCP port with the given server options and
// returns its address; the server stops when the test ends.
func serve(t testing.TB, s testpb.TestServiceServer, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// dial connects to addr with c's dial options (plain text) and returns a
// test service client.
func dial(t testing.TB, addr string, opts ...grpc.DialOption) testpb.TestServiceClient {
	t.Helper()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

// newClient returns the dial options of a client (grpcretry.DialOptions)
// or fails the test.
func newClient(t testing.TB, opts ...grpcretry.Option) []grpc.DialOption {
	t.Helper()
	c, err := grpcretry.DialOptions(opts...)
	if err != nil {
		t.Fatalf("DialOptions: %v", err)
	}
	return c
}

// timeline is an observer that records the sleeps the retry loop chose
// before its retries (the Delay of its Retry events), in order; onRetry,
// if set, runs at each retry, just before the sleep. It is safe for
// concurrent use.
type timeline struct {
	mu      sync.Mutex
	sleeps  []time.Duration
	onRetry func()
}

func newTimeline() *timeline { return &timeline{} }

func (tl *timeline) Observe(_ context.Context, e observe.Event) {
	if e.Kind != observe.Retry {
		return
	}
	tl.mu.Lock()
	tl.sleeps = append(tl.sleeps, e.Delay)
	hook := tl.onRetry
	tl.mu.Unlock()
	if hook != nil {
		hook()
	}
}

func (tl *timeline) Sleeps() []time.Duration {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]time.Duration(nil), tl.sleeps...)
}

// quick is a backoff of a millisecond or two, so that retries cost the
// tests next to nothing on the real clock.
func quick() *backoff.Backoff {
	b, err := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Millisecond / 2, Cap: 2 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	return b
}
