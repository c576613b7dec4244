package grpcretry_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// floodWindow is the HTTP/2 flow-control window (stream and connection) of
// both ends in the flood tests: grpc-go's smallest, so that a few messages
// fill it.
const floodWindow = 64 << 10

// serveSmallWindows starts s on an in-memory listener with floodWindow
// windows on both ends and returns a client connected to it with opts.
func serveSmallWindows(t testing.TB, s testpb.TestServiceServer, opts ...grpc.DialOption) testpb.TestServiceClient {
	t.Helper()
	ln := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(grpc.InitialWindowSize(floodWindow), grpc.InitialConnWindowSize(floodWindow))
	testpb.RegisterTestServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) })
	return dial(t, "passthrough:///bufconn", append(opts, dialer,
		grpc.WithInitialWindowSize(floodWindow), grpc.WithInitialConnWindowSize(floodWindow))...)
}

// floodServer answers each message of a bidirectional call with fanOut
// responses of size bytes, all sent before it reads the next message: a
// server that waits for its answers to be read before it reads more. Its
// client-streaming call sends its header, then reads nothing until read is
// closed.
type floodServer struct {
	testpb.UnimplementedTestServiceServer
	fanOut, size int
	// failAfter > 0: the first stream fails UNAVAILABLE once it received
	// that many messages, before any response.
	failAfter int
	read      chan struct{}

	mu      sync.Mutex
	streams [][]uint32 // the index of each message each stream received
}

// open records a new stream and returns its number.
func (s *floodServer) open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams = append(s.streams, nil)
	return len(s.streams) - 1
}

// got records that stream n received a message with body b, and returns
// how many that stream received.
func (s *floodServer) got(n int, b []byte) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[n] = append(s.streams[n], binary.BigEndian.Uint32(b))
	return len(s.streams[n])
}

func (s *floodServer) received() [][]uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.streams)
}

func (s *floodServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	n := s.open()
	for {
		m, err := ss.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if k := s.got(n, m.GetPayload().GetBody()); n == 0 && s.failAfter > 0 {
			if k == s.failAfter {
				return status.Error(codes.Unavailable, "flood: the first stream fails before any response")
			}
			continue
		}
		for range s.fanOut {
			if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: make([]byte, s.size)}}); err != nil {
				return err
			}
		}
	}
}

func (s *floodServer) StreamingInputCall(ss testpb.TestService_StreamingInputCallServer) error {
	n := s.open()
	if err := ss.SendHeader(metadata.MD{"flood": []string{"1"}}); err != nil {
		return err
	}
	select {
	case <-s.read:
	case <-ss.Context().Done():
		return ss.Context().Err()
	}
	total := 0
	for {
		m, err := ss.Recv()
		if err == io.EOF {
			return ss.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
		}
		if err != nil {
			return err
		}
		s.got(n, m.GetPayload().GetBody())
		total += len(m.GetPayload().GetBody())
	}
}

// floodMsg is message i of size bytes, its index in its first 4 bytes.
func floodMsg(i, size int) *testpb.StreamingOutputCallRequest {
	b := make([]byte, size)
	binary.BigEndian.PutUint32(b, uint32(i))
	return &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: b}}
}

// stallGuard runs call, which must return once ctx ends, and fails t if it
// has not returned after 10 s: a stall detector, not a timing check (each
// call here takes well under a second when it does not stall). It then
// cancels ctx's cancel and waits for call to return.
func stallGuard(t *testing.T, cancel context.CancelFunc, what string, call func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	select {
	case <-done:
		return
	case <-time.After(10 * time.Second):
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	t.Fatalf("%s stalled: still running after 10 s", what)
}

// TestBufferedBidiFloodDoesNotStall: a buffered bidirectional call whose
// server sends many large responses to each message before it reads the
// next, with windows of 64 KiB, the caller sending on one goroutine and
// receiving on another. The sends block on flow control until the caller
// reads; they must never keep the receiver from reading (before, a send
// held the stream's lock a receive needed, and the first receive replayed
// the kept messages itself: the call stalled for good). Within the bound,
// past it, and with a first stream that fails after two messages (every
// message replayed, in order, on the second). The cases that send before
// the first receive stalled every time; those that send while receiving
// most times (the lock was not always held when the receive needed it).
func TestBufferedBidiFloodDoesNotStall(t *testing.T) {
	const n, size, fanOut = 48, 16 << 10, 4
	tests := []struct {
		name      string
		bound     int
		sendFirst bool // every message sent (and the sending side closed) before the first receive
		failAfter int
	}{
		{"sent before the first receive", 4 << 20, true, 0},
		{"sent while receiving", 4 << 20, false, 0},
		{"past the bound while receiving", 256 << 10, false, 0},
		{"sent before the first receive, first stream fails", 4 << 20, true, 2},
		{"sent while receiving, first stream fails", 4 << 20, false, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &floodServer{fanOut: fanOut, size: size, failAfter: tt.failAfter}
			client := serveSmallWindows(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
				grpcretry.WithBufferMessages(tt.bound), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var got int
			var sendErr, recvErr error
			stallGuard(t, cancel, "the call", func() {
				st, err := client.FullDuplexCall(ctx)
				if err != nil {
					recvErr = err
					return
				}
				send := func() {
					for i := range n {
						if sendErr = st.Send(floodMsg(i, size)); sendErr != nil {
							return
						}
					}
					sendErr = st.CloseSend()
				}
				var wg sync.WaitGroup
				if tt.sendFirst {
					send()
				} else {
					wg.Go(send)
				}
				for {
					if _, recvErr = st.Recv(); recvErr != nil {
						break
					}
					got++
				}
				wg.Wait()
			})
			if sendErr != nil || recvErr != io.EOF || got != n*fanOut {
				t.Errorf("sent: %v; received %d responses, then %v; want %d, then EOF", sendErr, got, recvErr, n*fanOut)
			}
			streams := srv.received()
			want := make([]uint32, n)
			for i := range want {
				want[i] = uint32(i)
			}
			if wantStreams := 1 + min(tt.failAfter, 1); len(streams) != wantStreams || !slices.Equal(streams[len(streams)-1], want) {
				t.Errorf("server streams received %v, want %d streams, the last with every message in order", streams, wantStreams)
			}
		})
	}
}

// TestBufferedClientStreamHeaderWhileSending: a buffered client-streaming
// call whose server sends its header and reads nothing until the caller
// has it: the messages kept before the stream opened (more than the
// windows hold) must not keep Header from returning (before, the Header
// that opened the stream replayed them itself, and blocked on flow control
// for good).
func TestBufferedClientStreamHeaderWhileSending(t *testing.T) {
	const n, size = 32, 16 << 10
	srv := &floodServer{read: make(chan struct{})}
	client := serveSmallWindows(t, srv, newClient(t, grpcretry.WithIdempotentMethods(inMethod),
		grpcretry.WithBufferMessages(4<<20), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var resp *testpb.StreamingInputCallResponse
	var hdr metadata.MD
	var err error
	stallGuard(t, cancel, "the call", func() {
		var st testpb.TestService_StreamingInputCallClient
		if st, err = client.StreamingInputCall(ctx); err != nil {
			return
		}
		for i := range n {
			if err = st.Send(&testpb.StreamingInputCallRequest{Payload: floodMsg(i, size).GetPayload()}); err != nil {
				return
			}
		}
		if hdr, err = st.Header(); err != nil {
			return
		}
		close(srv.read)
		resp, err = st.CloseAndRecv()
	})
	if err != nil || resp.GetAggregatedPayloadSize() != n*size || len(hdr.Get("flood")) != 1 {
		t.Errorf("header %v; CloseAndRecv = %v, %v; want the header, then %d bytes received", hdr, resp, err, n*size)
	}
}

// panicSendStream is a client stream whose SendMsg panics, of a type whose
// values cannot be compared (a func field).
type panicSendStream struct {
	grpc.ClientStream
	bug func()
}

func (s panicSendStream) SendMsg(any) error {
	s.bug()
	return nil
}

// TestBufferedBidiReplayPanic: a kept message's replay goes beside the
// receive that opened the stream, on a goroutine of its own; a send that
// panics there (an interceptor under the client's) does not take the
// process down: the receive panics with the value, as it did when it
// replayed the messages itself, and the stream is over, its later calls
// never blocking.
func TestBufferedBidiReplayPanic(t *testing.T) {
	srv := &testServer{}
	wrap := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return panicSendStream{cs, func() { panic("send bug") }}, nil
	})
	client := serveInMemory(t, srv, append(newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
		grpcretry.WithBufferMessages(1<<10), grpcretry.WithRetry(retry.WithBackoff(quick()))), wrap)...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	stallGuard(t, cancel, "the call", func() {
		st, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		if err := st.Send(floodMsg(0, 8)); err != nil {
			t.Errorf("Send (kept, the stream not open yet) = %v", err)
		}
		if got := panicking(func() { _, _ = st.Recv() }); got != "send bug" {
			t.Errorf("Recv panicked with %v, want the replay's value", got)
		}
		_ = st.CloseSend()
		if _, err := st.Recv(); err == nil {
			t.Error("Recv after the panic = nil, want an error")
		}
		if err := st.Send(floodMsg(1, 8)); err == nil {
			t.Error("Send after the panic = nil, want an error")
		}
	})
}
