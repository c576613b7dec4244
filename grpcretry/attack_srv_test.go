package grpcretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// srvAttack is a unary test service whose handler is a func; it counts runs.
type srvAttack struct {
	testpb.UnimplementedTestServiceServer
	runs atomic.Int64
	fn   func(ctx context.Context, n int64, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error)
}

func (s *srvAttack) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	n := s.runs.Add(1)
	if s.fn == nil {
		return &testpb.SimpleResponse{Username: fmt.Sprint("run-", n)}, nil
	}
	return s.fn(ctx, n, req)
}

// keyedAttackServer serves s behind the idempotency interceptor (shared
// scope, memory store) and returns a plain client.
func keyedAttackServer(t *testing.T, s *srvAttack, opts ...grpcretry.IdempotencyOption) testpb.TestServiceClient {
	t.Helper()
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	g, err := idempotency.NewGuard(mem)
	if err != nil {
		t.Fatal(err)
	}
	ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, append([]grpcretry.IdempotencyOption{sharedKeyScope}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s, grpc.ChainUnaryInterceptor(ic))
	return dial(t, addr)
}

func srvKeyed(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, idempotency.Header, key)
}

// TestAttackSrvStoredCodesSeeTheCallersCode: WithStoredCodes decides by
// "final codes"; a handler that returns a context error (the Go idiom
// `return nil, ctx.Err()`) answers its caller DEADLINE_EXCEEDED / CANCELED
// (grpc-go converts it), codes the policy below does not store; the
// interceptor must not store it (as UNKNOWN or otherwise): a retry runs the
// handler again.
func TestAttackSrvStoredCodesSeeTheCallersCode(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code codes.Code
	}{
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			s := &srvAttack{}
			s.fn = func(ctx context.Context, n int64, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
				if n == 1 {
					return nil, tc.err // e.g. a dependency call's ctx.Err()
				}
				return &testpb.SimpleResponse{Username: "ok"}, nil
			}
			// Store every final code but the transient ones.
			policy := func(c codes.Code) bool {
				switch c {
				case codes.DeadlineExceeded, codes.Canceled, codes.Unavailable, codes.Aborted, codes.ResourceExhausted:
					return false
				}
				return true
			}
			client := keyedAttackServer(t, s, grpcretry.WithStoredCodes(policy))
			ctx := srvKeyed(t.Context(), "k-ctx")
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			if status.Code(err) != tc.code {
				t.Fatalf("first call: %v, want %v (grpc-go's conversion of the context error)", err, tc.code)
			}
			var h metadata.MD
			resp, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&h))
			if err != nil || resp.GetUsername() != "ok" || s.runs.Load() != 2 {
				t.Fatalf("retry: %v (replayed %q), runs %d; want the handler run again (its first answer was %v, a code the policy does not store)",
					err, h.Get(idempotency.ReplayHeader), s.runs.Load(), tc.code)
			}
		})
	}
}

// TestAttackSrvConcurrentDuplicatesRunOnce: 8 concurrent calls with
// one key through grpcretry's client: the handler runs once, every call
// gets the first reply, the duplicates marked replayed.
func TestAttackSrvConcurrentDuplicatesRunOnce(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	s := &srvAttack{}
	s.fn = func(ctx context.Context, n int64, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-id", fmt.Sprint("id-", n)))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", "a", "x-t", "b"))
		if n == 1 {
			entered <- struct{}{}
			<-release
		}
		return &testpb.SimpleResponse{Username: fmt.Sprint("run-", n)}, nil
	}
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	g, _ := idempotency.NewGuard(mem)
	ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, sharedKeyScope,
		grpcretry.WithKeyPushback(time.Millisecond), grpcretry.WithReplayMetadata("x-id", "x-t"))
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, s, grpc.ChainUnaryInterceptor(ic))
	client := dial(t, addr, newClient(t, grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil), grpcretry.WithRetry(retry.WithMaxAttempts(200), retry.WithBackoff(quick())))...)
	type res struct {
		name     string
		err      error
		h, tr    metadata.MD
		replayed bool
	}
	out := make([]res, 8)
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	ctx = srvKeyed(ctx, "dup")
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := &out[0]
		resp, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&r.h), grpc.Trailer(&r.tr))
		r.name, r.err = resp.GetUsername(), err
	}()
	<-entered
	for i := 1; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &out[i]
			resp, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&r.h), grpc.Trailer(&r.tr))
			r.name, r.err = resp.GetUsername(), err
			r.replayed = slices.Equal(r.h.Get(idempotency.ReplayHeader), []string{"true"})
		}()
	}
	// Let the duplicates meet the held key at least once.
	for range 20 {
		if _, err := dial(t, addr).UnaryCall(srvKeyed(t.Context(), "dup"), &testpb.SimpleRequest{}); status.Code(err) != codes.Aborted {
			t.Fatalf("a duplicate while the first runs: %v, want ABORTED", err)
		}
	}
	close(release)
	wg.Wait()
	if n := s.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	for i, r := range out {
		if r.err != nil || r.name != "run-1" {
			t.Errorf("call %d: %q, %v; want run-1", i, r.name, r.err)
			continue
		}
		if i > 0 && (!r.replayed || !slices.Equal(r.h.Get("x-id"), []string{"id-1"}) || !slices.Equal(r.tr.Get("x-t"), []string{"a", "b"})) {
			t.Errorf("duplicate %d: replayed %v header %v trailer %v; want the first call's metadata", i, r.replayed, r.h, r.tr)
		}
	}
	if !slices.Equal(out[0].h.Get("x-id"), []string{"id-1"}) || !slices.Equal(out[0].tr.Get("x-t"), []string{"a", "b"}) {
		t.Errorf("first call header %v trailer %v", out[0].h, out[0].tr)
	}
}

// TestAttackSrvReplayExact: header metadata (SetHeader twice, a -bin key),
// trailer metadata, an error status with details; replays equal the first.
func TestAttackSrvReplayExact(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprint("error=", fail), func(t *testing.T) {
			s := &srvAttack{}
			s.fn = func(ctx context.Context, n int64, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
				_ = grpc.SetHeader(ctx, metadata.Pairs("x-a", "1", "x-bin", string([]byte{0, 1, 2, 255})))
				_ = grpc.SetHeader(ctx, metadata.Pairs("x-a", "2", "x-private", "p"))
				_ = grpc.SetTrailer(ctx, metadata.Pairs("x-t", fmt.Sprint(n)))
				if fail {
					st, _ := status.New(codes.NotFound, fmt.Sprint("gone ", n)).WithDetails(&errdetails.ErrorInfo{Reason: "R", Metadata: map[string]string{"z": "1", "a": "2"}})
					return nil, st.Err()
				}
				return &testpb.SimpleResponse{Username: fmt.Sprint("run-", n), Payload: &testpb.Payload{Body: []byte("xyz")}}, nil
			}
			client := keyedAttackServer(t, s, grpcretry.WithReplayMetadata("x-a", "X-Bin", "x-t"))
			ctx := srvKeyed(t.Context(), "exact")
			var h1, t1 metadata.MD
			r1, err1 := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&h1), grpc.Trailer(&t1))
			for i := range 3 {
				var h2, t2 metadata.MD
				r2, err2 := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Header(&h2), grpc.Trailer(&t2))
				if !proto.Equal(r1, r2) || !proto.Equal(status.Convert(err1).Proto(), status.Convert(err2).Proto()) {
					t.Fatalf("replay %d: %v %v, first %v %v", i, r2, err2, r1, err1)
				}
				for _, k := range []string{"x-a", "x-bin"} {
					if !slices.Equal(h1.Get(k), h2.Get(k)) {
						t.Errorf("replay %d: header %s %q, first %q", i, k, h2.Get(k), h1.Get(k))
					}
				}
				if !slices.Equal(t1.Get("x-t"), t2.Get("x-t")) {
					t.Errorf("replay %d: trailer %q, first %q", i, t2.Get("x-t"), t1.Get("x-t"))
				}
				if h2.Get("x-private") != nil {
					t.Errorf("replay %d: x-private replayed", i)
				}
			}
			if s.runs.Load() != 1 {
				t.Fatalf("runs %d", s.runs.Load())
			}
		})
	}
}

// TestAttackSrvAllCodes: each code is stored or not as documented.
func TestAttackSrvAllCodes(t *testing.T) {
	storedDoc := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true,
		codes.PermissionDenied: true, codes.FailedPrecondition: true, codes.OutOfRange: true, codes.Unimplemented: true}
	s := &srvAttack{}
	s.fn = func(ctx context.Context, n int64, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		c := codes.Code(req.GetResponseStatus().GetCode())
		if c == codes.OK {
			return &testpb.SimpleResponse{}, nil
		}
		return nil, status.Error(c, "scripted")
	}
	client := keyedAttackServer(t, s)
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		ctx := srvKeyed(t.Context(), "code-"+c.String())
		req := &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(c)}}
		before := s.runs.Load()
		_, err1 := client.UnaryCall(ctx, req)
		var h metadata.MD
		_, err2 := client.UnaryCall(ctx, req, grpc.Header(&h))
		runs := s.runs.Load() - before
		replayed := h.Get(idempotency.ReplayHeader) != nil
		if status.Code(err1) != c || status.Code(err2) != c {
			t.Errorf("%v: codes %v, %v", c, status.Code(err1), status.Code(err2))
		}
		if storedDoc[c] != (runs == 1 && replayed) || (!storedDoc[c] && runs != 2) {
			t.Errorf("%v: runs %d, replayed %v; documented stored=%v", c, runs, replayed, storedDoc[c])
		}
	}
}

// TestAttackSrvMismatchAndKeys: a different request or method under the
// same key is FAILED_PRECONDITION with a PreconditionFailure; missing,
// malformed or doubled keys with WithKeyRequired are INVALID_ARGUMENT with
// a BadRequest; the handler never runs for them.
func TestAttackSrvMismatchAndKeys(t *testing.T) {
	s := &srvAttack{}
	client := keyedAttackServer(t, s, grpcretry.WithKeyRequired())
	ctx := srvKeyed(t.Context(), "m")
	if _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 1}); err != nil {
		t.Fatal(err)
	}
	check := func(name string, err error, want codes.Code) {
		t.Helper()
		st := status.Convert(err)
		if st.Code() != want {
			t.Errorf("%s: %v, want %v", name, err, want)
			return
		}
		ok := false
		for _, d := range st.Details() {
			switch d.(type) {
			case *errdetails.PreconditionFailure:
				ok = ok || want == codes.FailedPrecondition
			case *errdetails.BadRequest:
				ok = ok || want == codes.InvalidArgument
			}
		}
		if !ok {
			t.Errorf("%s: details %v lack the documented one", name, st.Details())
		}
	}
	_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 2})
	check("other request", err, codes.FailedPrecondition)
	_, err = client.EmptyCall(ctx, &testpb.Empty{})
	check("other method", err, codes.FailedPrecondition)
	_, err = client.UnaryCall(t.Context(), &testpb.SimpleRequest{})
	check("missing key", err, codes.InvalidArgument)
	_, err = client.UnaryCall(srvKeyed(srvKeyed(t.Context(), "a"), "b"), &testpb.SimpleRequest{})
	check("two keys", err, codes.InvalidArgument)
	_, err = client.UnaryCall(srvKeyed(t.Context(), "a,b"), &testpb.SimpleRequest{})
	check("comma key", err, codes.InvalidArgument)
	_, err = client.UnaryCall(srvKeyed(t.Context(), strings.Repeat("k", 256)), &testpb.SimpleRequest{})
	check("long key", err, codes.InvalidArgument)
	if n := s.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestAttackSrvMaxStoredReply: at the cap stored; over it the reply
// reaches the first caller, a retry gets DATA_LOSS with the omitted mark,
// the handler does not run again; an error over the cap keeps its code.
func TestAttackSrvMaxStoredReply(t *testing.T) {
	s := &srvAttack{}
	s.fn = func(ctx context.Context, n int64, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("x-a", "v"))
		if c := req.GetResponseStatus().GetCode(); c != 0 {
			st, _ := status.New(codes.Code(c), strings.Repeat("m", int(req.GetResponseSize()))).WithDetails(&errdetails.ErrorInfo{Reason: "R"})
			return nil, st.Err()
		}
		return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: make([]byte, req.GetResponseSize())}}, nil
	}
	const capBytes = 100
	client := keyedAttackServer(t, s, grpcretry.WithMaxStoredReply(capBytes), grpcretry.WithReplayMetadata("x-a"))
	// A SimpleResponse with a payload body of b bytes marshals to b+4 bytes (b < 128).
	at := &testpb.SimpleRequest{ResponseSize: capBytes - 4}
	over := &testpb.SimpleRequest{ResponseSize: capBytes - 3}
	if sz := proto.Size(&testpb.SimpleResponse{Payload: &testpb.Payload{Body: make([]byte, capBytes-4)}}); sz != capBytes {
		t.Fatalf("size %d", sz)
	}
	ctxAt, ctxOver := srvKeyed(t.Context(), "at"), srvKeyed(t.Context(), "over")
	r1, err := client.UnaryCall(ctxAt, at)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := client.UnaryCall(ctxAt, at)
	if err != nil || !proto.Equal(r1, r2) {
		t.Fatalf("at the cap: replay %v, want the reply", err)
	}
	r1, err = client.UnaryCall(ctxOver, over)
	if err != nil || len(r1.GetPayload().GetBody()) != capBytes-3 {
		t.Fatalf("over the cap, first call: %v", err)
	}
	var h metadata.MD
	_, err = client.UnaryCall(ctxOver, over, grpc.Header(&h))
	if status.Code(err) != codes.DataLoss || !slices.Equal(h.Get(grpcretry.ReplyOmittedMetadata), []string{"true"}) || !slices.Equal(h.Get("x-a"), []string{"v"}) {
		t.Fatalf("over the cap, retry: %v header %v; want DATA_LOSS, omitted mark, x-a", err, h)
	}
	if n := s.runs.Load(); n != 2 {
		t.Fatalf("runs %d, want 2", n)
	}
	ctxErr := srvKeyed(t.Context(), "err-over")
	reqErr := &testpb.SimpleRequest{ResponseSize: 200, ResponseStatus: &testpb.EchoStatus{Code: int32(codes.NotFound)}}
	_, err = client.UnaryCall(ctxErr, reqErr)
	if status.Code(err) != codes.NotFound || len(status.Convert(err).Details()) != 1 {
		t.Fatalf("error over the cap, first: %v", err)
	}
	h = nil
	_, err = client.UnaryCall(ctxErr, reqErr, grpc.Header(&h))
	if status.Code(err) != codes.NotFound || len(status.Convert(err).Details()) != 0 || !slices.Equal(h.Get(grpcretry.ReplyOmittedMetadata), []string{"true"}) {
		t.Fatalf("error over the cap, retry: %v (details %d) header %v; want NOT_FOUND, no details, omitted mark", err, len(status.Convert(err).Details()), h)
	}
	if n := s.runs.Load(); n != 3 {
		t.Fatalf("runs %d, want 3", n)
	}
}

// TestAttackSrvInProgressPushbackDefault: a duplicate while the first
// runs gets ABORTED with "grpc-retry-pushback-ms: 1000" by default.
func TestAttackSrvInProgressPushbackDefault(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	s := &srvAttack{}
	s.fn = func(ctx context.Context, n int64, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		close(entered)
		<-release
		return &testpb.SimpleResponse{}, nil
	}
	client := keyedAttackServer(t, s)
	ctx := srvKeyed(t.Context(), "ip")
	done := make(chan error)
	go func() { _, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}); done <- err }()
	<-entered
	var tr metadata.MD
	_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Trailer(&tr))
	close(release)
	if status.Code(err) != codes.Aborted || !slices.Equal(tr.Get(wire.PushbackMetadata), []string{"1000"}) {
		t.Fatalf("duplicate: %v, pushback %q; want ABORTED, [1000]", err, tr.Get(wire.PushbackMetadata))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// admittedInMemory serves s behind ctl on loopback (the name is historical) and returns a plain client.
func admittedInMemory(t *testing.T, s testpb.TestServiceServer, ctl *admission.Controller, opts ...grpc.ServerOption) testpb.TestServiceClient {
	t.Helper()
	addr := serve(t, s, append(grpcretry.AdmissionServerOptions(ctl), opts...)...)
	return dial(t, addr)
}

func retryCtx(ctx context.Context, prev int, probe bool) context.Context {
	ctx = metadata.AppendToOutgoingContext(ctx, wire.PreviousAttemptsMetadata, fmt.Sprint(prev))
	if probe {
		ctx = metadata.AppendToOutgoingContext(ctx, "stormguard-probe", "1")
	}
	return ctx
}

// TestAttackSrvAdmissionRatioDefaults: with the default floor (1 a
// second over a 10 s window) and 100 originals, 0.1*100 + 10 = 20 retries
// are admitted, the rest refused with UNAVAILABLE and pushback -1; marked
// probes onto idle slots neither are refused nor spend the allowance.
func TestAttackSrvAdmissionRatioDefaults(t *testing.T) {
	ctl, err := admission.New(admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	s := &srvAttack{}
	client := admittedInMemory(t, s, ctl)
	for range 100 {
		if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	// Probes first: 50 of them, all admitted.
	for i := range 50 {
		if _, err := client.UnaryCall(retryCtx(t.Context(), 1+i%3, true), &testpb.SimpleRequest{}); err != nil {
			t.Fatalf("probe %d: %v", i, err)
		}
	}
	admitted, refused := 0, 0
	for range 40 {
		var tr metadata.MD
		_, err := client.UnaryCall(retryCtx(t.Context(), 2, false), &testpb.SimpleRequest{}, grpc.Trailer(&tr))
		switch status.Code(err) {
		case codes.OK:
			admitted++
		case codes.Unavailable:
			refused++
			if !slices.Equal(tr.Get(wire.PushbackMetadata), []string{"-1"}) {
				t.Errorf("refused retry: pushback %q", tr.Get(wire.PushbackMetadata))
			}
		default:
			t.Fatal(err)
		}
	}
	if admitted != 20 || refused != 20 {
		t.Errorf("retries admitted %d refused %d; want 20, 20 (0.1 x 100 originals + 10 floor)", admitted, refused)
	}
	// Once the allowance is spent, a probe onto an idle slot still passes.
	if _, err := client.UnaryCall(retryCtx(t.Context(), 5, true), &testpb.SimpleRequest{}); err != nil {
		t.Errorf("probe after the allowance was spent: %v", err)
	}
	if n := s.runs.Load(); n != 100+50+20+1 {
		t.Errorf("handler ran %d times, want 171", n)
	}
}

// TestAttackSrvProbeRefusalNotDontRetry: a marked probe that finds no
// idle slot and no allowance is refused with RetryAfterBase as pushback and
// RetryInfo, never the don't-retry -1.
func TestAttackSrvProbeRefusalNotDontRetry(t *testing.T) {
	ctl, err := admission.New(admission.Config{MaxInFlight: 1, RetryRatio: -1, MinRetriesPerSecond: -1, RetryAfterBase: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	s := &srvAttack{}
	s.fn = func(ctx context.Context, n int64, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		if n == 1 {
			close(entered)
			<-release
		}
		return &testpb.SimpleResponse{}, nil
	}
	client := admittedInMemory(t, s, ctl)
	done := make(chan error)
	go func() { _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); done <- err }()
	<-entered
	var tr metadata.MD
	_, err = client.UnaryCall(retryCtx(t.Context(), 1, true), &testpb.SimpleRequest{}, grpc.Trailer(&tr))
	close(release)
	<-done
	st := status.Convert(err)
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if st.Code() != codes.Unavailable || !slices.Equal(tr.Get(wire.PushbackMetadata), []string{"1500"}) || ri == nil || ri.GetRetryDelay().AsDuration() != 1500*time.Millisecond {
		t.Fatalf("busy probe: %v, pushback %q, RetryInfo %v; want UNAVAILABLE, [1500], 1.5s", err, tr.Get(wire.PushbackMetadata), ri)
	}
}

// TestAttackSrvDeadlinePropagated: the handler's deadline is the
// attempt's (WithAttemptTimeout) or the call's, whichever is earlier.
func TestAttackSrvDeadlinePropagated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got atomic.Int64
		s := &srvAttack{}
		s.fn = func(ctx context.Context, n int64, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			dl, ok := ctx.Deadline()
			if ok {
				got.Store(int64(time.Until(dl)))
			}
			return &testpb.SimpleResponse{}, nil
		}
		client := serveInMemory(t, s, newClient(t, grpcretry.WithIdempotentMethods(unaryMethod), grpcretry.WithAttemptTimeout(300*time.Millisecond))...)
		for _, tc := range []struct{ call, want time.Duration }{{5 * time.Second, 300 * time.Millisecond}, {200 * time.Millisecond, 200 * time.Millisecond}} {
			ctx, cancel := context.WithTimeout(t.Context(), tc.call)
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if d := time.Duration(got.Load()); d > tc.want || d < tc.want-time.Millisecond {
				t.Errorf("call deadline %v: handler saw %v left, want %v", tc.call, d, tc.want)
			}
		}
	})
}

// streamAttack serves server streams and bidi streams that fail after a
// scripted number of messages.
type streamAttack struct {
	testpb.UnimplementedTestServiceServer
	opens atomic.Int64
	msgs  int
}

func (s *streamAttack) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, ss testpb.TestService_StreamingOutputCallServer) error {
	n := s.opens.Add(1)
	if n == 1 {
		for range s.msgs {
			if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte("m")}}); err != nil {
				return err
			}
		}
		return status.Error(codes.Unavailable, "down")
	}
	return ss.Send(&testpb.StreamingOutputCallResponse{Payload: &testpb.Payload{Body: []byte("retry")}})
}

func (s *streamAttack) FullDuplexCall(ss testpb.TestService_FullDuplexCallServer) error {
	n := s.opens.Add(1)
	for {
		m, err := ss.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n == 1 && s.msgs == 0 {
			return status.Error(codes.Unavailable, "down before answering")
		}
		if err := ss.Send(&testpb.StreamingOutputCallResponse{Payload: m.GetPayload()}); err != nil {
			return err
		}
		if n == 1 {
			return status.Error(codes.Unavailable, "down after answering")
		}
	}
}

// TestAttackSrvStreamsCommitPoint: a server stream or bidi stream that
// failed after a message reached the caller is never retried; one that
// failed before is.
func TestAttackSrvStreamsCommitPoint(t *testing.T) {
	opts := newClient(t, grpcretry.WithIdempotentMethods(outMethod, duplexMethod), grpcretry.WithBufferMessages(1<<10), grpcretry.WithBudget(nil), grpcretry.WithBreaker(nil))
	for _, msgs := range []int{0, 1} {
		t.Run(fmt.Sprint("server-stream msgs=", msgs), func(t *testing.T) {
			s := &streamAttack{msgs: msgs}
			client := dial(t, serve(t, s), opts...)
			st, err := client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for {
				m, err := st.Recv()
				if err == io.EOF {
					got = append(got, "EOF")
					break
				}
				if err != nil {
					got = append(got, status.Code(err).String())
					break
				}
				got = append(got, string(m.GetPayload().GetBody()))
			}
			want := []string{"retry", "EOF"}
			if msgs == 1 {
				want = []string{"m", "Unavailable"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("got %q, want %q", got, want)
			}
			if n := s.opens.Load(); n != 2-int64(msgs) {
				t.Errorf("opens %d", n)
			}
		})
		t.Run(fmt.Sprint("bidi msgs=", msgs), func(t *testing.T) {
			s := &streamAttack{msgs: msgs}
			client := dial(t, serve(t, s), opts...)
			st, err := client.FullDuplexCall(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
			m, err := st.Recv()
			if err != nil || string(m.GetPayload().GetBody()) != "x" {
				t.Fatalf("first recv: %v %v", m, err)
			}
			_ = st.Send(&testpb.StreamingOutputCallRequest{Payload: &testpb.Payload{Body: []byte("y")}})
			_, err = st.Recv()
			if msgs == 1 && status.Code(err) != codes.Unavailable {
				t.Errorf("after a message: %v, want the failure, not a retry", err)
			}
			want := int64(2 - msgs)
			if n := s.opens.Load(); n != want {
				t.Errorf("opens %d, want %d", n, want)
			}
		})
	}
}

var _ = errors.New
