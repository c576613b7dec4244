package grpcretry

import (
	"context"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// attemptFromContext returns the attempt number of the server call of ctx,
// as its client counts it: 1 plus the wire.PreviousAttemptsMetadata (the
// largest, if it came more than once), or 1 without a valid one.
func attemptFromContext(ctx context.Context) int {
	n := 1
	for _, v := range metadata.ValueFromIncomingContext(ctx, wire.PreviousAttemptsMetadata) {
		if prev, valid := wire.ParseAttempt(v); valid && prev+1 > n {
			n = prev + 1
		}
	}
	return n
}

// acquire asks c for the server call of ctx: with its attempt number, as a
// probe when the client marked it so (probeMetadata "1", see
// admission.Controller.AcquireProbe), and with gRPC's deadline, which ctx
// carries.
func acquire(ctx context.Context, c *admission.Controller) (admission.Permit, admission.Decision) {
	attempt := attemptFromContext(ctx)
	for _, v := range metadata.ValueFromIncomingContext(ctx, probeMetadata) {
		if strings.Trim(v, " \t") == "1" {
			return c.AcquireProbe(ctx, attempt)
		}
	}
	return c.Acquire(ctx, attempt)
}

// AdmissionServerOptions returns the server options that put every call,
// unary or streaming, through c (see package admission): interceptors,
// chained after any given before them (give these first, so that refused
// calls cost nothing else). The attempt number comes from the
// wire.PreviousAttemptsMetadata a client sends, a call marked as a probe
// ("stormguard-probe: 1", the gRPC form of wire.ProbeHeader, which this
// package's client sends) goes through admission.Controller.AcquireProbe,
// the call's gRPC deadline is its caller's (a call whose deadline passed, or
// cannot be met in the queue, is dropped before the handler), and a refused call never
// reaches the handler. It is answered UNAVAILABLE with the trailer
// "grpc-retry-pushback-ms: -1" (do not retry) when the decision says so (a
// retry beyond the ratio, or any refused retry), and otherwise with the
// decision's jittered Retry-After as the pushback in milliseconds and as a
// google.rpc.RetryInfo, so that refused clients come back spread out. An
// admitted call releases its permit when the handler returns (or panics);
// a stream holds it for its life. The admitted path allocates nothing.
// With an adaptive limit (admission.Config.LatencyCeiling), a stream that
// lives longer than the ceiling counts as a drop when it ends, as any
// permit held that long: put long-lived streams on a Controller of their
// own (fixed MaxInFlight), or none, not on the unary calls' adaptive one.
//
//	srv := grpc.NewServer(grpcretry.AdmissionServerOptions(ctl)...)
func AdmissionServerOptions(c *admission.Controller) []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(admissionUnary(c)), grpc.ChainStreamInterceptor(admissionStream(c))}
}

// admissionUnary is the unary interceptor of AdmissionServerOptions.
func admissionUnary(c *admission.Controller) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		p, d := acquire(ctx, c)
		if d.Outcome != admission.Admitted {
			md, err := refusal(d)
			_ = grpc.SetTrailer(ctx, md)
			return nil, err
		}
		defer p.Release()
		return handler(ctx, req)
	}
}

// admissionStream is the stream interceptor of AdmissionServerOptions: the
// permit is held for the life of the stream.
func admissionStream(c *admission.Controller) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		p, d := acquire(ss.Context(), c)
		if d.Outcome != admission.Admitted {
			md, err := refusal(d)
			ss.SetTrailer(md)
			return err
		}
		defer p.Release()
		return handler(srv, ss)
	}
}

// refusal returns the trailer and the status error of a refused call.
func refusal(d admission.Decision) (metadata.MD, error) {
	if d.DontRetry {
		return pushbackMD(-1), status.Error(codes.Unavailable, "overloaded; don't retry ("+d.Outcome.String()+")")
	}
	st := status.New(codes.Unavailable, "overloaded; try again later ("+d.Outcome.String()+")")
	if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}); err == nil {
		st = ds
	}
	return pushbackMD(d.RetryAfter), st.Err()
}
