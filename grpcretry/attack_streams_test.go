package grpcretry_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// stmPlan says how stream n of a stmReplayServer behaves before failing.
type stmPlan struct {
	failAfter int  // fail UNAVAILABLE once this many messages arrived (0: before reading any); -1: never
	onEOF     bool // fail on the end of the client's messages instead
	header    bool // send the header first
}

// stmReplayServer records the index of every message each stream of a
// bidirectional call receives; stream n follows plans[n] (the last
// succeeds: echoes each message as it arrives, ends OK on EOF).
type stmReplayServer struct {
	testpb.UnimplementedTestServiceServer
	plans []stmPlan

	mu      sync.Mutex
	streams [][]uint32
}

func (s *stmReplayServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	s.mu.Lock()
	n := len(s.streams)
	s.streams = append(s.streams, []uint32{})
	s.mu.Unlock()
	plan := stmPlan{failAfter: -1}
	if n < len(s.plans) {
		plan = s.plans[n]
	}
	fail := status.Error(codes.Unavailable, fmt.Sprintf("stm: stream %d fails", n))
	if plan.header {
		if err := ss.SendHeader(metadata.MD{"stm": []string{"1"}}); err != nil {
			return err
		}
	}
	got := 0
	for {
		if got == plan.failAfter {
			return fail
		}
		m, err := ss.Recv()
		if err == io.EOF {
			if plan.onEOF {
				return fail
			}
			if plan.failAfter >= 0 {
				return fail
			}
			return nil
		}
		if err != nil {
			return err
		}
		got++
		s.mu.Lock()
		s.streams[n] = append(s.streams[n], binary.BigEndian.Uint32(m.GetPayload().GetBody()))
		s.mu.Unlock()
		if plan.failAfter < 0 && !plan.onEOF {
			if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
				return err
			}
		}
	}
}

func (s *stmReplayServer) received() [][]uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]uint32, len(s.streams))
	for i, st := range s.streams {
		out[i] = slices.Clone(st)
	}
	return out
}

// stmIsPrefix reports whether got is 0, 1, ..., len(got)-1.
func stmIsPrefix(got []uint32) bool {
	for i, v := range got {
		if v != uint32(i) {
			return false
		}
	}
	return true
}

// stmMsg is message i with a body of size bytes, its index first.
func stmMsg(i, size int) *testpb.StreamingOutputCallRequest {
	b := make([]byte, max(size, 4))
	binary.BigEndian.PutUint32(b, uint32(i))
	return &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: b}}
}

// TestAttackStreamsReplayOrderExactlyOnce: a buffered bidirectional call whose first
// streams fail at every point (before any message, mid-way, after the
// client's CloseSend, after sending the header) gets, on every stream, the
// messages kept in order and exactly once, and the last stream all of them;
// the caller sending on one goroutine and receiving on another, or sending
// everything first.
func TestAttackStreamsReplayOrderExactlyOnce(t *testing.T) {
	const n = 12
	plans := map[string][]stmPlan{
		"before any message":     {{failAfter: 0}},
		"after one":              {{failAfter: 1}},
		"mid-way, twice":         {{failAfter: 5}, {failAfter: 3}},
		"after CloseSend":        {{failAfter: -1, onEOF: true}},
		"after the header":       {{failAfter: 4, header: true}},
		"header, then at EOF":    {{failAfter: -1, onEOF: true, header: true}, {failAfter: 0, header: true}},
		"every message then EOF": {{failAfter: n}},
	}
	for name, p := range plans {
		for _, sendFirst := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/sendFirst=%v", name, sendFirst), func(t *testing.T) {
				for iter := range 20 {
					srv := &stmReplayServer{plans: p}
					client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
						grpcretry.WithBufferMessages(1<<20), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
					ctx, cancel := context.WithCancel(t.Context())
					var sendErr, recvErr error
					var got []uint32
					stallGuard(t, cancel, "the call", func() {
						st, err := client.FullDuplexCall(ctx)
						if err != nil {
							recvErr = err
							return
						}
						send := func() {
							for i := range n {
								if sendErr = st.Send(stmMsg(i, 16)); sendErr != nil {
									return
								}
							}
							sendErr = st.CloseSend()
						}
						var wg sync.WaitGroup
						if sendFirst {
							send()
						} else {
							wg.Go(send)
						}
						for {
							m, err := st.Recv()
							if err != nil {
								recvErr = err
								break
							}
							got = append(got, binary.BigEndian.Uint32(m.GetPayload().GetBody()))
						}
						wg.Wait()
					})
					cancel()
					streams := srv.received()
					for i, s := range streams {
						if !stmIsPrefix(s) {
							t.Fatalf("iter %d: stream %d received %v: not the kept messages in order, once each", iter, i, s)
						}
					}
					if sendErr != nil || recvErr != io.EOF || len(got) != n || !stmIsPrefix(got) {
						t.Fatalf("iter %d: send %v; received %v then %v; want %d echoes then EOF (streams %v)", iter, sendErr, got, recvErr, n, streams)
					}
					if len(streams) != len(p)+1 || len(streams[len(p)]) != n {
						t.Fatalf("iter %d: streams %v, want %d, the last with all %d", iter, streams, len(p)+1, n)
					}
				}
			})
		}
	}
}

// TestAttackStreamsPastTheBoundWhileReplaying: a bound of 3 messages; message 3 goes
// past it while the first stream fails at some point and the caller
// receives on another goroutine. The call either succeeds, its last stream
// having every message in order, or ends with the failure of the stream the
// message past the bound went to; no stream ever gets a message twice or
// out of order, and the SendMsg past the bound does not hang.
func TestAttackStreamsPastTheBoundWhileReplaying(t *testing.T) {
	const n, size = 8, 60
	bound := 3 * (size + 8)
	for _, failAfter := range []int{0, 1, 2, 3, 4, 6} {
		t.Run(fmt.Sprint("failAfter=", failAfter), func(t *testing.T) {
			for iter := range 30 {
				srv := &stmReplayServer{plans: []stmPlan{{failAfter: failAfter}}}
				client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
					grpcretry.WithBufferMessages(bound), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
				ctx, cancel := context.WithCancel(t.Context())
				var sendErr, recvErr error
				var got []uint32
				stallGuard(t, cancel, "the call", func() {
					st, err := client.FullDuplexCall(ctx)
					if err != nil {
						recvErr = err
						return
					}
					var wg sync.WaitGroup
					wg.Go(func() {
						for i := range n {
							if sendErr = st.Send(stmMsg(i, size)); sendErr != nil {
								return
							}
						}
						sendErr = st.CloseSend()
					})
					for {
						m, err := st.Recv()
						if err != nil {
							recvErr = err
							break
						}
						got = append(got, binary.BigEndian.Uint32(m.GetPayload().GetBody()))
					}
					wg.Wait()
				})
				cancel()
				streams := srv.received()
				for i, s := range streams {
					if !stmIsPrefix(s) {
						t.Fatalf("iter %d: stream %d received %v: not in order, once each", iter, i, s)
					}
				}
				switch {
				case recvErr == io.EOF:
					last := streams[len(streams)-1]
					if len(last) != n || len(got) != n || !stmIsPrefix(got) {
						t.Fatalf("iter %d: the call ended OK with %v echoed, its stream receiving %v; want all %d (streams %v)", iter, got, last, n, streams)
					}
				case status.Code(recvErr) == codes.Unavailable:
					// The message past the bound went to the failing stream.
					if len(streams) != 1 {
						t.Fatalf("iter %d: call failed %v after %d streams; want it to fail on the stream the message past the bound went to", iter, recvErr, len(streams))
					}
				default:
					t.Fatalf("iter %d: Recv ended %v (send %v), streams %v", iter, recvErr, sendErr, streams)
				}
			}
		})
	}
}

// stmGoroutines waits (up to 5 s, polling) for the goroutine count to come
// back to at most base, and returns the last count.
func stmGoroutines(base int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= base || time.Now().After(deadline) {
			return n
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stmStuckServer's client-streaming call sends its header, then never reads
// (so the client's sends block on flow control), until its stream ends.
type stmStuckServer struct {
	testpb.UnimplementedTestServiceServer
	header bool
	mu     sync.Mutex
	calls  int
}

func (s *stmStuckServer) StreamingInputCall(ss testpb.TestService_StreamingInputCallServer) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.header {
		if err := ss.SendHeader(metadata.MD{"stm": []string{"1"}}); err != nil {
			return err
		}
	}
	<-ss.Context().Done()
	return ss.Context().Err()
}

func (s *stmStuckServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	if s.header {
		if err := ss.SendHeader(metadata.MD{"stm": []string{"1"}}); err != nil {
			return err
		}
	}
	<-ss.Context().Done()
	return ss.Context().Err()
}

// TestAttackStreamsCancelMidReplayNoLeak: the caller cancels its context while the
// kept messages' replay is blocked on flow control (the server never
// reads): every goroutine the call started ends.
func TestAttackStreamsCancelMidReplayNoLeak(t *testing.T) {
	const n, size = 32, 16 << 10
	srv := &stmStuckServer{header: true}
	client := serveSmallWindows(t, srv, newClient(t, grpcretry.WithIdempotentMethods(inMethod, duplexMethod),
		grpcretry.WithBufferMessages(4<<20), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
	// Warm the connection.
	{
		ctx, cancel := context.WithCancel(t.Context())
		st, _ := client.FullDuplexCall(ctx)
		_, _ = st.Header()
		cancel()
	}
	base := runtime.NumGoroutine()
	for iter := range 5 {
		ctx, cancel := context.WithCancel(t.Context())
		stallGuard(t, cancel, "the call", func() {
			st, err := client.FullDuplexCall(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			for i := range n {
				if err := st.Send(stmMsg(i, size)); err != nil {
					t.Errorf("Send %d: %v", i, err)
					return
				}
			}
			if _, err := st.Header(); err != nil {
				t.Errorf("Header: %v", err)
			}
			cancel()
			if _, err := st.Recv(); status.Code(err) != codes.Canceled {
				t.Errorf("Recv after cancel = %v, want CANCELED", err)
			}
		})
		if got := stmGoroutines(base); got > base {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("iter %d: %d goroutines after the canceled call, %d before:\n%s", iter, got, base, stmStacks(string(buf)))
		}
	}
}

// stmStacks keeps the stacks that mention grpcretry.
func stmStacks(all string) string {
	var keep []string
	for _, g := range strings.Split(all, "\n\n") {
		if strings.Contains(g, "grpcretry.(*retryStream)") {
			keep = append(keep, g)
		}
	}
	return strings.Join(keep, "\n\n")
}

// stmEvents records the client's events.
type stmEvents struct {
	mu     sync.Mutex
	events []observe.Event
}

func (l *stmEvents) Observe(_ context.Context, e observe.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *stmEvents) count(k observe.Kind) (n int, outcomes []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.events {
		if e.Kind == k {
			n++
			if k == observe.AttemptEnd {
				outcomes = append(outcomes, e.Outcome)
			}
		}
	}
	return n, outcomes
}

// TestAttackStreamsAttemptTimeoutWhileReplayBlocked: every attempt's replay blocks on
// flow control (the server never reads nor answers) until the attempt
// timeout cuts it off: the call gives up DEADLINE_EXCEEDED after its 3
// attempts, each counted once (a failure), and no goroutine is left.
func TestAttackStreamsAttemptTimeoutWhileReplayBlocked(t *testing.T) {
	const n, size = 32, 16 << 10
	for _, method := range []string{"client-streaming", "bidi"} {
		t.Run(method, func(t *testing.T) {
			srv := &stmStuckServer{}
			ev := &stmEvents{}
			client := serveSmallWindows(t, srv, newClient(t, grpcretry.WithIdempotentMethods(inMethod, duplexMethod),
				grpcretry.WithBufferMessages(4<<20), grpcretry.WithAttemptTimeout(50*time.Millisecond),
				grpcretry.WithObserver(ev), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
			_, _ = client.UnaryCall(t.Context(), &testpb.SimpleRequest{}) // the connection up
			ev.mu.Lock()
			ev.events = nil
			ev.mu.Unlock()
			base := runtime.NumGoroutine()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var err error
			stallGuard(t, cancel, "the call", func() {
				if method == "bidi" {
					st, e := client.FullDuplexCall(ctx)
					if e != nil {
						err = e
						return
					}
					for i := range n {
						if e := st.Send(stmMsg(i, size)); e != nil {
							t.Errorf("Send %d: %v", i, e)
						}
					}
					_, err = st.Recv()
					return
				}
				st, e := client.StreamingInputCall(ctx)
				if e != nil {
					err = e
					return
				}
				for i := range n {
					if e := st.Send(&testpb.StreamingInputCallRequest{Payload: stmMsg(i, size).GetPayload()}); e != nil {
						t.Errorf("Send %d: %v", i, e)
					}
				}
				_, err = st.CloseAndRecv()
			})
			if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, retry.AttemptsExhausted) {
				t.Errorf("call ended %v, want DEADLINE_EXCEEDED, attempts exhausted", err)
			}
			srv.mu.Lock()
			calls := srv.calls
			srv.mu.Unlock()
			starts, _ := ev.count(observe.AttemptStart)
			ends, outs := ev.count(observe.AttemptEnd)
			if calls != 3 || starts != 3 || ends != 3 || slices.ContainsFunc(outs, func(o string) bool { return o != "failure" }) {
				t.Errorf("server saw %d streams; %d AttemptStart, %d AttemptEnd %v; want 3 each, all failures", calls, starts, ends, outs)
			}
			cancel()
			if got := stmGoroutines(base); got > base {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("%d goroutines after the call, %d before:\n%s", got, base, stmStacks(string(buf)))
			}
		})
	}
}

// TestAttackStreamsOutcomesOncePerAttempt: a buffered bidirectional call whose first
// two streams fail (mid-replay) and whose third answers: 3 attempts, each
// started and ended once, failure, failure, success.
func TestAttackStreamsOutcomesOncePerAttempt(t *testing.T) {
	for _, sendFirst := range []bool{true, false} {
		srv := &stmReplayServer{plans: []stmPlan{{failAfter: 2}, {failAfter: 1, header: true}}}
		ev := &stmEvents{}
		client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(1<<20), grpcretry.WithObserver(ev), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
		ctx, cancel := context.WithCancel(t.Context())
		stallGuard(t, cancel, "the call", func() {
			st, err := client.FullDuplexCall(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			var wg sync.WaitGroup
			send := func() {
				for i := range 6 {
					_ = st.Send(stmMsg(i, 8))
				}
				_ = st.CloseSend()
			}
			if sendFirst {
				send()
			} else {
				wg.Go(send)
			}
			for {
				if _, err := st.Recv(); err != nil {
					if err != io.EOF {
						t.Errorf("Recv: %v", err)
					}
					break
				}
			}
			wg.Wait()
		})
		cancel()
		starts, _ := ev.count(observe.AttemptStart)
		ends, outs := ev.count(observe.AttemptEnd)
		if starts != 3 || ends != 3 || !slices.Equal(outs, []string{"failure", "failure", "success"}) {
			t.Errorf("sendFirst=%v: %d AttemptStart, %d AttemptEnd %v; want 3, 3, failure failure success", sendFirst, starts, ends, outs)
		}
	}
}

// stmPanicCodec is the proto codec, but its Marshal panics for a message
// whose payload body starts with "PANIC".
type stmPanicCodec struct{ encoding.CodecV2 }

func (c stmPanicCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*testpb.StreamingOutputCallRequest); ok && strings.HasPrefix(string(m.GetPayload().GetBody()), "PANIC") {
		panic("stm marshal bug")
	}
	return c.CodecV2.Marshal(v)
}

func (stmPanicCodec) Name() string { return proto.Name }

// stmGateServer's bidirectional call echoes the first message, then reads
// no more until gate is closed, then reads to the end.
type stmGateServer struct {
	testpb.UnimplementedTestServiceServer
	gate chan struct{}
}

func (s *stmGateServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	m, err := ss.Recv()
	if err != nil {
		return err
	}
	if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: m.GetPayload().GetBody()[:4]}}); err != nil {
		return err
	}
	select {
	case <-s.gate:
	case <-ss.Context().Done():
		return ss.Context().Err()
	}
	for {
		if _, err := ss.Recv(); err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// TestAttackStreamsReplayPanicAfterFirstResponse: the marshalling of a kept message
// panics during a replay that runs on the stream's goroutine, after the
// first response reached the caller (the replay was blocked on flow
// control). With grpc-go alone the caller's SendMsg panics; the retried
// stream says the receive panics with the value in its place. Here the
// panic must not vanish, and the stream must not end as if the caller had
// left (CANCELED).
func TestAttackStreamsReplayPanicAfterFirstResponse(t *testing.T) {
	const n, size = 16, 16 << 10
	srv := &stmGateServer{gate: make(chan struct{})}
	codec := grpc.WithDefaultCallOptions(grpc.ForceCodecV2(stmPanicCodec{encoding.GetCodecV2(proto.Name)}))
	client := serveSmallWindows(t, srv, append(newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
		grpcretry.WithBufferMessages(4<<20), grpcretry.WithRetry(retry.WithBackoff(quick()))), codec)...)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var recv2 error
	var p any
	stallGuard(t, cancel, "the call", func() {
		st, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		for i := range n { // more than the windows hold: the replay blocks
			if err := st.Send(stmMsg(i, size)); err != nil {
				t.Errorf("Send %d: %v", i, err)
			}
		}
		bad := stmMsg(n, size)
		copy(bad.Payload.Body, "PANIC")
		if err := st.Send(bad); err != nil {
			t.Errorf("Send (kept, panics when marshalled): %v", err)
		}
		if _, err := st.Recv(); err != nil {
			t.Errorf("first Recv: %v", err)
			return
		}
		close(srv.gate) // the replay goes on, and reaches the bad message
		p = panicking(func() { _, recv2 = st.Recv() })
	})
	if p == nil && status.Code(recv2) == codes.Canceled {
		t.Errorf("the replay's panic vanished: the next Recv returned %v (CANCELED: as if the caller had left), never panicking", recv2)
	}
	t.Logf("second Recv: panic %v, err %v", p, recv2)
}

// stmQuorumServer's bidirectional call reads need messages, then echoes
// their indices, then echoes the rest as they come: a server that reads
// several messages before it answers.
type stmQuorumServer struct {
	testpb.UnimplementedTestServiceServer
	need int
}

func (s *stmQuorumServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	var held []*testpb.StreamingOutputCallRequest
	for len(held) < s.need {
		m, err := ss.Recv()
		if err != nil {
			return err
		}
		held = append(held, m)
	}
	for _, m := range held {
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
	for {
		m, err := ss.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// TestAttackStreamsPastTheBoundRacesFirstRecv: a bound of 3 messages, 3 kept before
// the stream opens; then, at the same moment, one goroutine sends message
// 3 (past the bound) and another makes the first Recv. The server answers
// once it has 4 messages. grpc-go allows one goroutine to send while
// another receives, and WithBufferMessages says a message past the bound
// goes out before its SendMsg returns: the call must complete. Each
// iteration that has not completed within 3 s is a deadlock (the call then
// ends by cancel).
func TestAttackStreamsPastTheBoundRacesFirstRecv(t *testing.T) {
	const size = 60
	bound := 3 * (size + 8)
	srv := &stmQuorumServer{need: 4}
	client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
		grpcretry.WithBufferMessages(bound), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
	stalls := 0
	var dumped sync.Once
	const iters = 300
	for iter := range iters {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		st, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if err := st.Send(stmMsg(i, size)); err != nil {
				t.Fatalf("Send %d: %v", i, err)
			}
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		var sendErr error
		wg.Go(func() {
			<-start
			if sendErr = st.Send(stmMsg(3, size)); sendErr == nil {
				sendErr = st.CloseSend()
			}
		})
		var got []uint32
		var recvErr error
		wg.Go(func() {
			<-start
			for {
				m, err := st.Recv()
				if err != nil {
					recvErr = err
					return
				}
				got = append(got, binary.BigEndian.Uint32(m.GetPayload().GetBody()))
			}
		})
		close(start)
		dump := time.AfterFunc(2500*time.Millisecond, func() {
			dumped.Do(func() {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Logf("iter %d stalled:\n%s", iter, stmStacks(string(buf)))
			})
		})
		wg.Wait()
		dump.Stop()
		if ctx.Err() == context.DeadlineExceeded || status.Code(recvErr) == codes.DeadlineExceeded {
			stalls++
		} else if recvErr != io.EOF || sendErr != nil || len(got) != 4 || !stmIsPrefix(got) {
			t.Errorf("iter %d: send %v; received %v then %v; want 0 1 2 3 then EOF", iter, sendErr, got, recvErr)
		}
		cancel()
	}
	if stalls > 0 {
		t.Errorf("%d of %d calls deadlocked: the SendMsg past the bound waited for the retry loop the first Recv runs, which waits for the server, which waits for that message", stalls, iters)
	}
}
