package grpcretry_test

import (
	"context"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/stormguard/stormguard/grpcretry"
)

// staticServer answers every call with the same response: no allocation of
// its own, so that allocation counts compare the clients.
type staticServer struct {
	testpb.UnimplementedTestServiceServer
	resp *testpb.SimpleResponse
}

func (s *staticServer) UnaryCall(context.Context, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return s.resp, nil
}

// TestSuccessPathAllocs: a successful unary call through the interceptor
// (budget and breaker on) allocates at most 2 objects more than a bare
// call: the call's options with the trailer they read into, and grpc-go's
// copy of the (empty) trailer.
func TestSuccessPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts over a live connection")
	}
	addr := serve(t, &staticServer{resp: &testpb.SimpleResponse{}})
	bare := dial(t, addr)
	guarded := dial(t, addr, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod))...)
	req := &testpb.SimpleRequest{}
	allocs := func(c testpb.TestServiceClient) float64 {
		ctx := context.Background()
		for range 100 { // connect and warm up
			if _, err := c.UnaryCall(ctx, req); err != nil {
				t.Fatal(err)
			}
		}
		return testing.AllocsPerRun(1000, func() { _, _ = c.UnaryCall(ctx, req) })
	}
	b, g := allocs(bare), allocs(guarded)
	if g-b > 2 {
		t.Errorf("a successful call allocates %v objects through the interceptor, %v bare: %v more, want at most 2", g, b, g-b)
	}
	t.Logf("allocs per call: bare %v, through grpcretry %v", b, g)
}

// TestHedgeSuccessPathAllocs: hedging adds no allocation to a successful
// call that runs no race: a method not declared for hedging, or a
// declared one whose hedges are held back (here: no budget; or its delay
// not learned yet, its target pushing back...). A declared call that
// runs a race its first copy wins (a fixed delay it answers within) costs
// maxRaceAllocs more, on a context that never ends and on a cancelable
// one (none on a context whose deadline comes before the delay: no hedge
// could go, so no race runs): the first copy's own cancelable context (by a memory profile: the
// context, its cancel func, the Done channel grpc-go waits on, and the
// table in which grpc-go's own context registers under it). The race's
// state and timer come from a pool, and the first copy runs on the
// caller's goroutine.
func TestHedgeSuccessPathAllocs(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts over a live connection")
	}
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector (sync.Pool drops items)")
	}
	addr := serve(t, &staticServer{resp: &testpb.SimpleResponse{}})
	req := &testpb.SimpleRequest{}
	cancelable, cancel := context.WithCancel(context.Background())
	defer cancel()
	short, cancelShort := context.WithTimeout(context.Background(), 30*time.Minute) // before the delay of an hour
	defer cancelShort()
	for _, ctx := range []context.Context{context.Background(), cancelable, short} {
		allocs := func(opts ...grpcretry.Option) float64 {
			c := dial(t, addr, newClient(t, append(opts, grpcretry.WithIdempotentMethods(unaryMethod))...)...)
			for range 100 { // connect and warm up
				if _, err := c.UnaryCall(ctx, req); err != nil {
					t.Fatal(err)
				}
			}
			return testing.AllocsPerRun(1000, func() { _, _ = c.UnaryCall(ctx, req) })
		}
		plain := allocs()
		other := allocs(grpcretry.WithHedging(time.Hour, 0, 1, "/other.Service/Get"))
		held := allocs(grpcretry.WithHedging(time.Hour, 0, 1, unaryMethod), grpcretry.WithBudget(nil))
		raced := allocs(grpcretry.WithHedging(time.Hour, 0, 1, unaryMethod))
		t.Logf("on %v: allocs per call: no hedging %v, another method hedged %v, hedges held back %v, raced %v", ctx, plain, other, held, raced)
		if other != plain || held != plain {
			t.Errorf("on %v: a call that runs no race allocates %v (another method hedged) and %v (hedges held back), %v without hedging; want the same", ctx, other, held, plain)
		}
		if ctx == short && raced != plain { // no hedge could go before the deadline: no race
			t.Errorf("on %v: a call whose deadline comes before the delay allocates %v, %v without hedging; want the same", ctx, raced, plain)
		}
		if raced-plain > maxRaceAllocs {
			t.Errorf("on %v: a raced call its first copy wins allocates %v, %v more than without hedging; want at most %v", ctx, raced, raced-plain, maxRaceAllocs)
		}
	}
}

// maxRaceAllocs is what a race its first copy wins adds over the same
// call without hedging (TestHedgeSuccessPathAllocs): 5 measured, was 7
// when the first copy ran on a goroutine of its own. Not 0: the first
// copy must be cancelable when a hedge wins, so it goes on a context of
// the race's, which cannot come from a pool (its Value must answer for
// the call's own context, and a context may be kept past its call).
const maxRaceAllocs = 5
