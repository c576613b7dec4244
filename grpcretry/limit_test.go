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

// TestWithLimit: with a limit of one attempt in flight, a call made while
// another holds the slot waits for it within its deadline, and one without
// a deadline fails at once with UNAVAILABLE and Reason Limited, sending
// nothing; PushBack tells the caller's caller not to retry. A bad limit
// configuration is an error of New naming the field.
func TestWithLimit(t *testing.T) {
	if _, err := grpcretry.DialOptions(grpcretry.WithLimit(&limit.Config{Max: -1})); err == nil {
		t.Errorf("New(WithLimit(Max -1)) = nil error, want one naming Config.Max")
	}
	c := newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithLimit(&limit.Config{Max: 1}))
	srv := &testServer{hold: make(chan struct{})}
	early := make(chan int, 4) // calls that reached the server while the first held the slot
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
	client := dial(t, serve(t, srv), c...)
	held := make(chan error, 1)
	go func() {
		_, err := client.UnaryCall(t.Context(), &grpc_testing.SimpleRequest{})
		held <- err
	}()
	for srv.Calls() == 0 {
		time.Sleep(time.Millisecond)
	}

	_, err := client.UnaryCall(t.Context(), &grpc_testing.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.Limited) || !errors.Is(err, limit.ErrLimited) || srv.Calls() != 1 {
		t.Errorf("UnaryCall without a deadline while the slot is held = %v after %d server calls; want UNAVAILABLE, limited, 1", err, srv.Calls())
	}
	if pushed := grpcretry.PushBack(t.Context(), err); status.Code(pushed) != codes.Unavailable || pushed == err {
		t.Errorf("PushBack = %v; want the don't-retry UNAVAILABLE", pushed)
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	// The slot is given back 50 ms from now; this call waits for it.
	time.AfterFunc(50*time.Millisecond, func() { close(srv.hold) })
	if _, err := client.UnaryCall(ctx, &grpc_testing.SimpleRequest{}); err != nil || srv.Calls() != 2 {
		t.Errorf("the call that waited = %v after %d server calls; want success after 2", err, srv.Calls())
	}
	if err := <-held; err != nil {
		t.Errorf("the call holding the slot = %v", err)
	}
	if len(early) > 0 {
		t.Errorf("call %d reached the server while the only slot was held", <-early)
	}
}
