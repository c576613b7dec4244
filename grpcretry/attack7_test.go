package grpcretry_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
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

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// g26Obs records every event.
type g26Obs struct {
	mu sync.Mutex
	ev []observe.Event
}

func (o *g26Obs) Observe(_ context.Context, e observe.Event) {
	o.mu.Lock()
	o.ev = append(o.ev, e)
	o.mu.Unlock()
}

func (o *g26Obs) events() []observe.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]observe.Event(nil), o.ev...)
}

func (o *g26Obs) hedgeStarts() int {
	n := 0
	for _, e := range o.events() {
		if e.Kind == observe.AttemptStart && e.Hedge {
			n++
		}
	}
	return n
}

// doc.go (table): DEADLINE_EXCEEDED is retried "only when the attempt's
// own timeout (WithAttemptTimeout) cut it off and the call still has
// time"; WithAttemptTimeout: "this is the only DEADLINE_EXCEEDED that is
// retried". A server that answers DEADLINE_EXCEEDED of its own at once
// (its dependency's deadline), long before a 4 ms attempt timeout could
// fire, must get one attempt.
func TestAttackGrpcServerDeadlineExceededShortAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{script: []answer{fail(codes.DeadlineExceeded)}}
		obs := &g26Obs{}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithAttemptTimeout(4*time.Millisecond), grpcretry.WithObserver(obs),
			grpcretry.WithRetry(retry.WithBackoff(quick()), retry.WithMaxAttempts(3)))...)
		start := time.Now()
		_, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if srv.Calls() != 1 {
			t.Errorf("server answered DEADLINE_EXCEEDED at once, each attempt before its 4ms timeout (all %d took %v): want 1 attempt (not the attempt timeout); err %v",
				srv.Calls(), time.Since(start), err)
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("code %v, want DEADLINE_EXCEEDED", status.Code(err))
		}
	})
}

// The same with an attempt timeout of 50 ms: one attempt (control).
func TestAttackGrpc7ServerDeadlineExceededNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{script: []answer{fail(codes.DeadlineExceeded)}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithAttemptTimeout(50*time.Millisecond),
			grpcretry.WithRetry(retry.WithBackoff(quick()), retry.WithMaxAttempts(3)))...)
		_, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if srv.Calls() != 1 || status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("%d attempts, code %v; want 1, DEADLINE_EXCEEDED", srv.Calls(), status.Code(err))
		}
	})
}

// g26Throttled puts lim's throttle (K = 2) at a known share: on a fresh
// history, drops dropped attempts and accepts good ones through the
// limiter itself, counting the local refusals as the throttle does. It
// returns the share of calls the limiter now rejects.
func g26Throttled(t *testing.T, lim *limit.Limiter, drops, accepts int) float64 {
	t.Helper()
	var r, a int
	for i := range drops + accepts {
		p, err := lim.Acquire(context.Background())
		r++
		if err != nil {
			continue
		}
		dropped := i < drops
		lim.Release(p, dropped)
		if !dropped {
			a++
		}
	}
	return max(0, float64(r-2*a)/float64(r+1))
}

// WithHedging: "A hedge is only sent when ... its concurrency limiter
// (WithLimit) has a free slot at once ... and is not throttling";
// docs/grpc.md: "none while ... its limiter is at its limit or
// throttling". With the target's limiter throttling (its share of calls
// rejected above 0, known exactly from the history the test made), no
// hedge may go.
func TestAttackGrpcNoHedgeWhileThrottling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limit.New(limit.Config{Throttle: 2})
		if err != nil {
			t.Fatal(err)
		}
		b, err := budget.New(budget.Config{MinPerSecond: 1000})
		if err != nil {
			t.Fatal(err)
		}
		obs := &g26Obs{}
		srv := &legServer{answer: delays(time.Second)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithObserver(obs), grpcretry.WithRetry(retry.WithMaxAttempts(1)),
			withGuards(retry.Guards{Budget: b, Limiter: lim}))...)
		raced, hedged := 0, 0
		var shares []float64
		for range 200 {
			time.Sleep(2 * time.Second) // a fresh throttle history
			share := g26Throttled(t, lim, 6, 2)
			if share <= 0 {
				continue
			}
			before := obs.hedgeStarts()
			if _, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
				continue // the first copy was throttled: no race
			}
			raced++
			if obs.hedgeStarts() > before {
				hedged++
				shares = append(shares, share)
			}
		}
		if raced == 0 {
			t.Fatal("no call got through the throttle: the test proves nothing")
		}
		if hedged > 0 {
			t.Errorf("%d of %d races sent a hedge while the target's limiter was throttling (share rejected %.2f...)", hedged, raced, shares)
		}
	})
}

// Control: the same limiter, not throttling (no drops): the hedge goes.
func TestAttackGrpc7HedgeGoesWithIdleThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, err := limit.New(limit.Config{Throttle: 2})
		if err != nil {
			t.Fatal(err)
		}
		b, err := budget.New(budget.Config{MinPerSecond: 1000})
		if err != nil {
			t.Fatal(err)
		}
		obs := &g26Obs{}
		srv := &legServer{answer: delays(time.Second)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithObserver(obs), grpcretry.WithRetry(retry.WithMaxAttempts(1)),
			withGuards(retry.Guards{Budget: b, Limiter: lim}))...)
		if share := g26Throttled(t, lim, 0, 5); share != 0 {
			t.Fatalf("share %v", share)
		}
		if _, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
		if obs.hedgeStarts() != 1 {
			t.Errorf("%d hedges; want 1", obs.hedgeStarts())
		}
		srv.settle(t)
	})
}

// options.go: the table of targets holds 1024; "the target that entered
// the table first is forgotten when a new one comes, its guards starting
// afresh if it comes back"; package observe: the observer hears a
// forgotten breaker go (BreakerState, To "", Reason "forgotten").
func TestAttackGrpc7EvictionForgotten(t *testing.T) {
	obs := &g26Obs{}
	fails := true
	var mu sync.Mutex
	//lint:ignore ST1008 the signature of atk3Term.answer (attack3_test.go)
	z := &atk3Term{answer: func(int) (error, metadata.MD) {
		mu.Lock()
		defer mu.Unlock()
		if fails {
			return status.Error(codes.Unavailable, "down"), nil
		}
		return nil, nil
	}}
	dopts, err := grpcretry.DialOptions(grpcretry.WithObserver(obs), grpcretry.WithIdempotentMethods(unaryMethod),
		grpcretry.WithBreaker(&breaker.Config{MinCalls: 2, OpenFor: time.Hour}), grpcretry.WithRetry(retry.WithMaxAttempts(1)))
	if err != nil {
		t.Fatal(err)
	}
	dopts = append(dopts, grpc.WithChainUnaryInterceptor(z.intercept), grpc.WithTransportCredentials(insecure.NewCredentials()))
	conn := func(target string) *grpc.ClientConn {
		cc, err := grpc.NewClient(target, dopts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	ctx := t.Context()
	first := conn("passthrough:///g26-t0")
	for range 5 {
		_ = atk3Invoke(ctx, first)
	}
	if err := atk3Invoke(ctx, first); status.Code(err) != codes.Unavailable || !isOpen(err) {
		t.Fatalf("the first target's breaker should be open: %v", err)
	}
	mu.Lock()
	fails = false
	mu.Unlock()
	for i := 1; i < 1024; i++ {
		_ = atk3Invoke(ctx, conn(fmt.Sprintf("passthrough:///g26-t%d", i)))
	}
	for _, e := range obs.events() {
		if e.Kind == observe.BreakerState && e.Reason == "forgotten" {
			t.Fatalf("a target forgotten with 1024 in the table: %+v", e)
		}
	}
	_ = atk3Invoke(ctx, conn("passthrough:///g26-t1024"))
	var forgotten []observe.Event
	for _, e := range obs.events() {
		if e.Kind == observe.BreakerState && e.Reason == "forgotten" {
			forgotten = append(forgotten, e)
		}
	}
	if len(forgotten) != 1 || forgotten[0].Name != "passthrough:///g26-t0" || forgotten[0].From != "open" || forgotten[0].To != "" {
		t.Errorf("forgotten events %+v; want one for g26-t0 from open", forgotten)
	}
	// Back: its guards start afresh (a closed breaker).
	if err := atk3Invoke(ctx, first); err != nil {
		t.Errorf("the first target, back after its eviction, still refused: %v", err)
	}
}

func isOpen(err error) bool {
	var e *grpcretry.Error
	return errors.As(err, &e) && errors.Is(err, retry.CircuitOpen)
}

type g26Srv struct {
	addr string
	stop func()
}

// serveNoCleanup starts s on loopback; the caller stops it.
func serveNoCleanup(t *testing.T, s testpb.TestServiceServer) g26Srv {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, s)
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	return g26Srv{addr: ln.Addr().String(), stop: func() { srv.Stop(); <-done }}
}

// No goroutine is left behind by hedged calls whose callers cancel
// mid-race, once the connection and the server are closed.
func TestAttackGrpc7HedgeCancelNoLeak(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		srv := &legServer{answer: delays(200 * time.Millisecond)}
		ln := serveNoCleanup(t, srv)
		dopts := newClient(t, grpcretry.WithHedging(time.Millisecond, 0, 3, unaryMethod),
			grpcretry.WithIdempotentMethods(unaryMethod))
		cc, err := grpc.NewClient(ln.addr, append(dopts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		c := testpb.NewTestServiceClient(cc)
		var wg sync.WaitGroup
		for range 20 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
				defer cancel()
				_, _ = c.UnaryCall(ctx, &testpb.SimpleRequest{})
			})
		}
		wg.Wait()
		_ = cc.Close()
		ln.stop()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines after, %d before:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}
