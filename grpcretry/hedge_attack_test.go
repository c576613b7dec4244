package grpcretry_test

import (
	"context"
	"errors"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// The tests of this file attack WithHedging from outside, against what its
// documentation (and docs/hedging.md) promises.

// serveConn serves the services reg registers, with the server options
// sopts, over an in-memory listener, and returns a connection to it made
// with dopts: as serveInMemory, for any service and server options.
func serveConn(t testing.TB, reg func(*grpc.Server), sopts []grpc.ServerOption, dopts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	ln := bufconn.Listen(1 << 16)
	srv := grpc.NewServer(sopts...)
	reg(srv)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) })
	conn, err := grpc.NewClient("passthrough:///bufconn", append(dopts, dialer, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestAttackHedgeInvokerPanic: an interceptor under the client that panics
// on a hedge's copy leaves the call with its value, in the caller's
// goroutine, as it does on an attempt that is not raced (package doc,
// TestInvokerPanicEndsAttemptAndCall): a panic on the race's own goroutine
// would end the program, out of the caller's reach.
func TestAttackHedgeInvokerPanic(t *testing.T) {
	for _, panicAt := range []int{1, 2} { // the first copy, the hedge
		t.Run("copy "+strconv.Itoa(panicAt), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: delays(time.Second, time.Second)}
				var n atomic.Int64
				inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					if n.Add(1) == int64(panicAt) {
						if panicAt == 1 {
							time.Sleep(100 * time.Millisecond) // after the hedge went
						}
						panic("interceptor bug")
					}
					return invoker(ctx, method, req, reply, cc, opts...)
				}
				b := newBudget(t)
				var log eventLog
				c := serveInMemory(t, srv, append(newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					withGuards(retry.Guards{Budget: b}), grpcretry.WithObserver(&log)), grpc.WithChainUnaryInterceptor(inner))...)
				v := panicking(func() { _, _, _ = hedgeCall(t.Context(), c) })
				if v != "interceptor bug" {
					t.Errorf("the call panicked with %v, want the interceptor's value", v)
				}
				if n.Load() != 2 {
					t.Errorf("%d copies sent, want 2 (the first and a hedge)", n.Load())
				}
				srv.settle(t)
				var loop []observe.Event // the hedge's own events aside
				for _, e := range log.take() {
					if !e.Hedge {
						loop = append(loop, e)
					}
				}
				checkPanicEvents(t, loop, 1) // the race is the loop's attempt 1, and it panicked
			})
		})
	}
}

// TestAttackHedgeKeyedInProgress: a keyed call hedged against the
// package's own idempotency interceptor: every copy carries the same key,
// the handler runs once (the hedge meets the key in progress), the caller
// gets the first copy's reply, and the in-progress ABORTED, which says the
// key is busy rather than that the target is loaded, holds no later hedge
// back.
func TestAttackHedgeKeyedInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: delays(time.Second)}
		mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		g, err := idempotency.NewGuard(mem)
		if err != nil {
			t.Fatal(err)
		}
		ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope, grpcretry.WithKeyPushback(250*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		var arrived atomic.Int64 // copies that reached the server, keyed or refused
		count := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			arrived.Add(1)
			return h(ctx, req)
		}
		b := newBudget(t)
		conn := serveConn(t, func(s *grpc.Server) { testpb.RegisterTestServiceServer(s, srv) },
			[]grpc.ServerOption{grpc.ChainUnaryInterceptor(count, ic)},
			newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithAutoIdempotencyKey(),
				withGuards(retry.Guards{Budget: b}))...)
		c := testpb.NewTestServiceClient(conn)
		for call := range 2 {
			reply, took, err := hedgeCall(t.Context(), c)
			if err != nil || reply != "call-"+strconv.Itoa(call) || took != time.Second {
				t.Errorf("call %d = %q after %v, %v; want call-%d after 1s", call, reply, took, err, call)
			}
		}
		if r := b.Stats().Retries; r != 2 {
			t.Errorf("%d budget withdrawals, want 2 (one hedge per call)", r)
		}
		srv.settle(t)
		if srv.n() != 2 || arrived.Load() != 4 {
			t.Errorf("%d handler runs for %d copies at the server; want 2 runs of 4 copies (each call hedged once)", srv.n(), arrived.Load())
		}
		for i, k := range srv.keys {
			if k == "" || i > 0 && k == srv.keys[i-1] {
				t.Errorf("handler runs had keys %q, want one key per call", srv.keys)
			}
		}
	})
}

// countingBudget is a retry budget that counts the withdrawals it grants.
type countingBudget struct {
	*budget.Budget
	granted atomic.Int64
}

func (b *countingBudget) Withdraw() bool {
	ok := b.Budget.Withdraw()
	if ok {
		b.granted.Add(1)
	}
	return ok
}

// TestAttackHedgeBudgetConcurrent: 200 callers at once, a fifth of the
// answers slow, 2 hedges allowed: the hedges on the wire are exactly the
// budget's grants, within its limit, and no call sends more than 2.
func TestAttackHedgeBudgetConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			if i%5 == 0 {
				return legAnswer{delay: 300 * time.Millisecond}
			}
			return legAnswer{delay: time.Duration(i%3+1) * 10 * time.Millisecond}
		}}
		b := &countingBudget{Budget: newBudget(t)}
		// No limiter (WithLimit(nil)): the subject is the budget's
		// accounting. With the default limiter (cold: 10 slots) the 200
		// callers hold every slot, and a hedge the budget granted finds
		// none (a refused slot wastes its withdrawal, by design).
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 2, unaryMethod), grpcretry.WithLimit(nil), withGuards(retry.Guards{Budget: b}))...)
		var wg sync.WaitGroup
		var failed atomic.Int64
		for range 200 {
			wg.Go(func() {
				for range 5 {
					if _, _, err := hedgeCall(t.Context(), c); err != nil {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		srv.settle(t)
		hedges := 0
		for _, p := range strings.Split(srv.calls(), "|") {
			switch p {
			case "":
			case "1", "2":
				hedges++
			default:
				t.Errorf("a copy numbered %q on the wire; want at most 2 hedges per call", p)
			}
		}
		st := b.Stats()
		if int64(hedges) != b.granted.Load() || float64(st.Retries) > st.Limit || hedges == 0 {
			t.Errorf("%d hedges on the wire, %d granted, budget %+v; want as many as granted, some, within the limit", hedges, b.granted.Load(), st)
		}
		if failed.Load() != 0 {
			t.Errorf("%d calls failed, want none", failed.Load())
		}
		t.Logf("1000 calls: %d server calls, %d hedges, budget %+v", srv.n(), hedges, st)
	})
}

// hintServer answers its first unary call at once with UNAVAILABLE and
// the given pushback trailer values and RetryInfo delay (nil: none), and
// every later call OK after a second.
type hintServer struct {
	testpb.UnimplementedTestServiceServer
	push  []string
	info  *durationpb.Duration
	calls atomic.Int64
}

func (s *hintServer) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	if s.calls.Add(1) == 1 {
		if s.push != nil {
			_ = grpc.SetTrailer(ctx, metadata.MD{"grpc-retry-pushback-ms": s.push})
		}
		st := status.New(codes.Unavailable, "hint")
		if s.info != nil {
			st, _ = st.WithDetails(&errdetails.RetryInfo{RetryDelay: s.info})
		}
		return nil, st.Err()
	}
	select {
	case <-time.After(time.Second):
		return &testpb.SimpleResponse{}, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// TestAttackHedgeAbsurdHints: a hint too large to add to a clock holds
// hedges back for a very long time (saturated), never wraps to "the past";
// a malformed or negative one holds them 5 s; a RetryInfo that is not
// valid holds nothing.
func TestAttackHedgeAbsurdHints(t *testing.T) {
	tests := []struct {
		name  string
		push  []string
		info  *durationpb.Duration
		after time.Duration // the wait before the second call
		hedge bool          // whether the second call is hedged
	}{
		{"pushback beyond int64 ms (malformed: a stop), within 5s", []string{"99999999999999999999999999"}, nil, 4 * time.Second, false},
		{"pushback beyond int64 ms (malformed: a stop), after 5s", []string{"99999999999999999999999999"}, nil, 5 * time.Second, true},
		{"pushback of 200 years and more, after the saturated hold", []string{"2000000000000000"}, nil, 201 * 365 * 24 * time.Hour, true},
		{"pushback of MaxInt64 ms", []string{strconv.FormatInt(math.MaxInt64, 10)}, nil, 30 * 365 * 24 * time.Hour, false},
		{"RetryInfo of 10,000 years", nil, &durationpb.Duration{Seconds: 315576000000}, 30 * 365 * 24 * time.Hour, false},
		{"pushback and RetryInfo both huge", []string{"9223372036854775807"}, &durationpb.Duration{Seconds: 315576000000}, 30 * 365 * 24 * time.Hour, false},
		{"negative pushback, within 5s", []string{"-9223372036854775808"}, nil, 4 * time.Second, false},
		{"negative pushback, after 5s", []string{"-1"}, nil, 5 * time.Second, true},
		{"garbage pushback, after 5s", []string{"1e9"}, nil, 5 * time.Second, true},
		{"negative RetryInfo (not valid)", nil, &durationpb.Duration{Seconds: -5}, 0, true},
		{"RetryInfo out of range (not valid)", nil, &durationpb.Duration{Seconds: math.MaxInt64}, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &hintServer{push: tt.push, info: tt.info}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithBudget(&budget.Config{MinPerSecond: 1000}))...)
				if _, _, err := hedgeCall(t.Context(), c); status.Code(err) != codes.Unavailable {
					t.Fatalf("first call: %v, want the UNAVAILABLE", err)
				}
				time.Sleep(tt.after)
				if _, _, err := hedgeCall(t.Context(), c); err != nil {
					t.Fatalf("second call: %v", err)
				}
				if hedged := srv.calls.Load() == 3; hedged != tt.hedge {
					t.Errorf("%d server calls: hedged %v, want %v", srv.calls.Load(), hedged, tt.hedge)
				}
			})
		})
	}
}

// listService is a service with one unary method whose reply has a
// repeated field: each call answers, after delays[i], the list of three
// numbers i, and a header "leg: i".
type listService struct {
	delays []time.Duration
	mu     sync.Mutex
	n      int
}

const listMethod = "/attack.Lists/Get"

func (s *listService) register(srv *grpc.Server) {
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "attack.Lists",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Get", Handler: func(_ any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			if err := dec(new(emptypb.Empty)); err != nil {
				return nil, err
			}
			s.mu.Lock()
			i := s.n
			s.n++
			s.mu.Unlock()
			select {
			case <-time.After(s.delays[min(i, len(s.delays)-1)]):
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			_ = grpc.SetHeader(ctx, metadata.Pairs("leg", strconv.Itoa(i)))
			return listOf(i), nil
		}}},
	}, s)
}

func listOf(i int) *structpb.ListValue {
	v := structpb.NewNumberValue(float64(i))
	return &structpb.ListValue{Values: []*structpb.Value{v, v, v}}
}

// TestAttackHedgeReplyRepeated: the caller's reply is the winner's alone,
// header included, whatever it held before and however close the copies
// answer: a repeated field is never merged with another copy's, or with
// what the reply held.
func TestAttackHedgeReplyRepeated(t *testing.T) {
	tests := []struct {
		name   string
		delays []time.Duration
		want   []int // the legs the reply may be from
	}{
		{"hedge wins", []time.Duration{time.Second, 10 * time.Millisecond}, []int{1}},
		{"both answer at the same instant", []time.Duration{100 * time.Millisecond, 50 * time.Millisecond}, []int{0, 1}},
		{"first copy wins", []time.Duration{60 * time.Millisecond, time.Second}, []int{0}},
		{"second hedge wins, first hedge at the same instant", []time.Duration{time.Second, 100 * time.Millisecond, 50 * time.Millisecond}, []int{1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &listService{delays: tt.delays}
				conn := serveConn(t, s.register, nil, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 2, listMethod))...)
				reply := listOf(99)
				var header metadata.MD
				if err := conn.Invoke(t.Context(), listMethod, &emptypb.Empty{}, reply, grpc.Header(&header)); err != nil {
					t.Fatal(err)
				}
				leg, err := strconv.Atoi(strings.Join(header["leg"], ","))
				if err != nil || !proto.Equal(reply, listOf(leg)) || !containsInt(tt.want, leg) {
					t.Errorf("reply %v with header leg %q; want the list of one of the legs %v, and its header", reply, header["leg"], tt.want)
				}
			})
		})
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestAttackHedgeDeadline: no copy outlives the caller's deadline, with
// or without an attempt timeout that would reach past it, and once the
// call has returned and its copies' ends are collected, no goroutine of
// the race is left.
func TestAttackHedgeDeadline(t *testing.T) {
	for _, attemptTimeout := range []time.Duration{0, 80 * time.Millisecond} {
		t.Run("attempt timeout "+attemptTimeout.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: func(i int) legAnswer {
					if i == 0 {
						return legAnswer{delay: time.Millisecond}
					}
					return legAnswer{delay: time.Hour}
				}}
				opts := []grpcretry.Option{grpcretry.WithHedging(30*time.Millisecond, 0, 3, unaryMethod), grpcretry.WithBudget(&budget.Config{MinPerSecond: 100})}
				if attemptTimeout > 0 {
					opts = append(opts, grpcretry.WithAttemptTimeout(attemptTimeout))
				}
				c := serveInMemory(t, srv, newClient(t, opts...)...)
				if _, _, err := hedgeCall(t.Context(), c); err != nil { // warm the connection
					t.Fatal(err)
				}
				synctest.Wait()
				before := packageGoroutines()
				ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
				defer cancel()
				_, took, err := hedgeCall(ctx, c)
				synctest.Wait() // no fake time passes: what is left now outlives the call
				if status.Code(err) != codes.DeadlineExceeded || took != 100*time.Millisecond {
					t.Errorf("call = %v after %v, want DEADLINE_EXCEEDED after 100ms", err, took)
				}
				if n := srv.inflight.Load(); n != 0 {
					t.Errorf("%d copies still run on the server at the caller's deadline", n)
				}
				// Hedges at 30, 60 and 90 ms; with the attempt timeout the
				// first copy fails at 80 ms, and no hedge goes after a
				// failure in the race.
				want := 4
				if attemptTimeout > 0 {
					want = 3
				}
				if got := srv.n() - 1; got != want {
					t.Errorf("%d copies sent, want %d", got, want)
				}
				if after := packageGoroutines(); after > before {
					t.Errorf("%d goroutines running the package's code after the call, %d before", after, before)
				}
			})
		})
	}
}

// packageGoroutines counts the goroutines with a frame of the package's
// shipped code on their stack (the race's timer and copies): unlike
// runtime.NumGoroutine, it does not count gRPC's or the test runner's own,
// which come and go outside the call (counting those failed 1 run in 100).
func packageGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "stormguard/grpcretry.") {
			count++
		}
	}
	return count
}

// TestAttackHedgeErrorsIs: a hedged call that fails reads as an *Error
// whatever copy failed last.
func TestAttackHedgeErrorsIs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			if i == 0 {
				return legAnswer{delay: 100 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 200 * time.Millisecond, code: codes.Unavailable}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithBudget(&budget.Config{MinPerSecond: 100}))...)
		_, took, err := hedgeCall(t.Context(), c)
		var ge *grpcretry.Error
		if !errors.As(err, &ge) || status.Code(err) != codes.Unavailable || took != 250*time.Millisecond {
			t.Errorf("call = %v after %v; want the hedge's UNAVAILABLE as an *Error after 250ms", err, took)
		}
		srv.settle(t)
	})
}

// TestAttackHedgeBreakerTripsMidRace: a breaker that opens while a call's
// first copy is in flight (another call's failure tripped it) lets no
// hedge of that call go when it is due.
func TestAttackHedgeBreakerTripsMidRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			if i == 1 {
				return legAnswer{delay: time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: time.Second}
		}}
		b := newBudget(t)
		br, err := breaker.New(breaker.Config{MinCalls: 1, OpenFor: time.Hour, MaxOpenFor: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			withGuards(retry.Guards{Budget: b, Breaker: br}))...)
		done := make(chan error)
		go func() {
			_, _, err := hedgeCall(t.Context(), c)
			done <- err
		}()
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		if _, _, err := hedgeCall(t.Context(), c); status.Code(err) != codes.Unavailable { // trips the breaker
			t.Fatalf("second call: %v, want UNAVAILABLE", err)
		}
		if err := <-done; err != nil {
			t.Errorf("first call: %v", err)
		}
		if srv.n() != 2 || b.Stats().Retries != 0 {
			t.Errorf("%d server calls, %d budget withdrawals; want 2 calls, no hedge", srv.n(), b.Stats().Retries)
		}
		srv.settle(t)
	})
}

// TestAttackHedgeNotEligible: no hedge for a method named in another case
// or with a trailing slash, for a reply that is not a proto message, or
// with a learned delay from 19 good answers among failures or from 20
// answers more than 20 s old (two windows); and no panic
// with guards whose budget is a nil *budget.Budget and no breaker.
func TestAttackHedgeNotEligible(t *testing.T) {
	tests := []struct {
		name   string
		opts   []grpcretry.Option
		warm   func(t *testing.T, c testpb.TestServiceClient, srv *legServer)
		invoke func(ctx context.Context, conn *grpc.ClientConn) error
	}{
		{name: "method in another case", opts: []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, strings.ToLower(unaryMethod))}},
		{name: "reply not a proto message", opts: []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod)},
			invoke: func(ctx context.Context, conn *grpc.ClientConn) error {
				var raw []byte
				return conn.Invoke(ctx, unaryMethod, &testpb.SimpleRequest{}, &raw, grpc.ForceCodec(rawCodec{}))
			}},
		{name: "nil budget in supplied guards", opts: []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			withGuards(retry.Guards{Budget: (*budget.Budget)(nil), Breaker: nil, Limiter: nil})}},
		{name: "20 good answers more than 20 s ago", opts: []grpcretry.Option{grpcretry.WithHedging(0, 0.5, 1, unaryMethod)},
			warm: func(t *testing.T, c testpb.TestServiceClient, srv *legServer) {
				srv.mu.Lock()
				srv.answer = delays(time.Millisecond)
				srv.mu.Unlock()
				for range 20 {
					_, _, _ = hedgeCall(t.Context(), c)
				}
				time.Sleep(20 * time.Second)
				srv.mu.Lock()
				srv.answer = delays(time.Second)
				srv.mu.Unlock()
			}},
		{name: "19 good answers among 40 failures", opts: []grpcretry.Option{grpcretry.WithHedging(0, 0.5, 1, unaryMethod), grpcretry.WithBreaker(nil)},
			warm: func(t *testing.T, c testpb.TestServiceClient, srv *legServer) {
				srv.mu.Lock()
				srv.answer = func(i int) legAnswer {
					if i%3 == 0 && i < 57 {
						return legAnswer{delay: time.Millisecond} // 19 of them
					}
					return legAnswer{delay: time.Millisecond, code: codes.Unavailable}
				}
				srv.mu.Unlock()
				for range 59 {
					_, _, _ = hedgeCall(t.Context(), c)
				}
				time.Sleep(100 * time.Millisecond)
				srv.mu.Lock()
				srv.answer = delays(time.Second)
				srv.mu.Unlock()
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: delays(time.Second)}
				conn := serveConn(t, func(s *grpc.Server) { testpb.RegisterTestServiceServer(s, srv) }, nil, newClient(t, tt.opts...)...)
				c := testpb.NewTestServiceClient(conn)
				if tt.warm != nil {
					tt.warm(t, c, srv)
				}
				before := srv.n()
				invoke := tt.invoke
				if invoke == nil {
					invoke = func(ctx context.Context, _ *grpc.ClientConn) error { _, _, err := hedgeCall(ctx, c); return err }
				}
				start := time.Now()
				if err := invoke(t.Context(), conn); err != nil || time.Since(start) != time.Second || srv.n()-before != 1 {
					t.Errorf("call: %v after %v, %d server calls; want the first copy's answer after 1s, no hedge", err, time.Since(start), srv.n()-before)
				}
				srv.settle(t)
			})
		})
	}
}

// TestAttackHedgeStormAccounting: 20 callers at once (2 in every other
// round) with deadlines from 35 to 235 ms, slow and failing answers, up to 3 hedges under a
// limiter: afterwards every limiter slot is back exactly once (the limit
// is free, and no more), every hedge the observer heard start it heard
// end, and no hedge reached the server unheard.
func TestAttackHedgeStormAccounting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			switch {
			case i%8 == 0:
				return legAnswer{delay: 80 * time.Millisecond}
			case i%29 == 0:
				return legAnswer{delay: 15 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: time.Duration(10+i%4*10) * time.Millisecond}
		}}
		lim, err := limit.New(limit.Config{Max: 64})
		if err != nil {
			t.Fatal(err)
		}
		var log eventLog
		b, err := budget.New(budget.Config{MinPerSecond: 1000})
		if err != nil {
			t.Fatal(err)
		}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(30*time.Millisecond, 0, 3, unaryMethod), grpcretry.WithObserver(&log),
			withGuards(retry.Guards{Budget: b, Limiter: lim}))...)
		// The limiter learns its limit down under this load (as it does
		// without hedging), leaving hedges few slots, none at all when the
		// callers fill it from the start: storm until some hedge went, at
		// most 10 times, every other round with 1 caller instead of 20 (a
		// lone caller leaves its hedge a slot whenever the limit is 2 or
		// more; with 2 callers a limit of 2 left none, and 5 such rounds
		// in a row without a hedge failed once in CI).
		rounds := 0
		for round := 0; round < 10 && !strings.Contains(srv.calls(), "1"); round++ {
			rounds++
			callers := 20
			if round%2 == 1 {
				callers = 1
			}
			var wg sync.WaitGroup
			for g := range callers {
				wg.Go(func() {
					for k := range 25 {
						ctx, cancel := context.WithTimeout(t.Context(), time.Duration(35+(g*37+k*101)%200)*time.Millisecond)
						_, _, _ = hedgeCall(ctx, c)
						cancel()
					}
				})
			}
			wg.Wait()
			srv.settle(t)
		}
		starts, ends := 0, 0
		for _, e := range log.take() {
			switch {
			case !e.Hedge:
			case e.Kind == observe.AttemptStart:
				starts++
			case e.Kind == observe.AttemptEnd:
				ends++
			}
		}
		wire := 0
		for _, p := range strings.Split(srv.calls(), "|") {
			if p != "" {
				wire++
			}
		}
		// A hedge canceled before its stream reached the server is heard
		// but never handled there.
		if starts != ends || wire > starts || wire == 0 {
			t.Errorf("observer heard %d hedges start and %d end, %d hedges on the wire; want as many ends as starts, no more on the wire, some", starts, ends, wire)
		}
		var ps []limit.Permit
		for range lim.Limit() {
			p, err := lim.Acquire(context.Background())
			if err != nil {
				t.Fatalf("after the storm the limiter refuses a slot within its limit %d: %v", lim.Limit(), err)
			}
			ps = append(ps, p)
		}
		done, cancel := context.WithCancel(context.Background())
		cancel() // a free slot or none: no wait
		if p, err := lim.Acquire(done); err == nil {
			lim.Release(p, false)
			t.Errorf("the limiter grants a slot beyond its limit %d: a slot was given back twice", lim.Limit())
		}
		for _, p := range ps {
			lim.Release(p, false)
		}
		t.Logf("%d server calls, %d hedges, limit %d, rounds %d", srv.n(), wire, lim.Limit(), rounds)
	})
}

// TestAttackHedgePushbackFromAHedge: a hedge that meets RESOURCE_EXHAUSTED
// lets its first copy win, and holds the target's hedges back for 5 s
// like a pushback on a first copy.
func TestAttackHedgePushbackFromAHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &legServer{answer: func(i int) legAnswer {
			switch i {
			case 0:
				return legAnswer{delay: 200 * time.Millisecond}
			case 1:
				return legAnswer{delay: time.Millisecond, code: codes.ResourceExhausted}
			}
			return legAnswer{delay: time.Second}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod), grpcretry.WithBudget(&budget.Config{MinPerSecond: 100}))...)
		if reply, took, err := hedgeCall(t.Context(), c); err != nil || reply != "call-0" || took != 200*time.Millisecond {
			t.Fatalf("first call = %q after %v, %v; want call-0 after 200ms", reply, took, err)
		}
		time.Sleep(4 * time.Second)
		if _, took, err := hedgeCall(t.Context(), c); err != nil || took != time.Second || srv.n() != 3 {
			t.Errorf("within 5 s: %v after %v, %d server calls; want no hedge", err, took, srv.n())
		}
		time.Sleep(time.Second)
		if _, took, err := hedgeCall(t.Context(), c); err != nil || took != time.Second || srv.n() != 5 {
			t.Errorf("after 5 s: %v after %v, %d server calls; want a hedge sent, the first copy's answer after 1s", err, took, srv.n())
		}
		srv.settle(t)
	})
}

// TestAttackHedgeWhileFirstCopyDecodes: the first copy writes into the
// caller's reply (as gRPC does when it decodes an answer) while the hedge
// goes out. The race must not read the caller's reply to make the hedge's
// own (it did, to learn the reply's type: a data race the race detector
// reports). Real time, not a bubble: the first copy writes without
// blocking until the hedge is sent, so the two run side by side.
func TestAttackHedgeWhileFirstCopyDecodes(t *testing.T) {
	srv := &legServer{answer: delays(0)}
	var n atomic.Int64
	var hedged atomic.Bool
	inner := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if n.Add(1) == 1 {
			for !hedged.Load() && ctx.Err() == nil {
				reply.(*testpb.SimpleResponse).Reset() // what decoding an answer does first
				runtime.Gosched()
			}
		} else {
			hedged.Store(true)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := serveInMemory(t, srv, append(newClient(t, grpcretry.WithHedging(5*time.Millisecond, 0, 1, unaryMethod),
		withGuards(retry.Guards{Budget: newBudget(t)})), grpc.WithChainUnaryInterceptor(inner))...)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if reply, _, err := hedgeCall(ctx, c); err != nil || !strings.HasPrefix(reply, "call-") {
		t.Errorf("call = %q, %v; want a copy's answer", reply, err)
	}
	if !hedged.Load() {
		t.Errorf("no hedge went: the attack did not run")
	}
}

// TestAttackHedgeObserverPanic: an observer that panics hearing of a
// hedge's start or end (on the race's timer goroutine) leaves the call
// with its value, in the caller's goroutine, as an invoker's panic does:
// it once ended the program from the timer's goroutine.
func TestAttackHedgeObserverPanic(t *testing.T) {
	for _, kind := range []observe.Kind{observe.AttemptStart, observe.AttemptEnd} {
		t.Run(string(kind), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: delays(time.Second, 10*time.Millisecond)}
				o := observe.Func(func(_ context.Context, e observe.Event) {
					if e.Hedge && e.Kind == kind {
						panic("observer bug")
					}
				})
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
					withGuards(retry.Guards{Budget: newBudget(t)}), grpcretry.WithObserver(o))...)
				v := panicking(func() { _, _, _ = hedgeCall(t.Context(), c) })
				if v != "observer bug" {
					t.Errorf("the call panicked with %v, want the observer's value", v)
				}
				srv.settle(t)
			})
		})
	}
}

// TestAttackHedgeEarlierHedgeHintStands: a hedge that fails before the
// first copy does, with a pushback (a longer floor, or the don't-retry
// signal), is not dropped for the first copy's plain failure: the server's
// word stands for the retry loop (it was, and the retry went 5 ms later,
// or at all).
func TestAttackHedgeEarlierHedgeHintStands(t *testing.T) {
	for _, tc := range []struct {
		name    string
		push    string
		calls   int           // server calls in all
		retryAt time.Duration // the retry's earliest time, from the call's start
	}{
		{"pushback of 10 s", "10000", 3, 10 * time.Second},
		{"don't retry", "-1", 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: func(i int) legAnswer {
					switch i {
					case 0: // the first copy: a plain failure, after the hedge's
						return legAnswer{delay: 50 * time.Millisecond, code: codes.Unavailable}
					case 1: // the hedge: fails first, with the server's word
						return legAnswer{delay: 10 * time.Millisecond, code: codes.Unavailable, pushback: []string{tc.push}}
					}
					return legAnswer{}
				}}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(10*time.Millisecond, 0, 1, unaryMethod),
					grpcretry.WithIdempotentMethods(unaryMethod), withGuards(retry.Guards{Budget: newBudget(t)}),
					grpcretry.WithRetry(retry.WithMaxAttempts(2)))...)
				_, took, err := hedgeCall(t.Context(), c)
				if n := srv.n(); n != tc.calls {
					t.Errorf("%d server calls (%s), want %d; err %v", n, srv.calls(), tc.calls, err)
				}
				if tc.retryAt > 0 && (err != nil || took < tc.retryAt) {
					t.Errorf("call took %v, err %v; want the retry at %v or later, and its success", took, err, tc.retryAt)
				}
				srv.settle(t)
			})
		})
	}
}
