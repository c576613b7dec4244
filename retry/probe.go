package retry

import "context"

// probeKey is the context key of the probe mark (see IsProbe).
type probeKey struct{}

// markProbe returns ctx marked as the context of a probe attempt. It
// allocates (one context value), only on the breaker's probe and release
// path.
func markProbe(ctx context.Context) context.Context {
	return context.WithValue(ctx, probeKey{}, true)
}

// IsProbe reports whether ctx is the context of an attempt that a circuit
// breaker ([WithGuards]) let through to find out whether its dependency is
// back: an attempt the breaker admitted as a probe, or the first send of a
// call that waited behind the open breaker and was released when it closed.
// The loop marks the attempt context it hands the operation; a client
// built on the loop (packages httpretry and grpcretry) puts the mark on the
// wire (package wire's ProbeHeader) so that a provider's admission does
// not refuse it as one more retry. It is false for every other context,
// nil included, and allocates nothing.
func IsProbe(ctx context.Context) bool {
	if ctx == nil {
		return false
	}
	v, _ := ctx.Value(probeKey{}).(bool)
	return v
}
