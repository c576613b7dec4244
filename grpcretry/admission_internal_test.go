package grpcretry

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// TestAttemptFromContext reads the attempt number a server call carries.
func TestAttemptFromContext(t *testing.T) {
	tests := []struct {
		vals []string
		n    int
	}{
		{nil, 1},
		{[]string{"1"}, 2},
		{[]string{"2", "1"}, 3},
		{[]string{"x"}, 1},
		{[]string{"0"}, 1},
		{[]string{"-3"}, 1},
	}
	for _, tt := range tests {
		md := metadata.MD{}
		if tt.vals != nil {
			md[wire.PreviousAttemptsMetadata] = tt.vals
		}
		ctx := metadata.NewIncomingContext(context.Background(), md)
		if n := attemptFromContext(ctx); n != tt.n {
			t.Errorf("attemptFromContext(%q) = %d, want %d", tt.vals, n, tt.n)
		}
	}
}

// TestAdmissionAllocs: an admitted call costs the admission interceptor no
// allocation.
func TestAdmissionAllocs(t *testing.T) {
	ctl, err := admission.New(admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	in := admissionUnary(ctl)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.MD{"content-type": {"application/grpc"}})
	info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_UnaryCall_FullMethodName}
	handler := func(ctx context.Context, req any) (any, error) { return req, nil }
	req := &testpb.SimpleRequest{}
	if n := testing.AllocsPerRun(1000, func() { _, _ = in(ctx, req, info, handler) }); n != 0 {
		t.Errorf("admitted call: %v allocations, want 0", n)
	}
}

// probeMetadata is wire.ProbeHeader in lower case, as the wire documents.
func TestProbeMetadataName(t *testing.T) {
	if probeMetadata != strings.ToLower(wire.ProbeHeader) {
		t.Errorf("probeMetadata = %q, want %q", probeMetadata, strings.ToLower(wire.ProbeHeader))
	}
}

// TestAdmissionProbe: with no retry allowance left, a retry is refused; the
// same retry marked as a probe passes (an idle slot is free), and a call
// whose deadline has passed is dropped before the handler.
func TestAdmissionProbe(t *testing.T) {
	ctl, err := admission.New(admission.Config{RetryRatio: -1, MinRetriesPerSecond: -1})
	if err != nil {
		t.Fatal(err)
	}
	in := admissionUnary(ctl)
	info := &grpc.UnaryServerInfo{FullMethod: testpb.TestService_UnaryCall_FullMethodName}
	ran := 0
	handler := func(ctx context.Context, req any) (any, error) { ran++; return req, nil }
	retry := metadata.MD{wire.PreviousAttemptsMetadata: {"1"}}
	probe := metadata.MD{wire.PreviousAttemptsMetadata: {"1"}, probeMetadata: {"1"}}
	if _, err := in(metadata.NewIncomingContext(context.Background(), retry), nil, info, handler); err == nil || ran != 0 {
		t.Errorf("retry without allowance: err %v, handler ran %d times; want refused", err, ran)
	}
	if _, err := in(metadata.NewIncomingContext(context.Background(), probe), nil, info, handler); err != nil || ran != 1 {
		t.Errorf("marked probe: err %v, handler ran %d times; want admitted", err, ran)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
	defer cancel()
	if _, err := in(metadata.NewIncomingContext(ctx, metadata.MD{}), nil, info, handler); err == nil || ran != 1 {
		t.Errorf("call past its deadline: err %v, handler ran %d times; want dropped", err, ran)
	}
	if s := ctl.Stats(); s.Outcomes[admission.RetryRefused] != 1 || s.Outcomes[admission.Canceled] != 1 {
		t.Errorf("outcomes %v, want 1 retry refused and 1 dropped for its deadline (Canceled)", s.Outcomes)
	}
}

// TestAttemptContextProbe: an attempt the retry loop marked as a breaker's
// probe carries "stormguard-probe: 1" beside its attempt count; the other
// attempts do not.
func TestAttemptContextProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, err := newClient()
		if err != nil {
			t.Fatal(err)
		}
		brk, err := breaker.New(breaker.Config{MinCalls: 1, Probes: 1, OpenFor: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		p, err := retry.New(retry.WithGuards(retry.Guards{Breaker: brk}), retry.WithMaxAttempts(3))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var got [][]string
		_ = p.Do(ctx, func(ctx context.Context, n int) error {
			md, _ := metadata.FromOutgoingContext(c.attemptContext(ctx, n, false))
			got = append(got, md[probeMetadata])
			if n == 1 {
				return temporary{} // trips the breaker; the next attempt is a probe
			}
			return nil
		})
		if len(got) != 2 || got[0] != nil || len(got[1]) != 1 || got[1][0] != "1" {
			t.Errorf("probe metadata of the attempts: %q, want none on the first, \"1\" on the probe", got)
		}
	})
}

// temporary is an error the retry loop retries.
type temporary struct{}

func (temporary) Error() string   { return "temporarily down" }
func (temporary) Temporary() bool { return true }

// TestWithoutInheritedMarks: a call the client passes through goes without
// the attempt count and probe mark its caller's metadata carries from
// elsewhere (however spelled, set or appended), keeps the rest of it, and
// leaves the caller's metadata as it was; a context without marks is
// passed on as it is, with nothing allocated.
func TestWithoutInheritedMarks(t *testing.T) {
	in := metadata.MD{"Grpc-Previous-Rpc-Attempts": {"2"}, "x-keep": {"v"}}
	ctx := metadata.AppendToOutgoingContext(metadata.NewOutgoingContext(context.Background(), in), probeMetadata, "1", "x-more", "w")
	md, _ := metadata.FromOutgoingContext(withoutInheritedMarks(ctx))
	if len(md) != 2 || md.Get("x-keep")[0] != "v" || md.Get("x-more")[0] != "w" {
		t.Errorf("metadata passed on: %v, want x-keep and x-more only", md)
	}
	if orig, _ := metadata.FromOutgoingContext(ctx); len(orig) != 4 {
		t.Errorf("the caller's metadata changed: %v", orig)
	}
	clean := metadata.AppendToOutgoingContext(metadata.NewOutgoingContext(context.Background(), metadata.MD{"x-keep": {"v"}}), "x-more", "w")
	if withoutInheritedMarks(clean) != clean {
		t.Error("a context without marks was replaced")
	}
	if n := testing.AllocsPerRun(100, func() { _ = withoutInheritedMarks(clean) }); n != 0 {
		t.Errorf("%v allocations for a context without marks, want 0", n)
	}
}
