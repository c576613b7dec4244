package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/timed"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

// Policy is a validated retry configuration. Build one with [New] and run
// operations with [Policy.Do] or [DoValue].
//
// A Policy is immutable and safe for concurrent use by any number of
// goroutines; build it once and reuse it (a reused policy's success path
// allocates nothing). The observer, the classifier and the backoff's random
// source it was given are called from every goroutine that uses it, so
// they must be safe for concurrent use too. A nil *Policy is valid and
// behaves like the one New() returns without options.
type Policy struct {
	config
}

// config is what options set. It is unexported so that an [Option] can
// only ever be applied by [New], never to a Policy already in use.
type config struct {
	maxAttempts    int
	backoff        *backoff.Backoff
	attemptTimeout time.Duration // 0: none
	maxRetryAfter  time.Duration
	classify       func(error) bool
	defaultClass   bool                                     // classify is IsRetryable: a not-retryable give-up says how to change it
	rateLimit      interface{ Wait(context.Context) error } // WithRateLimit; nil: none
	name           string
	observer       observe.Observer
	tagger         attemptTagger // observer, if it tags attempts

	// budget, if not nil, is deposited into by each call's first attempt
	// and withdrawn from before each retry; breaker, if not nil, admits
	// every attempt and is told its outcome. See guard.go.
	budget  Budget
	within  budgetWithin // budget, if it implements budgetWithin
	breaker *breaker.Breaker
	limiter *limit.Limiter // nil: none; every attempt holds one of its slots

	// oneClock is set when the budget runs on the default clock: a loop
	// that reads the clock anyway (a deadline, an attempt timeout) hands
	// that reading to the deposit through depositAt (see internal/timed).
	// The breaker reads its own clock when it is told of a success, at the
	// attempt's end: a success belongs where the attempt ended, not where
	// it started (a long attempt's would fall out of the window).
	oneClock  *budget.Budget
	depositAt func(*budget.Budget, time.Time)
	// restamp, set when the policy has a limiter and a breaker with
	// SlowCall, times the attempt's permit from after the wait for a slot.
	restamp func(*breaker.Breaker, breaker.Permit) breaker.Permit
	// current, set when the policy has a limiter and a breaker, reports
	// whether a permit is of the breaker's current generation: one that is
	// not, after a wait for a slot, is stale (the breaker opened, even if
	// it closed again; a probe's round ended, even if another began).
	current func(*breaker.Breaker, breaker.Permit) bool

	// path is how run takes a call, decided once by New from the options
	// above: a test of one field instead of five on every call.
	path runPath
}

// runPath is how a policy's calls run (see Policy.run).
type runPath uint8

const (
	// pathBare: no breaker, limiter, rate limit, observer or attempt
	// timeout; the first attempt runs in run's own small frame.
	pathBare runPath = iota
	// pathLoop: the loop from the first attempt (a rate limit), no guard.
	pathLoop
	// pathGuarded: a breaker, a limiter, an observer or an attempt timeout:
	// the loop under loopGuarded, which ends an attempt whose op panics.
	pathGuarded
)

// attemptTagger is an observer that gives each attempt a context of its
// own (see observe.Observer).
type attemptTagger interface {
	TagAttempt(ctx context.Context, e observe.Event) context.Context
}

// defaultBackoff is built from the zero backoff.Config (its defaults are
// valid by construction). It is never modified.
var defaultBackoff, _ = backoff.New(backoff.Config{})

// defaultPolicy is what a nil *Policy runs with. It is never modified.
var defaultPolicy, _ = New()

// Option configures a [Policy]; pass options to [New]. A nil Option is
// ignored. Options are values: one Option may be passed to many New calls.
type Option interface {
	apply(*config) error
}

// ScheduleOption is an [Option] that shapes the retry schedule alone: how
// many attempts ([WithMaxAttempts]), how far apart ([WithBackoff]), which
// server hints are honoured ([WithMaxRetryAfter]) and how fast attempts may
// go ([WithRateLimit]). The protocol
// layers (package httpretry's and grpcretry's WithRetry) take these and set
// everything else themselves (the classifier, the guards, the name and the
// observer of each destination, their own timeouts), so that an option they
// would override or could not honour does not compile there.
type ScheduleOption interface {
	Option
	schedule()
}

// option is an Option; scheduleOption a ScheduleOption.
type (
	option         func(*config) error
	scheduleOption func(*config) error
)

func (o option) apply(c *config) error         { return o(c) }
func (o scheduleOption) apply(c *config) error { return o(c) }
func (scheduleOption) schedule()               {}

// New returns a Policy configured by opts, applied in order (a later option
// overrides an earlier one). Without options it makes 3 attempts (the SRE
// book's per-request cap) with the zero [backoff.Config] (full jitter, base
// 100 ms, cap 10 s), classifies with [IsRetryable], has no timeout of its
// own (the parent context's deadline counts: give the calls a context with
// a deadline to bound them), honours server hints up to 1 minute (spread
// above the hint, see [Policy.Do]), has no retry budget and no circuit
// breaker, and reports nothing.
//
// A bad option value (attempts below 1, a negative duration, a
// MaxRetryAfter that is not positive, a nil backoff or classifier) makes
// New return an error that says which; New never panics.
func New(opts ...Option) (*Policy, error) {
	c := config{
		maxAttempts:   3,
		backoff:       defaultBackoff,
		maxRetryAfter: time.Minute,
		classify:      IsRetryable,
		defaultClass:  true,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&c); err != nil {
			return nil, err
		}
	}
	c.tagger, _ = c.observer.(attemptTagger)
	c.within, _ = c.budget.(budgetWithin)
	if c.limiter != nil && c.breaker != nil {
		c.current = timed.Current.(func(*breaker.Breaker, breaker.Permit) bool) // set by package breaker's init, which runs first
	}
	if c.limiter != nil && c.breaker != nil && c.breaker.Config().SlowCall > 0 {
		c.restamp, _ = timed.Restamp.(func(*breaker.Breaker, breaker.Permit) breaker.Permit)
	}
	if bb, ok := c.budget.(*budget.Budget); ok { // not bb.Config(): a zero Budget's window starts at its first use
		if dep, ok := timed.Deposit.(func(*budget.Budget, time.Time)); ok {
			c.oneClock, c.depositAt = bb, dep
		}
	}
	switch {
	case c.breaker != nil || c.limiter != nil || c.observer != nil || c.attemptTimeout > 0:
		c.path = pathGuarded
	case c.rateLimit != nil:
		c.path = pathLoop
	}
	return &Policy{config: c}, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("retry: invalid option: "+format, args...)
}

// WithMaxAttempts sets how many times the operation may run in total, the
// first attempt included; n = 1 means no retries. n must be at least 1. The
// default is 3. A call that waits behind an open breaker (see [WithGuards])
// may also be handed the breaker's probes: those do not count, so that a
// lone caller waiting out an outage is not ended three rounds into it; they
// are bounded by the breaker (a probe round every OpenFor or longer, a few
// probes each, whoever waits), not by n. The attempt number the operation
// is given counts every attempt sent, probes included.
func WithMaxAttempts(n int) ScheduleOption {
	return scheduleOption(func(p *config) error {
		if n < 1 {
			return invalid("max attempts %d must be at least 1", n)
		}
		p.maxAttempts = n
		return nil
	})
}

// WithBackoff sets the delays between attempts; b must not be nil. The
// default is built from the zero [backoff.Config]. Retry n (n = 1 before the second attempt)
// sleeps b's n-th delay of a fresh [backoff.Sequence], raised to the
// server's hint if one is larger. b is shared by every call, so its random
// source must be safe for concurrent use (the default one is); it also
// spreads server hints above their floor (see [Policy.Do]: a source that
// always returns 0 sleeps exactly the hint). A delay of 250 years or more
// (a runtime timer that long may fire early: see [WithMaxRetryAfter])
// lasts until the call's context ends.
func WithBackoff(b *backoff.Backoff) ScheduleOption {
	return scheduleOption(func(p *config) error {
		if b == nil {
			return invalid("nil backoff")
		}
		p.backoff = b
		return nil
	})
}

// maxHintWait is the longest server hint any policy honours (see
// WithMaxRetryAfter): 150 years.
const maxHintWait = 150 * 365 * 24 * time.Hour

// WithMaxRetryAfter sets the longest server hint (Retry-After) the policy
// honours; d must be positive. The default is 1 minute.
//
// A hint is a floor: the loop never retries sooner than the server asked.
// So a hint above d is not cut down to d (that would retry early, into a
// server that said it is not ready); it counts as a wait that ends past the
// deadline: the loop gives up at once with Reason [Deadline], the
// give-up's [RetryAfter] the hint, and the last error (and so the server's
// answer) returned to the caller. With the default d, a hint of 484289
// hours never puts a goroutine to sleep. A d above 150 years counts as 150 years: a timer
// cannot be trusted with a longer wait (with its jitter of up to half
// again, it could end past the runtime's clock, which saturates 292 years
// after the process starts; such a timer fires early), so a longer hint
// stops the loop as any hint above the maximum does.
func WithMaxRetryAfter(d time.Duration) ScheduleOption {
	return scheduleOption(func(p *config) error {
		if d <= 0 {
			return invalid("max retry-after %v must be positive", d)
		}
		p.maxRetryAfter = min(d, maxHintWait)
		return nil
	})
}

// WithAttemptTimeout caps each attempt at d; an attempt still never runs
// past the call's deadline. An attempt that fails because its own timeout
// fired, while the call still has time, is retried (the classifier sees
// context.DeadlineExceeded), and counts as a failure of the dependency for
// the breaker, as a slow or hanging call should. d = 0 means no
// per-attempt cap (the default); a negative d is an error. Each attempt
// then gets its own context (a few allocations per attempt).
//
// The call's own deadline is its context's: give the calls a context with
// a deadline (context.WithTimeout) to bound attempts, sleeps and waits
// behind an open breaker together.
func WithAttemptTimeout(d time.Duration) Option {
	return option(func(p *config) error {
		if d < 0 {
			return invalid("attempt timeout %v must not be negative", d)
		}
		p.attemptTimeout = d
		return nil
	})
}

// WithClassifier replaces the default classifier [IsRetryable]. classify
// reports whether an error is worth another attempt; it must not be nil and
// must be safe for concurrent use. It is never asked about a nil error or
// an error returned after the parent context ended, and never sees the
// mark of [Permanent] (a marked error is not retried; the classifier is
// asked about the error inside the mark, for the breaker). Once the call's
// deadline has passed the loop stops whatever it says; it is then asked
// only if the policy has a breaker ([WithGuards]), to tell whether the
// attempt failed. Its verdict is also the breaker's: a retryable error is a
// failure of the dependency. To extend rather than replace the default,
// call IsRetryable from it. Whatever the classifier, the server's hint is
// read with [RetryAfter].
func WithClassifier(classify func(error) bool) Option {
	return option(func(p *config) error {
		if classify == nil {
			return invalid("nil classifier")
		}
		p.classify, p.defaultClass = classify, false
		return nil
	})
}

// WithObserver reports what the loop does to o: each attempt's start and
// end, each retry (with the delay chosen and why), each give-up (with its
// Reason), waits behind an open breaker; see package observe. Events carry
// the name set by [WithName]. nil means no observer, the default: the loop
// then reports nothing and the success path allocates nothing. An observer
// (or a classifier) that panics, or calls runtime.Goexit, while an attempt
// runs or while its outcome is reported ends the attempt as a panic of the
// operation does (a failure for the breaker, a drop for the limiter, the
// attempt's end reported once, a GiveUp with Reason "panic"), and the
// panic goes on; a classifier that panics as the loop decides whether to
// retry, after the attempt's outcome was reported, ends the call the same
// way (a GiveUp with Reason "panic"); an observer that panics hearing of a
// wait behind the breaker gives back the permit the wait ended with.
func WithObserver(o observe.Observer) Option {
	return option(func(p *config) error {
		p.observer = o
		return nil
	})
}

// WithName names the dependency the policy calls (e.g. "payments"), for
// the events of [WithObserver].
func WithName(name string) Option {
	return option(func(p *config) error {
		p.name = name
		return nil
	})
}
