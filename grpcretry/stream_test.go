package grpcretry_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// recvAll reads a server stream to its end and returns the message bodies
// and the final error (nil for io.EOF).
func recvAll(s interface {
	Recv() (*testpb.StreamingOutputCallResponse, error)
}) ([]string, error) {
	var got []string
	for {
		m, err := s.Recv()
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, string(m.GetPayload().GetBody()))
	}
}

// TestServerStreamRetriedBeforeFirstMessage: a server-streaming call that
// fails before its first message is retried with the same request; the
// caller sees only the stream that answered.
func TestServerStreamRetriedBeforeFirstMessage(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), fail(codes.Unavailable), ok()}, streamMsgs: 2}
	c := newClient(t, grpcretry.WithIdempotentMethods(outMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
	// The scripted failures come after streamMsgs messages; make them come
	// first by sending none on the failing calls.
	srv.handlerStream = func(n int) int {
		if n < 2 {
			return 0
		}
		return 2
	}
	req := &testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{}, {}, {}}}
	stream, err := client.StreamingOutputCall(t.Context(), req)
	if err != nil {
		t.Fatalf("StreamingOutputCall: %v", err)
	}
	got, err := recvAll(stream)
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	// Each body is "<call>/<message>/<response parameters the request had>".
	if strings.Join(got, " ") != "2/0/3 2/1/3" {
		t.Errorf("messages = %q, want the third call's two, each seeing the full request", got)
	}
	if n := srv.Calls(); n != 3 {
		t.Errorf("server saw %d streams, want 3", n)
	}
	if want := [][]string{nil, {"1"}, {"2"}}; len(srv.prev) != 3 || srv.prev[0] != nil || srv.prev[2][0] != "2" {
		t.Errorf("previous attempts = %q, want %q", srv.prev, want)
	}
}

// TestServerStreamNotRetriedAfterFirstMessage: once a message reached the
// caller, a failure is the caller's.
func TestServerStreamNotRetriedAfterFirstMessage(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}, streamMsgs: 1}
	c := newClient(t, grpcretry.WithIdempotentMethods(outMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
	stream, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatalf("StreamingOutputCall: %v", err)
	}
	got, err := recvAll(stream)
	if len(got) != 1 || status.Code(err) != codes.Unavailable {
		t.Errorf("Recv: %q then %v, want one message then UNAVAILABLE", got, err)
	}
	if n := srv.Calls(); n != 1 {
		t.Errorf("server saw %d streams, want 1", n)
	}
}

// TestServerStreamGiveUp: a stream that never answers gives up like a
// unary call, and says so on every later call.
func TestServerStreamGiveUp(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable).push("-1")}}
	c := newClient(t, grpcretry.WithIdempotentMethods(outMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
	stream, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatalf("StreamingOutputCall: %v", err)
	}
	_, err = stream.Recv()
	if pushed := grpcretry.PushBack(t.Context(), err); status.Code(err) != codes.Unavailable || pushed == err {
		t.Errorf("Recv = %v (PushBack: %v), want UNAVAILABLE with the don't-retry signal, pushed back", err, pushed)
	}
	if _, err2 := stream.Recv(); err2 != err {
		t.Errorf("second Recv = %v, want the same give-up %v", err2, err)
	}
	if n := srv.Calls(); n != 1 {
		t.Errorf("server saw %d streams, want 1 (pushback -1)", n)
	}
}

// TestServerStreamHeaderFirst: a caller that asks for the header first gets
// it after the retries, and then the messages.
func TestServerStreamHeaderFirst(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}, streamMsgs: 1}
	srv.handlerStream = func(n int) int { return n } // first call: no message
	c := newClient(t, grpcretry.WithIdempotentMethods(outMethod), grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
	stream, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatalf("StreamingOutputCall: %v", err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatalf("Header: %v", err)
	}
	got, err := recvAll(stream)
	if err != nil || len(got) != 1 {
		t.Errorf("Recv: %q, %v; want one message", got, err)
	}
}

// sendAll sends n payloads of size bytes on a client stream and closes it.
func sendAll(t *testing.T, s testpb.TestService_StreamingInputCallClient, n, size int) (*testpb.StreamingInputCallResponse, error) {
	t.Helper()
	for range n {
		if err := s.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: make([]byte, size)}}); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	return s.CloseAndRecv()
}

// TestClientStream: without WithBufferMessages a client-streaming call is
// never retried; with it, a failure before the response is retried with
// every message replayed; past the bound it is not.
func TestClientStream(t *testing.T) {
	tests := []struct {
		name      string
		opts      []grpcretry.Option
		n         int
		wantCalls int
		wantErr   bool
	}{
		{"no buffering", nil, 3, 1, true},
		{"buffered", []grpcretry.Option{grpcretry.WithBufferMessages(1 << 10)}, 3, 2, false},
		{"past the bound", []grpcretry.Option{grpcretry.WithBufferMessages(250)}, 3, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
			opts := append([]grpcretry.Option{grpcretry.WithIdempotentMethods(inMethod), grpcretry.WithRetry(retry.WithBackoff(quick()))}, tt.opts...)
			client := dial(t, serve(t, srv), newClient(t, opts...)...)
			stream, err := client.StreamingInputCall(t.Context())
			if err != nil {
				t.Fatalf("StreamingInputCall: %v", err)
			}
			resp, err := sendAll(t, stream, tt.n, 100)
			if (err != nil) != tt.wantErr {
				t.Errorf("CloseAndRecv = %v, %v; want error %v", resp, err, tt.wantErr)
			}
			if err == nil && resp.GetAggregatedPayloadSize() != int32(tt.n*100) {
				t.Errorf("server received %d bytes, want %d", resp.GetAggregatedPayloadSize(), tt.n*100)
			}
			if n := srv.Calls(); n != tt.wantCalls {
				t.Errorf("server saw %d streams, want %d", n, tt.wantCalls)
			}
		})
	}
}

// TestBidiStream: a bidirectional call with buffering is retried until the
// first response, with the messages sent so far replayed, and then passes
// through.
func TestBidiStream(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
	c := newClient(t, grpcretry.WithIdempotentMethods(duplexMethod), grpcretry.WithBufferMessages(1<<10), grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
	stream, err := client.FullDuplexCall(t.Context())
	if err != nil {
		t.Fatalf("FullDuplexCall: %v", err)
	}
	for _, body := range []string{"a", "b"} {
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte(body)}}); err != nil {
			t.Fatalf("Send: %v", err)
		}
		m, err := stream.Recv()
		if err != nil || string(m.GetPayload().GetBody()) != body {
			t.Fatalf("Recv = %v, %v; want the echo of %q", m, err, body)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("CloseSend: %v", err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("last Recv = %v, want io.EOF", err)
	}
	if n := srv.Calls(); n != 2 {
		t.Errorf("server saw %d streams, want 2", n)
	}
}

// TestUnsafeStreamPassesThrough: a server-streaming call that is not safe
// to repeat gets one attempt.
func TestUnsafeStreamPassesThrough(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
	client := dial(t, serve(t, srv), newClient(t)...)
	stream, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatalf("StreamingOutputCall: %v", err)
	}
	_, err = recvAll(stream)
	var e *grpcretry.Error
	if status.Code(err) != codes.Unavailable || errors.As(err, &e) || srv.Calls() != 1 {
		t.Errorf("Recv = %v (%T) after %d streams, want gRPC's own UNAVAILABLE after 1", err, err, srv.Calls())
	}
}
