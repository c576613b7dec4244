// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

//lint:file-ignore ST1008 the test terminal's answers read (error, trailer), as a server writes them

package grpcretry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// atk3Term is a terminal unary interceptor, chained after grpcretry's: it
// answers every attempt itself (no network), recording each attempt's
// outgoing metadata, and sets the trailer the scripted answer carries.
type atk3Term struct {
	mu     sync.Mutex
	mds    []metadata.MD
	answer func(n int) (error, metadata.MD)
}

func (z *atk3Term) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, _ grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	md, _ := metadata.FromOutgoingContext(ctx)
	z.mu.Lock()
	n := len(z.mds)
	z.mds = append(z.mds, md.Copy())
	z.mu.Unlock()
	err, tr := z.answer(n)
	for _, o := range opts {
		if t, ok := o.(grpc.TrailerCallOption); ok && tr != nil {
			*t.TrailerAddr = tr.Copy()
		}
	}
	return err
}

func (z *atk3Term) attempts() []metadata.MD {
	z.mu.Lock()
	defer z.mu.Unlock()
	return append([]metadata.MD(nil), z.mds...)
}

func atk3Conn(t testing.TB, target string, z *atk3Term, opts ...grpcretry.Option) *grpc.ClientConn {
	t.Helper()
	dopts, err := grpcretry.DialOptions(opts...)
	if err != nil {
		t.Fatalf("DialOptions: %v", err)
	}
	dopts = append(dopts, grpc.WithChainUnaryInterceptor(z.intercept), grpc.WithTransportCredentials(insecure.NewCredentials()))
	cc, err := grpc.NewClient(target, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func atk3Invoke(ctx context.Context, cc *grpc.ClientConn) error {
	return cc.Invoke(ctx, unaryMethod, &testpb.SimpleRequest{}, &testpb.SimpleResponse{})
}

// Options: a bad value is an error of DialOptions, never a panic.
func TestAttack3OptionsNeverPanic(t *testing.T) {
	nan := math.NaN()
	cases := map[string][]grpcretry.Option{
		"max attempts 0":          {grpcretry.WithRetry(retry.WithMaxAttempts(0))},
		"max attempts -1":         {grpcretry.WithRetry(retry.WithMaxAttempts(-1))},
		"max retry after -1":      {grpcretry.WithRetry(retry.WithMaxRetryAfter(-1))},
		"nil backoff":             {grpcretry.WithRetry(retry.WithBackoff(nil))},
		"budget NaN ratio":        {grpcretry.WithBudget(&budget.Config{Ratio: nan})},
		"budget inf ratio":        {grpcretry.WithBudget(&budget.Config{Ratio: math.Inf(1)})},
		"budget negative window":  {grpcretry.WithBudget(&budget.Config{Window: -time.Second})},
		"breaker NaN":             {grpcretry.WithBreaker(&breaker.Config{FailureRatio: nan})},
		"breaker ratio 2":         {grpcretry.WithBreaker(&breaker.Config{FailureRatio: 2})},
		"breaker negative window": {grpcretry.WithBreaker(&breaker.Config{Window: -time.Second})},
		"limit Max -1":            {grpcretry.WithLimit(&limit.Config{Max: -1})},
		"limit timeout -1":        {grpcretry.WithLimit(&limit.Config{Timeout: -1})},
		"attempt timeout -1":      {grpcretry.WithAttemptTimeout(-1)},
		"buffer 0":                {grpcretry.WithBufferMessages(0)},
		"buffer -1":               {grpcretry.WithBufferMessages(-1)},
		"method empty":            {grpcretry.WithIdempotentMethods("")},
		"method no slash":         {grpcretry.WithIdempotentMethods("a/b")},
		"method no service":       {grpcretry.WithIdempotentMethods("//b")},
		"method trailing slash":   {grpcretry.WithIdempotentMethods("/a/")},
		"method three parts":      {grpcretry.WithIdempotentMethods("/a/b/c")},
		"method only slash":       {grpcretry.WithIdempotentMethods("/")},
		"hedge NaN":               {grpcretry.WithHedging(0, nan, 1, unaryMethod)},
		"hedge -inf":              {grpcretry.WithHedging(0, math.Inf(-1), 1, unaryMethod)},
		"hedge 9":                 {grpcretry.WithHedging(0, 0, 9, unaryMethod)},
		"hedge no method":         {grpcretry.WithHedging(time.Millisecond, 0, 1)},
		"guards nil":              {grpcretry.WithGuards(nil)},
	}
	for name, opts := range cases {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("DialOptions panicked: %v", r)
				}
			}()
			_, err := grpcretry.DialOptions(opts...)
			if err == nil {
				t.Errorf("DialOptions accepted %s", name)
			}
		})
	}
}

func atk3Quick() grpcretry.Option { return grpcretry.WithRetry(retry.WithBackoff(quick())) }

// A non-probe first attempt must not carry "stormguard-probe: 1" (only
// attempts the breaker let through to test the target carry it).
func TestAttack3InheritedProbeMark(t *testing.T) {
	z := &atk3Term{answer: func(int) (error, metadata.MD) { return nil, nil }}
	cc := atk3Conn(t, "passthrough:///zz-probe", z, atk3Quick())
	ctx := metadata.AppendToOutgoingContext(context.Background(), "stormguard-probe", "1")
	if err := atk3Invoke(ctx, cc); err != nil {
		t.Fatal(err)
	}
	if v := z.attempts()[0]["stormguard-probe"]; len(v) != 0 {
		t.Errorf("first (non-probe) attempt carries stormguard-probe %q", v)
	}
}

// Inherited probe mark on a retry is removed (contrast: it is removed there).
func TestAttack3InheritedProbeMarkRetry(t *testing.T) {
	z := &atk3Term{answer: func(n int) (error, metadata.MD) {
		if n == 0 {
			return status.Error(codes.Unavailable, "down"), nil
		}
		return nil, nil
	}}
	cc := atk3Conn(t, "passthrough:///zz-probe2", z, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "stormguard-probe", "1")
	if err := atk3Invoke(ctx, cc); err != nil {
		t.Fatal(err)
	}
	at := z.attempts()
	for i, md := range at {
		t.Logf("attempt %d: probe=%q prev=%q", i, md["stormguard-probe"], md[wire.PreviousAttemptsMetadata])
	}
}

// WithAutoIdempotencyKey: a call that carries a (blank) key gets a second
// value: the server sees two values of idempotency-key.
func TestAttack3AutoKeyWithBlankKey(t *testing.T) {
	z := &atk3Term{answer: func(int) (error, metadata.MD) { return nil, nil }}
	cc := atk3Conn(t, "passthrough:///zz-blank", z, atk3Quick(), grpcretry.WithAutoIdempotencyKey())
	ctx := metadata.AppendToOutgoingContext(context.Background(), keyMD, " ")
	if err := atk3Invoke(ctx, cc); err != nil {
		t.Fatal(err)
	}
	if v := z.attempts()[0][keyMD]; len(v) != 1 {
		t.Errorf("idempotency-key values sent: %q (want one)", v)
	}
}

// RESOURCE_EXHAUSTED with "grpc-retry-pushback-ms: 0" is a hint (>= 0):
// retried for a safe call.
func TestAttack3ResourceExhaustedPushbackZero(t *testing.T) {
	z := &atk3Term{answer: func(n int) (error, metadata.MD) {
		if n == 0 {
			return status.Error(codes.ResourceExhausted, "slow down"), metadata.Pairs(wire.PushbackMetadata, "0")
		}
		return nil, nil
	}}
	cc := atk3Conn(t, "passthrough:///zz-re0", z, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod))
	if err := atk3Invoke(context.Background(), cc); err != nil {
		t.Fatalf("RE with pushback 0 not retried: %v", err)
	}
	if n := len(z.attempts()); n != 2 {
		t.Errorf("attempts %d, want 2", n)
	}
}

// The hint spread: a source at (almost) 1 sleeps below 1.5 x hint; a
// source at 0 sleeps the hint exactly.
func TestAttack3HintSpread(t *testing.T) {
	for _, r := range []float64{0, 0.999999} {
		t.Run(fmt.Sprint(r), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return r }})
				if err != nil {
					t.Fatal(err)
				}
				z := &atk3Term{answer: func(n int) (error, metadata.MD) {
					if n == 0 {
						return status.Error(codes.Unavailable, "down"), metadata.Pairs(wire.PushbackMetadata, "1000")
					}
					return nil, nil
				}}
				cc := atk3Conn(t, "passthrough:///zz-spread", z, grpcretry.WithRetry(retry.WithBackoff(b)), grpcretry.WithIdempotentMethods(unaryMethod))
				start := time.Now()
				if err := atk3Invoke(context.Background(), cc); err != nil {
					t.Fatal(err)
				}
				el := time.Since(start)
				if el < time.Second || el >= 1500*time.Millisecond || (r == 0 && el != time.Second) {
					t.Errorf("slept %v for a 1 s hint with rand %v", el, r)
				}
			})
		})
	}
}

// The give-up error reads as the last attempt's status, details included.
func TestAttack3GiveUpStatusDetails(t *testing.T) {
	st := status.New(codes.Unavailable, "down for good")
	st, _ = st.WithDetails(&testpb.Payload{Body: []byte("x")})
	z := &atk3Term{answer: func(n int) (error, metadata.MD) { return st.Err(), nil }}
	cc := atk3Conn(t, "passthrough:///zz-details", z, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod))
	err := atk3Invoke(context.Background(), cc)
	var ge *grpcretry.Error
	if !errors.As(err, &ge) {
		t.Fatalf("err %T %v is not *grpcretry.Error", err, err)
	}
	if !errors.Is(err, retry.AttemptsExhausted) {
		t.Errorf("not AttemptsExhausted: %v", err)
	}
	got, _ := status.FromError(err)
	if got.Code() != codes.Unavailable || got.Message() != "down for good" || len(got.Details()) != 1 {
		t.Errorf("status %v details %v", got, got.Details())
	}
	if !strings.Contains(err.Error(), "after 3 attempts") {
		t.Errorf("message %q", err.Error())
	}
}

// A hint above WithMaxRetryAfter, or past the call's deadline, ends the
// call at once (Reason Deadline), with the last attempt's code.
func TestAttack3HintEndsAtOnce(t *testing.T) {
	cases := []struct {
		name     string
		pushback string
		deadline time.Duration
		reason   error
	}{
		{"above max", "61000", 0, retry.Deadline},
		{"above max with deadline", "61000", time.Hour, retry.Deadline},
		{"past deadline", "2000", time.Second, retry.Deadline},
		{"max int64", "9223372036854775807", 0, retry.Deadline},
		{"max int64 deadline", "9223372036854775807", time.Hour, retry.Deadline},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				z := &atk3Term{answer: func(n int) (error, metadata.MD) {
					return status.Error(codes.Unavailable, "down"), metadata.Pairs(wire.PushbackMetadata, c.pushback)
				}}
				cc := atk3Conn(t, "passthrough:///zz-hint", z, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod))
				ctx := context.Background()
				if c.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.deadline)
					defer cancel()
				}
				start := time.Now()
				err := atk3Invoke(ctx, cc)
				if el := time.Since(start); el != 0 {
					t.Errorf("call took %v, want at once", el)
				}
				if !errors.Is(err, c.reason) || status.Code(err) != codes.Unavailable {
					t.Errorf("err %v (code %v), want %v and UNAVAILABLE", err, status.Code(err), c.reason)
				}
				if n := len(z.attempts()); n != 1 {
					t.Errorf("attempts %d", n)
				}
			})
		})
	}
}

// Both hints: the longer one is the floor.
func TestAttack3BothHintsLonger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return 0 }})
		z := &atk3Term{answer: func(n int) (error, metadata.MD) {
			if n == 0 {
				return answer{code: codes.ResourceExhausted, retryInfo: 3 * time.Second}.err(context.Background()), metadata.Pairs(wire.PushbackMetadata, "1000")
			}
			if n == 1 {
				return answer{code: codes.ResourceExhausted, retryInfo: time.Second}.err(context.Background()), metadata.Pairs(wire.PushbackMetadata, "2000")
			}
			return nil, nil
		}}
		cc := atk3Conn(t, "passthrough:///zz-both", z, grpcretry.WithRetry(retry.WithBackoff(b)), grpcretry.WithIdempotentMethods(unaryMethod))
		start := time.Now()
		if err := atk3Invoke(context.Background(), cc); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el != 5*time.Second {
			t.Errorf("slept %v, want 5s", el)
		}
	})
}

// An open breaker refuses a call without a deadline before any attempt:
// UNAVAILABLE, CircuitOpen.
func TestAttack3OpenBreakerStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := &atk3Term{answer: func(n int) (error, metadata.MD) { return status.Error(codes.Unavailable, "down"), nil }}
		cc := atk3Conn(t, "passthrough:///zz-brk", z, grpcretry.WithRetry(retry.WithMaxAttempts(1)),
			grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Minute}), grpcretry.WithBudget(nil))
		for range 2 {
			_ = atk3Invoke(context.Background(), cc)
		}
		before := len(z.attempts())
		err := atk3Invoke(context.Background(), cc)
		if len(z.attempts()) != before {
			t.Errorf("an attempt went through an open breaker")
		}
		if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.CircuitOpen) {
			t.Errorf("err %v code %v", err, status.Code(err))
		}
		var ge *grpcretry.Error
		if !errors.As(err, &ge) {
			t.Errorf("not a *grpcretry.Error: %T", err)
		}
	})
}

// WithGuards: f is called once per target; again after the target was
// evicted from the 1024-target table.
func TestAttack3GuardsTable(t *testing.T) {
	var mu sync.Mutex
	calls := map[string]int{}
	f := func(target string) (retry.Guards, error) {
		mu.Lock()
		calls[target]++
		mu.Unlock()
		if target == "passthrough:///zz-bad" {
			return retry.Guards{}, errors.New("no guards")
		}
		return retry.Guards{}, nil
	}
	dopts, err := grpcretry.DialOptions(grpcretry.WithGuards(f), atk3Quick())
	if err != nil {
		t.Fatal(err)
	}
	z := &atk3Term{answer: func(int) (error, metadata.MD) { return nil, nil }}
	dopts = append(dopts, grpc.WithChainUnaryInterceptor(z.intercept), grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn := func(target string) *grpc.ClientConn {
		cc, err := grpc.NewClient(target, dopts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	bad := conn("passthrough:///zz-bad")
	if err := atk3Invoke(context.Background(), bad); status.Code(err) != codes.Unavailable {
		t.Errorf("guards error: %v", err)
	}
	first := conn("passthrough:///zz-t0")
	_ = atk3Invoke(context.Background(), first)
	_ = atk3Invoke(context.Background(), first)
	if calls["passthrough:///zz-t0"] != 1 {
		t.Errorf("f called %d times for one target", calls["passthrough:///zz-t0"])
	}
	for i := 1; i <= 1024; i++ {
		cc := conn(fmt.Sprintf("passthrough:///zz-t%d", i))
		_ = atk3Invoke(context.Background(), cc)
	}
	_ = atk3Invoke(context.Background(), first)
	if calls["passthrough:///zz-t0"] != 2 {
		t.Errorf("after 1024 more targets, f called %d times for the first", calls["passthrough:///zz-t0"])
	}
}

// atk3StreamServer answers StreamingOutputCall by a function of the call
// number, recording each call's metadata.
type atk3StreamServer struct {
	testpb.UnimplementedTestServiceServer
	mu  sync.Mutex
	mds []metadata.MD
	fn  func(n int, ss testpb.TestService_StreamingOutputCallServer) error
	// unaryFail makes UnaryCall answer UNAVAILABLE.
	unaryFail bool
}

func (s *atk3StreamServer) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	s.mu.Lock()
	n := len(s.mds)
	s.mds = append(s.mds, md.Copy())
	s.mu.Unlock()
	return s.fn(n, ss)
}

func (s *atk3StreamServer) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if s.unaryFail {
		return nil, status.Error(codes.Unavailable, "down")
	}
	return &testpb.SimpleResponse{}, nil
}

func (s *atk3StreamServer) calls() []metadata.MD {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]metadata.MD(nil), s.mds...)
}

// A header alone does not commit a stream the caller only reads with
// RecvMsg: a failure after the header, before the first message, is retried.
func TestAttack3StreamHeaderThenFailRetried(t *testing.T) {
	s := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error {
		if n == 0 {
			_ = ss.SendHeader(metadata.Pairs("x-attempt", "0"))
			return status.Error(codes.Unavailable, "down after header")
		}
		return ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte("ok")}})
	}}
	c := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(outMethod))...)
	ctx := metadata.AppendToOutgoingContext(context.Background(), wire.PreviousAttemptsMetadata, "7")
	st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if string(m.GetPayload().GetBody()) != "ok" {
		t.Errorf("body %q", m.GetPayload().GetBody())
	}
	calls := s.calls()
	if len(calls) != 2 {
		t.Fatalf("calls %d", len(calls))
	}
	if v := calls[0][wire.PreviousAttemptsMetadata]; len(v) != 0 {
		t.Errorf("first attempt carries %q", v)
	}
	if v := calls[1][wire.PreviousAttemptsMetadata]; len(v) != 1 || v[0] != "1" {
		t.Errorf("second attempt carries %q", v)
	}
	if h, err := st.Header(); err != nil || len(h["x-attempt"]) != 0 {
		t.Errorf("Header after commit: %v %v", h, err)
	}
}

// A stream's give-up: the last attempt's status with details, the reason,
// the same error on the next RecvMsg, io.EOF on SendMsg.
func TestAttack3StreamGiveUp(t *testing.T) {
	st0 := status.New(codes.Unavailable, "stream down")
	st0, _ = st0.WithDetails(&testpb.Payload{Body: []byte("d")})
	s := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error { return st0.Err() }}
	c := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(outMethod))...)
	st, err := c.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	got, _ := status.FromError(err)
	if got.Code() != codes.Unavailable || got.Message() != "stream down" || len(got.Details()) != 1 || !errors.Is(err, retry.AttemptsExhausted) {
		t.Errorf("give-up %v details %v", err, got.Details())
	}
	if _, err2 := st.Recv(); err2 != err {
		t.Errorf("second Recv %v", err2)
	}
	if n := len(s.calls()); n != 3 {
		t.Errorf("attempts %d", n)
	}
}

// A stream holds its limiter slot until committed (its first response):
// after the first message, a unary call to the target gets the slot.
func TestAttack3StreamSlotReleasedAtCommit(t *testing.T) {
	hold := make(chan struct{})
	s := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error {
		if err := ss.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
		<-hold
		return nil
	}}
	defer close(hold)
	c := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(outMethod, unaryMethod),
		grpcretry.WithLimit(&limit.Config{Max: 1, Waiting: -1}))...)
	st, err := c.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); err != nil {
		t.Errorf("unary call after the stream committed: %v", err)
	}
}

type atk3Obs struct {
	mu  sync.Mutex
	evs []observe.Event
}

func (o *atk3Obs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.evs = append(o.evs, e)
	o.mu.Unlock()
}

func (o *atk3Obs) kinds(k observe.Kind) []observe.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []observe.Event
	for _, e := range o.evs {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

// The breaker column of the code table, read from AttemptEnd's Outcome
// ("failure": the breaker counts a failure; "rejected": an answer).
func TestAttack3BreakerColumn(t *testing.T) {
	re := func(c codes.Code, push string, ri time.Duration) func(int) (error, metadata.MD) {
		return func(int) (error, metadata.MD) {
			var md metadata.MD
			if push != "" {
				md = metadata.Pairs(wire.PushbackMetadata, push)
			}
			return answer{code: c, retryInfo: ri}.err(context.Background()), md
		}
	}
	cases := []struct {
		name      string
		ans       func(int) (error, metadata.MD)
		idem, key bool
		want      string
		wantTries int
	}{
		{"unavailable idem", re(codes.Unavailable, "", -1), true, false, "failure", 3},
		{"unavailable unsafe", re(codes.Unavailable, "", -1), false, false, "failure", 1},
		{"RE no hint", re(codes.ResourceExhausted, "", -1), true, false, "rejected", 1},
		{"RE pushback", re(codes.ResourceExhausted, "1", -1), true, false, "failure", 3},
		{"RE retryinfo", re(codes.ResourceExhausted, "", time.Millisecond), true, false, "failure", 3},
		{"RE hint unsafe", re(codes.ResourceExhausted, "1", -1), false, false, "failure", 1},
		{"deadline from server", re(codes.DeadlineExceeded, "", -1), true, false, "rejected", 1},
		{"internal idem", re(codes.Internal, "", -1), true, false, "failure", 2},
		{"internal keyed", re(codes.Internal, "", -1), false, true, "failure", 1},
		{"aborted idem", re(codes.Aborted, "", -1), true, false, "failure", 3},
		{"aborted keyed no hint", re(codes.Aborted, "", -1), false, true, "rejected", 1},
		{"aborted keyed hint", re(codes.Aborted, "1", -1), false, true, "failure", 3},
		{"aborted unsafe", re(codes.Aborted, "", -1), false, false, "rejected", 1},
		{"not found", re(codes.NotFound, "", -1), true, false, "rejected", 1},
		{"unavailable stop", re(codes.Unavailable, "-1", -1), true, false, "failure", 1},
		{"unavailable malformed", re(codes.Unavailable, "1 ", -1), true, false, "failure", 1},
		{"aborted idem stop", re(codes.Aborted, "-1", -1), true, false, "rejected", 1},
		{"RE stop + retryinfo", re(codes.ResourceExhausted, "-1", time.Millisecond), true, false, "rejected", 1},
		{"unknown", re(codes.Unknown, "", -1), true, false, "rejected", 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			z := &atk3Term{answer: c.ans}
			o := &atk3Obs{}
			opts := []grpcretry.Option{atk3Quick(), grpcretry.WithObserver(o), grpcretry.WithBudget(nil)}
			if c.idem {
				opts = append(opts, grpcretry.WithIdempotentMethods(unaryMethod))
			}
			cc := atk3Conn(t, "passthrough:///zz-col-"+strings.ReplaceAll(c.name, " ", "-"), z, opts...)
			ctx := context.Background()
			if c.key {
				ctx = metadata.AppendToOutgoingContext(ctx, keyMD, "k-1")
			}
			_ = atk3Invoke(ctx, cc)
			ends := o.kinds(observe.AttemptEnd)
			if len(ends) != c.wantTries {
				t.Errorf("attempts %d, want %d", len(ends), c.wantTries)
			}
			for _, e := range ends {
				if e.Outcome != c.want {
					t.Errorf("attempt %d outcome %q, want %q", e.Attempt, e.Outcome, c.want)
				}
				if e.Name != cc.Target() {
					t.Errorf("event name %q", e.Name)
				}
			}
		})
	}
}

// grpc.OnFinish runs once per call, when it returns, with the error it
// returns: also when the call fails because WithGuards's f failed.
func TestAttack3OnFinishGuardsError(t *testing.T) {
	f := func(string) (retry.Guards, error) { return retry.Guards{}, errors.New("no guards today") }
	z := &atk3Term{answer: func(int) (error, metadata.MD) { return nil, nil }}
	cc := atk3Conn(t, "passthrough:///zz-onfinish", z, grpcretry.WithGuards(f))
	runs := 0
	var got error
	err := cc.Invoke(context.Background(), unaryMethod, &testpb.SimpleRequest{}, &testpb.SimpleResponse{},
		grpc.OnFinish(func(e error) { runs++; got = e }))
	if err == nil {
		t.Fatal("call succeeded")
	}
	if runs != 1 || got != err {
		t.Errorf("OnFinish ran %d times (with %v); the call returned %v", runs, got, err)
	}
}

// The same, for an open breaker that refuses the call before any attempt.
func TestAttack3OnFinishOpenBreaker(t *testing.T) {
	z := &atk3Term{answer: func(n int) (error, metadata.MD) { return status.Error(codes.Unavailable, "down"), nil }}
	cc := atk3Conn(t, "passthrough:///zz-onfinish-brk", z, grpcretry.WithRetry(retry.WithMaxAttempts(1)),
		grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Hour}), grpcretry.WithBudget(nil))
	_ = atk3Invoke(context.Background(), cc)
	runs := 0
	var got error
	err := cc.Invoke(context.Background(), unaryMethod, &testpb.SimpleRequest{}, &testpb.SimpleResponse{},
		grpc.OnFinish(func(e error) { runs++; got = e }))
	if runs != 1 || got != err {
		t.Errorf("OnFinish ran %d times (with %v); the call returned %v", runs, got, err)
	}
}

// A full limiter refuses a call before any attempt: UNAVAILABLE, Limited.
func TestAttack3LimitedStatus(t *testing.T) {
	hold := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	z := &atk3Term{answer: func(n int) (error, metadata.MD) {
		if n == 0 {
			once.Do(func() { close(started) })
			<-hold
		}
		return nil, nil
	}}
	cc := atk3Conn(t, "passthrough:///zz-limited", z, atk3Quick(), grpcretry.WithLimit(&limit.Config{Max: 1, Waiting: -1}))
	done := make(chan struct{})
	go func() { _ = atk3Invoke(context.Background(), cc); close(done) }()
	<-started
	err := atk3Invoke(context.Background(), cc)
	close(hold)
	<-done
	if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.Limited) {
		t.Errorf("err %v code %v", err, status.Code(err))
	}
	var ge *grpcretry.Error
	if !errors.As(err, &ge) {
		t.Errorf("not *grpcretry.Error: %T", err)
	}
}

// End to end: WithAutoIdempotencyKey on a call whose metadata carries a
// blank idempotency-key: the client adds its key as a second value, and the
// package's own server interceptor refuses the call (two values).
func TestAttack3AutoKeyWithBlankKeyEndToEnd(t *testing.T) {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	g, err := idempotency.NewGuard(mem)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, &testServer{}, grpc.ChainUnaryInterceptor(ic))
	c := dial(t, addr, newClient(t, atk3Quick(), grpcretry.WithAutoIdempotencyKey())...)
	for _, blank := range []string{"", " "} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), keyMD, blank)
		if _, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
			t.Errorf("call with idempotency-key %q and the client's auto key: %v", blank, err)
		}
	}
}

// A call released after waiting behind an open breaker is a probe: its
// first send carries "stormguard-probe: 1"; a later call does not.
func TestAttack3ProbeMarkAfterWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := &atk3Term{answer: func(n int) (error, metadata.MD) {
			if n == 0 {
				return status.Error(codes.Unavailable, "down"), nil
			}
			return nil, nil
		}}
		cc := atk3Conn(t, "passthrough:///zz-probewait", z, atk3Quick(), grpcretry.WithRetry(retry.WithMaxAttempts(1)),
			grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1}), grpcretry.WithBudget(nil))
		_ = atk3Invoke(context.Background(), cc)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		if err := atk3Invoke(ctx, cc); err != nil {
			t.Fatalf("waiting call: %v", err)
		}
		if el := time.Since(start); el < 800*time.Millisecond || el > 1200*time.Millisecond {
			t.Errorf("waited %v", el)
		}
		if err := atk3Invoke(ctx, cc); err != nil {
			t.Fatal(err)
		}
		at := z.attempts()
		if len(at) != 3 {
			t.Fatalf("attempts %d", len(at))
		}
		if v := at[1]["stormguard-probe"]; len(v) != 1 || v[0] != "1" {
			t.Errorf("released call carries probe %q", v)
		}
		if v := at[2]["stormguard-probe"]; len(v) != 0 {
			t.Errorf("later call carries probe %q", v)
		}
	})
}

// Attempt timeout vs the call's deadline, in a bubble: attempts cut by
// their own timeout are retried; the one cut by the caller's deadline is
// not, and the call ends DEADLINE_EXCEEDED with Reason Deadline at the
// deadline.
func TestAttack3AttemptTimeoutThenDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var dls []time.Duration
		z := &atk3Term{}
		start := time.Now()
		z.answer = func(n int) (error, metadata.MD) { return nil, nil }
		dopts, err := grpcretry.DialOptions(grpcretry.WithRetry(retry.WithBackoff(quick()), retry.WithMaxAttempts(5)),
			grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithAttemptTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		hang := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, _ grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			dl, _ := ctx.Deadline()
			mu.Lock()
			dls = append(dls, dl.Sub(start))
			mu.Unlock()
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}
		dopts = append(dopts, grpc.WithChainUnaryInterceptor(hang), grpc.WithTransportCredentials(insecure.NewCredentials()))
		cc, err := grpc.NewClient("passthrough:///zz-at", dopts...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
		defer cancel()
		err = atk3Invoke(ctx, cc)
		el := time.Since(start)
		if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, retry.Deadline) {
			t.Errorf("err %v", err)
		}
		if el != 2500*time.Millisecond {
			t.Errorf("ended after %v", el)
		}
		t.Logf("attempt deadlines %v", dls)
		if len(dls) != 3 {
			t.Errorf("attempts %d", len(dls))
		}
	})
}

// Concurrent calls over several targets on one client, under -race.
func TestAttack3ConcurrentTargets(t *testing.T) {
	dopts, err := grpcretry.DialOptions(atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithAutoIdempotencyKey())
	if err != nil {
		t.Fatal(err)
	}
	var conns []*grpc.ClientConn
	for i := range 4 {
		z := &atk3Term{answer: func(n int) (error, metadata.MD) {
			if n%3 == 0 {
				return status.Error(codes.Unavailable, "down"), nil
			}
			return nil, nil
		}}
		cc, err := grpc.NewClient(fmt.Sprintf("passthrough:///zz-conc-%d", i), append(dopts, grpc.WithChainUnaryInterceptor(z.intercept), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		conns = append(conns, cc)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 50 {
				method := unaryMethod
				if i%2 == 0 {
					method = testpb.TestService_EmptyCall_FullMethodName
				}
				_ = conns[(g+i)%4].Invoke(context.Background(), method, &testpb.SimpleRequest{}, &testpb.SimpleResponse{})
			}
		})
	}
	wg.Wait()
}

// The budget: retries stay below Ratio of the target's calls.
func TestAttack3BudgetRatio(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		failing := false
		var mu sync.Mutex
		z := &atk3Term{answer: func(n int) (error, metadata.MD) {
			mu.Lock()
			defer mu.Unlock()
			if failing {
				return status.Error(codes.Unavailable, "down"), nil
			}
			return nil, nil
		}}
		cc := atk3Conn(t, "passthrough:///zz-budget", z, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithBudget(&budget.Config{Ratio: 0.1, MinPerSecond: -1}), grpcretry.WithBreaker(nil))
		for range 100 {
			if err := atk3Invoke(context.Background(), cc); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		failing = true
		mu.Unlock()
		refused := 0
		for range 50 {
			err := atk3Invoke(context.Background(), cc)
			if errors.Is(err, retry.BudgetExhausted) {
				refused++
				if status.Code(err) != codes.Unavailable {
					t.Errorf("budget give-up code %v", status.Code(err))
				}
				if pe := grpcretry.PushBack(context.Background(), err); status.Code(pe) != codes.Unavailable || pe == err {
					t.Errorf("PushBack passed a budget give-up on: %v", pe)
				}
			}
		}
		retries := len(z.attempts()) - 150
		t.Logf("retries %d, refused %d", retries, refused)
		if retries > 15 {
			t.Errorf("%d retries for 150 calls at ratio 0.1", retries)
		}
	})
}

// Keys sent under the mixed-case HTTP name count as keys.
func TestAttack3KeyHeaderCases(t *testing.T) {
	for i, mk := range []func() context.Context{
		func() context.Context {
			return metadata.AppendToOutgoingContext(context.Background(), idempotency.Header, "k1")
		},
		func() context.Context {
			return metadata.NewOutgoingContext(context.Background(), metadata.MD{idempotency.Header: {"k1"}})
		},
	} {
		z := &atk3Term{answer: func(n int) (error, metadata.MD) { return status.Error(codes.Unavailable, "down"), nil }}
		cc := atk3Conn(t, fmt.Sprintf("passthrough:///zz-case-%d", i), z, atk3Quick())
		_ = atk3Invoke(mk(), cc)
		if n := len(z.attempts()); n != 3 {
			t.Errorf("variant %d: %d attempts of a keyed call", i, n)
		}
	}
}

// Defaults: a pushback of exactly 1 minute is honoured (slept, spread
// above it by at most half); one millisecond more ends the call at once.
func TestAttack3MaxRetryAfterBoundary(t *testing.T) {
	for _, c := range []struct {
		push  string
		tries int
	}{{"60000", 2}, {"60001", 1}} {
		t.Run(c.push, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				z := &atk3Term{answer: func(n int) (error, metadata.MD) {
					if n == 0 {
						return status.Error(codes.Unavailable, "down"), metadata.Pairs(wire.PushbackMetadata, c.push)
					}
					return nil, nil
				}}
				cc := atk3Conn(t, "passthrough:///zz-max", z, grpcretry.WithIdempotentMethods(unaryMethod))
				start := time.Now()
				err := atk3Invoke(context.Background(), cc)
				el := time.Since(start)
				if n := len(z.attempts()); n != c.tries {
					t.Errorf("attempts %d (err %v)", n, err)
				}
				if c.tries == 2 && (el < time.Minute || el >= 90*time.Second) {
					t.Errorf("slept %v", el)
				}
				if c.tries == 1 && el != 0 {
					t.Errorf("took %v", el)
				}
			})
		})
	}
}

// Default breaker: trips at 50% failures of at least 20 calls.
func TestAttack3DefaultBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := &atk3Term{answer: func(n int) (error, metadata.MD) { return status.Error(codes.Unavailable, "down"), nil }}
		cc := atk3Conn(t, "passthrough:///zz-defbrk", z, grpcretry.WithRetry(retry.WithMaxAttempts(1)))
		for i := range 19 {
			if err := atk3Invoke(context.Background(), cc); errors.Is(err, retry.CircuitOpen) {
				t.Fatalf("open after %d calls", i)
			}
		}
		_ = atk3Invoke(context.Background(), cc)
		err := atk3Invoke(context.Background(), cc)
		if !errors.Is(err, retry.CircuitOpen) {
			t.Errorf("21st call: %v (attempts %d)", err, len(z.attempts()))
		}
	})
}

// Default limiter: a cold one lets 10 attempts in flight; the 11th waits.
func TestAttack3DefaultLimiterCold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hold := make(chan struct{})
		var mu sync.Mutex
		in := 0
		dopts, err := grpcretry.DialOptions()
		if err != nil {
			t.Fatal(err)
		}
		term := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, _ grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			mu.Lock()
			in++
			mu.Unlock()
			<-hold
			return nil
		}
		cc, err := grpc.NewClient("passthrough:///zz-deflim", append(dopts, grpc.WithChainUnaryInterceptor(term), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		var wg sync.WaitGroup
		for range 11 {
			wg.Go(func() { _ = atk3Invoke(context.Background(), cc) })
		}
		synctest.Wait()
		mu.Lock()
		got := in
		mu.Unlock()
		if got != 10 {
			t.Errorf("%d attempts in flight on a cold default limiter, want 10", got)
		}
		close(hold)
		wg.Wait()
	})
}

type atk3Rec struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

type atk3Handler struct {
	mu    *sync.Mutex
	recs  *[]atk3Rec
	attrs []slog.Attr
}

func (h atk3Handler) Enabled(context.Context, slog.Level) bool { return true }
func (h atk3Handler) Handle(_ context.Context, r slog.Record) error {
	m := map[string]string{}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool { m[a.Key] = a.Value.String(); return true })
	h.mu.Lock()
	*h.recs = append(*h.recs, atk3Rec{r.Level, r.Message, m})
	h.mu.Unlock()
	return nil
}
func (h atk3Handler) WithAttrs(as []slog.Attr) slog.Handler {
	h.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return h
}
func (h atk3Handler) WithGroup(string) slog.Handler { return h }

// WithLogger: a Warn per breaker state change, Debug per retry and give-up,
// each with "target".
func TestAttack3Logger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var recs []atk3Rec
		l := slog.New(atk3Handler{mu: &mu, recs: &recs})
		z := &atk3Term{answer: func(n int) (error, metadata.MD) { return status.Error(codes.Unavailable, "down"), nil }}
		cc := atk3Conn(t, "passthrough:///zz-log", z, atk3Quick(), grpcretry.WithLogger(l), grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 3, OpenFor: time.Hour}), grpcretry.WithBudget(nil))
		_ = atk3Invoke(context.Background(), cc)
		mu.Lock()
		defer mu.Unlock()
		var warn, retrying, giving int
		for _, r := range recs {
			if r.attrs["target"] != cc.Target() {
				t.Errorf("record %q without target: %v", r.msg, r.attrs)
			}
			switch {
			case r.level == slog.LevelWarn:
				warn++
			case r.msg == "retry: retrying" && r.level == slog.LevelDebug:
				retrying++
			case r.msg == "retry: giving up" && r.level == slog.LevelDebug:
				giving++
			default:
				t.Logf("other record %v %q %v", r.level, r.msg, r.attrs)
			}
		}
		if warn != 1 || retrying != 2 || giving != 1 {
			t.Errorf("warn %d retrying %d giving up %d", warn, retrying, giving)
		}
	})
}

// The package doc: "A stream of a method that is not safe to repeat
// passes through untouched too (not guarded: its failures are not counted,
// and an open breaker does not hold it)". A black-box attack found the
// pass-through, which the doc said of client-streaming and bidirectional
// calls only; the doc now says it of every unsafe stream.
func TestAttack3UnsafeServerStreamPassesThrough(t *testing.T) {
	s := &atk3StreamServer{unaryFail: true, fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error {
		return status.Error(codes.Unavailable, "down")
	}}
	c := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithRetry(retry.WithMaxAttempts(1)),
		grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 2, OpenFor: time.Hour}))...)
	for range 3 { // unsafe streams fail: not counted
		stream, err := c.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		var ge *grpcretry.Error
		if status.Code(err) != codes.Unavailable || errors.As(err, &ge) {
			t.Fatalf("unsafe stream: %T %v, want the server's UNAVAILABLE as it came", err, err)
		}
	}
	if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); errors.Is(err, retry.CircuitOpen) {
		t.Fatalf("the breaker opened on unsafe streams' failures: %v", err)
	}
	for range 2 {
		_, _ = c.UnaryCall(context.Background(), &testpb.SimpleRequest{})
	}
	if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); !errors.Is(err, retry.CircuitOpen) {
		t.Fatalf("breaker not open after failed unsafe unary calls: %v", err)
	}
	before := len(s.calls())
	stream, err := c.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if len(s.calls()) != before+1 || errors.Is(err, retry.CircuitOpen) {
		t.Errorf("open breaker: an unsafe stream made %d calls, got %v; want it through, untouched", len(s.calls())-before, err)
	}
}

// atk3DuplexServer records the messages each FullDuplexCall received; call 0
// fails with UNAVAILABLE after its first message, later calls echo every
// message until the client closes.
type atk3DuplexServer struct {
	testpb.UnimplementedTestServiceServer
	mu   sync.Mutex
	msgs [][]string
}

func (s *atk3DuplexServer) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	s.mu.Lock()
	n := len(s.msgs)
	s.msgs = append(s.msgs, nil)
	s.mu.Unlock()
	for {
		m, err := ss.Recv()
		if err != nil {
			return nil // io.EOF: the client closed
		}
		s.mu.Lock()
		s.msgs[n] = append(s.msgs[n], string(m.GetPayload().GetBody()))
		s.mu.Unlock()
		if n == 0 {
			return status.Error(codes.Unavailable, "down")
		}
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

func (s *atk3DuplexServer) received() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([][]string, len(s.msgs))
	copy(out, s.msgs)
	return out
}

// A message past the buffer's bound, sent while the retry loop sleeps
// between attempts (a bidi caller sends and receives on two goroutines):
// the next attempt opens a new stream that carries neither the kept
// messages nor the new one.
func TestAttack3BidiMessagePastBoundDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: time.Second, Cap: time.Second})
		srv := &atk3DuplexServer{}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(64), grpcretry.WithRetry(retry.WithBackoff(b)))...)
		stream, err := c.FullDuplexCall(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("small")}}); err != nil {
			t.Fatal(err)
		}
		type res struct {
			body string
			err  error
		}
		first := make(chan res, 1)
		go func() {
			m, err := stream.Recv()
			first <- res{string(m.GetPayload().GetBody()), err}
		}()
		synctest.Wait() // attempt 1 failed; the loop sleeps its 1 s backoff
		big := strings.Repeat("B", 100)
		sendErr := stream.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte(big)}})
		time.Sleep(2 * time.Second) // the loop's next attempt opens
		synctest.Wait()
		_ = stream.CloseSend()
		r := <-first
		got := srv.received()
		t.Logf("Send(big) = %v; first Recv = %q, %v; server streams received %q", sendErr, r.body, r.err, got)
		if len(got) > 1 {
			if len(got[1]) == 0 || got[1][0] != "small" {
				t.Errorf("attempt 2 opened a new stream without replaying the kept message: it received %q", got[1])
			}
		}
		if r.err == nil && r.body != "small" {
			t.Errorf("the call succeeded with %q", r.body)
		}
	})
}

// WithAutoIdempotencyKey on a server stream: one key, on every attempt,
// named by the *Error.
func TestAttack3StreamAutoKey(t *testing.T) {
	s := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error {
		return status.Error(codes.Unavailable, "down")
	}}
	c := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithAutoIdempotencyKey())...)
	st, err := c.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	var ge *grpcretry.Error
	if !errors.As(err, &ge) || ge.IdempotencyKey == "" {
		t.Fatalf("err %v", err)
	}
	calls := s.calls()
	if len(calls) != 3 {
		t.Fatalf("attempts %d", len(calls))
	}
	for i, md := range calls {
		if v := md[keyMD]; len(v) != 1 || v[0] != ge.IdempotencyKey {
			t.Errorf("attempt %d key %q, want %q", i, v, ge.IdempotencyKey)
		}
	}
}

// Header first on a stream whose every attempt fails: Header returns the
// give-up, and so does Recv.
func TestAttack3StreamHeaderGiveUp(t *testing.T) {
	s := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error {
		return status.Error(codes.Unavailable, "down")
	}}
	c := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(outMethod))...)
	st, err := c.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	h, herr := st.Header()
	_, rerr := st.Recv()
	if herr == nil || !errors.Is(herr, retry.AttemptsExhausted) || rerr != herr || len(s.calls()) != 3 {
		t.Errorf("Header = %v, %v; Recv = %v; streams %d", h, herr, rerr, len(s.calls()))
	}
}

// A context that ended before the call: no attempt; CANCELED or
// DEADLINE_EXCEEDED, as a *grpcretry.Error.
func TestAttack3EndedContext(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, c := range []struct {
		ctx  context.Context
		code codes.Code
	}{{canceled, codes.Canceled}, {expired, codes.DeadlineExceeded}} {
		z := &atk3Term{answer: func(int) (error, metadata.MD) { return nil, nil }}
		cc := atk3Conn(t, "passthrough:///zz-ended", z, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod))
		err := atk3Invoke(c.ctx, cc)
		var ge *grpcretry.Error
		if status.Code(err) != c.code || !errors.As(err, &ge) || len(z.attempts()) != 0 {
			t.Errorf("unary: %v (%T), attempts %d, want %v", err, err, len(z.attempts()), c.code)
		}
		s := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error { return nil }}
		cl := serveInMemory(t, s, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(outMethod))...)
		st, err := cl.StreamingOutputCall(c.ctx, &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != c.code || len(s.calls()) != 0 {
			t.Errorf("stream: %v (%T), streams %d, want %v", err, err, len(s.calls()), c.code)
		}
	}
}

// PushBack from a streaming handler: the trailer reaches the caller, whose
// client does not retry on top.
func TestAttack3PushBackStreaming(t *testing.T) {
	dep := &atk3StreamServer{unaryFail: true}
	depClient := serveInMemory(t, dep, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(unaryMethod))...)
	mid := &atk3StreamServer{fn: func(n int, ss testpb.TestService_StreamingOutputCallServer) error {
		_, err := depClient.UnaryCall(ss.Context(), &testpb.SimpleRequest{})
		if err != nil {
			return grpcretry.PushBack(ss.Context(), err)
		}
		return ss.Send(&testpb.StreamingOutputCallResponse{})
	}}
	top := serveInMemory(t, mid, newClient(t, atk3Quick(), grpcretry.WithIdempotentMethods(outMethod))...)
	st, err := top.StreamingOutputCall(context.Background(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Recv()
	if status.Code(err) != codes.Unavailable || len(mid.calls()) != 1 {
		t.Errorf("top got %v after %d streams at the middle, want 1", err, len(mid.calls()))
	}
	if v := st.Trailer()[wire.PushbackMetadata]; len(v) != 1 || v[0] != "-1" {
		t.Errorf("trailer %v", st.Trailer())
	}
}

// grpc-previous-rpc-attempts counts up past the shared values (16).
func TestAttack3ManyAttemptsNumbers(t *testing.T) {
	z := &atk3Term{answer: func(int) (error, metadata.MD) { return status.Error(codes.Unavailable, "down"), nil }}
	cc := atk3Conn(t, "passthrough:///zz-many", z, grpcretry.WithRetry(retry.WithBackoff(quick()), retry.WithMaxAttempts(20)),
		grpcretry.WithRetry(retry.WithMaxAttempts(20)), grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil))
	_ = atk3Invoke(context.Background(), cc)
	at := z.attempts()
	if len(at) != 20 {
		t.Fatalf("attempts %d", len(at))
	}
	for i, md := range at {
		v := md[wire.PreviousAttemptsMetadata]
		if i == 0 && len(v) != 0 || i > 0 && (len(v) != 1 || v[0] != fmt.Sprint(i)) {
			t.Errorf("attempt %d carries %q", i+1, v)
		}
	}
}

// A pushback that opened the breaker holds it open at least that long.
func TestAttack3PushbackHoldsBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		z := &atk3Term{answer: func(n int) (error, metadata.MD) {
			if n == 0 {
				return status.Error(codes.ResourceExhausted, "slow down"), metadata.Pairs(wire.PushbackMetadata, "5000")
			}
			return nil, nil
		}}
		cc := atk3Conn(t, "passthrough:///zz-holdbrk", z, atk3Quick(), grpcretry.WithRetry(retry.WithMaxAttempts(1)), grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithBreaker(&breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Second, Probes: 1}), grpcretry.WithBudget(nil))
		_ = atk3Invoke(context.Background(), cc)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		start := time.Now()
		if err := atk3Invoke(ctx, cc); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el < 5*time.Second {
			t.Errorf("released after %v, before the 5 s pushback", el)
		}
	})
}
