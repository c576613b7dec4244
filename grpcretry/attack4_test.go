package grpcretry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// atk4ZeroBackoff is a backoff whose random source returns 0: no sleep.
func atk4ZeroBackoff(t *testing.T) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// atk4DeadlineServer answers every unary call DEADLINE_EXCEEDED a moment
// (lead) before the call's own gRPC deadline, as a server does whose own
// call to a dependency, under the propagated deadline, gave up first.
type atk4DeadlineServer struct {
	testpb.UnimplementedTestServiceServer
	lead  time.Duration
	mu    sync.Mutex
	calls int
}

func (s *atk4DeadlineServer) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	dl, ok := ctx.Deadline()
	if !ok {
		return nil, status.Error(codes.DeadlineExceeded, "no deadline")
	}
	select {
	case <-time.After(time.Until(dl) - s.lead):
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return nil, status.Error(codes.DeadlineExceeded, "dependency: deadline exceeded")
}

func (s *atk4DeadlineServer) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// DOC (package doc, table): "DEADLINE_EXCEEDED | only when the attempt's own
// timeout ([WithAttemptTimeout]) cut it off and the call still has time;
// never the caller's". Here the attempt timeout is 10 s, the caller's
// deadline 1 s: the caller's deadline is what the server's
// DEADLINE_EXCEEDED comes from, 2 ms before it. It must not be retried.
func TestAttack4CallerDeadlineNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk4DeadlineServer{lead: 2 * time.Millisecond}
		c := serveInMemory(t, srv, newClient(t,
			grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithAttemptTimeout(10*time.Second),
			grpcretry.WithRetry(retry.WithBackoff(atk4ZeroBackoff(t)), retry.WithMaxAttempts(5)))...)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("code %v (%v)", status.Code(err), err)
		}
		if n := srv.n(); n != 1 {
			t.Errorf("server saw %d attempts of a call whose DEADLINE_EXCEEDED came from the caller's deadline (attempt timeout 10 s, caller 1 s); want 1 (never the caller's)", n)
		}
		if !errors.Is(err, retry.NotRetryable) {
			t.Errorf("err %v: want reason NotRetryable", err)
		}
	})
}

// atk4PushServer answers a server-streaming call RESOURCE_EXHAUSTED (the
// target pushing back), a unary call OK after 100 ms, and counts the
// unary calls it gets (a hedge is one more).
type atk4PushServer struct {
	testpb.UnimplementedTestServiceServer
	mu     sync.Mutex
	unary  int
	stream int
}

func (s *atk4PushServer) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
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

func (s *atk4PushServer) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	s.mu.Lock()
	s.stream++
	s.mu.Unlock()
	return status.Error(codes.ResourceExhausted, "overloaded")
}

func (s *atk4PushServer) counts() (int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unary, s.stream
}

// DOC (WithHedging): "A hedge is only sent when ... the target has not
// pushed back in the last 5 s (RESOURCE_EXHAUSTED, ...)". The target
// answered RESOURCE_EXHAUSTED to a (guarded, retryable) server-streaming
// call of the same connection a moment ago; a hedged unary call to it
// must not be hedged for 5 s. A unary RESOURCE_EXHAUSTED to a method that is
// not hedged holds the hedges (TestAttackHedgePushbackFromOtherMethod).
func TestAttack4StreamPushbackHoldsHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk4PushServer{}
		c := serveInMemory(t, srv, newClient(t,
			grpcretry.WithIdempotentMethods(outMethod),
			grpcretry.WithHedging(10*time.Millisecond, 0, 1, unaryMethod))...)
		ctx := context.Background()
		st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stream: %v, want RESOURCE_EXHAUSTED", err)
		}
		atkNoHedgeAfterPushback(t, ctx, c, srv.counts)
	})
}

// atk4SilentDuplex never answers a bidirectional call: it reads what comes
// and waits for the call to end.
type atk4SilentDuplex struct {
	testpb.UnimplementedTestServiceServer
	mu    sync.Mutex
	calls int
}

func (s *atk4SilentDuplex) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	go func() {
		for {
			if _, err := ss.Recv(); err != nil {
				return
			}
		}
	}()
	<-ss.Context().Done()
	return status.FromContextError(ss.Context().Err()).Err()
}

func (s *atk4SilentDuplex) n() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

// DOC (WithAttemptTimeout): "WithAttemptTimeout caps each attempt at d (...
// a stream attempt is cut off if no response arrives within d)". A
// bidirectional call (WithBufferMessages(16)) sends a 100-byte message, past
// the bound, which commits it to its attempt; the server never answers.
// The attempt must be cut off 100 ms after it opened; it runs on until the
// caller's deadline (5 s). With a message within the bound the same
// attempt is cut off at 100 ms (and retried).
func TestAttack4PinnedStreamAttemptTimeout(t *testing.T) {
	for _, size := range []int{4, 100} {
		t.Run(map[int]string{4: "within-bound", 100: "past-bound"}[size], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &atk4SilentDuplex{}
				c := serveInMemory(t, srv, newClient(t,
					grpcretry.WithIdempotentMethods(duplexMethod),
					grpcretry.WithBufferMessages(16),
					grpcretry.WithAttemptTimeout(100*time.Millisecond),
					grpcretry.WithRetry(retry.WithBackoff(atk4ZeroBackoff(t)), retry.WithMaxAttempts(1)))...)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				start := time.Now()
				st, err := c.FullDuplexCall(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, size)}}); err != nil {
					t.Fatal(err)
				}
				_, err = st.Recv()
				took := time.Since(start)
				t.Logf("size %d: Recv after %v: %v (server calls %d)", size, took, err, srv.n())
				if err == nil {
					t.Fatal("Recv succeeded")
				}
				if took > 100*time.Millisecond {
					t.Errorf("the attempt ran %v with no response, past its 100 ms attempt timeout (caller's deadline 5 s); code %v", took, status.Code(err))
				}
			})
		})
	}
}

// atk4SilentOut never answers a server-streaming call.
type atk4SilentOut struct {
	testpb.UnimplementedTestServiceServer
	mu    sync.Mutex
	calls int
}

func (s *atk4SilentOut) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	s.mu.Lock()
	s.calls++
	s.mu.Unlock()
	<-ss.Context().Done()
	return status.FromContextError(ss.Context().Err()).Err()
}

// DOC (package doc, table; WithAttemptTimeout; Error): "DEADLINE_EXCEEDED |
// only when the attempt's own timeout ([WithAttemptTimeout]) cut it off and
// the call still has time" and "status.Code(err) is the last attempt's
// code". A unary attempt cut off by its timeout fails DEADLINE_EXCEEDED; a
// server-streaming attempt cut off the same way (no response within d)
// reads CANCELED, the code of a caller that went away, though the caller
// is still there and its deadline 4.9 s away.
func TestAttack4StreamAttemptTimeoutCode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &atk4SilentOut{}
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
		_, err = st.Recv()
		t.Logf("Recv: %v", err)
		if !errors.Is(err, retry.AttemptsExhausted) {
			t.Errorf("reason: %v, want AttemptsExhausted (2 attempts cut off)", err)
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("status.Code %v after two attempts cut off by the attempt timeout, want DeadlineExceeded (a unary call's gets it)", status.Code(err))
		}
	})
}

// atk4Flaky answers its first unary call UNAVAILABLE and the others OK.
type atk4Flaky struct {
	testpb.UnimplementedTestServiceServer
	mu    sync.Mutex
	calls int
}

func (s *atk4Flaky) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.calls == 1 {
		return nil, status.Error(codes.Unavailable, "down")
	}
	return &testpb.SimpleResponse{}, nil
}

// DOC (Option): "An Option is a value: it may be passed to any number of
// constructors." (IdempotencyOption says the same, and its WithKeyMethods and
// WithReplayMetadata copy their arguments when made.) An Option made by
// WithIdempotentMethods(ms...) changes meaning when the caller later reuses
// its slice ms: the method it declared idempotent is no longer retried.
func TestAttack4OptionIsAValue(t *testing.T) {
	ms := []string{unaryMethod}
	opt := grpcretry.WithIdempotentMethods(ms...)
	ms[0] = "/other.Service/Method" // the caller reuses its slice
	srv := &atk4Flaky{}
	c := dial(t, serve(t, srv), newClient(t, opt, grpcretry.WithRetry(retry.WithBackoff(quick())))...)
	_, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{})
	srv.mu.Lock()
	n := srv.calls
	srv.mu.Unlock()
	if err != nil {
		t.Errorf("a call of %s, declared idempotent when the Option was made, was not retried on UNAVAILABLE: %v (server calls %d)", unaryMethod, err, n)
	}
}

// DOC (WithHedging): "the client sends up to max (0 means 1; at most 8)
// further copies of it, delay apart, while it is still in flight". One
// slow call, max 8, a budget with room (the default floor: 10 per window).
func TestAttack4HedgeMax8(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(10*time.Millisecond, 0, 8, unaryMethod))...)
		_, took, err := hedgeCall(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		srv.settle(t)
		t.Logf("took %v, calls %q", took, srv.calls())
		if n := srv.n(); n != 9 {
			t.Errorf("server got %d copies, want 9 (1 + 8 hedges)", n)
		}
	})
}

// Option: "An Option is a value". The configuration WithBudget,
// WithBreaker and WithLimit point to, and the slices WithRetry,
// WithIdempotentMethods and WithHedging are given, are copied when the
// option is made: a caller that makes them invalid afterwards does not
// change the option.
func TestAttack4OptionsCopiedWhenMade(t *testing.T) {
	bu, br, li := budget.Config{Ratio: 0.2}, breaker.Config{MinCalls: 5}, limit.Config{Max: 8}
	sched := []retry.ScheduleOption{retry.WithMaxAttempts(2)}
	idem, hedged := []string{unaryMethod}, []string{unaryMethod}
	opts := []grpcretry.Option{
		grpcretry.WithBudget(&bu), grpcretry.WithBreaker(&br), grpcretry.WithLimit(&li), grpcretry.WithRetry(sched...),
		grpcretry.WithIdempotentMethods(idem...), grpcretry.WithHedging(time.Millisecond, 0, 1, hedged...),
	}
	bu.Ratio, br.FailureRatio, li.Max = -1, 2, -1
	sched[0] = retry.WithMaxAttempts(-1)
	idem[0], hedged[0] = "not a method", "not a method"
	if _, err := grpcretry.DialOptions(opts...); err != nil {
		t.Errorf("DialOptions after the caller changed what the options were made from: %v, want nil", err)
	}
}

// atkNoHedgeAfterPushback makes a hedged unary call 1 s after the target
// pushed back on a stream, and checks in counts (the server's unary calls
// and stream attempts) that the call went once (no hedge) and the stream
// had one attempt.
func atkNoHedgeAfterPushback(t *testing.T, ctx context.Context, c testpb.TestServiceClient, counts func() (unary, stream int)) {
	t.Helper()
	time.Sleep(time.Second)
	if _, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	synctest.Wait()
	u, s := counts()
	if s != 1 {
		t.Errorf("stream attempts %d, want 1", s)
	}
	if u != 1 {
		t.Errorf("unary call 1 s after the target pushed back on a stream: the server got %d copies (a hedge went), want 1", u)
	}
}
