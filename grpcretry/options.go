package grpcretry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// DefaultMaxTargets is the default bound on the number of targets whose
// budget and breaker a [Client] keeps; see [WithMaxTargets].
const DefaultMaxTargets = 1024

// DefaultStreamBuffer is the default bound, in bytes (proto.Size), on the
// request messages a retried stream keeps for replay; see
// [WithBufferMessages].
const DefaultStreamBuffer = 1 << 20

// maxAttemptsLimit bounds the attempts per call (the attempt metadata values
// are built once per client).
const maxAttemptsLimit = 100

// ErrInvalidOption is wrapped by every error [New] (and the interceptor
// constructors) return for a bad option value.
var ErrInvalidOption = errors.New("grpcretry: invalid option")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// Fallback is called when a unary call gives up because the target is
// failing (see [WithFallback]). It may fill reply (cached data) and return
// nil, or return an error for the caller.
type Fallback func(ctx context.Context, method string, req, reply any, err *Error) error

// config is what options set; it is unexported so that an Option only ever
// applies to a Client being built.
type config struct {
	retry          []retry.Option
	timeout        time.Duration
	attemptTimeout time.Duration
	budget         *budget.Config  // nil: no budget
	breaker        *breaker.Config // nil: no breaker
	guards         func(target string) (retry.Guards, error)
	idempotent     map[string]bool
	idempotentFunc func(method string) bool
	autoKey        bool
	streamBuffer   int  // bytes of request messages kept for replay
	bufferStreams  bool // client-streaming and bidi calls may be retried
	retryDisabled  bool // grpc-go's own retry is off on every connection
	fallback       Fallback
	logger         *slog.Logger
	observer       observe.Observer
	maxTargets     int
}

// Option configures a [Client]; pass options to [New],
// [UnaryClientInterceptor] or [StreamClientInterceptor]. Options are applied
// in order, a later one overriding an earlier one; a nil Option is ignored.
// An Option is a value: it may be passed to any number of constructors.
type Option func(*config) error

// WithRetry sets the retry options of every target's policy (package
// retry): retry.WithMaxAttempts (at most 100 here), retry.WithBackoff,
// retry.WithMaxRetryAfter, retry.WithExactRetryAfter, retry.WithClock. The
// client sets the rest itself, after these: the classifier (gRPC codes),
// the budget and breaker of each target, and the name, observer and logger
// (labelled with the target; use [WithObserver] and [WithLogger]).
// Timeouts are the client's own, because a stream outlives the call that
// opens it: retry.WithTimeout and retry.WithAttemptTimeout are rejected;
// use [WithTimeout] and [WithAttemptTimeout]. A later WithRetry adds to the
// earlier ones.
func WithRetry(opts ...retry.Option) Option {
	return func(c *config) error {
		c.retry = append(c.retry[:len(c.retry):len(c.retry)], opts...)
		return nil
	}
}

// WithTimeout sets an overall deadline for each call: d from the moment
// the interceptor is called, covering every attempt, every sleep, any wait
// behind an open breaker and, for a stream, the whole life of the stream.
// The caller's context deadline still counts; the earlier one wins. d = 0
// means none (the default); a negative d is an error.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return invalid("timeout %v must not be negative", d)
		}
		c.timeout = d
		return nil
	}
}

// WithAttemptTimeout caps each attempt at d (a unary attempt's context
// carries the deadline, so the server sees it as grpc-timeout; a stream
// attempt is cut off if no response arrives within d). An attempt never
// runs past the overall deadline. An attempt that fails because its own
// timeout fired, while the call still has time, is retried like
// UNAVAILABLE: this is the only DEADLINE_EXCEEDED that is retried. d = 0
// means no cap (the default); a negative d is an error.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return invalid("attempt timeout %v must not be negative", d)
		}
		c.attemptTimeout = d
		return nil
	}
}

// WithBudgetConfig sets the configuration of the retry budget each target
// gets (retries stay below Ratio of that target's calls over the window).
// The default is the zero budget.Config: 10% plus 1 per second over 10 s.
// A nil cfg.Now uses the retry policy's clock.
func WithBudgetConfig(cfg budget.Config) Option {
	return func(c *config) error {
		c.budget = &cfg
		return nil
	}
}

// WithoutBudget turns the per-target retry budget off: only the attempt
// limit bounds the retries.
func WithoutBudget() Option {
	return func(c *config) error {
		c.budget = nil
		return nil
	}
}

// WithBreakerConfig sets the configuration of the circuit breaker each
// target gets. The default is the zero breaker.Config: trips at 50%
// failures over 10 s (at least 20 calls), probes with 3 calls about every
// second. A nil cfg.Now uses the retry policy's clock; the client's logger
// and observer hear of its state changes, with the target, besides
// cfg.OnStateChange.
func WithBreakerConfig(cfg breaker.Config) Option {
	return func(c *config) error {
		c.breaker = &cfg
		return nil
	}
}

// WithoutBreaker turns the per-target circuit breaker off.
func WithoutBreaker() Option {
	return func(c *config) error {
		c.breaker = nil
		return nil
	}
}

// WithGuards makes f supply the budget and breaker of each target, instead
// of the client building them from [WithBudgetConfig] and
// [WithBreakerConfig]: for guards shared with other clients (an HTTP
// transport to the same dependency), or across a fleet of processes. f is
// called once per target (grpc.ClientConn.Target), when the target is first
// seen, and again if it was evicted from the table ([WithMaxTargets]); an
// error fails that call with UNAVAILABLE. It must be safe for concurrent
// use. Breaker state changes reach the client's logger and observer only if
// f wires them (breaker.Config.OnStateChange).
func WithGuards(f func(target string) (retry.Guards, error)) Option {
	return func(c *config) error {
		if f == nil {
			return invalid("nil guards func")
		}
		c.guards = f
		return nil
	}
}

// WithIdempotentMethods declares methods safe to repeat, by full method
// name ("/package.Service/Method"). Calls of these methods are retried on
// the codes the package documentation lists, and may be retried once on
// INTERNAL. A later WithIdempotentMethods adds to the earlier ones.
// Without it (or [WithIdempotentFunc]) no method is idempotent: only calls
// carrying an idempotency key are retried.
func WithIdempotentMethods(methods ...string) Option {
	return func(c *config) error {
		m := make(map[string]bool, len(c.idempotent)+len(methods))
		for k := range c.idempotent {
			m[k] = true
		}
		for _, name := range methods {
			if name == "" || name[0] != '/' {
				return invalid("method %q is not a full method name (/package.Service/Method)", name)
			}
			m[name] = true
		}
		c.idempotent = m
		return nil
	}
}

// WithIdempotentFunc declares methods safe to repeat with a function of the
// full method name, consulted for methods that [WithIdempotentMethods] does
// not list. It is called on every call, so it must be quick and safe for
// concurrent use. nil removes a function set before.
func WithIdempotentFunc(f func(method string) bool) Option {
	return func(c *config) error {
		c.idempotentFunc = f
		return nil
	}
}

// WithAutoIdempotencyKey makes the client give every call of a method that
// is not idempotent and carries no idempotency key in its outgoing metadata
// ([IdempotencyKeyMetadata]) a key of its own, made with idempotency.NewKey once per
// call, before the first attempt, and sent unchanged on every attempt (an
// [*Error] names it in Key). Such calls then become retryable. Only use it
// against servers that honour the key (that run a keyed call at most once
// and replay its answer). Off by default.
func WithAutoIdempotencyKey() Option {
	return func(c *config) error {
		c.autoKey = true
		return nil
	}
}

// WithBufferMessages lets the client retry client-streaming and
// bidirectional calls, and sets the bound on the request messages any
// retried stream keeps for replay: up to maxBytes (by proto.Size) of the
// messages a call sent are kept (as clones) until the first response
// arrives, and sent again on a new stream if the attempt fails before it.
// A call whose messages outgrow maxBytes, or that sends a message that is
// not a proto.Message, is committed to the attempt it is on and no longer
// retried. maxBytes must be positive. Without it client-streaming and
// bidirectional calls pass through untouched, and server-streaming calls
// keep up to [DefaultStreamBuffer].
func WithBufferMessages(maxBytes int) Option {
	return func(c *config) error {
		if maxBytes <= 0 {
			return invalid("buffer limit %d must be positive", maxBytes)
		}
		c.streamBuffer, c.bufferStreams = maxBytes, true
		return nil
	}
}

// WithGRPCRetryDisabled tells the client that every connection it is used
// on was made with grpc.WithDisableRetry (as [Client.DialOptions] does), so
// that it need not look for a retry policy in the service config: see
// "grpc-go's own retry" in the package documentation.
func WithGRPCRetryDisabled() Option {
	return func(c *config) error {
		c.retryDisabled = true
		return nil
	}
}

// WithFallback sets what the caller of a unary call gets when the client
// gives up because the target is failing: the breaker refused it (also
// after waiting for it until the deadline), the budget refused a retry, the
// attempts ran out, or the deadline came first; fallback's result is
// returned instead (it may fill reply with cached data and return nil). err
// says why and carries the last failure. A call that was not retryable (a
// NOT_FOUND, a non-idempotent call without a key) or whose context was
// canceled gets no fallback. fallback must be safe for concurrent use. nil
// (the default) means no fallback. Streams have no fallback.
func WithFallback(fallback Fallback) Option {
	return func(c *config) error {
		c.fallback = fallback
		return nil
	}
}

// WithLogger logs to l, each record with the attribute "target": one Warn
// per state change of a target's breaker, one Warn per target whose service
// config carries a retry policy of grpc-go's, and the retry loop's per-call
// records at Debug (see retry.WithLogger). nil means silent, the default.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.logger = l
		return nil
	}
}

// WithObserver reports what the client does to o (package observe): every
// attempt, retry and give-up, waits behind an open breaker, and the state
// changes of the targets' breakers, each event named with its target. nil
// means no observer, the default.
func WithObserver(o observe.Observer) Option {
	return func(c *config) error {
		c.observer = o
		return nil
	}
}

// WithMaxTargets bounds how many targets the client keeps a budget and a
// breaker for; n must be positive. When a new target arrives and the table
// is full, the target that entered it first is forgotten (its budget and
// breaker start afresh if it comes back). The default is
// [DefaultMaxTargets].
func WithMaxTargets(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return invalid("max targets %d must be positive", n)
		}
		c.maxTargets = n
		return nil
	}
}
