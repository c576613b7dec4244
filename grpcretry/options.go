package grpcretry

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// Bounds of the client's tables: the targets whose guards it keeps (the
// target that entered the table first is forgotten when a new one comes,
// its guards starting afresh if it comes back), and the request messages, in
// bytes (proto.Size), a retried server-streaming call keeps for replay.
const (
	maxTargets          = 1024
	defaultStreamBuffer = 1 << 20
)

// defaultLimitMax is the Max of the limiter a client builds per target
// when [WithLimit] is not given: the largest limit.Config allows, so that
// the default never caps a target's attempts in flight below what its
// latency says it takes (see WithLimit).
const defaultLimitMax = 1 << 30

func invalid(format string, args ...any) error {
	return fmt.Errorf("grpcretry: invalid option: "+format, args...)
}

// config is what options set; it is unexported so that an Option only ever
// applies to a client being built.
type config struct {
	schedule       []retry.ScheduleOption
	attemptTimeout time.Duration
	budget         *budget.Config  // nil: no budget
	breaker        *breaker.Config // nil: no breaker
	limit          *limit.Config   // nil: no limiter (WithLimit(nil)); the default is Config{Max: defaultLimitMax}
	guards         func(target string) (retry.Guards, error)
	idempotent     map[string]bool
	autoKey        bool
	streamBuffer   int  // bytes of request messages kept for replay
	bufferStreams  bool // client-streaming and bidi calls may be retried
	logger         *slog.Logger
	observer       observe.Observer
	hedge          *hedgeConfig // nil: no hedging
}

// Option configures the client [DialOptions] installs; pass options to
// DialOptions. Options are applied
// in order, a later one overriding an earlier one; a nil Option is ignored.
// An Option is a value: it may be passed to any number of constructors.
type Option interface {
	apply(*config) error
}

// option is an Option.
type option func(*config) error

func (o option) apply(c *config) error { return o(c) }

// WithRetry sets the schedule of every target's retries (package retry):
// retry.WithMaxAttempts, retry.WithBackoff, retry.WithMaxRetryAfter, and
// retry.WithRateLimit (one client-side limiter, such as a *rate.Limiter of
// golang.org/x/time/rate, for the attempts to every target; a hedge
// ([WithHedging]) does not wait for it: it goes at its delay or not at
// all, bounded by the budget and the hedging rules instead). The
// client sets the rest of each target's policy itself: the classifier
// (gRPC codes), the target's guards, its name and the observer (use
// [WithObserver] and [WithLogger]); its attempt timeout is the client's own,
// because a stream outlives the call that opens it ([WithAttemptTimeout]).
// The call's deadline is its context's. A later WithRetry adds to the
// earlier ones.
func WithRetry(opts ...retry.ScheduleOption) Option {
	opts = slices.Clone(opts) // an Option is a value: the caller may reuse its slice
	return option(func(c *config) error {
		c.schedule = append(c.schedule[:len(c.schedule):len(c.schedule)], opts...)
		return nil
	})
}

// WithAttemptTimeout caps each attempt at d (a unary attempt's context
// carries the deadline, so the server sees it as grpc-timeout; a stream
// attempt is cut off if no response arrives within d, also one committed
// by a message past WithBufferMessages's bound, and ends
// DEADLINE_EXCEEDED, as a unary attempt does; exactly one of the first
// answer and the timeout wins, even at the same instant). A stream
// committed by a message past the bound counts as its attempt's success
// when it opens (for the breaker and the limiter); a cut-off after that is
// the caller's, as any failure after a commit. An attempt never
// runs past the call's deadline. An attempt that fails because its own
// timeout fired, while the call still has time, is retried like
// UNAVAILABLE: this is the only DEADLINE_EXCEEDED that is retried. The
// server sees the attempt's deadline, not the call's: a server's admission
// that drops the attempt because its queue holds it longer than that
// deadline (AdmissionServerOptions) answers with the don't-retry pushback,
// and the call ends at once, even with time left (a retry with the same
// timeout would meet the same queue); set d above the provider's queue
// wait. d = 0 means no cap (the default); a negative d is an error.
func WithAttemptTimeout(d time.Duration) Option {
	return option(func(c *config) error {
		if d < 0 {
			return invalid("attempt timeout %v must not be negative", d)
		}
		c.attemptTimeout = d
		return nil
	})
}

// WithBudget sets the configuration of the retry budget each target gets
// (retries stay below Ratio of that target's calls over the window); nil
// turns the budget off: only the attempt limit bounds the retries. The
// default is the zero budget.Config: 10% plus 1 per second over 10 s.
func WithBudget(cfg *budget.Config) Option {
	cfg = copied(cfg) // an Option is a value: the config is copied when it is made
	return option(func(c *config) error {
		c.budget = copied(cfg) // a copy per config: an Option may be applied by several clients at once
		return nil
	})
}

// WithBreaker sets the configuration of the circuit breaker each target
// gets; nil turns the breaker off. The default is the zero breaker.Config:
// trips at 50% failures over 10 s (at least 20 calls), probes with 3 calls
// about every second. The client's logger and observer hear of its state
// changes, with the target, besides cfg.OnStateChange.
func WithBreaker(cfg *breaker.Config) Option {
	cfg = copied(cfg) // an Option is a value: the config is copied when it is made
	return option(func(c *config) error {
		c.breaker = copied(cfg) // a copy per config: an Option may be applied by several clients at once
		return nil
	})
}

// WithLimit sets the configuration of the concurrency limiter each
// target gets (see package limit; a zero cfg.Timeout takes
// [WithAttemptTimeout]); nil turns the limiter off. The default is a
// limiter built from limit.Config{Max: 1 << 30}: the attempts in flight to
// the target are bounded by a limit learned from its latency and drops,
// starting at 10 and doubling every round trip in which half of it is
// used and the latency stays near its floor, with no cap of its own (a healthy target that takes
// thousands of attempts at once is never held below them; a cfg of your
// own with Max 0 means package limit's 1000). An attempt over the limit
// waits for a slot: calls with a deadline first, earliest deadline first,
// failing fast (retry.Limited and UNAVAILABLE) once their turn would come
// too late; calls without one after them, in arrival order (one slot in 8
// goes to them while both wait), until a slot comes or the call is
// canceled; up to cfg.Waiting (10,000) waiting in all, beyond which a
// call fails at once with retry.Limited and UNAVAILABLE. See retry.Guards
// for what counts as a drop. A unary attempt holds its slot until it
// returns, a stream's until the stream is committed (its first response).
// With a cfg of your own (not the default), a breaker the client builds
// ([WithBreaker]) with ReleaseRate 0 releases the calls that waited
// through an outage at once and lets the limiter's slots pace them,
// instead of the rate seen before the trip (cfg.ReleaseRate reads -1).
// The default limiter leaves that breaker's paced release as it is: a
// client per caller never reaches its limiter, and releasing every
// caller's backlog at once would send a fleet of them back together.
// With [WithGuards], a target whose supplied guards bring
// no Limiter gets one built from cfg (the default one unless
// WithLimit(nil)): package fleet's guards bring one only with
// fleet.Config.Limit, so without it each process limits its own attempts
// to the target, and the fleet's breaker still paces its release.
//
// The limiter works where the client sees the traffic to a target: one
// set of [DialOptions] shared by the process, not one per caller: a
// limiter only knows the attempts of its own client, and one that carries
// a single call at a time never binds (it costs little: one
// compare-and-swap per attempt). Set [WithAttemptTimeout] too: a hung
// attempt without one holds its slot until the call's own deadline, if
// any.
func WithLimit(cfg *limit.Config) Option {
	cfg = copied(cfg) // an Option is a value: the config is copied when it is made
	return option(func(c *config) error {
		c.limit = copied(cfg) // a copy per config: an Option may be applied by several clients at once
		return nil
	})
}

// WithGuards makes f supply the guards (retry budget and circuit breaker)
// of each target, instead of the client building them from [WithBudget]
// and [WithBreaker]: for guards shared with other clients (an HTTP
// transport to the same dependency), or across a fleet of processes. f is
// called once per target (grpc.ClientConn.Target), when the target is first
// seen, and again if it was evicted from the client's table (which holds
// 1024 targets); an error fails that call with UNAVAILABLE (a plain status
// error whose message carries f's, not an [*Error]: no retry loop ran). It must be safe
// for concurrent use. Breaker state changes reach the client's logger and
// observer only if f wires them (breaker.Config.OnStateChange).
func WithGuards(f func(target string) (retry.Guards, error)) Option {
	return option(func(c *config) error {
		if f == nil {
			return invalid("nil guards func")
		}
		c.guards = f
		return nil
	})
}

// WithIdempotentMethods declares methods safe to repeat, by full method
// name ("/package.Service/Method"). Calls of these methods are retried on
// the codes the package documentation lists, and may be retried once on
// INTERNAL. A later WithIdempotentMethods adds to the earlier ones.
// Without it no method is idempotent: only calls carrying an idempotency
// key are retried.
func WithIdempotentMethods(methods ...string) Option {
	methods = slices.Clone(methods) // an Option is a value: the caller may reuse its slice
	return option(func(c *config) error {
		m := make(map[string]bool, len(c.idempotent)+len(methods))
		for k := range c.idempotent {
			m[k] = true
		}
		for _, name := range methods {
			if !fullMethod(name) {
				return invalid("method %q is not a full method name (/package.Service/Method)", name)
			}
			m[name] = true
		}
		c.idempotent = m
		return nil
	})
}

// WithAutoIdempotencyKey makes the client give every call of a method that
// is not idempotent and carries no idempotency key in its outgoing metadata
// ("idempotency-key") a key of its own, made with idempotency.NewKey
// once per call, before the first attempt, and sent unchanged on every
// attempt (an [*Error] names it). Such calls then become retryable. Only use
// it against servers that honour the key (that run a keyed call at most
// once and replay its answer). Off by default.
func WithAutoIdempotencyKey() Option {
	return option(func(c *config) error {
		c.autoKey = true
		return nil
	})
}

// WithBufferMessages lets the client retry client-streaming and
// bidirectional calls, and sets the bound on the request messages any
// retried stream keeps for replay: up to maxBytes (by proto.Size) of the
// messages a call sent are kept (by reference: as grpc-go asks, a caller
// must not modify a message after sending it) until the first response
// arrives, and sent again on a new stream if the attempt fails before it.
// A call whose messages outgrow maxBytes, or that sends a message that is
// not a proto.Message, is committed to the attempt it is on and no longer
// retried. maxBytes must be positive. Without it client-streaming and
// bidirectional calls pass through, never retried nor guarded (their
// outgoing metadata untouched but for an attempt count or probe mark
// inherited from elsewhere, which is removed: see the package
// documentation), and server-streaming calls keep up to 1 MiB.
//
// Such a stream opens when the caller first asks for a response (RecvMsg,
// Header, CloseAndRecv) or a message past the bound commits it: messages
// within the bound reach the server only then. On each stream that opens,
// the messages kept (and a CloseSend already made) go out in the order
// sent, before any later one, and beside the caller's receives: a RecvMsg
// or Header that opens a stream waits for the server's answer only, while
// the kept messages are sent on a goroutine of the stream's, or by the
// caller's own SendMsg. No send holds a lock a receive needs, so a send
// that blocks on flow control never holds up a RecvMsg on another
// goroutine: as with grpc-go, one goroutine may send while another
// receives (SendMsg from two goroutines at once is not allowed), and a
// bidirectional call whose server waits for its answers to be read before
// it reads more goes on as long as the caller reads. A SendMsg within the
// bound may return before its message is on the wire (it is kept, and
// goes out after those before it; a failure shows in RecvMsg); a message
// past the bound goes out, after the kept ones, before its SendMsg
// returns, which then blocks on flow control as grpc-go's does. The
// attempt it goes on is the last, whatever happens to it: one sent while
// the loop waits to retry a failed attempt commits the call to that
// failed attempt (the call ends with its error), and a stream it commits
// is not retried even if it fails before the message went out.
func WithBufferMessages(maxBytes int) Option {
	return option(func(c *config) error {
		if maxBytes <= 0 {
			return invalid("buffer limit %d must be positive", maxBytes)
		}
		c.streamBuffer, c.bufferStreams = maxBytes, true
		return nil
	})
}

// WithLogger logs to l, each record with the attribute "target": one Warn
// per state change of a target's breaker, and a record per retry ("retry:
// retrying") and per give-up ("retry: giving up") at Debug, the event as a
// group under the key "retry": per-call records are for debugging, never a
// log storm during an outage. nil means silent, the default.
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) error {
		c.logger = l
		return nil
	})
}

// WithObserver reports what the client does to o (package observe): every
// attempt, retry and give-up, waits behind an open breaker, and the state
// changes of the targets' breakers, each event named with its target. nil
// means no observer, the default.
func WithObserver(o observe.Observer) Option {
	return option(func(c *config) error {
		c.observer = o
		return nil
	})
}

// fullMethod reports whether name is a full method name as gRPC writes it:
// "/service/method", a service (its package included, as in
// "package.Service") and a method, neither empty, and no other '/'.
func fullMethod(name string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(name, "/"), "/")
	return ok && name[0] == '/' && svc != "" && method != "" && !strings.Contains(method, "/")
}

// copied returns a copy of *p in a variable of its own, or nil for nil.
func copied[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}
