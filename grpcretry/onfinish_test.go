package grpcretry_test

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/stormguard/stormguard/grpcretry"
)

// TestOnFinishOncePerCall: a grpc.OnFinish callback runs once per call,
// with the error the call returns, however many copies the call sent:
// hedges (a losing one ends after the call returned) and retries alike,
// as gRPC runs it once per call.
func TestOnFinishOncePerCall(t *testing.T) {
	hedged := grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod)
	for _, tt := range []struct {
		name    string
		answers func(int) legAnswer
		opts    []grpcretry.Option
		calls   int  // server calls the call makes
		fails   bool // the call returns an error
	}{
		{"hedge wins", delays(time.Second, 10*time.Millisecond), []grpcretry.Option{hedged}, 2, false},
		{"first copy wins after a hedge went", delays(60*time.Millisecond, time.Second), []grpcretry.Option{hedged}, 2, false},
		{"first copy wins before the delay", delays(time.Millisecond), []grpcretry.Option{hedged}, 1, false},
		{"retried", answerCodes(codes.Unavailable, codes.OK), nil, 2, false},
		{"every attempt fails", answerCodes(codes.Unavailable), nil, 3, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &legServer{answer: tt.answers}
				opts := append([]grpcretry.Option{grpcretry.WithIdempotentMethods(unaryMethod)}, tt.opts...)
				c := serveInMemory(t, srv, newClient(t, opts...)...)
				var mu sync.Mutex
				var got []error
				finish := grpc.OnFinish(func(err error) {
					mu.Lock()
					got = append(got, err)
					mu.Unlock()
				})
				_, err := c.UnaryCall(t.Context(), &testpb.SimpleRequest{}, finish)
				if (err != nil) != tt.fails || srv.n() != tt.calls {
					t.Fatalf("UnaryCall = %v after %d server calls; want failure %v after %d", err, srv.n(), tt.fails, tt.calls)
				}
				srv.settle(t) // every copy ended
				mu.Lock()
				defer mu.Unlock()
				if len(got) != 1 || got[0] != err {
					t.Errorf("OnFinish ran with %v; want once, with the call's error %v", got, err)
				}
			})
		})
	}
}

// answerCodes answers with cs[i] at once (the last one for any later call).
func answerCodes(cs ...codes.Code) func(int) legAnswer {
	return func(i int) legAnswer { return legAnswer{code: cs[min(i, len(cs)-1)]} }
}
