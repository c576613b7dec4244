package grpcretry_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// take returns the events so far, and forgets them.
func (l *eventLog) take() []observe.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	ev := l.events
	l.events = nil
	return ev
}

// panicking returns the value what panicked with, nil if it returned.
func panicking(what func()) (v any) {
	defer func() { v = recover() }()
	what()
	return nil
}

// checkPanicEvents checks that the last two events end attempt n and the
// call for a panic.
func checkPanicEvents(t *testing.T, events []observe.Event, n int) {
	t.Helper()
	if len(events) < 3 {
		t.Fatalf("events %+v, want the attempt's end and the give-up last", events)
	}
	end, giveUp := events[len(events)-2], events[len(events)-1]
	const msg = "retry: operation panicked: interceptor bug"
	if end.Kind != observe.AttemptEnd || end.Attempt != n || end.Outcome != "failure" || end.Err == nil || end.Err.Error() != msg {
		t.Errorf("second to last event %+v, want AttemptEnd of attempt %d, outcome failure, Err %q", end, n, msg)
	}
	if giveUp.Kind != observe.GiveUp || giveUp.Attempt != n || giveUp.Reason != "panic" || giveUp.Err != end.Err {
		t.Errorf("last event %+v, want GiveUp after %d attempts, reason panic", giveUp, n)
	}
}

// TestInvokerPanicEndsAttemptAndCall: an interceptor under the client's
// (its invoker, or its streamer) that panics, on the first attempt or on
// a retry after UNAVAILABLE, has the attempt and the call reported as
// ended to the client's observer, and the panic leaves the call with its
// value. Before, the events stopped at AttemptStart. A stream whose
// streamer panicked can still be closed, and is over (its lock was left
// held: a deferred CloseSend blocked for ever).
func TestInvokerPanicEndsAttemptAndCall(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
	addr := serve(t, srv)
	for _, panicAt := range []int{1, 2} {
		var log eventLog
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod, outMethod), grpcretry.WithRetry(retry.WithBackoff(quick())),
			grpcretry.WithObserver(&log))
		n := 0
		inner := func() bool { // counts the attempts; reports whether this one panics
			n++
			return n == panicAt
		}
		unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if inner() {
				panic("interceptor bug")
			}
			if n == 1 {
				return status.Error(codes.Unavailable, "scripted")
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if inner() {
				panic("interceptor bug")
			}
			if n == 1 {
				return nil, status.Error(codes.Unavailable, "scripted")
			}
			return streamer(ctx, desc, cc, method, opts...)
		}
		client := dial(t, addr, append(c, grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream))...)

		got := panicking(func() { _, _ = client.UnaryCall(t.Context(), &testpb.SimpleRequest{}) })
		if got != "interceptor bug" {
			t.Fatalf("unary, panic on attempt %d: the call panicked with %v, want the interceptor's value", panicAt, got)
		}
		checkPanicEvents(t, log.take(), panicAt)

		n = 0
		s, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatalf("StreamingOutputCall: %v", err)
		}
		got = panicking(func() { _, _ = s.Recv() })
		if got != "interceptor bug" {
			t.Fatalf("stream, panic on attempt %d: Recv panicked with %v, want the interceptor's value", panicAt, got)
		}
		checkPanicEvents(t, log.take(), panicAt)
		closed := make(chan error)
		go func() {
			_ = s.CloseSend()
			_, err := s.Recv()
			closed <- err
		}()
		select {
		case err := <-closed:
			if err == nil {
				t.Errorf("stream, panic on attempt %d: Recv after the panic = nil, want an error", panicAt)
			}
		case <-time.After(10 * time.Second): // a hang detector, not a timing check
			t.Fatalf("stream, panic on attempt %d: CloseSend or Recv after the panic blocked", panicAt)
		}
	}
}
