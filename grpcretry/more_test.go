package grpcretry_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// recorder is an observer that keeps the events it saw.
type recorder struct {
	mu     sync.Mutex
	events []observe.Event
}

func (r *recorder) Observe(_ context.Context, e observe.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) kinds(name string) map[observe.Kind]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := map[observe.Kind]int{}
	for _, e := range r.events {
		if e.Name == name {
			m[e.Kind]++
		}
	}
	return m
}

// TestObserver: the loop's events and the breaker's state changes reach the
// observer, named with the target.
func TestObserver(t *testing.T) {
	rec := &recorder{}
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithObserver(rec),
		grpcretry.WithBreaker(&breaker.Config{MinCalls: 2}), grpcretry.WithBudget(nil),
		grpcretry.WithRetry(retry.WithBackoff(quick())))
	srv := &testServer{script: []answer{fail(codes.Unavailable)}}
	addr := serve(t, srv)
	client := dial(t, addr, c...)
	_, _ = client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	target := "" // the connection's, as grpc.ClientConn.Target names it
	rec.mu.Lock()
	for _, e := range rec.events {
		target = e.Name
	}
	rec.mu.Unlock()
	if !strings.HasSuffix(target, addr) {
		t.Fatalf("events named %q, want the target, which names %s", target, addr)
	}
	k := rec.kinds(target)
	if k[observe.AttemptStart] == 0 || k[observe.AttemptEnd] == 0 || k[observe.GiveUp] != 1 || k[observe.BreakerState] == 0 {
		t.Errorf("events for %s: %v; want attempts, a give-up and a breaker state change", target, k)
	}
}

// TestCallDeadline: the call's deadline bounds the whole call, sleeps
// included.
func TestCallDeadline(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	srv := &testServer{hold: hold}
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod))
	client := dial(t, serve(t, srv), c...)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
	if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, retry.Deadline) || srv.Calls() != 1 {
		t.Errorf("UnaryCall = %v after %d attempts, want DEADLINE_EXCEEDED, reason deadline, after 1", err, srv.Calls())
	}
}

// TestStreamAttemptTimeout: a stream attempt that gets no response within
// the attempt timeout is cut off and retried. It runs in a synctest bubble
// over an in-memory connection, so that each stream reaches the server
// before its 30ms (of fake time) run out, whatever the load on the machine.
func TestStreamAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		srv := &testServer{streamMsgs: 1}
		srv.hold = hold
		c := newClient(t, grpcretry.WithIdempotentMethods(outMethod), grpcretry.WithAttemptTimeout(30*time.Millisecond),
			grpcretry.WithRetry(retry.WithBackoff(quick())))
		client := serveInMemory(t, srv, c...)
		start := time.Now() // the bubble's clock
		stream, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = stream.Recv()
		close(hold)
		if !errors.Is(err, retry.AttemptsExhausted) || srv.Calls() != 3 {
			t.Errorf("Recv = %v after %d streams, want attempts exhausted after 3", err, srv.Calls())
		}
		// 3 attempts of 30ms and 2 sleeps of 2ms at most, on the fake clock.
		if took := time.Since(start); took > 3*30*time.Millisecond+2*2*time.Millisecond {
			t.Errorf("the call took %v, want each attempt cut off at 30ms", took)
		}
	})
}

// TestServerStreamEmpty: a stream that ends OK without a message ends with
// io.EOF, once.
func TestServerStreamEmpty(t *testing.T) {
	srv := &testServer{}
	c := newClient(t, grpcretry.WithIdempotentMethods(outMethod))
	client := dial(t, serve(t, srv), c...)
	stream, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := stream.Recv(); err != io.EOF {
			t.Errorf("Recv %d = %v, want io.EOF", i, err)
		}
	}
}

// TestBidiConcurrent: a caller receiving on one goroutine from the start
// while another sends; the first attempt fails, the retry replays what was
// sent, under the race detector.
func TestBidiConcurrent(t *testing.T) {
	srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
	c := newClient(t, grpcretry.WithIdempotentMethods(duplexMethod), grpcretry.WithBufferMessages(1<<10),
		grpcretry.WithRetry(retry.WithBackoff(quick())))
	client := dial(t, serve(t, srv), c...)
	stream, err := client.FullDuplexCall(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []string)
	go func() {
		var bodies []string
		for {
			m, err := stream.Recv()
			if err != nil {
				if err != io.EOF {
					bodies = append(bodies, "error: "+err.Error())
				}
				got <- bodies
				return
			}
			bodies = append(bodies, string(m.GetPayload().GetBody()))
		}
	}()
	for _, b := range []string{"a", "b", "c"} {
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte(b)}}); err != nil {
			t.Fatalf("Send(%s): %v", b, err)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if bodies := <-got; strings.Join(bodies, "") != "abc" {
		t.Errorf("received %q, want the echo of a, b, c", bodies)
	}
	if n := srv.Calls(); n != 2 {
		t.Errorf("server saw %d streams, want 2", n)
	}
}
