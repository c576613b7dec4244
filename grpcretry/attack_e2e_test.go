package grpcretry_test

import (
	"context"
	"errors"
	"io"
	"net"
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
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// e2eSrv is a test service whose unary and server-streaming handlers are
// functions; it records the grpc-previous-rpc-attempts and start time of
// each handler run.
type e2eSrv struct {
	testpb.UnimplementedTestServiceServer
	mu     sync.Mutex
	runs   []time.Time
	prev   [][]string
	mds    []metadata.MD
	unary  func(ctx context.Context, n int) (*testpb.SimpleResponse, error)
	stream func(ss testpb.TestService_StreamingOutputCallServer, n int) error
}

func (s *e2eSrv) rec(ctx context.Context) int {
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.runs = append(s.runs, time.Now())
	s.prev = append(s.prev, md[wire.PreviousAttemptsMetadata])
	s.mds = append(s.mds, md)
	return len(s.runs) - 1
}

func (s *e2eSrv) Runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.runs)
}

func (s *e2eSrv) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	n := s.rec(ctx)
	if s.unary == nil {
		return &testpb.SimpleResponse{Username: "ok"}, nil
	}
	return s.unary(ctx, n)
}

func (s *e2eSrv) StreamingOutputCall(_ *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	n := s.rec(ss.Context())
	if s.stream == nil {
		return ss.Send(&testpb.StreamingOutputCallResponse{})
	}
	return s.stream(ss, n)
}

// e2eServe starts s on bufconn with the server options and returns a client
// connected with the dial options.
func e2eServe(t *testing.T, s *e2eSrv, sopts []grpc.ServerOption, dopts []grpc.DialOption) testpb.TestServiceClient {
	t.Helper()
	ln := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(sopts...)
	testpb.RegisterTestServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	dopts = append(dopts,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn, err := grpc.NewClient("passthrough:///e2e", dopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

func e2eDial(t *testing.T, opts ...grpcretry.Option) []grpc.DialOption {
	t.Helper()
	d, err := grpcretry.DialOptions(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func e2eCtl(t *testing.T, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return ctl
}

// e2eZeroBackoff sleeps exactly the hints (random source 0), 1 ms base.
func e2eZeroBackoff(t *testing.T) grpcretry.Option {
	b, err := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond, Rand: func() float64 { return 0 }})
	if err != nil {
		t.Fatal(err)
	}
	return grpcretry.WithRetry(retry.WithBackoff(b))
}

// e2eAdmObs records admission events with their time.
type e2eAdmObs struct {
	mu sync.Mutex
	ev []e2eAdmEv
}
type e2eAdmEv struct {
	at      time.Time
	outcome string
	attempt int
	delay   time.Duration
}

func (o *e2eAdmObs) Observe(_ context.Context, e observe.Event) {
	if e.Kind != observe.Admission {
		return
	}
	o.mu.Lock()
	o.ev = append(o.ev, e2eAdmEv{time.Now(), e.Outcome, e.Attempt, e.Delay})
	o.mu.Unlock()
}

func (o *e2eAdmObs) Events() []e2eAdmEv {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]e2eAdmEv(nil), o.ev...)
}

// Attempts of a retried call reach admission as one original and retries.
func TestAttackE2EAdmissionCountsAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{})
		s := &e2eSrv{unary: func(context.Context, int) (*testpb.SimpleResponse, error) {
			return nil, status.Error(codes.Unavailable, "down")
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if !errors.Is(err, retry.AttemptsExhausted) || status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v", err)
		}
		st := ctl.Stats()
		if st.Originals != 1 || st.Retries != 2 || s.Runs() != 3 {
			t.Fatalf("originals %d retries %d runs %d prev %v", st.Originals, st.Retries, s.Runs(), s.prev)
		}
	})
}

// A retry refused by the ratio stops the call (don't-retry), and PushBack
// passes the signal on.
func TestAttackE2EAdmissionRetryRefusedStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
		s := &e2eSrv{unary: func(context.Context, int) (*testpb.SimpleResponse, error) {
			return nil, status.Error(codes.Unavailable, "down")
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v", err)
		}
		st := ctl.Stats()
		if s.Runs() != 1 || st.Retries != 1 || st.Outcomes[admission.RetryRefused] != 1 {
			t.Fatalf("runs %d stats %+v err %v", s.Runs(), st, err)
		}
		if time.Since(start) > 10*time.Millisecond {
			t.Fatalf("took %v", time.Since(start))
		}
		pb := grpcretry.PushBack(context.Background(), err)
		if pb == err {
			t.Fatalf("PushBack passed a don't-retry give-up on unchanged: %v", err)
		}
		t.Logf("err: %v", err)
	})
}

// A call shed for lack of room is retried after the shed's jittered hint
// (exactly, with a zero random source); the hint's RetryInfo has the full
// resolution.
func TestAttackE2EAdmissionShedHintFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		obs := &e2eAdmObs{}
		ctl := e2eCtl(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 200 * time.Millisecond,
			RetryAfterSpread: 100 * time.Millisecond, Rand: func() float64 { return 0.5 }, Observer: obs})
		hold := make(chan struct{})
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			if n == 0 {
				<-hold
			}
			return &testpb.SimpleResponse{Username: "ok"}, nil
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
		go func() { _, _ = c.UnaryCall(t.Context(), &testpb.SimpleRequest{}) }()
		synctest.Wait()
		if s.Runs() != 1 {
			t.Fatalf("holder not running")
		}
		// Release the holder after 100 ms: the shed call's retry at 250 ms
		// finds the slot free.
		time.AfterFunc(100*time.Millisecond, func() { close(hold) })
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		start := time.Now()
		resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err != nil {
			t.Fatalf("err = %v events %+v", err, obs.Events())
		}
		_ = resp
		if d := time.Since(start); d != 250*time.Millisecond {
			t.Fatalf("call took %v, want exactly the hint 250ms; events %+v", d, obs.Events())
		}
	})
}

// A hint past the call's deadline ends the call at once with
// retry.Deadline.
func TestAttackE2EAdmissionShedHintPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 200 * time.Millisecond,
			RetryAfterSpread: 100 * time.Millisecond, Rand: func() float64 { return 0.5 }})
		hold := make(chan struct{})
		defer close(hold)
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			if n == 0 {
				<-hold
			}
			return &testpb.SimpleResponse{Username: "ok"}, nil
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
		go func() { _, _ = c.UnaryCall(t.Context(), &testpb.SimpleRequest{}) }()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(t.Context(), 240*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if !errors.Is(err, retry.Deadline) || status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v (code %v)", err, status.Code(err))
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("took %v, want at once", d)
		}
	})
}

// A call whose deadline comes while it waits in admission's queue never
// reaches the handler.
func TestAttackE2EAdmissionQueuedDeadlineDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{MaxInFlight: 1, MaxQueueWait: 10 * time.Second})
		hold := make(chan struct{})
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			if n == 0 {
				<-hold
			}
			return &testpb.SimpleResponse{Username: "ok"}, nil
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
		go func() { _, _ = c.UnaryCall(t.Context(), &testpb.SimpleRequest{}) }()
		synctest.Wait()
		time.AfterFunc(time.Second, func() { close(hold) })
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("err = %v", err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if s.Runs() != 1 {
			t.Fatalf("handler ran %d times, want 1 (the holder)", s.Runs())
		}
	})
}

// A server stream holds its permit for its life: a unary call meets no
// room while it is open, and is admitted after it ends.
func TestAttackE2EAdmissionStreamHoldsPermit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{MaxInFlight: 1, MaxQueue: -1})
		release := make(chan struct{})
		s := &e2eSrv{stream: func(ss testpb.TestService_StreamingOutputCallServer, n int) error {
			if err := ss.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
				return err
			}
			<-release
			return nil
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(outMethod)))
		st, err := c.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		_, err = c.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("unary while stream open: %v", err)
		}
		close(release)
		for {
			if _, err := st.Recv(); err != nil {
				break
			}
		}
		synctest.Wait()
		if _, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
			t.Fatalf("unary after stream: %v", err)
		}
	})
}

// A keyed call whose first attempt was cut off by the attempt timeout while
// the handler goes on and succeeds: the retry meets ABORTED with the
// pushback, then the stored answer. The handler runs once.
func TestAttackE2EIdempotencyAttemptTimeoutThenReplay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.NewGuard(ms)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := grpcretry.IdempotencyUnaryServerInterceptor(g,
			grpcretry.WithKeyScope(func(context.Context) (string, error) { return "e2e", nil }),
			grpcretry.WithKeyPushback(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			time.Sleep(150 * time.Millisecond) // ignores its caller
			return &testpb.SimpleResponse{Username: "paid"}, nil
		}}
		c := e2eServe(t, s, []grpc.ServerOption{grpc.UnaryInterceptor(keys)},
			e2eDial(t, grpcretry.WithAutoIdempotencyKey(), grpcretry.WithAttemptTimeout(100*time.Millisecond), e2eZeroBackoff(t)))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		var hdr metadata.MD
		resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&hdr))
		if err != nil {
			t.Fatalf("err = %v, runs %d", err, s.Runs())
		}
		if resp.GetUsername() != "paid" || s.Runs() != 1 {
			t.Fatalf("resp %q runs %d", resp.GetUsername(), s.Runs())
		}
		if hdr.Get(idempotency.ReplayHeader) == nil {
			t.Errorf("no replay mark: %v", hdr)
		}
	})
}

func (s *e2eSrv) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	s.rec(ss.Context())
	for {
		m, err := ss.Recv()
		if err != nil {
			if err == io.EOF {
				return nil
			}
			return err
		}
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
	}
}

func (s *e2eSrv) StreamingInputCall(ss testpb.TestService_StreamingInputCallServer) error {
	s.rec(ss.Context())
	total := 0
	for {
		m, err := ss.Recv()
		if err == io.EOF {
			return ss.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: int32(total)})
		}
		if err != nil {
			return err
		}
		total += len(m.GetPayload().GetBody())
	}
}

// e2eShedFirst returns a controller that sheds (QueueFull, a 100 ms hint,
// no don't-retry) while a unary holder runs, and the holder's release.
func e2eShedFirst(t *testing.T, s *e2eSrv, c testpb.TestServiceClient) func() {
	hold := make(chan struct{})
	s.unary = func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
		<-hold
		return &testpb.SimpleResponse{}, nil
	}
	go func() { _, _ = c.UnaryCall(context.Background(), &testpb.SimpleRequest{}) }()
	synctest.Wait()
	return func() { close(hold) }
}

// A bidi call (buffered) whose first stream admission refused at once is
// replayed on a new stream after the hint: the caller's Send and Recv see
// nothing of it.
func TestAttackE2EAdmissionBidiShedAtOpenReplayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 100 * time.Millisecond, RetryAfterSpread: -1})
		s := &e2eSrv{}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(1<<10), e2eZeroBackoff(t)))
		release := e2eShedFirst(t, s, c)
		time.AfterFunc(50*time.Millisecond, release)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		st, err := c.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the refusal has arrived
		for _, b := range []string{"a", "b"} {
			if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte(b)}}); err != nil {
				t.Fatalf("Send %q: %v (stats %+v)", b, err, ctl.Stats())
			}
		}
		if err := st.CloseSend(); err != nil {
			t.Fatalf("CloseSend: %v", err)
		}
		var got string
		for {
			m, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Recv after %q: %v (stats %+v)", got, err, ctl.Stats())
			}
			got += string(m.GetPayload().GetBody())
		}
		if got != "ab" {
			t.Fatalf("got %q", got)
		}
	})
}

// The same for a client-streaming call.
func TestAttackE2EAdmissionClientStreamShedAtOpenReplayed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: 100 * time.Millisecond, RetryAfterSpread: -1})
		s := &e2eSrv{}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(inMethod),
			grpcretry.WithBufferMessages(1<<10), e2eZeroBackoff(t)))
		release := e2eShedFirst(t, s, c)
		time.AfterFunc(50*time.Millisecond, release)
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		st, err := c.StreamingInputCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		for _, b := range []string{"aa", "bbb"} {
			if err := st.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: []byte(b)}}); err != nil {
				t.Fatalf("Send %q: %v", b, err)
			}
		}
		resp, err := st.CloseAndRecv()
		if err != nil || resp.GetAggregatedPayloadSize() != 5 {
			t.Fatalf("CloseAndRecv = %v, %v (stats %+v)", resp, err, ctl.Stats())
		}
	})
}

// A hedge that admission refuses with the don't-retry pushback does not
// take the race from the first copy, which answers OK later.
func TestAttackE2EAdmissionHedgeRefusedFirstCopyWins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := e2eCtl(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			time.Sleep(50 * time.Millisecond)
			return &testpb.SimpleResponse{Username: "first"}, nil
		}}
		c := e2eServe(t, s, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithHedging(10*time.Millisecond, 0, 1, unaryMethod), e2eZeroBackoff(t)))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{})
		if err != nil || resp.GetUsername() != "first" {
			t.Fatalf("resp %v err %v stats %+v runs %d", resp, err, ctl.Stats(), s.Runs())
		}
		if st := ctl.Stats(); st.Retries != 1 || st.Outcomes[admission.RetryRefused] != 1 {
			t.Fatalf("stats %+v (want the hedge seen as a refused retry)", st)
		}
	})
}

// Concurrent keyed calls, hedged and retried, through admission and the
// idempotency interceptor: each key's handler completes at most once, every
// OK reply is its key's, and -race is quiet.
func TestAttackE2EConcurrentKeyedAdmissionHedging(t *testing.T) {
	ms, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.NewGuard(ms)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := grpcretry.IdempotencyUnaryServerInterceptor(g,
		grpcretry.WithKeyScope(func(context.Context) (string, error) { return "e2e", nil }),
		grpcretry.WithKeyPushback(2*time.Millisecond), grpcretry.WithReplayMetadata("x-key"))
	if err != nil {
		t.Fatal(err)
	}
	ctl := e2eCtl(t, admission.Config{MaxInFlight: 4, MaxQueue: 8, RetryAfterBase: time.Millisecond, RetryAfterSpread: 3 * time.Millisecond})
	var mu sync.Mutex
	done := map[string]int{}
	var calls int
	s := &e2eSrv{}
	s.unary = func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		k := md.Get("idempotency-key")
		mu.Lock()
		calls++
		c := calls
		mu.Unlock()
		if c%7 == 0 {
			return nil, status.Error(codes.Unavailable, "flaky")
		}
		time.Sleep(time.Duration(c%5) * time.Millisecond)
		key := ""
		if len(k) > 0 {
			key = k[0]
		}
		mu.Lock()
		done[key]++
		mu.Unlock()
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-key", key))
		return &testpb.SimpleResponse{Username: key}, nil
	}
	sopts := append(grpcretry.AdmissionServerOptions(ctl), grpc.ChainUnaryInterceptor(keys))
	c := e2eServe(t, s, sopts, e2eDial(t, grpcretry.WithAutoIdempotencyKey(), grpcretry.WithAttemptTimeout(20*time.Millisecond),
		grpcretry.WithHedging(3*time.Millisecond, 0, 2, unaryMethod), grpcretry.WithRetry(retry.WithMaxAttempts(5)), e2eZeroBackoff(t)))
	var wg sync.WaitGroup
	var okN, failN int
	var errs sync.Map
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			var hdr metadata.MD
			key := idempotency.NewKey()
			ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", key)
			resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte{byte(i)}}}, grpc.Header(&hdr))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failN++
				errs.Store(status.Code(err).String(), err.Error())
				return
			}
			okN++
			if resp.GetUsername() != key {
				t.Errorf("reply %q for key %q", resp.GetUsername(), key)
			}
			if got := hdr.Get("x-key"); len(got) != 1 || got[0] != key {
				var names []string
				for k, v := range hdr {
					names = append(names, strings.ReplaceAll(k, "-", "_")+"="+strings.Join(v, ","))
				}
				// Same cause as TestAttackE2EIdempotencyReplayMetadataAfterCallerLeft
				// (a replay of a call whose first caller left): logged only.
				t.Logf("header x-key %q for key %q (header fields %q)", got, key, names)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for k, n := range done {
		if n > 1 {
			t.Errorf("key %q completed %d times", k, n)
		}
	}
	t.Logf("ok %d failed %d handler completions %d stats %+v", okN, failN, len(done), ctl.Stats())
	errs.Range(func(k, v any) bool { t.Logf("%v: %v", k, v); return true })
}

// A middle service that forwards its incoming metadata as the outgoing
// metadata of its own call (metadata.NewOutgoingContext, the usual proxy
// idiom): the bottom's first attempt must carry no
// grpc-previous-rpc-attempts, unary and server-streaming, and admission
// at the bottom counts it as an original.
func TestAttackE2EForwardedMetadataFirstAttempt(t *testing.T) {
	for _, streaming := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			ctl := e2eCtl(t, admission.Config{})
			bottom := &e2eSrv{}
			bc := e2eServe(t, bottom, grpcretry.AdmissionServerOptions(ctl), e2eDial(t,
				grpcretry.WithIdempotentMethods(unaryMethod, outMethod), e2eZeroBackoff(t)))
			mid := &e2eSrv{}
			mid.unary = func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
				if n == 0 {
					return nil, status.Error(codes.Unavailable, "flaky")
				}
				in, _ := metadata.FromIncomingContext(ctx)
				out := metadata.NewOutgoingContext(ctx, in.Copy())
				if streaming {
					st, err := bc.StreamingOutputCall(out, &testpb.StreamingOutputCallRequest{})
					if err != nil {
						return nil, err
					}
					if _, err := st.Recv(); err != nil {
						return nil, err
					}
					return &testpb.SimpleResponse{}, nil
				}
				return bc.UnaryCall(out, &testpb.SimpleRequest{})
			}
			mc := e2eServe(t, mid, nil, e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			if _, err := mc.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
				t.Fatal(err)
			}
			if got := mid.prev; len(got) != 2 || got[0] != nil || len(got[1]) != 1 || got[1][0] != "1" {
				t.Fatalf("mid saw %q", got)
			}
			if got := bottom.prev; len(got) != 1 || got[0] != nil {
				t.Errorf("streaming=%v: bottom's first attempt carried grpc-previous-rpc-attempts %q; stats %+v", streaming, got, ctl.Stats())
			}
		})
	}
}

// The same with calls the bottom's client does not retry: a unary call of
// a method not declared idempotent, a server stream of such a method, and a
// bidi call without WithBufferMessages (passed through "untouched").
func TestAttackE2EForwardedMetadataUnretried(t *testing.T) {
	for _, kind := range []string{"unary", "server-stream", "bidi", "bidi-idempotent"} {
		t.Run(kind, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctl := e2eCtl(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
				bottom := &e2eSrv{}
				bc := e2eServe(t, bottom, grpcretry.AdmissionServerOptions(ctl), e2eDial(t, grpcretry.WithIdempotentMethods(duplexMethod), e2eZeroBackoff(t)))
				mid := &e2eSrv{}
				mid.unary = func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
					if n == 0 {
						return nil, status.Error(codes.Unavailable, "flaky")
					}
					in, _ := metadata.FromIncomingContext(ctx)
					out := metadata.NewOutgoingContext(ctx, in.Copy())
					switch kind {
					case "unary":
						return bc.UnaryCall(out, &testpb.SimpleRequest{})
					case "server-stream":
						st, err := bc.StreamingOutputCall(out, &testpb.StreamingOutputCallRequest{})
						if err != nil {
							return nil, err
						}
						if _, err := st.Recv(); err != nil {
							return nil, err
						}
					default:
						st, err := bc.FullDuplexCall(out)
						if err != nil {
							return nil, err
						}
						if err := st.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
							return nil, err
						}
						if _, err := st.Recv(); err != nil {
							return nil, err
						}
						_ = st.CloseSend()
					}
					return &testpb.SimpleResponse{}, nil
				}
				mc := e2eServe(t, mid, nil, e2eDial(t, grpcretry.WithIdempotentMethods(unaryMethod), e2eZeroBackoff(t)))
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				_, err := mc.UnaryCall(ctx, &testpb.SimpleRequest{})
				if got := bottom.prev; len(got) != 1 || got[0] != nil || err != nil {
					t.Errorf("%s: bottom's only attempt carried grpc-previous-rpc-attempts %q (runs %d); call err %v; bottom admission %+v", kind, got, bottom.Runs(), err, ctl.Stats())
				}
			})
		})
	}
}

// A keyed call whose caller left (its deadline) while the handler ran: the
// handler goes on, sets its allow-listed header and trailer and answers OK,
// which is stored. The retry with the key gets the stored reply marked as
// a replay, but without the allow-listed metadata the handler set.
func TestAttackE2EIdempotencyReplayMetadataAfterCallerLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.NewGuard(ms)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := grpcretry.IdempotencyUnaryServerInterceptor(g,
			grpcretry.WithKeyScope(func(context.Context) (string, error) { return "e2e", nil }),
			grpcretry.WithReplayMetadata("x-charge", "x-ledger"))
		if err != nil {
			t.Fatal(err)
		}
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			time.Sleep(100 * time.Millisecond) // finishes whatever happens
			_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge", "ch-1"))
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "entry-1"))
			return &testpb.SimpleResponse{Username: "paid"}, nil
		}}
		c := e2eServe(t, s, []grpc.ServerOption{grpc.UnaryInterceptor(keys)}, nil)
		key := idempotency.NewKey()
		ctx1, cancel1 := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", key), 50*time.Millisecond)
		defer cancel1()
		if _, err := c.UnaryCall(ctx1, &testpb.SimpleRequest{}); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("first call: %v", err)
		}
		time.Sleep(time.Second) // the handler finished and its answer is stored
		var hdr, tlr metadata.MD
		resp, err := c.UnaryCall(metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", key), &testpb.SimpleRequest{},
			grpc.Header(&hdr), grpc.Trailer(&tlr))
		if err != nil || resp.GetUsername() != "paid" || s.Runs() != 1 {
			t.Fatalf("retry: %v %v runs %d", resp, err, s.Runs())
		}
		if hdr.Get(idempotency.ReplayHeader) == nil {
			t.Fatalf("not a replay: %v", hdr)
		}
		if got, gotT := hdr.Get("x-charge"), tlr.Get("x-ledger"); len(got) != 1 || len(gotT) != 1 {
			t.Errorf("replay's x-charge header %q, x-ledger trailer %q; want [ch-1] and [entry-1], as the handler set them", got, gotT)
		}
	})
}

// A pass-through call (a server stream of a method not safe to repeat, a
// client stream without WithBufferMessages) goes without an inherited
// attempt count and probe mark, and with the rest of its caller's
// metadata; a stream the caller marks with neither reaches the server
// with its metadata as sent.
func TestAttackE2EPassThroughStripsMarksOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &e2eSrv{}
		c := e2eServe(t, s, nil, e2eDial(t))
		marked := metadata.AppendToOutgoingContext(t.Context(), wire.PreviousAttemptsMetadata, "2", "stormguard-probe", "1", "x-keep", "v")
		plain := metadata.AppendToOutgoingContext(t.Context(), "x-keep", "v")
		for _, ctx := range []context.Context{marked, plain} {
			st, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatal(err)
			}
			in, err := c.StreamingInputCall(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := in.CloseAndRecv(); err != nil {
				t.Fatal(err)
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.mds) != 4 {
			t.Fatalf("%d calls reached the server, want 4", len(s.mds))
		}
		for i, md := range s.mds {
			if md[wire.PreviousAttemptsMetadata] != nil || md["stormguard-probe"] != nil || len(md["x-keep"]) != 1 {
				t.Errorf("call %d reached the server with %v", i, md)
			}
		}
	})
}

// A keyed handler that sends its header, then sets more header metadata
// (refused by gRPC) and a trailer: the replay carries what the first
// caller got, the sent header and the trailer, not the refused header.
func TestAttackE2EIdempotencyReplayHeaderOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.NewGuard(ms)
		if err != nil {
			t.Fatal(err)
		}
		keys, err := grpcretry.IdempotencyUnaryServerInterceptor(g,
			grpcretry.WithKeyScope(func(context.Context) (string, error) { return "e2e", nil }),
			grpcretry.WithReplayMetadata("x-charge", "x-late", "x-ledger"))
		if err != nil {
			t.Fatal(err)
		}
		s := &e2eSrv{unary: func(ctx context.Context, n int) (*testpb.SimpleResponse, error) {
			if err := grpc.SendHeader(ctx, metadata.Pairs("x-charge", "ch-1")); err != nil {
				return nil, err
			}
			if err := grpc.SetHeader(ctx, metadata.Pairs("x-late", "no")); err == nil {
				return nil, status.Error(codes.Internal, "gRPC took header metadata after the header")
			}
			_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "entry-1"))
			return &testpb.SimpleResponse{Username: "paid"}, nil
		}}
		c := e2eServe(t, s, []grpc.ServerOption{grpc.UnaryInterceptor(keys)}, nil)
		ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", idempotency.NewKey())
		var hdrs, tlrs [2]metadata.MD
		for i := range 2 {
			resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&hdrs[i]), grpc.Trailer(&tlrs[i]))
			if err != nil || resp.GetUsername() != "paid" || s.Runs() != 1 {
				t.Fatalf("call %d: %v %v runs %d", i, resp, err, s.Runs())
			}
			if got, late, gotT := hdrs[i].Get("x-charge"), hdrs[i].Get("x-late"), tlrs[i].Get("x-ledger"); len(got) != 1 || late != nil || len(gotT) != 1 {
				t.Errorf("call %d: header %v, trailer %v; want x-charge and x-ledger, no x-late", i, hdrs[i], tlrs[i])
			}
		}
		if hdrs[1].Get(idempotency.ReplayHeader) == nil {
			t.Fatalf("not a replay: %v", hdrs[1])
		}
	})
}
