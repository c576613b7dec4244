// Black-box attack on grpcretry's admission interceptors (AREA = adm3).

package grpcretry_test

import (
	"context"
	"math/rand/v2"
	"net"
	"strconv"
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
	"google.golang.org/grpc/test/bufconn"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/wire"
)

// ad3ServeBuf serves s behind ctl on a bufconn listener and returns a plain
// client.
func ad3ServeBuf(t *testing.T, s testpb.TestServiceServer, ctl *admission.Controller) testpb.TestServiceClient {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(grpcretry.AdmissionServerOptions(ctl)...)
	testpb.RegisterTestServiceServer(srv, s)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///buf",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testpb.NewTestServiceClient(conn)
}

func ad3Ctl(t *testing.T, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return ctl
}

func ad3RetryInfo(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func ad3Outcomes(s admission.Stats) uint64 {
	var n uint64
	for _, v := range s.Outcomes {
		n += v
	}
	return n
}

// Probes over gRPC: "stormguard-probe: 1" on a retry takes an idle slot
// with no ratio at all; with the slot busy it is refused UNAVAILABLE with
// RetryAfterBase as its pushback (and RetryInfo), not -1; an unmarked retry
// is refused with -1.
func TestAttackAdm3GrpcProbe(t *testing.T) {
	ctl := ad3Ctl(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryRatio: -1, MinRetriesPerSecond: -1,
		RetryAfterBase: 3 * time.Second, RetryAfterSpread: 5 * time.Second})
	hold := make(chan struct{})
	entered := make(chan struct{}, 1)
	srv := &testServer{handler: func(ctx context.Context, n int) error {
		if md, _ := metadata.FromIncomingContext(ctx); len(md["x-hold"]) > 0 {
			entered <- struct{}{}
			<-hold
		}
		return nil
	}}
	client := ad3ServeBuf(t, srv, ctl)
	probe := func(ctx context.Context, prev string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, wire.PreviousAttemptsMetadata, prev, "stormguard-probe", "1")
	}
	for range 5 {
		if _, err := client.UnaryCall(probe(t.Context(), "2"), &testpb.SimpleRequest{}); err != nil {
			t.Fatalf("probe onto an idle slot: %v", err)
		}
	}
	var tr metadata.MD
	_, err := client.UnaryCall(metadata.AppendToOutgoingContext(t.Context(), wire.PreviousAttemptsMetadata, "1"), &testpb.SimpleRequest{}, grpc.Trailer(&tr))
	if status.Code(err) != codes.Unavailable || len(tr[wire.PushbackMetadata]) != 1 || tr[wire.PushbackMetadata][0] != "-1" {
		t.Errorf("unmarked retry with no ratio: %v %v, want UNAVAILABLE, pushback -1", err, tr)
	}
	if _, ok := ad3RetryInfo(err); ok {
		t.Errorf("don't-retry refusal carries a RetryInfo")
	}
	// Busy slot.
	done := make(chan error)
	go func() {
		_, err := client.UnaryCall(metadata.AppendToOutgoingContext(context.Background(), "x-hold", "1"), &testpb.SimpleRequest{})
		done <- err
	}()
	<-entered
	for range 3 {
		tr = nil
		_, err = client.UnaryCall(probe(t.Context(), "1"), &testpb.SimpleRequest{}, grpc.Trailer(&tr))
		if status.Code(err) != codes.Unavailable || len(tr[wire.PushbackMetadata]) != 1 || tr[wire.PushbackMetadata][0] != "3000" {
			t.Errorf("probe with the slot busy: %v %v, want UNAVAILABLE, pushback 3000", err, tr)
		}
		if d, ok := ad3RetryInfo(err); !ok || d != 3*time.Second {
			t.Errorf("probe refusal RetryInfo %v %v, want 3s", d, ok)
		}
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := ctl.Stats()
	if s.InFlight != 0 || s.Retries != 9 || s.Originals != 1 || ad3Outcomes(s) != 10 || s.Outcomes[admission.Admitted] != 6 {
		t.Errorf("stats %+v", s)
	}
}

// Hostile grpc-previous-rpc-attempts values: none valid is an original;
// the largest valid one counts.
func TestAttackAdm3GrpcHostileAttempts(t *testing.T) {
	ctl := ad3Ctl(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
	client := ad3ServeBuf(t, &testServer{}, ctl)
	for _, vs := range [][]string{{"-1"}, {"0"}, {"junk"}, {"99999999999999999999"}, {"1048577"}, {""}, {"0", "junk"}} {
		md := metadata.MD{wire.PreviousAttemptsMetadata: vs}
		if _, err := client.UnaryCall(metadata.NewOutgoingContext(t.Context(), md), &testpb.SimpleRequest{}); err != nil {
			t.Errorf("previous attempts %q: %v, want an original admitted", vs, err)
		}
	}
	for _, vs := range [][]string{{"1"}, {"junk", "1"}, {"0", " 3 "}, {"1048576"}, {"1048575"}} {
		md := metadata.MD{wire.PreviousAttemptsMetadata: vs}
		var tr metadata.MD
		_, err := client.UnaryCall(metadata.NewOutgoingContext(t.Context(), md), &testpb.SimpleRequest{}, grpc.Trailer(&tr))
		if status.Code(err) != codes.Unavailable || len(tr[wire.PushbackMetadata]) != 1 || tr[wire.PushbackMetadata][0] != "-1" {
			t.Errorf("previous attempts %q: %v %v, want a retry refused with -1", vs, err, tr)
		}
	}
}

// A queued call whose gRPC deadline comes before a slot frees is dropped
// and its handler never runs, for unary calls and streams; the permit of a
// stream is held for its life.
func TestAttackAdm3GrpcQueuedDeadlineNeverRuns(t *testing.T) {
	ctl := ad3Ctl(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: 10 * time.Second})
	hold := make(chan struct{})
	entered := make(chan struct{}, 1)
	var runs atomic.Int32
	srv := &testServer{handler: func(ctx context.Context, n int) error {
		runs.Add(1)
		if md, _ := metadata.FromIncomingContext(ctx); len(md["x-hold"]) > 0 {
			entered <- struct{}{}
			<-hold
		}
		return nil
	}}
	client := ad3ServeBuf(t, srv, ctl)
	done := make(chan error)
	go func() {
		_, err := client.UnaryCall(metadata.AppendToOutgoingContext(context.Background(), "x-hold", "1"), &testpb.SimpleRequest{})
		done <- err
	}()
	<-entered
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+20*i)*time.Millisecond)
			defer cancel()
			_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{})
			if err == nil {
				t.Errorf("queued call past its deadline succeeded")
			}
		})
	}
	wg.Wait()
	// Let the server-side waiters see their deadlines.
	for deadline := time.Now().Add(5 * time.Second); ctl.Stats().Queued > 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1 (the holder)", n)
	}
	s := ctl.Stats()
	if s.InFlight != 0 || s.Queued != 0 || s.Outcomes[admission.Canceled] != 4 || ad3Outcomes(s) != 5 {
		t.Errorf("stats %+v", s)
	}
}

// Many goroutines over bufconn, -race: unary and streams, originals,
// retries, probes, short deadlines; the handlers never exceed MaxInFlight,
// every call is decided once, nothing is left held.
func TestAttackAdm3GrpcRaceStorm(t *testing.T) {
	const maxIn = 3
	ctl := ad3Ctl(t, admission.Config{MaxInFlight: maxIn, MaxQueue: 5, MaxQueueWait: 30 * time.Millisecond, LatencyCeiling: 50 * time.Millisecond})
	var cur, peakN atomic.Int64
	enter := func() {
		n := cur.Add(1)
		for {
			m := peakN.Load()
			if n <= m || peakN.CompareAndSwap(m, n) {
				return
			}
		}
	}
	srv := &testServer{streamMsgs: 1, handler: func(ctx context.Context, n int) error {
		enter()
		defer cur.Add(-1)
		time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
		return nil
	}}
	client := ad3ServeBuf(t, srv, ctl)
	const g, per = 24, 25
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			for j := range per {
				ctx := t.Context()
				var cancel context.CancelFunc = func() {}
				switch (i + j) % 5 {
				case 1:
					ctx = metadata.AppendToOutgoingContext(ctx, wire.PreviousAttemptsMetadata, strconv.Itoa(1+j%3))
				case 2:
					ctx = metadata.AppendToOutgoingContext(ctx, wire.PreviousAttemptsMetadata, "1", "stormguard-probe", "1")
				case 3:
					ctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(4000))*time.Microsecond+time.Millisecond)
				}
				if j%4 == 0 {
					st, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
					if err == nil {
						_, _ = st.Recv()
						_, _ = st.Recv()
					}
				} else {
					_, _ = client.UnaryCall(ctx, &testpb.SimpleRequest{})
				}
				cancel()
			}
		})
	}
	wg.Wait()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if s := ctl.Stats(); s.InFlight == 0 && s.Queued == 0 && ad3Outcomes(s) == s.Originals+s.Retries {
			break
		}
	}
	s := ctl.Stats()
	if p := peakN.Load(); p > maxIn {
		t.Errorf("peak unary handlers %d > %d", p, maxIn)
	}
	if s.InFlight != 0 || s.Queued != 0 || ad3Outcomes(s) != s.Originals+s.Retries {
		t.Errorf("stats %+v", s)
	}
	t.Logf("stats %+v", s)
}

// "a call whose deadline ... cannot be met in the queue, is dropped before
// the handler": with originals queued and the last one given a slot after
// ~300 ms, a call with 100 ms left is refused at once (UNAVAILABLE,
// pushback -1), not left to reach its deadline.
func TestAttackAdm3GrpcDeadlineCannotBeMetDroppedOnArrival(t *testing.T) {
	ctl := ad3Ctl(t, admission.Config{MaxInFlight: 1, MaxQueue: 10, MaxQueueWait: 5 * time.Second})
	gate := make(chan struct{})
	entered := make(chan struct{}, 10)
	var runs atomic.Int32
	srv := &testServer{handler: func(ctx context.Context, n int) error {
		runs.Add(1)
		entered <- struct{}{}
		<-gate
		return nil
	}}
	client := ad3ServeBuf(t, srv, ctl)
	var wg sync.WaitGroup
	call := func() {
		wg.Go(func() {
			if _, err := client.UnaryCall(context.Background(), &testpb.SimpleRequest{}); err != nil {
				t.Errorf("background call: %v", err)
			}
		})
	}
	call()
	<-entered // A holds the slot
	call()
	call()
	for ctl.Stats().Queued != 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	gate <- struct{}{} // A done: B gets the slot after ~300 ms; C still queued
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var tr metadata.MD
	_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Trailer(&tr))
	if status.Code(err) != codes.Unavailable || len(tr[wire.PushbackMetadata]) != 1 || tr[wire.PushbackMetadata][0] != "-1" {
		t.Errorf("call with 100 ms left behind a 300 ms queue: %v %v, want UNAVAILABLE with pushback -1 at once", err, tr)
	}
	gate <- struct{}{}
	<-entered
	gate <- struct{}{}
	wg.Wait()
	if n := runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
	if s := ctl.Stats(); s.Outcomes[admission.Canceled] != 1 || s.InFlight != 0 {
		t.Errorf("stats %+v", s)
	}
}
