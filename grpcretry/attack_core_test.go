package grpcretry_test

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// gcBreaker returns a breaker and the guards func that hands it to every target.
func gcBreaker(t *testing.T) (*breaker.Breaker, grpcretry.Option) {
	t.Helper()
	b, err := breaker.New(breaker.Config{MinCalls: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return b, grpcretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Breaker: b}, nil })
}

// TestAttackGrpcCoreCancelMidAttemptCountsNeither: doc.go "A call canceled
// by its caller counts neither way." A unary call canceled while its
// attempt runs must leave the breaker's window empty.
func TestAttackGrpcCoreCancelMidAttemptCountsNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, g := gcBreaker(t)
		srv := &testServer{hold: make(chan struct{})}
		client := serveInMemory(t, srv, newClient(t, g, grpcretry.WithIdempotentMethods(unaryMethod))...)
		for range 5 {
			ctx, cancel := context.WithCancel(t.Context())
			go func() { time.Sleep(100 * time.Millisecond); cancel() }()
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			if status.Code(err) != codes.Canceled {
				t.Fatalf("UnaryCall = %v, want CANCELED", err)
			}
		}
		if s := b.Snapshot(); s.Calls != 0 {
			t.Errorf("breaker counted %d calls (%d failures) of 5 canceled calls, want 0", s.Calls, s.Failures)
		}
	})
}

// TestAttackGrpcCoreCallerDeadlineCountsNeither: the caller's deadline
// ending an attempt (no attempt timeout) is the caller going away: per the
// table DEADLINE_EXCEEDED is a failure only when the attempt's own timeout
// cut it off; retry.WithGuards: an attempt that ends after the parent
// context has ended (past its own deadline) counts neither way.
func TestAttackGrpcCoreCallerDeadlineCountsNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, g := gcBreaker(t)
		srv := &testServer{hold: make(chan struct{})}
		client := serveInMemory(t, srv, newClient(t, g, grpcretry.WithIdempotentMethods(unaryMethod))...)
		for range 5 {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("UnaryCall = %v, want DEADLINE_EXCEEDED", err)
			}
		}
		if s := b.Snapshot(); s.Calls != 0 {
			t.Errorf("breaker counted %d calls (%d failures) of 5 calls past the caller's deadline, want 0", s.Calls, s.Failures)
		}
	})
}

// TestAttackGrpcCoreStreamCancelCountsNeither: the same for a retried
// server-streaming call canceled while waiting for its first message.
func TestAttackGrpcCoreStreamCancelCountsNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, g := gcBreaker(t)
		srv := &testServer{hold: make(chan struct{}), streamMsgs: 1}
		client := serveInMemory(t, srv, newClient(t, g, grpcretry.WithIdempotentMethods(outMethod))...)
		for range 5 {
			ctx, cancel := context.WithCancel(t.Context())
			go func() { time.Sleep(100 * time.Millisecond); cancel() }()
			st, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
			if err == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != codes.Canceled {
				t.Fatalf("Recv = %v, want CANCELED", err)
			}
		}
		if s := b.Snapshot(); s.Calls != 0 {
			t.Errorf("breaker counted %d calls (%d failures) of 5 canceled streams, want 0", s.Calls, s.Failures)
		}
	})
}

// TestAttackGrpcCoreCancelDuringBreakerWait: a call waiting behind an open
// breaker (nothing sent) that its caller cancels ends CANCELED (Error:
// "when no attempt ran ... CANCELED ... for a context that ended"), reason
// retry.Canceled, and at once.
func TestAttackGrpcCoreCancelDuringBreakerWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, g := gcBreaker(t)
		b.Trip(5 * time.Second)
		srv := &testServer{}
		client := serveInMemory(t, srv, newClient(t, g, grpcretry.WithIdempotentMethods(unaryMethod))...)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		go func() { time.Sleep(200 * time.Millisecond); cancel() }()
		start := time.Now()
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if el := time.Since(start); el > 300*time.Millisecond {
			t.Errorf("call returned %v after it was canceled at 200ms", el)
		}
		if status.Code(err) != codes.Canceled || !errors.Is(err, retry.Canceled) {
			t.Errorf("UnaryCall = %v (code %v), want CANCELED with reason canceled", err, status.Code(err))
		}
		if n := srv.Calls(); n != 0 {
			t.Errorf("server saw %d attempts, want 0", n)
		}
	})
}

// TestAttackGrpcCoreStreamCancelDuringBackoff: a server-streaming call
// canceled during the sleep between attempts returns at once, reason
// canceled, the last attempt's code (as a unary call: TestCancel).
func TestAttackGrpcCoreStreamCancelDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 10 * time.Second, Cap: 10 * time.Second})
		srv := &testServer{script: []answer{fail(codes.Unavailable)}}
		client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(outMethod),
			grpcretry.WithRetry(retry.WithBackoff(bo)), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil))...)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go func() { time.Sleep(time.Second); cancel() }()
		start := time.Now()
		st, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if el := time.Since(start); el != time.Second {
			t.Errorf("Recv returned after %v, want 1s (canceled in the 10s sleep)", el)
		}
		if !errors.Is(err, retry.Canceled) || status.Code(err) != codes.Unavailable {
			t.Errorf("Recv = %v (code %v), want the last UNAVAILABLE, reason canceled", err, status.Code(err))
		}
		if n := srv.Calls(); n != 1 {
			t.Errorf("server saw %d attempts, want 1", n)
		}
	})
}

// TestAttackGrpcCoreHintBelowBackoff: a hint is a floor on the next wait:
// a pushback of 1 ms never makes the wait shorter than the backoff's.
func TestAttackGrpcCoreHintBelowBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bo, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 500 * time.Millisecond, Cap: 500 * time.Millisecond})
		srv := &testServer{script: []answer{fail(codes.Unavailable).push("1"), ok()}}
		tl := newTimeline()
		client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod),
			grpcretry.WithRetry(retry.WithBackoff(bo)), grpcretry.WithObserver(tl))...)
		start := time.Now()
		if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el < 500*time.Millisecond {
			t.Errorf("retried after %v (sleeps %v), want at least the backoff's 500ms", el, tl.Sleeps())
		}
	})
}

// TestAttackGrpcCoreRequiredMissingReported: IdempotencyUnaryServerInterceptor:
// "Every call is reported to g's observer (idempotency.WithObserver), the
// refusals above as "invalid"", the refusals above including "key
// malformed, two values, or required and missing".
func TestAttackGrpcCoreRequiredMissingReported(t *testing.T) {
	f := newKeyedFixture(t, nil, grpcretry.WithKeyRequired())
	a := f.call(t, unaryMethod, charge("x"), "alice")
	if a.st.Code() != codes.InvalidArgument {
		t.Fatalf("call without a key = %v, want INVALID_ARGUMENT", a.st)
	}
	if got := f.log.outcomes(); len(got) != 1 || got[0] != "invalid" {
		t.Errorf("observer heard %q for a refused call without a required key, want [invalid]", got)
	}
	// The malformed-key refusal for comparison.
	f.call(t, unaryMethod, charge("x"), "alice", "a", "b")
	if got := f.log.outcomes(); len(got) != 1 || got[0] != "invalid" {
		t.Errorf("observer heard %q for two keys, want [invalid]", got)
	}
}

// TestAttackGrpcCoreInProgressPushbackValue: the ABORTED in-progress answer
// carries grpc-retry-pushback-ms of WithKeyPushback; a keyed client's retry
// waits at least that long, then gets the replay.
func TestAttackGrpcCoreInProgressPushbackValue(t *testing.T) {
	f := newKeyedFixture(t, nil)
	done := make(chan keyedAnswer)
	go func() { done <- f.call(t, unaryMethod, charge("block"), "alice", "k-1") }()
	<-f.srv.entered
	a := f.call(t, unaryMethod, charge("block"), "alice", "k-1")
	if a.st.Code() != codes.Aborted {
		t.Fatalf("second call = %v, want ABORTED", a.st)
	}
	if got := a.trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "250" {
		t.Errorf("pushback trailer %q, want [250]", got)
	}
	close(f.srv.proceed)
	first := <-done
	if first.st.Code() != codes.OK {
		t.Fatalf("first = %v", first.st)
	}
	b := f.call(t, unaryMethod, charge("block"), "alice", "k-1")
	if !b.replayed || b.st.Code() != codes.OK {
		t.Errorf("third call replayed=%v %v, want a replay", b.replayed, b.st)
	}
	if f.srv.runs.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", f.srv.runs.Load())
	}
}

// TestAttackGrpcCoreStreamAttemptsMetadata: every stream attempt after the
// first carries grpc-previous-rpc-attempts, the first none even when the
// caller's metadata carries one.
func TestAttackGrpcCoreStreamAttemptsMetadata(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{script: []answer{fail(codes.Unavailable), fail(codes.Unavailable), ok()},
			handlerStream: func(n int) int { return min(n/2, 1) }}
		client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(outMethod))...)
		ctx := metadata.AppendToOutgoingContext(t.Context(), "grpc-previous-rpc-attempts", "7")
		st, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != io.EOF {
			t.Fatalf("second Recv = %v", err)
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		want := [][]string{nil, {"1"}, {"2"}}
		for i := range want {
			if len(srv.prev[i]) != len(want[i]) || (len(want[i]) == 1 && srv.prev[i][0] != want[i][0]) {
				t.Errorf("attempt %d carried %q, want %q", i+1, srv.prev[i], want[i])
			}
		}
	})
}

// TestAttackGrpcCoreKeyedRows: rows of the table for a keyed call (a
// caller's idempotency key, method not idempotent).
func TestAttackGrpcCoreKeyedRows(t *testing.T) {
	rows := []struct {
		name string
		a    answer
		want int
	}{
		{"ABORTED with RetryInfo only", fail(codes.Aborted).info(time.Millisecond), 3},
		{"ABORTED with pushback 0", fail(codes.Aborted).push("0"), 3},
		{"INTERNAL with pushback", fail(codes.Internal).push("1"), 1},
		{"RESOURCE_EXHAUSTED with RetryInfo 0", fail(codes.ResourceExhausted).info(0), 3},
		{"ABORTED with pushback -1", fail(codes.Aborted).push("-1"), 1},
		{"ABORTED with RetryInfo and pushback -1", fail(codes.Aborted).info(time.Millisecond).push("-1"), 1},
		{"UNAVAILABLE with RetryInfo and malformed pushback", fail(codes.Unavailable).info(time.Millisecond).push("x"), 1},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testServer{script: []answer{r.a}}
				client := serveInMemory(t, srv, newClient(t, grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil))...)
				ctx := metadata.AppendToOutgoingContext(t.Context(), keyMD, "key-1")
				_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
				if status.Code(err) != r.a.code {
					t.Errorf("code %v, want %v", status.Code(err), r.a.code)
				}
				if n := srv.Calls(); n != r.want {
					t.Errorf("server saw %d attempts, want %d", n, r.want)
				}
			})
		})
	}
}

// TestAttackGrpcCoreKeyedAttemptTimeoutRetried: DEADLINE_EXCEEDED cut by
// the attempt's own timeout is retried for any safe call, a keyed one too,
// with the same key on every attempt; a plain one gets one attempt.
func TestAttackGrpcCoreKeyedAttemptTimeoutRetried(t *testing.T) {
	for _, keyed := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			srv := &testServer{hold: make(chan struct{})}
			client := serveInMemory(t, srv, newClient(t, grpcretry.WithAttemptTimeout(time.Second),
				grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil))...)
			ctx := t.Context()
			if keyed {
				ctx = metadata.AppendToOutgoingContext(ctx, keyMD, "key-1")
			}
			start := time.Now()
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			want := 1
			if keyed {
				want = 3
			}
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("keyed=%v: code %v, want DEADLINE_EXCEEDED", keyed, status.Code(err))
			}
			if n := srv.Calls(); n != want {
				t.Errorf("keyed=%v: server saw %d attempts, want %d (took %v)", keyed, n, want, time.Since(start))
			}
			if keyed {
				if !errors.Is(err, retry.AttemptsExhausted) {
					t.Errorf("reason: %v, want attempts exhausted", err)
				}
				srv.mu.Lock()
				for i, k := range srv.keys {
					if len(k) != 1 || k[0] != "key-1" {
						t.Errorf("attempt %d key %q", i+1, k)
					}
				}
				srv.mu.Unlock()
			}
		})
	}
}

// TestAttackGrpcCoreStreamPushbackFloor: a server-streaming attempt's
// pushback is a floor on the wait before the next attempt.
func TestAttackGrpcCoreStreamPushbackFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{script: []answer{fail(codes.Unavailable).push("3000"), ok()},
			handlerStream: func(n int) int { return n }}
		client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(outMethod),
			grpcretry.WithRetry(retry.WithBackoff(quick())))...)
		start := time.Now()
		st, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el < 3*time.Second || el >= 4500*time.Millisecond {
			t.Errorf("first message after %v, want in [3s, 4.5s)", el)
		}
	})
}

// TestAttackGrpcCoreIdempotencyConcurrent: 16 concurrent calls with one key
// run the handler once; every other one gets ABORTED (in progress) or the
// replay.
func TestAttackGrpcCoreIdempotencyConcurrent(t *testing.T) {
	f := newKeyedFixture(t, nil)
	res := make(chan keyedAnswer, 16)
	go func() { res <- f.call(t, unaryMethod, charge("block"), "alice", "k-c") }()
	<-f.srv.entered
	for range 15 {
		go func() { res <- f.call(t, unaryMethod, charge("block"), "alice", "k-c") }()
	}
	// let them arrive, then finish the first
	time.Sleep(50 * time.Millisecond)
	close(f.srv.proceed)
	oks, aborted := 0, 0
	for range 16 {
		a := <-res
		switch a.st.Code() {
		case codes.OK:
			oks++
		case codes.Aborted:
			aborted++
		default:
			t.Errorf("answer %v", a.st)
		}
	}
	if n := f.srv.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1 (ok %d, aborted %d)", n, oks, aborted)
	}
}

// TestAttackGrpcCoreSameTargetSharesBreaker: "connections to the same
// target share one target's guards": a breaker tripped through one
// connection refuses calls on another connection to the same target.
func TestAttackGrpcCoreSameTargetSharesBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opts := newClient(t, grpcretry.WithBreaker(&breaker.Config{MinCalls: 5}), grpcretry.WithBudget(nil))
		bad := serveInMemory(t, &testServer{script: []answer{fail(codes.Unavailable)}}, opts...)
		good := &testServer{}
		healthy := serveInMemory(t, good, opts...)
		for range 10 {
			_, _ = bad.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		}
		_, err := healthy.UnaryCall(t.Context(), &testpb.SimpleRequest{})
		if !errors.Is(err, retry.CircuitOpen) || status.Code(err) != codes.Unavailable {
			t.Errorf("call on the second connection = %v, want UNAVAILABLE, circuit open", err)
		}
		if n := good.Calls(); n != 0 {
			t.Errorf("second server saw %d calls, want 0", n)
		}
	})
}

var _ = grpc.Header
var _ = idempotency.Header

// TestAttackGrpcCorePushBackCases: PushBack's doc: the retrying is done
// (pushback) when the attempts were exhausted, the budget refused, a
// breaker was open, the limiter had no slot, or the layer below said so;
// "A plain failure that was not retried (NOT_FOUND, a non-idempotent call
// without a key) and a canceled call are passed on."
func TestAttackGrpcCorePushBackCases(t *testing.T) {
	cases := []struct {
		name     string
		a        answer
		idem     bool
		pushback bool
	}{
		{"idempotent UNAVAILABLE exhausted", fail(codes.Unavailable), true, true},
		{"plain UNAVAILABLE, not retried", fail(codes.Unavailable), false, false},
		{"idempotent NOT_FOUND", fail(codes.NotFound), true, false},
		{"plain NOT_FOUND", fail(codes.NotFound), false, false},
		{"idempotent UNAVAILABLE with pushback -1", fail(codes.Unavailable).push("-1"), true, true},
		{"plain INTERNAL", fail(codes.Internal), false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &testServer{script: []answer{c.a}}
				opts := []grpcretry.Option{grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil), grpcretry.WithRetry(retry.WithBackoff(quick()))}
				if c.idem {
					opts = append(opts, grpcretry.WithIdempotentMethods(unaryMethod))
				}
				client := serveInMemory(t, srv, newClient(t, opts...)...)
				_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
				got := grpcretry.PushBack(context.Background(), err)
				pushed := got != err
				if pushed != c.pushback {
					t.Errorf("PushBack(%v) = %v: pushed back %v, want %v", err, got, pushed, c.pushback)
				}
			})
		})
	}
}

// gcLimited starts one call that holds the only limiter slot of the client
// until the test ends, and returns the client.
func gcLimited(t *testing.T, srv *testServer, opts ...grpcretry.Option) testpb.TestServiceClient {
	t.Helper()
	opts = append(opts, grpcretry.WithLimit(&limit.Config{Max: 1}), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil))
	client := serveInMemory(t, srv, newClient(t, opts...)...)
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	go func() { _, _ = client.UnaryCall(ctx, &testpb.SimpleRequest{}) }()
	synctest.Wait()
	if srv.Calls() != 1 {
		t.Fatalf("holder not in flight: %d calls", srv.Calls())
	}
	return client
}

// TestAttackGrpcCoreLimiterWaitCanceled: retry.Guards: "a call canceled
// while it waits ends with Reason Canceled"; Error: when no attempt ran,
// CANCELED for a context that ended.
func TestAttackGrpcCoreLimiterWaitCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{hold: make(chan struct{})}
		client := gcLimited(t, srv, grpcretry.WithIdempotentMethods(unaryMethod))
		ctx, cancel := context.WithCancel(t.Context())
		go func() { time.Sleep(time.Second); cancel() }()
		start := time.Now()
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if el := time.Since(start); el != time.Second {
			t.Errorf("returned after %v, want 1s (when canceled)", el)
		}
		if status.Code(err) != codes.Canceled || !errors.Is(err, retry.Canceled) {
			t.Errorf("UnaryCall = %v (code %v), want CANCELED, reason canceled", err, status.Code(err))
		}
		if n := srv.Calls(); n != 1 {
			t.Errorf("server saw %d calls, want 1 (the holder)", n)
		}
		close(srv.hold)
	})
}

// TestAttackGrpcCoreLimiterWaitDeadline: WithLimit: calls with a deadline
// wait "failing fast (retry.Limited and UNAVAILABLE) once their turn would
// come too late"; never past the deadline.
func TestAttackGrpcCoreLimiterWaitDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{hold: make(chan struct{})}
		client := gcLimited(t, srv, grpcretry.WithIdempotentMethods(unaryMethod))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if el := time.Since(start); el > time.Second {
			t.Errorf("returned after %v, past the 1s deadline", el)
		}
		if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.Limited) {
			t.Errorf("UnaryCall = %v (code %v), want UNAVAILABLE, reason limited", err, status.Code(err))
		}
		close(srv.hold)
	})
}

// TestAttackGrpcCoreStreamLimited: a retried server stream refused by the
// limiter ends with an *Error, UNAVAILABLE, retry.Limited.
func TestAttackGrpcCoreStreamLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &testServer{hold: make(chan struct{}), streamMsgs: 1}
		client := gcLimited(t, srv, grpcretry.WithIdempotentMethods(unaryMethod, outMethod))
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		st, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		var ge *grpcretry.Error
		if status.Code(err) != codes.Unavailable || !errors.Is(err, retry.Limited) || !errors.As(err, &ge) {
			t.Errorf("Recv = %v (code %v), want *Error UNAVAILABLE, reason limited", err, status.Code(err))
		}
		close(srv.hold)
	})
}

// TestAttackGrpcCoreBidiCloseSendConcurrent: a buffered bidi call whose
// sender (SendMsg x3, CloseSend) runs beside its receiver, the first
// attempt failing before any response: the replay delivers all 3 echoes,
// in order, then EOF.
func TestAttackGrpcCoreBidiCloseSendConcurrent(t *testing.T) {
	for range 20 {
		srv := &testServer{script: []answer{fail(codes.Unavailable), ok()}}
		client := serveInMemory(t, srv, newClient(t, grpcretry.WithIdempotentMethods(duplexMethod),
			grpcretry.WithBufferMessages(1<<10), grpcretry.WithRetry(retry.WithBackoff(quick())))...)
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		st, err := client.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan error, 1)
		go func() {
			for i := range 3 {
				if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte{byte('a' + i)}}}); err != nil {
					sent <- err
					return
				}
			}
			sent <- st.CloseSend()
		}()
		var got []byte
		for {
			m, err := st.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Recv after %q: %v", got, err)
			}
			got = append(got, m.GetPayload().GetBody()...)
		}
		if err := <-sent; err != nil {
			t.Errorf("send side: %v", err)
		}
		if string(got) != "abc" {
			t.Errorf("got %q, want abc (server calls %d)", got, srv.Calls())
		}
		cancel()
	}
}

// TestAttackGrpcCoreEmptyReplyReplayed: a keyed call whose reply is an
// empty message is stored and replayed like any other (the handler runs once).
func TestAttackGrpcCoreEmptyReplyReplayed(t *testing.T) {
	f := newKeyedFixture(t, nil)
	a := f.call(t, emptyMethod, &testpb.Empty{}, "alice", "k-e")
	b := f.call(t, emptyMethod, &testpb.Empty{}, "alice", "k-e")
	if a.st.Code() != codes.OK || b.st.Code() != codes.OK || !b.replayed {
		t.Errorf("first %v, second %v replayed=%v; want OK twice, the second replayed", a.st, b.st, b.replayed)
	}
	if n := f.srv.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestAttackGrpcCoreLargeRequestStreamOpenFailsRetried: doc.go: "A call
// that never reached the server fails its attempt with UNAVAILABLE (a
// connection refused, closed or lost ...), which is retried like any
// UNAVAILABLE", and a server-streaming call of a safe method "is retried
// until the first response". Here the stream cannot open on its first
// attempt (UNAVAILABLE before anything is sent: an interceptor below the
// client stands for grpc-go failing to get a transport). With a request
// under the 1 MiB replay buffer the call is retried; with one over it, the
// request was never sent on any attempt, yet the call is not retried.
func TestAttackGrpcCoreLargeRequestStreamOpenFailsRetried(t *testing.T) {
	for _, size := range []int{10, 1<<20 + 100} {
		synctest.Test(t, func(t *testing.T) {
			opens := 0
			failFirst := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
				opens++
				if opens == 1 {
					return nil, status.Error(codes.Unavailable, "connection refused")
				}
				return streamer(ctx, desc, cc, method, opts...)
			})
			srv := &testServer{streamMsgs: 1}
			dopts := append(newClient(t, grpcretry.WithIdempotentMethods(outMethod), grpcretry.WithRetry(retry.WithBackoff(quick()))), failFirst)
			client := serveInMemory(t, srv, dopts...)
			req := &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, size)}}
			st, err := client.StreamingOutputCall(t.Context(), req)
			if err == nil {
				_, err = st.Recv()
			}
			if err != nil || srv.Calls() != 1 {
				t.Errorf("request of %d bytes: Recv = %v after %d opens (server saw %d); want the first message after a retry", size, err, opens, srv.Calls())
			}
		})
	}
}

// TestAttackGrpcCoreLargeRequestConnRefused: the same with a real refused
// connection: the first dial fails, grpc-go fails the stream's open with
// UNAVAILABLE, and nothing reached the server. The call with a small
// request is retried and succeeds; the one with a request over 1 MiB is
// not retried.
func TestAttackGrpcCoreLargeRequestConnRefused(t *testing.T) {
	for _, size := range []int{10, 1<<20 + 100} {
		synctest.Test(t, func(t *testing.T) {
			ln := bufconn.Listen(1 << 16)
			srv := &testServer{streamMsgs: 1}
			gs := grpc.NewServer()
			testpb.RegisterTestServiceServer(gs, srv)
			go func() { _ = gs.Serve(ln) }()
			t.Cleanup(gs.Stop)
			dials := 0
			dialer := grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
				dials++
				if dials == 1 {
					return nil, errors.New("connection refused")
				}
				return ln.DialContext(ctx)
			})
			bo, _ := backoff.New(backoff.Config{Strategy: backoff.NoJitter, Base: 3 * time.Second, Cap: 3 * time.Second})
			client := dial(t, "passthrough:///bufconn", append(newClient(t, grpcretry.WithIdempotentMethods(outMethod),
				grpcretry.WithRetry(retry.WithBackoff(bo)), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil)), dialer)...)
			req := &testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, size)}}
			st, err := client.StreamingOutputCall(t.Context(), req)
			if err == nil {
				_, err = st.Recv()
			}
			if err != nil || srv.Calls() != 1 {
				t.Errorf("request of %d bytes: Recv = %v after %d dials (server saw %d calls); want the first message after a retry", size, err, dials, srv.Calls())
			}
		})
	}
}

// TestAttackGrpcCoreBidiPastBoundOpenFails: a buffered bidi call whose
// first message is past the bound, sent before any stream opened: the
// stream's open fails (refused connection, nothing sent); the message was
// sent by no attempt, yet the call is not retried.
func TestAttackGrpcCoreBidiPastBoundOpenFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		opens := 0
		failFirst := grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			opens++
			if opens == 1 {
				return nil, status.Error(codes.Unavailable, "connection refused")
			}
			return streamer(ctx, desc, cc, method, opts...)
		})
		srv := &testServer{}
		dopts := append(newClient(t, grpcretry.WithIdempotentMethods(duplexMethod), grpcretry.WithBufferMessages(10),
			grpcretry.WithRetry(retry.WithBackoff(quick()))), failFirst)
		client := serveInMemory(t, srv, dopts...)
		st, err := client.FullDuplexCall(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		serr := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 100)}})
		_ = st.CloseSend()
		_, rerr := st.Recv()
		if serr != nil || rerr != nil {
			t.Errorf("Send = %v, Recv = %v after %d opens (server saw %d); want the echo after a retry", serr, rerr, opens, srv.Calls())
		}
	})
}
