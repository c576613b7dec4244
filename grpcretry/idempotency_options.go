package grpcretry

import (
	"context"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
)

// idemConfig is what the idempotency options set.
type idemConfig struct {
	scope    func(ctx context.Context) (string, error)
	required bool
	methods  map[string]bool // nil: every unary method
	stored   func(codes.Code) bool
	replay   []string // allowed metadata keys, lower-case
	maxReply int
	pushback time.Duration
}

// IdempotencyOption configures [IdempotencyUnaryServerInterceptor]. An
// IdempotencyOption is a value: it may be passed to any number of
// constructors; a nil one is ignored.
type IdempotencyOption interface {
	applyIdem(*idemConfig) error
}

// idemOption is an IdempotencyOption.
type idemOption func(*idemConfig) error

func (o idemOption) applyIdem(c *idemConfig) error { return o(c) }

// WithKeyScope sets the function that maps a server call to its caller
// (tenant, user, API key), from what its context carries: the
// authenticated identity an authentication interceptor before it put
// there, the peer (peer.FromContext), its TLS client certificate. Keys are
// scoped to it: the same key sent by two callers names two unrelated calls.
// f must return a non-empty string; an error (or "") means the caller
// cannot be identified, and the call is refused with INTERNAL without
// running. Every interceptor needs a scope.
//
// To put every caller in one shared scope, return a constant:
//
//	grpcretry.WithKeyScope(func(context.Context) (string, error) { return "shared", nil })
//
// Then any caller who sends a key another caller used gets that caller's
// stored answer: do it only when there is a single caller (one internal
// service) or keys cannot be guessed and answers hold nothing private.
func WithKeyScope(f func(ctx context.Context) (string, error)) IdempotencyOption {
	return idemOption(func(c *idemConfig) error {
		if f == nil {
			return invalid("nil key scope func")
		}
		if c.scope != nil {
			return invalid("key scope set twice (WithKeyScope)")
		}
		c.scope = f
		return nil
	})
}

// WithKeyRequired makes the key mandatory on guarded methods: a call
// without one is refused with INVALID_ARGUMENT. By default a call without
// a key runs unguarded.
func WithKeyRequired() IdempotencyOption {
	return idemOption(func(c *idemConfig) error {
		c.required = true
		return nil
	})
}

// WithKeyMethods sets the guarded methods, by full method name
// ("/package.Service/Method"); calls of other methods pass through
// untouched, key or not. A later WithKeyMethods adds to the earlier ones.
// By default every unary method is guarded. Each method's reply type must
// be known to protoregistry.GlobalFiles and GlobalTypes (generated code
// registers it); the constructor checks.
func WithKeyMethods(methods ...string) IdempotencyOption {
	methods = slices.Clone(methods)
	return idemOption(func(c *idemConfig) error {
		if len(methods) == 0 {
			return invalid("WithKeyMethods: no method")
		}
		m := make(map[string]bool, len(c.methods)+len(methods))
		for k := range c.methods {
			m[k] = true
		}
		for _, name := range methods {
			m[name] = true
		}
		c.methods = m
		return nil
	})
}

// WithStoredCodes sets which final codes are stored for replay; the others
// release the key, so that a retry runs the handler again. By default OK is
// stored, and the answers that the same call would get again
// (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
// FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED); the codes of a failure
// that a retry may not meet (UNAVAILABLE, INTERNAL, UNKNOWN,
// DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, CANCELED, DATA_LOSS,
// UNAUTHENTICATED) are not, as HTTP's 5xx, 401, 408 and 429 are not. The
// code is the one the caller gets: a handler that returns a bare context
// error (ctx.Err()) ends with CANCELED or DEADLINE_EXCEEDED, as grpc-go
// sends it, not UNKNOWN.
func WithStoredCodes(f func(codes.Code) bool) IdempotencyOption {
	return idemOption(func(c *idemConfig) error {
		if f == nil {
			return invalid("nil stored codes func")
		}
		c.stored = f
		return nil
	})
}

// defaultStoredCode reports whether the interceptor stores an answer with
// code c by default (see WithStoredCodes).
func defaultStoredCode(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented:
		return true
	}
	return false
}

// WithReplayMetadata sets the header and trailer metadata keys that are
// stored with an answer and sent again with its replays (default none).
// Keys are lower-cased; "grpc-" keys, pseudo-headers, and the keys this
// package reads or sets ("idempotency-key", "idempotent-replayed",
// [ReplyOmittedMetadata], wire.PushbackMetadata) are refused. A later
// WithReplayMetadata replaces the earlier one.
func WithReplayMetadata(keys ...string) IdempotencyOption {
	keys = slices.Clone(keys)
	return idemOption(func(c *idemConfig) error {
		c.replay = nil
		for _, k := range keys {
			k = strings.ToLower(k)
			switch {
			case k == "" || strings.HasPrefix(k, ":") || strings.HasPrefix(k, "grpc-"):
				return invalid("WithReplayMetadata: key %q is reserved or empty", k)
			case k == replayedMetadata || k == ReplyOmittedMetadata || k == keyMetadata:
				return invalid("WithReplayMetadata: key %q is the interceptor's own", k)
			}
			for i := 0; i < len(k); i++ {
				if ch := k[i]; !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '-' || ch == '_' || ch == '.') {
					return invalid("WithReplayMetadata: key %q is not a metadata key", k)
				}
			}
			c.replay = append(c.replay, k)
		}
		return nil
	})
}

// defaultMaxStoredReply is the default of WithMaxStoredReply, in bytes.
const defaultMaxStoredReply = 1 << 20

// WithMaxStoredReply caps the stored reply, in bytes of its marshaled
// message (default 1 MiB). A larger
// reply still reaches the client, and the call is stored without it: a
// retry gets DATA_LOSS with [ReplyOmittedMetadata] (the call ran once; its
// reply cannot be sent again), and the handler does not run again. The
// same happens when the store has no room for the reply. The cap applies
// to a stored error's status too (its message and details, marshaled): a
// retry then gets the error's code, a message that says it was not kept,
// no details, and [ReplyOmittedMetadata].
func WithMaxStoredReply(n int) IdempotencyOption {
	return idemOption(func(c *idemConfig) error {
		if n <= 0 {
			return invalid("max stored reply %d must be positive", n)
		}
		c.maxReply = n
		return nil
	})
}

// WithKeyPushback sets the retry pushback ([wire.PushbackMetadata]) sent with an
// ABORTED answer (the key's first call still runs) and an UNAVAILABLE one
// (the store is unavailable): the client waits at least d before its next
// attempt. d must be positive; the default is 1 second.
func WithKeyPushback(d time.Duration) IdempotencyOption {
	return idemOption(func(c *idemConfig) error {
		if d <= 0 {
			return invalid("key pushback %v must be positive", d)
		}
		c.pushback = d
		return nil
	})
}
