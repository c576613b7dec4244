package grpcretry_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// glEnds returns the AttemptEnd events of the log as "attempt hedge outcome code".
func glEnds(l *eventLog) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		if e.Kind != observe.AttemptEnd {
			continue
		}
		out = append(out, fmt.Sprintf("%d hedge=%v %s", e.Attempt, e.Hedge, e.Outcome))
	}
	return strings.Join(out, " | ")
}

// glHedgeEnd returns the Outcome of the hedge's AttemptEnd ("" if none).
func glHedgeEnd(l *eventLog) (string, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	hedge, loop := "", ""
	for _, e := range l.events {
		if e.Kind != observe.AttemptEnd {
			continue
		}
		if e.Hedge {
			hedge = e.Outcome
		} else {
			loop = e.Outcome
		}
	}
	return hedge, loop
}

// DOC observe.AttemptEnd: "... a hedge that lost its race ends with
// "canceled" (see Event.Hedge), and so does an attempt that failed after
// its call's context ended (the caller's deadline or cancel: the breaker
// counts it neither way)." A hedge in flight when the caller's deadline
// passes failed after its call's context ended: "canceled".
func TestAttackGrpcLimitHedgeCallerDeadlineOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log eventLog
		srv := &legServer{answer: delays(time.Second)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithObserver(&log))...)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		_, _, err := hedgeCall(ctx, c)
		t.Logf("err %v", err)
		srv.settle(t)
		hedge, loop := glHedgeEnd(&log)
		if srv.n() != 2 {
			t.Fatalf("%d server calls, want 2 (one hedge)", srv.n())
		}
		if hedge != "canceled" {
			t.Errorf("hedge cut by the caller's deadline ends with Outcome %q, want \"canceled\" (loop's own attempt: %q); events: %s", hedge, loop, glEnds(&log))
		}
	})
}

// Control: the same with the caller's cancel (expected to hold).
func TestAttackGrpcLimitHedgeCallerCancelOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log eventLog
		srv := &legServer{answer: delays(time.Second)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithObserver(&log))...)
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(100*time.Millisecond, cancel)
		hedgeCall(ctx, c)
		srv.settle(t)
		hedge, loop := glHedgeEnd(&log)
		if hedge != "canceled" {
			t.Errorf("hedge canceled by the caller ends with Outcome %q, want \"canceled\" (loop: %q); events: %s", hedge, loop, glEnds(&log))
		}
	})
}

// DOC observe.AttemptEnd: Outcome "success", "failure" (...) or "rejected"
// (the dependency answered, but no: a 404, a 400; not its failure); Err
// nil on success. A hedge that wins with NOT_FOUND (a good answer that
// wins the race, docs/hedging.md) answered "no": the loop reports the
// same race "rejected".
func TestAttackGrpcLimitHedgeNotFoundOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var log eventLog
		srv := &legServer{answer: func(i int) legAnswer {
			if i == 0 {
				return legAnswer{delay: time.Second}
			}
			return legAnswer{delay: 10 * time.Millisecond, code: codes.NotFound}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, 1, unaryMethod),
			grpcretry.WithObserver(&log))...)
		_, took, err := hedgeCall(t.Context(), c)
		if code := status.Code(err); code != codes.NotFound || took != 60*time.Millisecond {
			t.Fatalf("call = %v after %v; want the hedge's NOT_FOUND after 60ms", err, took)
		}
		srv.settle(t)
		hedge, loop := glHedgeEnd(&log)
		if hedge != loop || hedge == "success" {
			t.Errorf("the hedge's NOT_FOUND ends with Outcome %q, the loop's attempt of the same race with %q; want \"rejected\" for both (Err set: not a success); events: %s", hedge, loop, glEnds(&log))
		}
	})
}

// glFree returns how many slots lim grants at once (done context), and
// gives them back.
func glFree(lim *limit.Limiter) int {
	done, cancel := context.WithCancel(context.Background())
	cancel()
	var ps []limit.Permit
	for range lim.Limit() + 5 {
		p, err := lim.Acquire(done)
		if err != nil {
			break
		}
		ps = append(ps, p)
	}
	for _, p := range ps {
		lim.Release(p, false)
	}
	return len(ps)
}

// DOC docs/limit.md: "Every slot is given back exactly once when its
// attempt ends, a panic included"; grpcretry: "A unary attempt holds its
// slot until it returns". After each hedged call (winner, loser, caller
// cancel, attempt timeout, caller deadline, failures, panics) every slot
// is free, and no more.
func TestAttackGrpcLimitHedgeSlotsBack(t *testing.T) {
	panicky := func(which string) grpc.UnaryClientInterceptor {
		return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if which != "" {
				err := invoker(ctx, method, req, reply, cc, opts...)
				_ = err
				panic("boom " + which)
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
	}
	_ = panicky
	type tc struct {
		name     string
		answer   func(i int) legAnswer
		deadline time.Duration
		cancelAt time.Duration
		timeout  time.Duration
		max      int
		panicOn  func(n int64) bool // by the interceptor's call count
	}
	tests := []tc{
		{name: "hedge wins", answer: delays(time.Second, 10*time.Millisecond)},
		{name: "first wins", answer: delays(70*time.Millisecond, time.Second)},
		{name: "both fail", answer: func(int) legAnswer { return legAnswer{delay: 80 * time.Millisecond, code: codes.Unavailable} }},
		{name: "hedge fails first", answer: func(i int) legAnswer {
			if i == 1 {
				return legAnswer{delay: 5 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 100 * time.Millisecond}
		}},
		{name: "caller deadline", answer: delays(time.Second), deadline: 100 * time.Millisecond, max: 2},
		{name: "caller cancel", answer: delays(time.Second), cancelAt: 130 * time.Millisecond, max: 2},
		{name: "attempt timeout", answer: delays(time.Second), timeout: 120 * time.Millisecond, max: 2},
		{name: "hedge panics", answer: delays(time.Second, 10*time.Millisecond), panicOn: func(n int64) bool { return n == 2 }},
		{name: "first panics", answer: delays(100*time.Millisecond, time.Second), panicOn: func(n int64) bool { return n == 1 }},
		{name: "loser panics", answer: delays(70*time.Millisecond, 30*time.Millisecond), panicOn: func(n int64) bool { return n == 2 }},
		{name: "two hedges", answer: delays(time.Second, time.Second, 10*time.Millisecond), max: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim, err := limit.New(limit.Config{Max: 100})
				if err != nil {
					t.Fatal(err)
				}
				srv := &legServer{answer: tt.answer}
				var calls atomic.Int64
				ic := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					n := calls.Add(1)
					err := invoker(ctx, method, req, reply, cc, opts...)
					if tt.panicOn != nil && tt.panicOn(n) {
						panic("boom")
					}
					return err
				}
				opts := []grpcretry.Option{grpcretry.WithHedging(50*time.Millisecond, 0, max(tt.max, 1), unaryMethod),
					withGuards(retry.Guards{Budget: newBudget(t), Limiter: lim})}
				if tt.timeout > 0 {
					opts = append(opts, grpcretry.WithAttemptTimeout(tt.timeout))
				}
				c := serveInMemory(t, srv, append(newClient(t, opts...), grpc.WithChainUnaryInterceptor(ic))...)
				before := glFree(lim)
				ctx := t.Context()
				if tt.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.deadline)
					defer cancel()
				}
				if tt.cancelAt > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(tt.cancelAt, cancel)
				}
				func() {
					defer func() { _ = recover() }()
					_, _, err = hedgeCall(ctx, c)
				}()
				srv.settle(t)
				after := glFree(lim)
				if after != lim.Limit() {
					t.Errorf("after the call %d slots free, limit %d (before: %d free); err %v, %d server calls", after, lim.Limit(), before, err, srv.n())
				}
				if srv.n() < 2 {
					t.Errorf("%d server calls: no hedge went", srv.n())
				}
			})
		})
	}
}

// glBudget counts deposits and withdrawals and grants every withdrawal.
type glBudget struct{ dep, wd atomic.Int64 }

func (b *glBudget) Deposit()       { b.dep.Add(1) }
func (b *glBudget) Withdraw() bool { b.wd.Add(1); return true }

// DOC docs/hedging.md: "Every hedge is a withdrawal from the host's retry
// budget, made when the hedge is due ... A hedge never spends the call's
// attempts."; "A copy that fails while others are in flight is held; no
// further hedge goes in that race"; retry.Guards: "each call deposits
// once"; the loop withdraws before each retry.
func TestAttackGrpcLimitHedgeBudgetAccounting(t *testing.T) {
	for _, tt := range []struct {
		name           string
		answer         func(i int) legAnswer
		max            int
		wantWd, wantSv int
	}{
		{"one hedge wins", delays(time.Second, 10*time.Millisecond), 1, 1, 2},
		{"first wins before delay", delays(10 * time.Millisecond), 1, 0, 1},
		{"failed hedge stops the race", func(i int) legAnswer {
			if i == 1 {
				return legAnswer{delay: 5 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 200 * time.Millisecond}
		}, 3, 1, 2},
		{"race fails then retry", func(i int) legAnswer {
			if i < 2 {
				return legAnswer{delay: 80 * time.Millisecond, code: codes.Unavailable}
			}
			return legAnswer{delay: 10 * time.Millisecond}
		}, 1, 2, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := &glBudget{}
				srv := &legServer{answer: tt.answer}
				c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(50*time.Millisecond, 0, tt.max, unaryMethod),
					grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithRetry(retry.WithBackoff(quick())),
					withGuards(retry.Guards{Budget: b}))...)
				_, _, err := hedgeCall(t.Context(), c)
				srv.settle(t)
				if err != nil || b.dep.Load() != 1 || b.wd.Load() != int64(tt.wantWd) || srv.n() != tt.wantSv {
					t.Errorf("call %v: %d deposits, %d withdrawals, %d server calls (%s); want success, 1, %d, %d", err, b.dep.Load(), b.wd.Load(), srv.n(), srv.calls(), tt.wantWd, tt.wantSv)
				}
			})
		})
	}
}

// DOC docs/limit.md:20-28: "Every slot is given back exactly once when its
// attempt ends, a panic included: ... a panic or runtime.Goexit of the
// operation | a drop"; docs/hedging.md, Panics: a hedge's panic "goes on
// in the caller's goroutine, as without hedging". An interceptor under the
// client's that calls runtime.Goexit (t.FailNow in a test interceptor
// does) on a hedge, which runs on the race's timer goroutine: the hedge's
// slot came back never, and the call waited for the hedge's end until its
// deadline (for ever without one). Now the Goexit goes on in the caller's
// goroutine, as a panic does, and every slot comes back. Real time (a
// goroutine left blocked would make a synctest bubble panic and end the
// test binary); no delay is checked, only the slots and how the call ends.
func TestAttackGrpcLimitHedgeGoexitSlot(t *testing.T) {
	for _, firstFails := range []bool{false, true} {
		t.Run(fmt.Sprintf("firstFails=%v", firstFails), func(t *testing.T) {
			lim, err := limit.New(limit.Config{Max: 100})
			if err != nil {
				t.Fatal(err)
			}
			srv := &legServer{answer: func(i int) legAnswer {
				if i == 0 && firstFails {
					return legAnswer{delay: 300 * time.Millisecond, code: codes.Unavailable}
				}
				return legAnswer{delay: 300 * time.Millisecond}
			}}
			var calls atomic.Int64
			ic := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				if calls.Add(1) == 2 {
					runtime.Goexit()
				}
				return invoker(ctx, method, req, reply, cc, opts...)
			}
			c := serveInMemory(t, srv, append(newClient(t, grpcretry.WithHedging(20*time.Millisecond, 0, 1, unaryMethod),
				withGuards(retry.Guards{Budget: newBudget(t), Limiter: lim})), grpc.WithChainUnaryInterceptor(ic))...)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			var (
				took     time.Duration
				returned bool
			)
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, took, err = hedgeCall(ctx, c)
				returned = true
			}()
			<-done
			if returned {
				t.Errorf("the call returned %v after %v; want the hedge's runtime.Goexit to go on in the caller's goroutine", err, took)
			}
			for srv.inflight.Load() != 0 {
				time.Sleep(time.Millisecond)
			}
			free := glFree(lim)
			t.Logf("call returned %v; %d of %d slots free", returned, free, lim.Limit())
			if calls.Load() != 2 {
				t.Fatalf("%d interceptor calls, want 2 (a hedge)", calls.Load())
			}
			if free != lim.Limit() {
				t.Errorf("after a hedge whose interceptor called runtime.Goexit: %d of %d slots free; want every slot back", free, lim.Limit())
			}
		})
	}
}
