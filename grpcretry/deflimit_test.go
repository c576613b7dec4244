package grpcretry_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/interop/grpc_testing"

	"github.com/stormguard/stormguard/grpcretry"
)

// TestDefaultLimiter: a client built with no options has a per-target
// limiter, WithLimit(nil) has none. A burst of 50 calls without a deadline
// on a cold client all succeed: the limiter (cold: 10 slots) makes the
// rest wait for slots instead of refusing them. Each handler holds its
// call until all 50 are at the server at once, or 100 ms: behind the cold
// limiter the first 10 hold their slots for those 100 ms and the server
// never sees all 50 at once (the limit grows only as calls end); without
// it more than 10 arrive together.
func TestDefaultLimiter(t *testing.T) {
	for _, tt := range []struct {
		name    string
		opts    []grpcretry.Option
		limiter bool
	}{
		{"default", nil, true},
		{"WithLimit(nil)", []grpcretry.Option{grpcretry.WithLimit(nil)}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var in, peak atomic.Int64
			srv := &testServer{handler: func(ctx context.Context, _ int) error {
				n := in.Add(1)
				defer in.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				for start := time.Now(); in.Load() < 50 && time.Since(start) < 100*time.Millisecond && ctx.Err() == nil; {
					time.Sleep(time.Millisecond)
				}
				return nil
			}}
			client := dial(t, serve(t, srv), newClient(t, tt.opts...)...)
			var failed atomic.Int64
			var wg sync.WaitGroup
			for range 50 {
				wg.Go(func() {
					if _, err := client.UnaryCall(t.Context(), &grpc_testing.SimpleRequest{}); err != nil {
						failed.Add(1)
						t.Errorf("UnaryCall: %v", err)
					}
				})
			}
			wg.Wait()
			t.Logf("50 calls at once: %d failed, %d server calls, at most %d at the server at once", failed.Load(), srv.Calls(), peak.Load())
			if srv.Calls() != 50 {
				t.Errorf("%d server calls, want 50", srv.Calls())
			}
			if tt.limiter && peak.Load() >= 50 {
				t.Errorf("the server saw %d at once, want fewer than 50 behind a cold limiter", peak.Load())
			}
			if !tt.limiter && peak.Load() <= 10 {
				t.Errorf("the server saw at most %d at once, want more than 10 without a limiter", peak.Load())
			}
		})
	}
}
