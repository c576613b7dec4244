package httpretry

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// DefaultMaxHosts is the default bound on the number of destination hosts
// whose budget and breaker a [Transport] keeps; see [WithMaxHosts].
const DefaultMaxHosts = 1024

// ErrInvalidOption is wrapped by every error [NewTransport] and [NewClient]
// return for a bad option value.
var ErrInvalidOption = errors.New("httpretry: invalid option")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
}

// config is what options set; it is unexported so that an Option only ever
// applies to a Transport being built.
type config struct {
	maxAttempts    int
	backoff        *backoff.Backoff
	timeout        time.Duration
	attemptTimeout time.Duration
	maxRetryAfter  time.Duration
	budget         *budget.Config  // nil: no budget
	breaker        *breaker.Config // nil: no breaker
	autoKey        bool
	bufferBodies   int64 // 0: do not buffer
	refresh        func(*http.Request) (*http.Request, error)
	logger         *slog.Logger
	clock          retry.Clock
	maxHosts       int
}

// Option configures a [Transport]; pass options to [NewTransport] or
// [NewClient]. Options are applied in order, a later one overriding an
// earlier one; a nil Option is ignored. An Option is a value: it may be
// passed to any number of constructors.
type Option func(*config) error

// WithMaxAttempts sets how many attempts a request gets in total, the first
// included; n = 1 disables retries (budgets and breakers still apply). n
// must be from 1 to 100. The default is 3.
func WithMaxAttempts(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 100 {
			return invalid("max attempts %d must be from 1 to 100", n)
		}
		c.maxAttempts = n
		return nil
	}
}

// WithBackoff sets the delays between attempts; b must not be nil. The
// default is [backoff.Default]: full jitter, base 100 ms, cap 10 s. The
// server's Retry-After, when longer, is a floor on each delay.
func WithBackoff(b *backoff.Backoff) Option {
	return func(c *config) error {
		if b == nil {
			return invalid("nil backoff")
		}
		c.backoff = b
		return nil
	}
}

// WithTimeout sets an overall deadline for each request: d from the start
// of RoundTrip, covering every attempt and every sleep between them, and
// the reading of the returned response's body (like [http.Client]'s
// Timeout). The request context's own deadline still counts; the earlier
// one wins. d = 0 means none (the default); a negative d is an error.
func WithTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return invalid("timeout %v must not be negative", d)
		}
		c.timeout = d
		return nil
	}
}

// WithAttemptTimeout caps each attempt at d, until the response headers
// arrive and, for the returned response, while its body is read; an attempt
// never runs past the overall deadline. An attempt that times out is
// retried like a network timeout. d = 0 means no cap (the default); a
// negative d is an error.
func WithAttemptTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return invalid("attempt timeout %v must not be negative", d)
		}
		c.attemptTimeout = d
		return nil
	}
}

// WithMaxRetryAfter sets the longest Retry-After the transport honours; d
// must be positive. The default is [retry.DefaultMaxRetryAfter] (1 minute).
// A longer hint is not shortened (that would retry sooner than the server
// asked): the transport gives up at once and returns the response carrying
// it. So does a hint that would end past the deadline.
func WithMaxRetryAfter(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return invalid("max retry-after %v must be positive", d)
		}
		c.maxRetryAfter = d
		return nil
	}
}

// WithBudget sets the configuration of the retry budget each destination
// host gets (retries stay below Ratio of that host's requests over the
// window). The default is [budget.DefaultConfig]. A nil cfg.Now uses the
// transport's clock.
func WithBudget(cfg budget.Config) Option {
	return func(c *config) error {
		c.budget = &cfg
		return nil
	}
}

// WithoutBudget turns the per-host retry budget off: only the attempt
// limit bounds the retries.
func WithoutBudget() Option {
	return func(c *config) error {
		c.budget = nil
		return nil
	}
}

// WithBreaker sets the configuration of the circuit breaker each
// destination host gets. The default is [breaker.DefaultConfig]. A nil
// cfg.Now uses the transport's clock; a nil cfg.OnStateChange logs the
// change (with the host) to the transport's logger, if any.
func WithBreaker(cfg breaker.Config) Option {
	return func(c *config) error {
		c.breaker = &cfg
		return nil
	}
}

// WithoutBreaker turns the per-host circuit breaker off.
func WithoutBreaker() Option {
	return func(c *config) error {
		c.breaker = nil
		return nil
	}
}

// WithAutoIdempotencyKey makes the transport give every request whose
// method is not idempotent (POST, PATCH, ...) and that carries no
// Idempotency-Key an Idempotency-Key of its own, made with
// [idempotency.NewKey] once per RoundTrip, before the first attempt, and
// sent unchanged on every attempt. Such requests then become retryable.
// Only use it against servers that honour the key (e.g. behind
// [idempotency.Middleware]). Off by default.
func WithAutoIdempotencyKey() Option {
	return func(c *config) error {
		c.autoKey = true
		return nil
	}
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
	return func(c *config) error {
		if maxBytes <= 0 {
			return invalid("buffer limit %d must be positive", maxBytes)
		}
		c.bufferBodies = maxBytes
		return nil
	}
}

// WithRefreshOn401 sets a hook for 401 Unauthorized, which is never
// retried. When an attempt gets a 401, refresh is called once per
// RoundTrip with a copy of the request that got it (headers deep-copied,
// no body; the hook may modify and return it, e.g. with a new
// Authorization header, or return a new request). The transport then sends
// the returned request once more, with the original body replayed, as part
// of the same attempt: it does not count as an attempt and does not draw
// on the retry budget; later retries, if any, send it too. If refresh
// returns an error, RoundTrip returns that error (wrapped); if it returns a
// nil request, or the body cannot be replayed, the 401 is returned as is.
// refresh must be safe for concurrent use. nil (the default) means a 401
// is returned to the caller.
func WithRefreshOn401(refresh func(req *http.Request) (*http.Request, error)) Option {
	return func(c *config) error {
		c.refresh = refresh
		return nil
	}
}

// WithLogger logs retries and give-ups (see [retry.WithLogger]) and the
// state changes of the per-host breakers to l, each with the attribute
// "host". nil means silent, the default.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		c.logger = l
		return nil
	}
}

// WithClock sets the clock used for the sleeps between attempts, deadline
// checks, HTTP-date Retry-After values and (unless their configurations
// set Now) the budgets and breakers; c must not be nil. The default is
// [retry.SystemClock]. Tests pass a fake one so nothing sleeps for real.
// Context deadlines (WithTimeout, WithAttemptTimeout) still run on real
// time.
func WithClock(c retry.Clock) Option {
	return func(cfg *config) error {
		if c == nil {
			return invalid("nil clock")
		}
		cfg.clock = c
		return nil
	}
}

// WithMaxHosts bounds how many destination hosts (URL.Host, lower-cased)
// the transport keeps a budget and a breaker for; n must be positive. When
// a new host arrives and the table is full, the host that entered it first
// is forgotten (its budget and breaker start afresh if it comes back). The
// default is [DefaultMaxHosts].
func WithMaxHosts(n int) Option {
	return func(c *config) error {
		if n < 1 {
			return invalid("max hosts %d must be positive", n)
		}
		c.maxHosts = n
		return nil
	}
}
