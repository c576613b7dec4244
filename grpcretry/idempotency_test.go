package grpcretry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/wire"
)

const emptyMethod = testpb.TestService_EmptyCall_FullMethodName

// keyedServer is the test service behind the idempotency interceptor: it
// counts its runs, sets header and trailer metadata, answers the status a
// request asks for (ResponseStatus), pads its reply to ResponseSize bytes,
// and blocks a request whose payload is "block" until unblocked.
type keyedServer struct {
	testpb.UnimplementedTestServiceServer
	runs    atomic.Int64
	entered chan struct{} // a blocked request entered
	proceed chan struct{} // closed: blocked requests go on
}

func newKeyedServer() *keyedServer {
	return &keyedServer{entered: make(chan struct{}, 16), proceed: make(chan struct{})}
}

func (s *keyedServer) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	n := strconv.FormatInt(s.runs.Add(1), 10)
	_ = grpc.SetHeader(ctx, metadata.Pairs("x-charge", "ch-"+n, "x-private", "secret-"+n))
	_ = grpc.SetTrailer(ctx, metadata.Pairs("x-ledger", "entry-"+n))
	if string(req.GetPayload().GetBody()) == "block" {
		s.entered <- struct{}{}
		<-s.proceed
	}
	if st := req.GetResponseStatus(); st != nil && st.GetCode() != 0 {
		d, _ := status.New(codes.Code(st.GetCode()), st.GetMessage()+" (run "+n+")").
			WithDetails(&errdetails.ErrorInfo{Reason: "SCRIPTED", Domain: "test", Metadata: map[string]string{"run": n, "b": "2", "a": "1"}})
		return nil, d.Err()
	}
	return &testpb.SimpleResponse{
		Username: "run-" + n,
		Payload:  &testpb.Payload{Body: bytes.Repeat([]byte{'x'}, int(req.GetResponseSize()))},
	}, nil
}

func (s *keyedServer) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	s.runs.Add(1)
	return &testpb.Empty{}, nil
}

// userKeyScope scopes calls by their "x-user" metadata, as an
// authentication interceptor in front would.
func userKeyScope(ctx context.Context) (string, error) {
	if vs := metadata.ValueFromIncomingContext(ctx, "x-user"); len(vs) == 1 && vs[0] != "" {
		return vs[0], nil
	}
	return "", errors.New("no user")
}

// keyedFixture is a keyed server on loopback TCP behind the interceptor,
// and a connection to it.
type keyedFixture struct {
	srv  *keyedServer
	conn *grpc.ClientConn
	log  *eventLog
}

// eventLog is an observer that keeps the events; safe for concurrent use.
type eventLog struct {
	mu     sync.Mutex
	events []observe.Event
}

func (l *eventLog) Observe(_ context.Context, e observe.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// outcomes returns the outcomes of the events so far, and forgets them.
func (l *eventLog) outcomes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.events {
		out = append(out, e.Outcome)
	}
	l.events = nil
	return out
}

func newKeyedFixture(t *testing.T, mem store.Store, opts ...grpcretry.IdempotencyOption) *keyedFixture {
	t.Helper()
	if mem == nil {
		mem, _ = idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	}
	f := &keyedFixture{srv: newKeyedServer(), log: &eventLog{}}
	g, err := idempotency.NewGuard(mem, idempotency.WithObserver(f.log), idempotency.WithName("payments"))
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	ic, err := grpcretry.IdempotencyUnaryServerInterceptor(g, append([]grpcretry.IdempotencyOption{
		grpcretry.WithKeyScope(userKeyScope),
		grpcretry.WithReplayMetadata("x-charge", "x-ledger"),
		grpcretry.WithKeyPushback(250 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatalf("IdempotencyUnaryServerInterceptor: %v", err)
	}
	addr := serve(t, f.srv, grpc.ChainUnaryInterceptor(ic))
	f.conn = dialConn(t, addr)
	t.Cleanup(func() {
		select {
		case <-f.srv.proceed:
		default:
			close(f.srv.proceed)
		}
	})
	return f
}

// keyedAnswer is what a client got for one call.
type keyedAnswer struct {
	raw              []byte // the reply message as it came over the wire
	st               *status.Status
	header, trailer  metadata.MD
	replayed, omited bool
}

// rawCodec sends proto requests and keeps replies as the bytes that came
// over the wire, so that a test can compare them byte for byte.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return proto.Marshal(v.(proto.Message)) }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = slices.Clone(data)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// call makes a call of method with req as user, with the idempotency key
// values keys (none: no key).
func (f *keyedFixture) call(t *testing.T, method string, req proto.Message, user string, keys ...string) keyedAnswer {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-user", user)
	for _, k := range keys {
		ctx = metadata.AppendToOutgoingContext(ctx, idempotency.Header, k)
	}
	var a keyedAnswer
	err := f.conn.Invoke(ctx, method, req, &a.raw, grpc.ForceCodec(rawCodec{}), grpc.Header(&a.header), grpc.Trailer(&a.trailer))
	a.st = status.Convert(err)
	a.replayed = slices.Equal(a.header.Get(idempotency.ReplayHeader), []string{"true"})
	a.omited = slices.Equal(a.header.Get(grpcretry.ReplyOmittedMetadata), []string{"true"})
	return a
}

func charge(body string) *testpb.SimpleRequest {
	return &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}}
}

// TestIdempotencyReplay: the second call with a key gets the first one's
// reply, byte for byte, and its allow-listed metadata, marked as a replay;
// the handler runs once.
func TestIdempotencyReplay(t *testing.T) {
	f := newKeyedFixture(t, nil)
	first := f.call(t, unaryMethod, charge("100 EUR"), "alice", "k1")
	if first.st.Code() != codes.OK || first.replayed || len(first.raw) == 0 {
		t.Fatalf("first call: %v, replayed %v, %d reply bytes; want OK, a reply, not a replay", first.st, first.replayed, len(first.raw))
	}
	for i := range 3 {
		rep := f.call(t, unaryMethod, charge("100 EUR"), "alice", "k1")
		if rep.st.Code() != codes.OK || !rep.replayed || !bytes.Equal(rep.raw, first.raw) {
			t.Fatalf("retry %d: %v, replayed %v, reply %q; want OK, the reply %q byte for byte, replayed", i, rep.st, rep.replayed, rep.raw, first.raw)
		}
		if got := rep.header.Get("x-charge"); !slices.Equal(got, []string{"ch-1"}) {
			t.Errorf("retry %d: header x-charge %q, want the first call's [ch-1]", i, got)
		}
		if got := rep.header.Get("x-private"); got != nil {
			t.Errorf("retry %d: header x-private %q replayed, want it left out (not allow-listed)", i, got)
		}
		if got := rep.trailer.Get("x-ledger"); !slices.Equal(got, []string{"entry-1"}) {
			t.Errorf("retry %d: trailer x-ledger %q, want the first call's [entry-1]", i, got)
		}
	}
	if n := f.srv.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if got, want := f.log.outcomes(), []string{"new", "replay", "replay", "replay"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestIdempotencyStatuses: a stored error is replayed with its code,
// message and details; an error that is not stored releases the key.
func TestIdempotencyStatuses(t *testing.T) {
	tests := []struct {
		code   codes.Code
		stored bool
	}{
		{codes.NotFound, true},
		{codes.InvalidArgument, true},
		{codes.FailedPrecondition, true},
		{codes.Unavailable, false},
		{codes.Internal, false},
		{codes.ResourceExhausted, false},
		{codes.Aborted, false},
		{codes.Unauthenticated, false},
	}
	for _, tc := range tests {
		t.Run(tc.code.String(), func(t *testing.T) {
			f := newKeyedFixture(t, nil)
			req := &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(tc.code), Message: "scripted"}}
			first := f.call(t, unaryMethod, req, "alice", "k")
			second := f.call(t, unaryMethod, req, "alice", "k")
			if first.st.Code() != tc.code || second.st.Code() != tc.code {
				t.Fatalf("codes %v then %v, want %v twice", first.st.Code(), second.st.Code(), tc.code)
			}
			runs := f.srv.runs.Load()
			if tc.stored {
				if runs != 1 || !second.replayed || !proto.Equal(first.st.Proto(), second.st.Proto()) {
					t.Fatalf("runs %d, replayed %v, status %v then %v; want 1 run and the same status (message, details) replayed", runs, second.replayed, first.st.Proto(), second.st.Proto())
				}
				if got := second.trailer.Get("x-ledger"); !slices.Equal(got, []string{"entry-1"}) {
					t.Errorf("replayed trailer x-ledger %q, want [entry-1]", got)
				}
				return
			}
			if runs != 2 || second.replayed {
				t.Fatalf("runs %d, replayed %v; want 2 runs (the key released), no replay", runs, second.replayed)
			}
		})
	}
}

// TestIdempotencyMismatch: a key reused with another request message, or
// for another method, is FAILED_PRECONDITION with a PreconditionFailure,
// and runs nothing.
func TestIdempotencyMismatch(t *testing.T) {
	f := newKeyedFixture(t, nil)
	f.call(t, unaryMethod, charge("100 EUR"), "alice", "k")
	for _, c := range []struct {
		name   string
		method string
		req    proto.Message
	}{
		{"other message", unaryMethod, charge("999 EUR")},
		{"other method", emptyMethod, &testpb.Empty{}},
	} {
		a := f.call(t, c.method, c.req, "alice", "k")
		var pf *errdetails.PreconditionFailure
		for _, d := range a.st.Details() {
			if p, ok := d.(*errdetails.PreconditionFailure); ok {
				pf = p
			}
		}
		if a.st.Code() != codes.FailedPrecondition || pf == nil || pf.GetViolations()[0].GetSubject() != keyMD {
			t.Errorf("%s: %v with details %v, want FAILED_PRECONDITION with a PreconditionFailure on %s", c.name, a.st, a.st.Details(), keyMD)
		}
	}
	if n := f.srv.runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	if got, want := f.log.outcomes(), []string{"new", "mismatch", "mismatch"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestIdempotencyInProgress: a call whose key's first call still runs gets
// ABORTED with the pushback trailer, which this package's client reads as
// a retryable answer for a keyed call; once the first call ends, the
// replay.
func TestIdempotencyInProgress(t *testing.T) {
	f := newKeyedFixture(t, nil)
	done := make(chan keyedAnswer)
	go func() { done <- f.call(t, unaryMethod, charge("block"), "alice", "k") }()
	<-f.srv.entered
	a := f.call(t, unaryMethod, charge("block"), "alice", "k")
	if a.st.Code() != codes.Aborted || !slices.Equal(a.trailer.Get(wire.PushbackMetadata), []string{"250"}) {
		t.Fatalf("while the first runs: %v, trailer %v; want ABORTED with %s: 250", a.st, a.trailer, wire.PushbackMetadata)
	}
	close(f.srv.proceed)
	first := <-done
	rep := f.call(t, unaryMethod, charge("block"), "alice", "k")
	if !rep.replayed || !bytes.Equal(rep.raw, first.raw) || f.srv.runs.Load() != 1 {
		t.Fatalf("after the first ended: replayed %v, runs %d; want the replay of its reply and 1 run", rep.replayed, f.srv.runs.Load())
	}
	if got, want := f.log.outcomes(), []string{"in-progress", "new", "replay"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestIdempotencyInProgressClientRetries: grpcretry's client, with its own
// key, retries the ABORTED answer after the pushback and gets the first
// call's reply.
func TestIdempotencyInProgressClientRetries(t *testing.T) {
	f := newKeyedFixture(t, nil)
	clock := newTimeline()
	c := newClient(t, grpcretry.WithBudget(nil), grpcretry.WithObserver(clock))
	const key = "shared-key"
	done := make(chan error)
	go func() {
		_, err := testpb.NewTestServiceClient(f.conn).UnaryCall(
			metadata.AppendToOutgoingContext(t.Context(), "x-user", "alice", idempotency.Header, key), charge("block"))
		done <- err
	}()
	<-f.srv.entered
	clock.onRetry = func() { // the second client's first attempt got ABORTED: let the first call end
		select {
		case <-f.srv.proceed:
		default:
			close(f.srv.proceed)
			<-done
		}
	}
	addr := f.conn.Target()
	client := testpb.NewTestServiceClient(dialConn(t, addr, c...))
	var hdr metadata.MD
	resp, err := client.UnaryCall(metadata.AppendToOutgoingContext(t.Context(), "x-user", "alice", idempotency.Header, key), charge("block"), grpc.Header(&hdr))
	if err != nil || resp.GetUsername() != "run-1" || hdr.Get(idempotency.ReplayHeader) == nil {
		t.Fatalf("retried call: %v, %v, header %v; want the replay of run-1", resp, err, hdr)
	}
	if s := clock.Sleeps(); len(s) != 1 || s[0] < 250*time.Millisecond {
		t.Fatalf("client slept %v, want once, at least the 250ms pushback", s)
	}
}

// failingStore is a store that is down.
type failingStore struct{ store.Store }

var errStoreDown = errors.New("store down")

func (failingStore) Begin(context.Context, store.ID, store.Fingerprint, time.Duration) (store.Result, error) {
	return store.Result{}, errStoreDown
}

// TestIdempotencyStoreDown: the call is refused with UNAVAILABLE and the
// pushback, never run unguarded.
func TestIdempotencyStoreDown(t *testing.T) {
	f := newKeyedFixture(t, failingStore{})
	a := f.call(t, unaryMethod, charge("100 EUR"), "alice", "k")
	if a.st.Code() != codes.Unavailable || !slices.Equal(a.trailer.Get(wire.PushbackMetadata), []string{"250"}) {
		t.Fatalf("store down: %v, trailer %v; want UNAVAILABLE with %s: 250", a.st, a.trailer, wire.PushbackMetadata)
	}
	if n := f.srv.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times with the store down, want 0", n)
	}
	if got, want := f.log.outcomes(), []string{"store-error"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestIdempotencyKeys: malformed keys are INVALID_ARGUMENT with a
// BadRequest, and run nothing; with the key required, so is a call
// without one; quoted and bare forms are one key.
func TestIdempotencyKeys(t *testing.T) {
	f := newKeyedFixture(t, nil, grpcretry.WithKeyRequired())
	for _, keys := range [][]string{
		{},
		{""},
		{"   "},
		{strings.Repeat("k", 255+1)},
		{"a,b"},
		{`"a\q"`},
		{`"unterminated`},
		{"k1", "k2"},
		{"k1", "k1"},
	} {
		a := f.call(t, unaryMethod, charge("1"), "alice", keys...)
		var br *errdetails.BadRequest
		for _, d := range a.st.Details() {
			if b, ok := d.(*errdetails.BadRequest); ok {
				br = b
			}
		}
		if a.st.Code() != codes.InvalidArgument || br == nil {
			t.Errorf("keys %q: %v with details %v, want INVALID_ARGUMENT with a BadRequest", keys, a.st, a.st.Details())
		}
	}
	if n := f.srv.runs.Load(); n != 0 {
		t.Fatalf("handler ran %d times for bad keys, want 0", n)
	}
	if got := f.log.outcomes(); len(got) != 9 || slices.IndexFunc(got, func(o string) bool { return o != "invalid" }) >= 0 {
		t.Fatalf("events %q, want 9 \"invalid\" (the call without a key too: the key is required)", got)
	}
	f.call(t, unaryMethod, charge("1"), "alice", `"k-\"1\""`)
	if a := f.call(t, unaryMethod, charge("1"), "alice", `k-"1"`); !a.replayed || f.srv.runs.Load() != 1 {
		t.Fatalf("the bare form of a quoted key: replayed %v, runs %d; want a replay", a.replayed, f.srv.runs.Load())
	}
}

// TestIdempotencyScopeAndMethods: keys are per caller; methods not guarded
// and calls without a key (not required) run every time; a caller who
// cannot be identified is refused.
func TestIdempotencyScopeAndMethods(t *testing.T) {
	f := newKeyedFixture(t, nil, grpcretry.WithKeyMethods(unaryMethod))
	a := f.call(t, unaryMethod, charge("1"), "alice", "k")
	b := f.call(t, unaryMethod, charge("1"), "bob", "k")
	if b.replayed || bytes.Equal(a.raw, b.raw) || f.srv.runs.Load() != 2 {
		t.Fatalf("bob with alice's key: replayed %v, runs %d; want his own run", b.replayed, f.srv.runs.Load())
	}
	f.call(t, emptyMethod, &testpb.Empty{}, "alice", "k")
	f.call(t, emptyMethod, &testpb.Empty{}, "alice", "k")
	f.call(t, unaryMethod, charge("1"), "alice")
	if n := f.srv.runs.Load(); n != 5 {
		t.Fatalf("runs %d, want 5 (an unguarded method and a call without a key run every time)", n)
	}
	if a := f.call(t, unaryMethod, charge("1"), "", "k"); a.st.Code() != codes.Internal || f.srv.runs.Load() != 5 {
		t.Fatalf("caller unknown: %v, runs %d; want INTERNAL, nothing run", a.st, f.srv.runs.Load())
	}
	if got, want := f.log.outcomes(), []string{"new", "new", "invalid"}; !slices.Equal(got, want) {
		t.Fatalf("events %q, want %q", got, want)
	}
}

// TestIdempotencyReplyOverCap: a reply over the cap reaches the first
// caller whole; a retry gets DATA_LOSS marked as a replay without its
// reply, and the handler does not run again.
func TestIdempotencyReplyOverCap(t *testing.T) {
	f := newKeyedFixture(t, nil, grpcretry.WithMaxStoredReply(1024))
	req := &testpb.SimpleRequest{ResponseSize: 4096}
	first := f.call(t, unaryMethod, req, "alice", "k")
	rep := f.call(t, unaryMethod, req, "alice", "k")
	if first.st.Code() != codes.OK || len(first.raw) < 4096 {
		t.Fatalf("first call: %v, %d bytes; want OK with the whole reply", first.st, len(first.raw))
	}
	if rep.st.Code() != codes.DataLoss || !rep.replayed || !rep.omited || f.srv.runs.Load() != 1 {
		t.Fatalf("retry: %v, replayed %v, omitted %v, runs %d; want DATA_LOSS, replayed, reply omitted, 1 run", rep.st, rep.replayed, rep.omited, f.srv.runs.Load())
	}
}

// TestIdempotencyInterceptorErrors: bad construction is an error that says
// so, never a panic.
func TestIdempotencyInterceptorErrors(t *testing.T) {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	g, _ := idempotency.NewGuard(mem)
	scope := sharedKeyScope
	tests := []struct {
		name string
		g    *idempotency.Guard
		opts []grpcretry.IdempotencyOption
	}{
		{"nil guard", nil, []grpcretry.IdempotencyOption{scope}},
		{"no scope", g, nil},
		{"nil scope", g, []grpcretry.IdempotencyOption{grpcretry.WithKeyScope(nil)}},
		{"two scopes", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithKeyScope(userKeyScope)}},
		{"no method", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithKeyMethods()}},
		{"not a full method", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithKeyMethods("UnaryCall")}},
		{"unknown service", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithKeyMethods("/no.Such/Call")}},
		{"unknown method", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithKeyMethods("/grpc.testing.TestService/NoSuchCall")}},
		{"nil stored codes", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithStoredCodes(nil)}},
		{"grpc- key", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithReplayMetadata("grpc-status")}},
		{"pushback key", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithReplayMetadata(wire.PushbackMetadata)}},
		{"replayed key", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithReplayMetadata("Idempotent-Replayed")}},
		{"bad key", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithReplayMetadata("x y")}},
		{"max reply 0", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithMaxStoredReply(0)}},
		{"pushback 0", g, []grpcretry.IdempotencyOption{scope, grpcretry.WithKeyPushback(0)}},
	}
	for _, tc := range tests {
		if in, err := grpcretry.IdempotencyUnaryServerInterceptor(tc.g, tc.opts...); err == nil || in != nil || !strings.HasPrefix(err.Error(), "grpcretry: invalid option: ") {
			t.Errorf("%s: %v, want an invalid option error", tc.name, err)
		}
	}
	if _, err := grpcretry.IdempotencyUnaryServerInterceptor(g, nil, scope, grpcretry.WithKeyMethods(unaryMethod, emptyMethod),
		grpcretry.WithStoredCodes(func(codes.Code) bool { return true }), grpcretry.WithReplayMetadata("X-Charge")); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

// ExampleIdempotencyUnaryServerInterceptor shows a retried call that the
// server runs once.
func ExampleIdempotencyUnaryServerInterceptor() {
	mem, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	guard, err := idempotency.NewGuard(mem, idempotency.WithName("payments"))
	if err != nil {
		panic(err)
	}
	keys, err := grpcretry.IdempotencyUnaryServerInterceptor(guard,
		grpcretry.WithKeyScope(func(ctx context.Context) (string, error) {
			return "tenant-1", nil // in a real server: the authenticated caller
		}))
	if err != nil {
		panic(err)
	}
	addr, stop := startCharges(grpc.ChainUnaryInterceptor(keys))
	defer stop()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	client := testpb.NewTestServiceClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), idempotency.Header, idempotency.NewKey())
	for range 2 { // the same call, sent twice (a retry after a lost reply)
		var header metadata.MD
		resp, err := client.UnaryCall(ctx, charge("100 EUR"), grpc.Header(&header))
		fmt.Println(resp.GetUsername(), err, "replayed:", header.Get(idempotency.ReplayHeader))
	}
	// Output:
	// run-1 <nil> replayed: []
	// run-1 <nil> replayed: [true]
}

// startCharges serves a keyedServer on a loopback port.
func startCharges(opts ...grpc.ServerOption) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	s := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(s, newKeyedServer())
	go func() { _ = s.Serve(ln) }()
	return ln.Addr().String(), s.Stop
}

// dialConn connects to addr in plain text with opts; the connection is
// closed when the test ends.
func dialConn(t testing.TB, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
