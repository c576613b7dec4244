package grpcretry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// TestWithLimit: with a limit of one attempt in flight, calls made while
// another holds the slot wait for it (one with a deadline within it, one
// without until the slot comes), sending nothing meanwhile; with waiting
// off, one fails at once with UNAVAILABLE and Reason Limited, sending
// nothing, and PushBack tells the caller's caller not to retry. A bad
// limit configuration is an error of New naming the field.
func TestWithLimit(t *testing.T) {
	if _, err := grpcretry.DialOptions(grpcretry.WithLimit(&limit.Config{Max: -1})); err == nil {
		t.Errorf("New(WithLimit(Max -1)) = nil error, want one naming Config.Max")
	}
	// holding serves a client with cfg whose first call holds the only
	// slot until release is called; early gets the calls that reached
	// the server meanwhile.
	holding := func(cfg *limit.Config) (client grpc_testing.TestServiceClient, srv *testServer, held chan error, early chan int) {
		c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithLimit(cfg))
		srv = &testServer{hold: make(chan struct{})}
		early = make(chan int, 4)
		srv.handler = func(_ context.Context, n int) error {
			select {
			case <-srv.hold:
			default:
				if n > 0 {
					early <- n
				}
			}
			return nil
		}
		client = dial(t, serve(t, srv), c...)
		held = make(chan error, 1)
		go func() {
			_, err := client.UnaryCall(t.Context(), &grpc_testing.SimpleRequest{})
			held <- err
		}()
		for srv.Calls() == 0 {
			time.Sleep(time.Millisecond)
		}
		return client, srv, held, early
	}

	t.Run("waiting off", func(t *testing.T) {
		client, srv, held, _ := holding(&limit.Config{Max: 1, Waiting: -1})
		_, err := client.UnaryCall(t.Context(), &grpc_testing.SimpleRequest{})
		if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.Limited) || !errors.Is(err, limit.ErrLimited) || srv.Calls() != 1 {
			t.Errorf("UnaryCall while the slot is held = %v after %d server calls; want UNAVAILABLE, limited, 1", err, srv.Calls())
		}
		if pushed := grpcretry.PushBack(t.Context(), err); status.Code(pushed) != codes.Unavailable || pushed == err {
			t.Errorf("PushBack = %v; want the don't-retry UNAVAILABLE", pushed)
		}
		close(srv.hold)
		if err := <-held; err != nil {
			t.Errorf("the call holding the slot = %v", err)
		}
	})

	t.Run("waiting", func(t *testing.T) {
		client, srv, held, early := holding(&limit.Config{Max: 1})
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		waited := make(chan error, 2)
		for _, ctx := range []context.Context{t.Context(), ctx} { // without a deadline, with one
			go func() {
				_, err := client.UnaryCall(ctx, &grpc_testing.SimpleRequest{})
				waited <- err
			}()
		}
		// The slot is given back 50 ms from now; the waiting calls get it.
		time.AfterFunc(50*time.Millisecond, func() { close(srv.hold) })
		for range 2 {
			if err := <-waited; err != nil {
				t.Errorf("a call that waited = %v", err)
			}
		}
		if err := <-held; err != nil {
			t.Errorf("the call holding the slot = %v", err)
		}
		if srv.Calls() != 3 {
			t.Errorf("%d server calls, want 3", srv.Calls())
		}
		if len(early) > 0 {
			t.Errorf("call %d reached the server while the only slot was held", <-early)
		}
	})
}
