package grpcretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/retry"
)

// atk5Srv is a scripted test service: unary calls answer OK after 100 ms and
// are counted (a hedge is one more); streams behave as mode says.
type atk5Srv struct {
	testpb.UnimplementedTestServiceServer
	mode string

	mu      sync.Mutex
	unary   int
	streams int
}

func (s *atk5Srv) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.mu.Lock()
	s.unary++
	s.mu.Unlock()
	select {
	case <-time.After(100 * time.Millisecond):
		return &testpb.SimpleResponse{}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *atk5Srv) counts() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unary, s.streams
}

func (s *atk5Srv) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	switch s.mode {
	case "msg-then-push":
		if err := ss.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
		return status.Error(codes.ResourceExhausted, "overloaded")
	case "push":
		return status.Error(codes.ResourceExhausted, "overloaded")
	}
	<-ss.Context().Done()
	return status.FromContextError(ss.Context().Err()).Err()
}

func (s *atk5Srv) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	s.mu.Lock()
	s.streams++
	s.mu.Unlock()
	go func() {
		for {
			if _, err := ss.Recv(); err != nil {
				return
			}
		}
	}()
	switch s.mode {
	case "push":
		return status.Error(codes.ResourceExhausted, "overloaded")
	case "ack":
		if err := ss.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
	<-ss.Context().Done()
	return status.FromContextError(ss.Context().Err()).Err()
}

var atk5Big = &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 100)}}

// DOC (WithHedging): "the target has not pushed back in the last 5 s to any
// call (a stream's attempts too, unless the stream passes through
// unguarded) (RESOURCE_EXHAUSTED, ...)". A guarded bidirectional stream
// (idempotent method, WithBufferMessages(16)) sends a message past the
// bound, which commits it to its attempt; that attempt is answered
// RESOURCE_EXHAUSTED before any response. 1 s later a hedged unary call to
// the same target must not be hedged.
func TestAttack5FlushCommittedPushbackHoldsHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk5Srv{mode: "push"}
		c := serveInMemory(t, srv, newClient(t,
			grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(16),
			grpcretry.WithHedging(10*time.Millisecond, 0, 1, unaryMethod))...)
		ctx := context.Background()
		st, err := c.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = st.Send(atk5Big) // past the bound: commits the call to its attempt
		if _, err := st.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream: %v, want RESOURCE_EXHAUSTED", err)
		}
		atkNoHedgeAfterPushback(t, ctx, c, srv.counts)
	})
}

// Same DOC. A guarded server-streaming call gets one message, then its
// attempt ends RESOURCE_EXHAUSTED (the stream is committed by its first
// response, so not retried). The push-back to that attempt must hold the
// target's hedges for 5 s too.
func TestAttack5CommittedStreamPushbackHoldsHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk5Srv{mode: "msg-then-push"}
		c := serveInMemory(t, srv, newClient(t,
			grpcretry.WithIdempotentMethods(outMethod),
			grpcretry.WithHedging(10*time.Millisecond, 0, 1, unaryMethod))...)
		ctx := context.Background()
		st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatalf("first message: %v", err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream: %v, want RESOURCE_EXHAUSTED", err)
		}
		atkNoHedgeAfterPushback(t, ctx, c, srv.counts)
	})
}

// DOC (WithAttemptTimeout): "A stream committed by a message past the
// bound counts as its attempt's success when it opens (for the breaker and
// the limiter); a cut-off after that is the caller's, as any failure after
// a commit". A breaker tripping on 3 consecutive failures; 5 guarded
// bidirectional streams cut off by their 50 ms attempt timeout with no
// response: within the bound (4 bytes) each attempt fails in the loop and
// the breaker opens; past it (100 bytes) each ends DEADLINE_EXCEEDED for
// the caller, and the breaker stays closed.
func TestAttack5FlushCommittedTimeoutCountsInBreaker(t *testing.T) {
	for _, size := range []int{4, 100} {
		t.Run(map[int]string{4: "within-bound", 100: "past-bound"}[size], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				opened := false
				srv := &atk5Srv{mode: "silent"}
				c := serveInMemory(t, srv, newClient(t,
					grpcretry.WithIdempotentMethods(duplexMethod),
					grpcretry.WithBufferMessages(16),
					grpcretry.WithAttemptTimeout(50*time.Millisecond),
					grpcretry.WithBudget(nil),
					grpcretry.WithLimit(nil),
					grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 3, OpenFor: time.Minute,
						OnStateChange: func(_, to breaker.State) {
							mu.Lock()
							defer mu.Unlock()
							if to == breaker.Open {
								opened = true
							}
						}}),
					grpcretry.WithRetry(retry.WithMaxAttempts(1)))...)
				codesSeen := map[codes.Code]int{}
				for range 5 {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					st, err := c.FullDuplexCall(ctx)
					if err != nil {
						t.Fatal(err)
					}
					_ = st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, size)}})
					_, err = st.Recv()
					codesSeen[status.Code(err)]++
					cancel()
				}
				synctest.Wait()
				mu.Lock()
				defer mu.Unlock()
				t.Logf("codes %v, breaker opened %v", codesSeen, opened)
				if size > 16 && codesSeen[codes.DeadlineExceeded] != 5 {
					t.Errorf("codes %v, want 5 DEADLINE_EXCEEDED", codesSeen)
				}
				if want := size <= 16; opened != want {
					t.Errorf("5 stream attempts (message %d bytes, bound 16) cut off by the attempt timeout: breaker opened %v, want %v", size, opened, want)
				}
			})
		})
	}
}

// DOC (WithAttemptTimeout): "a stream attempt is cut off if no response
// arrives within d, also one committed by a message past
// WithBufferMessages's bound". The server answers such a committed
// bidirectional stream at once (its first response arrives within 1 ms of
// the 100 ms timeout); the caller reads it 200 ms later. A response arrived
// within d: the stream must not be cut off.
func TestAttack5FlushCommittedAnsweredInTimeNotCut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk5Srv{mode: "ack"}
		c := serveInMemory(t, srv, newClient(t,
			grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(16),
			grpcretry.WithAttemptTimeout(100*time.Millisecond))...)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := c.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(atk5Big); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the server's response has arrived
		time.Sleep(200 * time.Millisecond)
		if _, err := st.Recv(); err != nil {
			t.Errorf("Recv of a response that arrived at once, read 200 ms later: %v (code %v); the attempt timeout (100 ms) cut off a stream whose first response arrived in time", err, status.Code(err))
		}
	})
}

// Control for the cut-off path with Header: the header read within d stops
// the timer of a committed stream (no finding expected).
func TestAttack5FlushCommittedHeaderStopsTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk5HdrSrv{}
		c := serveInMemory(t, srv, newClient(t,
			grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(16),
			grpcretry.WithAttemptTimeout(100*time.Millisecond))...)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := c.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(atk5Big); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Header(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Errorf("Recv after the header: %v", err)
		}
	})
}

type atk5HdrSrv struct {
	testpb.UnimplementedTestServiceServer
}

func (s *atk5HdrSrv) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	time.Sleep(10 * time.Millisecond)
	if err := ss.SendHeader(metadata.MD{"x": []string{"1"}}); err != nil {
		return err
	}
	time.Sleep(300 * time.Millisecond)
	return ss.Send(&testpb.StreamingOutputCallResponse{})
}

var _ = errors.Is
var _ grpc.CallOption

// DOC (WithHedging): "a race held back looks again every half delay for
// three delays, then after one delay, doubling, while its first copy is
// unanswered and a hedge could go but for the bound, and its hedge goes
// once the bound allows". As TestHedgeHeldRaceLooksAgain, with a burst that
// lasts longer: delay 20 ms, the slow call is held at 20 ms and looks at 30,
// 40, ..., 80 (three delays past its delay, every half delay), then at 100
// (one delay), 140 (two), 220 (four). Its hedge answers 10 ms after it goes.
// The burst's answers are late: they hold a hedge for half a delay after the
// last of them (a queue at the target), so a look within 10 ms of the
// burst's end finds it held too.
func TestAttack5HeldRaceLookSchedule(t *testing.T) {
	for _, tc := range []struct {
		burst time.Duration // the burst's first copies answer after this
		want  time.Duration // the slow call's time
	}{
		{burst: 70 * time.Millisecond, want: 90 * time.Millisecond},  // ends at 69, late: held to 79, look at 80
		{burst: 85 * time.Millisecond, want: 110 * time.Millisecond}, // ends at 84: look at 100
		{burst: 110 * time.Millisecond, want: 150 * time.Millisecond},
		{burst: 150 * time.Millisecond, want: 230 * time.Millisecond},
	} {
		t.Run(tc.burst.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: func(i int) legAnswer {
					switch {
					case i >= 600 && i < 610, i >= 611 && i < 616:
						return legAnswer{delay: tc.burst}
					case i == 610:
						return legAnswer{delay: 10 * time.Second}
					}
					return legAnswer{delay: 10 * time.Millisecond}
				}}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(20*time.Millisecond, 0.95, 1, unaryMethod),
					grpcretry.WithLimit(nil), withGuards(retry.Guards{Budget: anyBudget{}}))...)
				call := func() (string, time.Duration) {
					name, took, err := hedgeCall(context.Background(), c)
					if err != nil {
						t.Errorf("call: %v", err)
					}
					return name, took
				}
				var wg sync.WaitGroup
				for range 600 {
					wg.Go(func() { call() })
					time.Sleep(time.Second / 300)
				}
				time.Sleep(time.Millisecond)
				for range 10 {
					wg.Go(func() { call() })
				}
				time.Sleep(time.Millisecond)
				var slow time.Duration
				var name string
				wg.Go(func() { name, slow = call() })
				wg.Wait()
				srv.settle(t)
				t.Logf("burst %v: slow call took %v, answered by %s", tc.burst, slow, name)
				if slow != tc.want {
					t.Errorf("burst %v: slow call took %v, want %v", tc.burst, slow, tc.want)
				}
			})
		})
	}
}

// DOC (table): DEADLINE_EXCEEDED is retried "only when the attempt's own
// timeout cut it off and the call still has time; never the caller's".
// A server-streaming attempt with a 1 s attempt timeout and a caller's
// deadline 1 s away: both come at the same instant, the call has no time
// left: one attempt, DEADLINE_EXCEEDED.
func TestAttack5StreamTimeoutAtCallerDeadline(t *testing.T) {
	for _, extra := range []time.Duration{0, -time.Millisecond} {
		t.Run(extra.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &atk5Srv{mode: "silent"}
				c := serveInMemory(t, srv, newClient(t,
					grpcretry.WithIdempotentMethods(outMethod),
					grpcretry.WithAttemptTimeout(time.Second),
					grpcretry.WithRetry(retry.WithBackoff(atk4ZeroBackoff(t)), retry.WithMaxAttempts(5)))...)
				ctx, cancel := context.WithTimeout(context.Background(), time.Second+extra)
				defer cancel()
				st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
				if err != nil {
					t.Fatal(err)
				}
				_, err = st.Recv()
				synctest.Wait()
				_, n := srv.counts()
				t.Logf("Recv: %v; attempts %d", err, n)
				if status.Code(err) != codes.DeadlineExceeded {
					t.Errorf("code %v, want DEADLINE_EXCEEDED", status.Code(err))
				}
				if n != 1 {
					t.Errorf("%d stream attempts, want 1 (the caller's deadline)", n)
				}
			})
		})
	}
}

// Same DOC, through a hedged race: delay 50 ms, attempt timeout 100 ms,
// caller's deadline 120 ms, a server that never answers. The first copy is
// cut off by its attempt timeout at 100 ms; the hedge (sent at 50 ms) by
// the caller's deadline at 120 ms: no retry after the race.
func TestAttack5HedgedCallerDeadlineNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Hour)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithAttemptTimeout(100*time.Millisecond),
			grpcretry.WithRetry(retry.WithBackoff(atk4ZeroBackoff(t)), retry.WithMaxAttempts(5)),
			grpcretry.WithLimit(nil), withGuards(retry.Guards{Budget: anyBudget{}}))...)
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Millisecond)
		defer cancel()
		_, took, err := hedgeCall(ctx, c)
		srv.settle(t)
		t.Logf("took %v err %v calls %q", took, err, srv.calls())
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("code %v, want DEADLINE_EXCEEDED", status.Code(err))
		}
		if n := srv.n(); n != 2 {
			t.Errorf("server got %d copies, want 2 (first + hedge, no retry)", n)
		}
	})
}

type atk5TimedOut struct {
	testpb.UnimplementedTestServiceServer
	first time.Duration
	mu    sync.Mutex
	calls int
}

func (s *atk5TimedOut) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	return atk5Answer(ss.Context(), s.first, func() error { return ss.Send(&testpb.StreamingOutputCallResponse{}) })
}

// DOC (package doc, Streams): "once a response arrived, the stream is the
// caller's and later failures are returned as they come"; WithAttemptTimeout:
// "a stream attempt is cut off if no response arrives within d". The first
// response arrives exactly at d (50 ms): either the attempt is cut off (and
// retried) or the stream is the caller's, never cut off once the caller
// holds its first message.
func TestAttack5FirstResponseAtTimeoutNotCutAfter(t *testing.T) {
	// The order of two events at one fake instant varies from run to run:
	// 300 runs (a cut after the first response showed in about 1 in 50).
	var tally atk5Tally
	for range 300 {
		synctest.Test(t, func(t *testing.T) {
			srv := &atk5TimedOut{first: 50 * time.Millisecond}
			c := serveInMemory(t, srv, newClient(t,
				grpcretry.WithIdempotentMethods(outMethod),
				grpcretry.WithAttemptTimeout(50*time.Millisecond),
				grpcretry.WithRetry(retry.WithBackoff(atk4ZeroBackoff(t)), retry.WithMaxAttempts(2)))...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				cancel()
				synctest.Wait()
			}()
			tally.read(func() error { _, err := st.Recv(); return err })
		})
	}
	tally.check(t, 300)
}

type atk5Echo struct {
	testpb.UnimplementedTestServiceServer
}

func (atk5Echo) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	for {
		m, err := ss.Recv()
		if err != nil {
			return nil
		}
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

// Concurrency of a stream committed by a message past the bound, with its
// attempt timeout still running: Send, Recv and Header from three
// goroutines (grpc-go allows one sender and one receiver; Header is safe
// with Recv). Run with -race.
func TestAttack5FlushCommittedConcurrent(t *testing.T) {
	for range 20 {
		synctest.Test(t, func(t *testing.T) {
			c := serveInMemory(t, atk5Echo{}, newClient(t,
				grpcretry.WithIdempotentMethods(duplexMethod),
				grpcretry.WithBufferMessages(16),
				grpcretry.WithAttemptTimeout(time.Second))...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := c.FullDuplexCall(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			got := 0
			var rerr error
			wg.Go(func() {
				for {
					if _, err := st.Recv(); err != nil {
						rerr = err
						return
					}
					got++
				}
			})
			wg.Go(func() { _, _ = st.Header() })
			wg.Go(func() {
				_ = st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 8)}})
				_ = st.Send(atk5Big)
				for range 20 {
					_ = st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 8)}})
					time.Sleep(100 * time.Millisecond)
				}
				_ = st.CloseSend()
			})
			wg.Wait()
			if got != 22 || rerr != io.EOF {
				t.Errorf("got %d echoes, then %v; want 22, then EOF", got, rerr)
			}
		})
	}
}

// Option: "An Option is a value: it may be passed to any number of
// constructors". One WithHedging option (q 0 and max 0, the defaults),
// applied by DialOptions in 8 goroutines at once: run with -race, the
// option's apply writes the q and max it captured (q = 0.95, max = 1)
// while another constructor reads them.
func TestAttack5HedgingOptionConcurrentConstructors(t *testing.T) {
	opt := grpcretry.WithHedging(time.Millisecond, 0, 0, unaryMethod)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := grpcretry.DialOptions(opt); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// The other options, the same way (no race expected).
func TestAttack5OptionsConcurrentConstructors(t *testing.T) {
	opts := []grpcretry.Option{
		grpcretry.WithBreaker(&breaker.Config{MinCalls: 5}),
		grpcretry.WithRetry(retry.WithMaxAttempts(2)),
		grpcretry.WithRetry(retry.WithMaxAttempts(3)),
		grpcretry.WithIdempotentMethods(unaryMethod),
		grpcretry.WithIdempotentMethods(outMethod),
		grpcretry.WithHedging(time.Millisecond, 0.9, 2, unaryMethod),
		grpcretry.WithBufferMessages(10),
		grpcretry.WithAttemptTimeout(time.Second),
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := grpcretry.DialOptions(opts...); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

type atk5DuplexAt struct {
	testpb.UnimplementedTestServiceServer
	first time.Duration
}

func (s atk5DuplexAt) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	go func() {
		for {
			if _, err := ss.Recv(); err != nil {
				return
			}
		}
	}()
	return atk5Answer(ss.Context(), s.first, func() error { return ss.Send(&testpb.StreamingOutputCallResponse{}) })
}

// The same for a bidirectional stream committed by a message past
// WithBufferMessages's bound, "which keeps its attempt timeout until its
// first response": the first response comes exactly at d (50 ms). The
// caller either gets DEADLINE_EXCEEDED first, or its first message and then
// the stream; never the first message and then a cut-off.
func TestAttack5FlushCommittedFirstResponseAtTimeoutNotCutAfter(t *testing.T) {
	var tally atk5Tally
	for range 1500 {
		synctest.Test(t, func(t *testing.T) {
			c := serveInMemory(t, atk5DuplexAt{first: 50 * time.Millisecond}, newClient(t,
				grpcretry.WithIdempotentMethods(duplexMethod),
				grpcretry.WithBufferMessages(16),
				grpcretry.WithAttemptTimeout(50*time.Millisecond))...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			st, err := c.FullDuplexCall(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				cancel()
				synctest.Wait()
			}()
			_ = st.Send(atk5Big)
			tally.read(func() error { _, err := st.Recv(); return err })
		})
	}
	tally.check(t, 1500)
}

// atk5Answer answers a stream on ctx: its first response after first, then
// two more 100 ms apart (send sends one), unless ctx ends.
func atk5Answer(ctx context.Context, first time.Duration, send func() error) error {
	wait := func(d time.Duration) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := wait(first); err != nil {
		return err
	}
	for range 3 {
		if err := send(); err != nil {
			return err
		}
		if err := wait(100 * time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// atk5Tally counts how streams whose first response came at the instant of
// their attempt timeout ended: cut off before it, or committed and then
// (never, as documented) cut off after it.
type atk5Tally struct {
	before, committed, cut int
	firstCut               string
}

// read reads a stream's first response and two more with recv.
func (r *atk5Tally) read(recv func() error) {
	if recv() != nil {
		r.before++
		return
	}
	r.committed++
	for i := range 2 {
		if err := recv(); err != nil {
			if r.cut == 0 {
				r.firstCut = fmt.Sprintf("message %d after the first: %v", i+2, err)
			}
			r.cut++
			return
		}
	}
}

// check fails t if a committed stream was cut off after its first response.
func (r *atk5Tally) check(t *testing.T, runs int) {
	t.Helper()
	t.Logf("%d runs: %d cut off before the first response, %d committed, of which %d cut off after it", runs, r.before, r.committed, r.cut)
	if r.cut > 0 {
		t.Errorf("%d of %d streams whose first response reached the caller were then cut off by the attempt timeout (%s)", r.cut, r.committed, r.firstCut)
	}
}
