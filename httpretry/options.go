package httpretry

import (
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// defaultMaxHosts is the default bound on the number of destination hosts
// whose guards a Transport keeps; see WithMaxHosts.
const defaultMaxHosts = 1024

// defaultLimitMax is the Max of the limiter a transport builds per host
// when [WithLimit] is not given: the largest limit.Config allows, so that
// the default never caps a host's attempts in flight below what its
// latency says it takes (see WithLimit).
const defaultLimitMax = 1 << 30

func invalid(format string, args ...any) error {
	return fmt.Errorf("httpretry: invalid option: "+format, args...)
}

// config is what options set; it is unexported so that an Option only ever
// applies to a Transport being built.
type config struct {
	schedule       []retry.ScheduleOption
	timeout        time.Duration
	attemptTimeout time.Duration
	budget         *budget.Config  // nil: no budget
	breaker        *breaker.Config // nil: no breaker
	limit          *limit.Config   // nil: no limiter (WithLimit(nil)); the default is Config{Max: defaultLimitMax}
	guards         func(host string) (retry.Guards, error)
	autoKey        bool
	bufferBodies   int64 // 0: do not buffer
	refresh        func(*http.Request) (*http.Request, error)
	fallback       func(*http.Request, *retry.Error) (*http.Response, error)
	stale          *staleConfig // nil: no stale cache (stale.go)
	logger         *slog.Logger
	observer       observe.Observer
	maxHosts       int
	hedge          *hedgeConfig // nil: no hedging
}

// Option configures a [Transport]; pass options to [NewTransport] or
// [NewClient]. Options are applied in order, a later one overriding an
// earlier one; a nil Option is ignored. An Option is a value: it may be
// passed to any number of constructors.
type Option interface {
	apply(*config) error
}

// option is an Option.
type option func(*config) error

func (o option) apply(c *config) error { return o(c) }

// WithRetry sets the schedule of every host's retries (package retry):
// retry.WithMaxAttempts, retry.WithBackoff, retry.WithMaxRetryAfter, and
// retry.WithRateLimit (one client-side limiter, such as a *rate.Limiter of
// golang.org/x/time/rate, for the attempts to every host; a hedge
// ([WithHedging]) does not wait for it: it goes at its delay or not at
// all, bounded by the budget and the hedging rules instead). The
// transport sets the rest of each host's policy itself: the classifier
// (HTTP statuses), the host's guards, its name and the observer (use
// [WithObserver] and [WithLogger]); its timeouts are the transport's own,
// because they cover the reading of the response body ([WithTimeout],
// [WithAttemptTimeout]). A later WithRetry adds to the earlier ones.
func WithRetry(opts ...retry.ScheduleOption) Option {
	opts = slices.Clone(opts) // an Option is a value: the caller may reuse its slice
	return option(func(c *config) error {
		c.schedule = append(c.schedule[:len(c.schedule):len(c.schedule)], opts...)
		return nil
	})
}

// WithTimeout sets an overall deadline for each request: d from the start
// of RoundTrip, covering every attempt, every sleep and any wait behind an
// open breaker, and the reading of the returned response's body (like
// [http.Client]'s Timeout). The request context's own deadline still
// counts; the earlier one wins. d = 0 means none (the default); a negative
// d is an error.
func WithTimeout(d time.Duration) Option {
	return option(func(c *config) error {
		if d < 0 {
			return invalid("timeout %v must not be negative", d)
		}
		c.timeout = d
		return nil
	})
}

// WithAttemptTimeout caps each attempt at d, until the response headers
// arrive and, for the returned response, while its body is read; an attempt
// never runs past the overall deadline. An attempt that times out is
// retried like a network timeout. The attempt's time left is what its
// timeout field tells the server (wire.TimeoutHeader): a server's
// admission that drops the attempt because its queue holds it longer
// answers with the don't-retry signal, and the call ends at once, even with
// time left (a retry with the same timeout would meet the same queue); set
// d above the provider's queue wait. d = 0 means no cap (the default); a
// negative d is an error.
func WithAttemptTimeout(d time.Duration) Option {
	return option(func(c *config) error {
		if d < 0 {
			return invalid("attempt timeout %v must not be negative", d)
		}
		c.attemptTimeout = d
		return nil
	})
}

// WithBudget sets the configuration of the retry budget each destination
// host gets (retries stay below Ratio of that host's requests over the
// window); nil turns the budget off: only the attempt limit bounds the
// retries. The default is the zero budget.Config: 10% plus 1 per second
// over 10 s.
func WithBudget(cfg *budget.Config) Option {
	cfg = copied(cfg) // an Option is a value: the config is copied when it is made
	return option(func(c *config) error {
		c.budget = copied(cfg) // a copy per config: an Option may be applied by several transports at once
		return nil
	})
}

// WithBreaker sets the configuration of the circuit breaker each
// destination host gets; nil turns the breaker off. The default is the
// zero breaker.Config: trips at 50% failures over 10 s (at least 20 calls),
// probes with 3 calls about every second. The transport's logger and
// observer hear of its state changes, with the host, besides
// cfg.OnStateChange.
func WithBreaker(cfg *breaker.Config) Option {
	cfg = copied(cfg) // an Option is a value: the config is copied when it is made
	return option(func(c *config) error {
		c.breaker = copied(cfg) // a copy per config: an Option may be applied by several transports at once
		return nil
	})
}

// WithLimit sets the configuration of the concurrency limiter each
// destination host gets (see package limit; a zero cfg.Timeout takes
// [WithAttemptTimeout]); nil turns the limiter off. The default is a
// limiter built from limit.Config{Max: 1 << 30}: the attempts in flight to
// the host are bounded by a limit learned from its latency and drops,
// starting at 10 and doubling every round trip in which half of it is
// used and the latency stays near its floor, with no cap of its own (a healthy host that takes
// thousands of attempts at once is never held below them; a cfg of your
// own with Max 0 means package limit's 1000). An attempt over the limit
// waits for a slot: requests with a deadline first, earliest deadline
// first, failing fast (with retry.Limited) once their turn would come too
// late; requests without one after them, in arrival order (one slot in 8
// goes to them while both wait), until a slot comes or the request is
// canceled; up to cfg.Waiting (10,000) waiting in all, beyond which a
// request fails at once with retry.Limited. See retry.Guards for what
// counts as a drop. An attempt holds its slot until its response headers
// arrive; one answered with a failure (a 503, a 429) until its body is read
// into memory too (up to 64 KiB, for at most 50 ms), so that its connection
// goes back to the pool before the retry. With a cfg of your own (not the default), a breaker the
// transport builds ([WithBreaker]) with ReleaseRate 0 releases the
// requests that waited through an outage at once and lets the limiter's
// slots pace them, instead of the rate seen before the trip
// (cfg.ReleaseRate reads -1): what a shared transport, or one that starts
// during an outage and saw no rate before it, wants. The default limiter
// leaves that breaker's paced release as it is: a transport per caller
// never reaches its limiter, and releasing every caller's backlog at once
// would send a fleet of them back together. With [WithGuards], a host whose supplied guards bring
// no Limiter gets one built from cfg (the default one unless
// WithLimit(nil)): package fleet's guards bring one only with
// fleet.Config.Limit, so without it each process limits its own attempts
// to the host, and the fleet's breaker still paces its release.
//
// A limiter the transport built follows the host's capacity hint: a 503
// or 429 carrying wire.CapacityHeader (an admission's shed answer, "I run
// n at once") caps its limit at n (0 reads as 1, at most 2^30; a malformed
// or repeated field is ignored), the latest hint replacing the cap. The
// cap holds until 1 s after the last hinted answer, then doubles every
// 200 ms while it still binds, and is removed once the learned limit is
// below it. A supplied limiter (a fleet's, capped at its share of a
// fleet-wide limit) is its owner's: hints leave it alone.
//
// The limiter works where the transport sees the traffic to a host: one
// Transport shared by the process (a gateway, a server calling its
// dependencies), not one per caller: a limiter only knows the attempts of
// its own transport, and one that carries a single request at a time
// never binds (it costs little: one compare-and-swap per attempt). Set
// [WithAttemptTimeout] too: a hung attempt without one holds its slot
// until the request's own deadline, if any.
func WithLimit(cfg *limit.Config) Option {
	cfg = copied(cfg) // an Option is a value: the config is copied when it is made
	return option(func(c *config) error {
		c.limit = copied(cfg) // a copy per config: an Option may be applied by several transports at once
		return nil
	})
}

// WithGuards makes f supply the guards (retry budget and circuit breaker)
// of each destination host, instead of the transport building them from
// [WithBudget] and [WithBreaker]: for guards shared with other transports,
// or across a fleet of processes. f is called once per host (lower-cased URL.Host),
// when the host is first seen, and again if the host was evicted from the
// table ([WithMaxHosts]); an error fails that request. It must be safe for
// concurrent use. Breaker state changes reach the transport's logger and
// observer only if f wires them (breaker.Config.OnStateChange).
func WithGuards(f func(host string) (retry.Guards, error)) Option {
	return option(func(c *config) error {
		if f == nil {
			return invalid("nil guards func")
		}
		c.guards = f
		return nil
	})
}

// WithAutoIdempotencyKey makes the transport give every request whose
// method is not idempotent (POST, PATCH, ...) and that carries no
// Idempotency-Key an Idempotency-Key of its own, made with
// idempotency.NewKey once per RoundTrip, before the first attempt, and
// sent unchanged on every attempt ([IdempotencyKey] returns it). Such requests then
// become retryable. Only use it against servers that honour the key (e.g.
// behind idempotency middleware). Off by default.
func WithAutoIdempotencyKey() Option {
	return option(func(c *config) error {
		c.autoKey = true
		return nil
	})
}

// WithBufferBodies lets the transport retry requests whose body has no
// GetBody (one built by hand rather than by [http.NewRequest] from a
// bytes.Buffer, bytes.Reader or strings.Reader): up to maxBytes of such a
// body are read into memory before the first attempt and replayed on each
// retry. A body longer than maxBytes (by ContentLength, or found so while
// reading) is sent once, never retried; the transport never reads more
// than maxBytes+1 bytes ahead. maxBytes must be positive. Off by default:
// a body without GetBody is sent once.
func WithBufferBodies(maxBytes int64) Option {
	return option(func(c *config) error {
		if maxBytes <= 0 {
			return invalid("buffer limit %d must be positive", maxBytes)
		}
		c.bufferBodies = maxBytes
		return nil
	})
}

// WithRefreshOn401 sets a hook for 401 Unauthorized, which is never
// retried. When an attempt gets a 401, refresh is called once per
// RoundTrip with a copy of the request that got it (headers deep-copied,
// no body, its context the attempt's: bounded by WithTimeout and the
// attempt timeout; the hook may modify and return it, e.g. with a new
// Authorization header, or return a new request to the same host: one to
// another host is an error, since its sends would count against this
// host's guards). The transport then sends
// the returned request once more, with the original body replayed, as part
// of the same attempt: it does not count as an attempt and does not draw
// on the retry budget; later retries, if any, send it too. If refresh
// returns an error, RoundTrip returns that error (wrapped); if it returns a
// nil request, or the body cannot be replayed (a body without GetBody, not
// buffered), the 401 is returned as is; if GetBody fails for the resend,
// RoundTrip returns its error.
// refresh must be safe for concurrent use. nil (the default) means a 401
// is returned to the caller.
func WithRefreshOn401(refresh func(req *http.Request) (*http.Request, error)) Option {
	return option(func(c *config) error {
		c.refresh = refresh
		return nil
	})
}

// WithFallback sets what the caller gets when the transport gives up on a
// request because the host is failing: the breaker refused it (also after
// waiting for it until the deadline), the budget refused a retry, the
// concurrency limit had no slot in time ([WithLimit]), the attempts ran
// out, or the deadline came first; fallback's response or error is
// returned instead (e.g. a cached response, or a 503 of the caller's own:
// a response that comes with an error is closed and the error returned,
// and a fallback that returns neither is an error wrapping err). err says why ([retry.Error].Reason), after how many
// attempts, and carries the last failure (with the server's hint, or the
// breaker's time until its next probe: retry.RetryAfter(err)). The last
// response, if any, has been drained and closed. A request that was not
// retryable (a 404, a POST without a key) or whose context was canceled
// gets no fallback. A request the transport made a key for
// ([WithAutoIdempotencyKey]) reaches fallback with that key in its
// Idempotency-Key header, and a response of fallback's whose Request is nil
// or the request it was given is returned with that keyed request, so that
// [IdempotencyKey] finds the key of a write that may have happened. With
// [WithStaleCache], a request the cache can answer
// gets the cached response and the fallback is not called. fallback must be
// safe for concurrent use. nil (the default) means no fallback.
func WithFallback(fallback func(req *http.Request, err *retry.Error) (*http.Response, error)) Option {
	return option(func(c *config) error {
		c.fallback = fallback
		return nil
	})
}

// WithLogger logs to l, each record with the attribute "host": one Warn per
// state change of a host's breaker, and a record per retry ("retry:
// retrying") and per give-up ("retry: giving up") at Debug, the event as a
// group under the key "retry": per-call records are for debugging, never a
// log storm during an outage. nil means silent, the default.
func WithLogger(l *slog.Logger) Option {
	return option(func(c *config) error {
		c.logger = l
		return nil
	})
}

// WithObserver reports what the transport does to o (package observe):
// every attempt, retry and give-up, waits behind an open breaker, and the
// state changes of the hosts' breakers, each event named with its host.
// nil means no observer, the default.
//
// If o also has a method
//
//	ObserveHTTP(req *http.Request, resp *http.Response, err error, elapsed time.Duration)
//
// (otelstormguard's Observer has: the HTTP semantic conventions' metric
// and span attributes), the transport calls it after each request it hands
// its base transport, with the request sent (its context the attempt's),
// the response or error the base returned, and the time that took.
func WithObserver(o observe.Observer) Option {
	return option(func(c *config) error {
		c.observer = o
		return nil
	})
}

// WithMaxHosts bounds how many destination hosts (URL.Host, lower-cased)
// the transport keeps a budget and a breaker for; n must be positive. When
// a new host arrives and the table is full, the host that entered it first
// is forgotten (its budget, breaker and limiter start afresh if it comes
// back, unless WithGuards supplies them: a fleet hands back the same ones;
// so does its hedging state, WithHedging's latency history and push-back,
// kept in a table of the same bound). The observer hears a forgotten
// host's breaker go: a BreakerState event with To "" (see package
// observe). The default is 1024.
func WithMaxHosts(n int) Option {
	return option(func(c *config) error {
		if n < 1 {
			return invalid("max hosts %d must be positive", n)
		}
		c.maxHosts = n
		return nil
	})
}

// copied returns a copy of *p in a variable of its own, or nil for nil.
func copied[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}
