package grpcretry_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/wire"
)

func newController(t *testing.T, c admission.Config) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return ctl
}

// serveAdmitted serves a test server behind ctl's interceptors.
func serveAdmitted(t *testing.T, srv *testServer, ctl *admission.Controller) testpb.TestServiceClient {
	t.Helper()
	addr := serve(t, srv, grpcretry.AdmissionServerOptions(ctl)...)
	return dial(t, addr) // a plain client: the test sets the attempt metadata itself
}

// TestAdmissionRetryRatio: retries (by grpc-previous-rpc-attempts) beyond
// the ratio are refused before the handler with UNAVAILABLE and pushback
// -1; originals pass.
func TestAdmissionRetryRatio(t *testing.T) {
	ctl := newController(t, admission.Config{RetryRatio: 0.1, MinRetriesPerSecond: -1})
	srv := &testServer{}
	client := serveAdmitted(t, srv, ctl)
	for range 20 {
		if _, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}); err != nil {
			t.Fatalf("original: %v", err)
		}
	}
	admitted, refused := 0, 0
	for range 5 {
		ctx := metadata.AppendToOutgoingContext(t.Context(), wire.PreviousAttemptsMetadata, "1")
		var tr metadata.MD
		_, err := client.UnaryCall(ctx, &testpb.SimpleRequest{}, grpc.Trailer(&tr))
		switch status.Code(err) {
		case codes.OK:
			admitted++
		case codes.Unavailable:
			refused++
			if got := tr[wire.PushbackMetadata]; len(got) != 1 || got[0] != "-1" {
				t.Errorf("refused retry: pushback %q, want [-1]", got)
			}
		default:
			t.Errorf("retry: %v", err)
		}
	}
	// 10% of 20 originals: 2 retries.
	if admitted != 2 || refused != 3 {
		t.Errorf("retries admitted %d, refused %d; want 2, 3", admitted, refused)
	}
	if n := srv.Calls(); n != 22 {
		t.Errorf("handler ran %d times, want 22", n)
	}
}

// TestAdmissionShedJittered: an original shed for lack of room gets
// UNAVAILABLE with a positive pushback and a RetryInfo, drawn afresh for
// each refusal.
func TestAdmissionShedJittered(t *testing.T) {
	ctl := newController(t, admission.Config{MaxInFlight: 1, MaxQueue: -1, RetryAfterBase: time.Second, RetryAfterSpread: 10 * time.Second})
	hold, entered := make(chan struct{}), make(chan struct{})
	srv := &testServer{hold: hold, handler: func(_ context.Context, n int) error {
		if n == 0 {
			close(entered)
		}
		return nil
	}}
	client := serveAdmitted(t, srv, ctl)
	busy := make(chan error)
	go func() {
		_, err := client.UnaryCall(context.Background(), &testpb.SimpleRequest{})
		busy <- err
	}()
	<-entered // the slot is taken
	seen := map[string]bool{}
	for range 20 {
		var tr metadata.MD
		_, err := client.UnaryCall(t.Context(), &testpb.SimpleRequest{}, grpc.Trailer(&tr))
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("shed call: %v, want UNAVAILABLE", err)
		}
		pb := tr[wire.PushbackMetadata]
		ms, perr := strconv.Atoi(pb[0])
		if len(pb) != 1 || perr != nil || ms < 1000 || ms > 11000 {
			t.Fatalf("shed call: pushback %q, want milliseconds in [1000, 11000]", pb)
		}
		seen[pb[0]] = true
		var info *errdetails.RetryInfo
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				info = ri
			}
		}
		if info == nil || info.GetRetryDelay().AsDuration().Milliseconds() > int64(ms) {
			t.Errorf("shed call: RetryInfo %v, want one matching the pushback %d ms", info, ms)
		}
	}
	close(hold)
	if err := <-busy; err != nil {
		t.Errorf("the call holding the slot: %v", err)
	}
	if len(seen) < 10 {
		t.Errorf("20 refusals had %d distinct pushbacks, want them spread", len(seen))
	}
}

// TestAdmissionStream: streams go through the controller too.
func TestAdmissionStream(t *testing.T) {
	ctl := newController(t, admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
	srv := &testServer{streamMsgs: 1}
	client := serveAdmitted(t, srv, ctl)
	ctx := metadata.AppendToOutgoingContext(t.Context(), wire.PreviousAttemptsMetadata, "2")
	stream, err := client.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("retry with no ratio: Recv = %v, want UNAVAILABLE", err)
	}
	if got := stream.Trailer()[wire.PushbackMetadata]; len(got) != 1 || got[0] != "-1" {
		t.Errorf("pushback %q, want [-1]", got)
	}
	stream, err = client.StreamingOutputCall(t.Context(), &testpb.StreamingOutputCallRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Errorf("original: Recv = %v", err)
	}
	if s := ctl.Stats(); s.Originals != 1 || s.Retries != 1 {
		t.Errorf("stats: %d originals, %d retries; want 1, 1", s.Originals, s.Retries)
	}
}
