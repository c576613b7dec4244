package retry

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/observe"
)

// Defaults used by [New] when an option is absent.
const (
	// DefaultMaxAttempts is the number of attempts, the first included: the
	// SRE book's per-request cap of three.
	DefaultMaxAttempts = 3
	// DefaultMaxRetryAfter is the longest server hint a policy honours by
	// default; see [WithMaxRetryAfter].
	DefaultMaxRetryAfter = time.Minute
)

// Policy is a validated retry configuration. Build one with [New] and run
// operations with [Policy.Do] or [DoValue].
//
// A Policy is immutable and safe for concurrent use by any number of
// goroutines; build it once and reuse it (a reused policy's success path
// allocates nothing). The observer, the classifier, the clock and the
// backoff's random source it was given are called from every goroutine that
// uses it, so they must be safe for concurrent use too. A nil *Policy is
// valid and behaves like the one New() returns without options.
type Policy struct {
	config
}

// config is what options set. It is unexported so that an [Option] can
// only ever be applied by [New], never to a Policy already in use.
type config struct {
	maxAttempts    int
	backoff        *backoff.Backoff
	timeout        time.Duration // 0: none
	attemptTimeout time.Duration // 0: none
	maxRetryAfter  time.Duration
	exactHint      bool // sleep exactly the server's hint, not spread above it
	classify       func(error) bool
	clock          Clock
	realClock      bool // clock is the system's: deadlines need no translation
	name           string
	observer       observe.Observer
	tagger         observe.AttemptTagger // observer, if it tags attempts
	logger         *slog.Logger

	// budget, if not nil, is deposited into by each call's first attempt
	// and withdrawn from before each retry; breaker, if not nil, admits
	// every attempt and is told its outcome. See guard.go.
	budget  Budget
	within  BudgetWithin // budget, if it implements BudgetWithin
	breaker *breaker.Breaker

	// oneClock is set when the budget and the breaker both run on the
	// default monotonic clock: the loop then reads it once per call, for
	// the deposit and the breaker's record of a success, through now.
	oneClock *budget.Budget
	now      func() time.Time
}

// defaultPolicy is what a nil *Policy runs with. It is never modified.
var defaultPolicy, _ = New()

// Option configures a [Policy]; pass options to [New]. A nil Option is
// ignored. Options are values: one Option may be passed to many New calls.
type Option func(*config) error

// New returns a Policy configured by opts, applied in order (a later option
// overrides an earlier one). Without options it makes 3 attempts with
// [backoff.Default] (full jitter, base 100 ms, cap 10 s), classifies with
// [IsRetryable], has no timeout of its own (the parent context's deadline
// still counts), honours server hints up to [DefaultMaxRetryAfter] (spread
// above the hint, see [WithExactRetryAfter]), runs on the system clock, has
// no retry budget and no circuit breaker, and is silent.
//
// A bad option value (attempts below 1, a negative duration, a
// MaxRetryAfter that is not positive, a nil backoff or classifier) makes
// New return an error wrapping [ErrInvalidOption]; New never panics.
func New(opts ...Option) (*Policy, error) {
	c := config{
		maxAttempts:   DefaultMaxAttempts,
		backoff:       backoff.Default(),
		maxRetryAfter: DefaultMaxRetryAfter,
		classify:      IsRetryable,
		clock:         systemClock{},
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	_, c.realClock = c.clock.(systemClock)
	c.tagger, _ = c.observer.(observe.AttemptTagger)
	c.within, _ = c.budget.(BudgetWithin)
	if bb, ok := c.budget.(*budget.Budget); ok && c.breaker != nil && bb.Config().Now == nil && c.breaker.Config().Now == nil {
		c.oneClock, c.now = bb, clock.Monotonic()
	}
	return &Policy{config: c}, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// WithMaxAttempts sets how many times the operation may run in total, the
// first attempt included; n = 1 means no retries. n must be at least 1. The
// default is [DefaultMaxAttempts] (3).
func WithMaxAttempts(n int) Option {
	return func(p *config) error {
		if n < 1 {
			return invalid("max attempts %d must be at least 1", n)
		}
		p.maxAttempts = n
		return nil
	}
}

// WithBackoff sets the delays between attempts; b must not be nil. The
// default is [backoff.Default]. Retry n (n = 1 before the second attempt)
// sleeps b's n-th delay of a fresh [backoff.Sequence], raised to the
// server's hint if one is larger. b is shared by every call, so its random
// source must be safe for concurrent use (the default one is); it also
// spreads server hints (see [WithExactRetryAfter]).
func WithBackoff(b *backoff.Backoff) Option {
	return func(p *config) error {
		if b == nil {
			return invalid("nil backoff")
		}
		p.backoff = b
		return nil
	}
}

// WithTimeout sets an overall deadline for each call: d after the call
// starts (by the policy's [Clock]), covering every attempt and every sleep.
// The parent context's own deadline still counts; the earlier one wins.
// d = 0 means no timeout of the policy's own (the default); a negative d is
// an error.
//
// With a timeout the loop derives one context per call (per attempt with
// [WithAttemptTimeout]), which costs a few allocations; without either
// option, attempts run on the parent context and a successful call
// allocates nothing.
func WithTimeout(d time.Duration) Option {
	return func(p *config) error {
		if d < 0 {
			return invalid("timeout %v must not be negative", d)
		}
		p.timeout = d
		return nil
	}
}

// WithAttemptTimeout caps each attempt at d; an attempt still never runs
// past the overall deadline. An attempt that fails because its own timeout
// fired, while the call still has time, is retried (the classifier sees
// context.DeadlineExceeded). d = 0 means no per-attempt cap (the default); a
// negative d is an error. Each attempt then gets its own context (a few
// allocations per attempt).
func WithAttemptTimeout(d time.Duration) Option {
	return func(p *config) error {
		if d < 0 {
			return invalid("attempt timeout %v must not be negative", d)
		}
		p.attemptTimeout = d
		return nil
	}
}

// WithClassifier replaces the default classifier [IsRetryable]. classify
// reports whether an error is worth another attempt; it must not be nil and
// must be safe for concurrent use. It is never asked about a nil error or
// an error returned after the parent context ended, and never overrides
// [Permanent]. Once the overall deadline has passed the loop stops whatever
// it says; it is then asked only if the policy has a breaker
// ([WithGuards]), to tell whether the attempt failed. Its verdict is also
// the breaker's: a retryable error is a failure of the dependency. To extend rather than replace the default, call
// IsRetryable from it. Whatever the classifier, the server's hint is read
// with [RetryAfter].
func WithClassifier(classify func(error) bool) Option {
	return func(p *config) error {
		if classify == nil {
			return invalid("nil classifier")
		}
		p.classify = classify
		return nil
	}
}

// WithClock sets the clock used for deadline checks and sleeps. nil means
// the system clock, the default. Tests can instead run the loop inside a
// testing/synctest bubble, where the system clock is fake.
func WithClock(c Clock) Option {
	return func(p *config) error {
		if c == nil {
			c = systemClock{}
		}
		p.clock = c
		return nil
	}
}

// WithObserver reports what the loop does to o: each attempt's start and
// end, each retry (with the delay chosen and why), each give-up (with its
// Reason), waits behind an open breaker; see package observe. Events carry
// the name set by [WithName]. nil means no observer, the default: the loop
// then reports nothing and the success path allocates nothing.
func WithObserver(o observe.Observer) Option {
	return func(p *config) error {
		p.observer = o
		return nil
	}
}

// WithName names the dependency the policy calls (e.g. "payments"), for
// the events of [WithObserver] and the records of [WithLogger].
func WithName(name string) Option {
	return func(p *config) error {
		p.name = name
		return nil
	}
}

// WithLogger logs each retry (message "retry: retrying") and each give-up
// ("retry: giving up") to l at Debug level, with the event as a group under
// key "retry": per-call records are for debugging, never a log storm
// during an outage (breaker state changes, which httpretry logs at Warn,
// are the events worth a warning). nil means silent, the default.
func WithLogger(l *slog.Logger) Option {
	return func(p *config) error {
		p.logger = l
		return nil
	}
}

// WithMaxRetryAfter sets the longest server hint (Retry-After) the policy
// honours; d must be positive. The default is [DefaultMaxRetryAfter] (1
// minute).
//
// A hint is a floor: the loop never retries sooner than the server asked.
// So a hint above d is not cut down to d (that would retry early, into a
// server that said it is not ready); it counts as a wait that ends past the
// deadline: the loop gives up at once with Reason [Deadline], the error's
// Delay set to the hint, and the last error (and so the server's answer)
// returned to the caller. A hint of 484289 hours never puts a goroutine to
// sleep.
func WithMaxRetryAfter(d time.Duration) Option {
	return func(p *config) error {
		if d <= 0 {
			return invalid("max retry-after %v must be positive", d)
		}
		p.maxRetryAfter = d
		return nil
	}
}

// WithExactRetryAfter makes the loop sleep exactly the server's hint when it
// is longer than the backoff delay. By default the loop sleeps a random
// time in [hint, 1.5·hint) (never past the deadline) instead: a hint is a
// floor, and a fleet of clients that all got "Retry-After: 2" at once would
// otherwise all come back in the same instant, erasing their jitter.
func WithExactRetryAfter() Option {
	return func(p *config) error {
		p.exactHint = true
		return nil
	}
}

// MaxAttempts returns the number of attempts p makes at most, the first
// included.
func (p *Policy) MaxAttempts() int {
	if p == nil {
		p = defaultPolicy
	}
	return p.maxAttempts
}

// Timeouts returns the policy's own overall timeout ([WithTimeout]) and
// per-attempt timeout ([WithAttemptTimeout]); 0 means none.
func (p *Policy) Timeouts() (call, attempt time.Duration) {
	if p == nil {
		p = defaultPolicy
	}
	return p.timeout, p.attemptTimeout
}

// Clock returns the clock set with [WithClock], or nil for the system clock.
func (p *Policy) Clock() Clock {
	if p == nil || p.realClock {
		return nil
	}
	return p.clock
}
