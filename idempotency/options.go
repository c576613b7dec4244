package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stormguard/stormguard/observe"
)

// Option configures the middleware of [NewMiddleware]. Options are values
// made by the With functions: the HTTP ones (scope, methods, route,
// required key, body caps, stored statuses, replayed header fields) are
// Options, and the options of the protocol-neutral core are
// [GuardOption]s, which are Options too. A nil Option does nothing. An
// Option is immutable: one may be passed to any number of constructors,
// and once a constructor has returned nothing can change what it built.
type Option interface {
	applyMiddleware(m *middleware) error
}

// GuardOption configures a [Guard] in [NewGuard], or the Guard under a
// middleware of [NewMiddleware]: [WithLockTimeout], [WithRetention],
// [WithStoreTimeout], [WithLogger], [WithObserver], [WithName]. Being its
// own type, an HTTP option given to NewGuard does not compile. The zero
// GuardOption does nothing.
type GuardOption struct {
	apply func(g *Guard) error
}

func (o GuardOption) applyMiddleware(m *middleware) error { return o.applyGuard(&m.g) }

func (o GuardOption) applyGuard(g *Guard) error {
	if o.apply == nil {
		return nil
	}
	return o.apply(g)
}

// httpOption is an Option that applies to the middleware only.
type httpOption func(m *middleware) error

func (f httpOption) applyMiddleware(m *middleware) error { return f(m) }

// minTTL is the shortest lock timeout and retention: every store keeps
// them at least to the millisecond.
const minTTL = time.Millisecond

// WithScope sets the function that maps an authenticated request to its
// caller (tenant, user, API key...). Keys are scoped to it: the same key
// sent by two callers names two unrelated operations. f must return a
// non-empty string; an error (or "") means the caller cannot be
// identified, and the middleware answers 500 without running the handler,
// since it runs after authentication. Every middleware needs a scope.
//
// To put every caller in one shared scope, return a constant:
//
//	idempotency.WithScope(func(*http.Request) (string, error) { return "shared", nil })
//
// Then any caller who sends a key another caller used gets that caller's
// stored response: do it only when there is a single caller (e.g. one
// internal service) or keys cannot be guessed and responses hold nothing
// private.
func WithScope(f func(*http.Request) (string, error)) Option {
	return httpOption(func(m *middleware) error {
		if f == nil {
			return errors.New("WithScope(nil)")
		}
		if m.scope != nil {
			return errors.New("scope set twice (WithScope)")
		}
		m.scope = f
		return nil
	})
}

// WithRequired makes the key mandatory on guarded methods: a request
// without one (in [Header] or X-Idempotency-Key) is answered 400. By default a
// request without a key runs unguarded.
func WithRequired() Option {
	return httpOption(func(m *middleware) error { m.required = true; return nil })
}

// WithMethods sets the guarded methods (default POST and PATCH). Requests
// with other methods pass through untouched, key or not.
func WithMethods(methods ...string) Option {
	methods = slices.Clone(methods)
	return httpOption(func(m *middleware) error {
		if len(methods) == 0 {
			return errors.New("WithMethods: no method")
		}
		m.methods = nil
		for _, method := range methods {
			if method == "" || strings.ToUpper(method) != method {
				return fmt.Errorf("WithMethods: method %q must be upper-case and non-empty", method)
			}
			m.methods = append(m.methods, method)
		}
		return nil
	})
}

// WithRoute sets the function that names a request's target for the
// fingerprint: the same key sent to another target is a different request
// (422), never a replay. The default is the escaped URL path plus the raw
// query, e.g. "/accounts/7/charges?currency=EUR": the actual target, not the
// ServeMux pattern (r.Pattern), because two requests that match one pattern
// ("POST /accounts/{id}/charges") with different path values are different
// operations. Return r.Pattern only if path values never change what a
// request does.
func WithRoute(f func(*http.Request) string) Option {
	return httpOption(func(m *middleware) error {
		if f == nil {
			return errors.New("WithRoute(nil)")
		}
		m.route = f
		return nil
	})
}

// WithMaxRequestBody caps the request body, in bytes (default 1 MiB): the
// middleware reads the body to fingerprint it, and a larger body is
// answered 413.
func WithMaxRequestBody(n int64) Option {
	return httpOption(func(m *middleware) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxRequestBody(%d): want > 0", n)
		}
		m.maxReqBody = n
		return nil
	})
}

// WithMaxResponseBody caps the stored response body, in bytes (default
// 1 MiB). A larger response still reaches the client, and its status and
// allow-listed header fields are stored without the body: a retry gets them
// with [BodyOmittedHeader] and an empty body, and the handler does not run
// again. The same happens when the store has no room for the body.
func WithMaxResponseBody(n int) Option {
	return httpOption(func(m *middleware) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxResponseBody(%d): want > 0", n)
		}
		m.maxRespBody = n
		return nil
	})
}

// WithLockTimeout sets how long a claim locks a key (default 1 min, at
// least 1 ms). While the handler runs, and while its response is being
// stored, the [Guard] renews the lock about every third of this time
// (store.Store.Extend), so a slow handler keeps its key. A renewal that is
// slow or fails is tried again, not taken as a loss: the lock is lost
// only when the store says another request holds it or its time is gone
// (no renewal confirmed for a whole lock timeout less a twentieth of it,
// the margin that tells the handler before the store's lock ends). Then
// the handler's context is canceled with [ErrLockLost] and its response
// is not stored.
// A server that dies stops renewing: after the lock timeout its key is
// free again. Shorter means faster recovery after a crash, more renewals,
// and a shorter outage of the store that a request's completion rides out
// (see [Guard.Run]).
func WithLockTimeout(d time.Duration) GuardOption {
	return GuardOption{func(g *Guard) error {
		if d < minTTL {
			return fmt.Errorf("WithLockTimeout(%v): want at least %v", d, minTTL)
		}
		g.lockTimeout = d
		return nil
	}}
}

// WithRetention sets how long a finished response is kept for replays
// (default 24 h, at least 1 ms).
func WithRetention(d time.Duration) GuardOption {
	return GuardOption{func(g *Guard) error {
		if d < minTTL {
			return fmt.Errorf("WithRetention(%v): want at least %v", d, minTTL)
		}
		g.retention = d
		return nil
	}}
}

// WithStoreTimeout bounds each call to the store (claim, renewal,
// completion, release), default 2 s. A call that has not answered by then
// counts as failed, even if the store ignores its context: a claim fails
// closed (the handler does not run; the middleware answers 503), a
// renewal or a completion is tried again while the lock lives. A claim is
// not canceled when the request is (its answer, with the owner token, must
// not be lost); one that the store reports after the timeout, or after the
// client left, is released. The in-memory store answers at once and is
// called directly.
func WithStoreTimeout(d time.Duration) GuardOption {
	return GuardOption{func(g *Guard) error {
		if d <= 0 {
			return fmt.Errorf("WithStoreTimeout(%v): want > 0", d)
		}
		g.callTimeout = d
		return nil
	}}
}

// WithStoreStatus sets which final statuses are stored for replay. The
// default stores everything except 5xx, 401, 408 and 429: those release
// the key so that a retry runs the handler again (408 and 429, like 5xx,
// are answers clients retry: stored, every retry would meet the replay). Stripe stores 500s too; pass
// func(code int) bool { return true } for that.
func WithStoreStatus(f func(code int) bool) Option {
	return httpOption(func(m *middleware) error {
		if f == nil {
			return errors.New("WithStoreStatus(nil)")
		}
		m.storeStatus = f
		return nil
	})
}

// defaultStoreStatus reports whether the middleware stores a response with
// status code by default: everything but 5xx, 401, 408 and 429.
func defaultStoreStatus(code int) bool {
	return code < 500 && code != http.StatusUnauthorized && code != http.StatusRequestTimeout && code != http.StatusTooManyRequests
}

// WithReplayHeaders replaces the allow-list of response header fields that
// are stored and replayed (default Cache-Control, Content-Encoding,
// Content-Language, Content-Type, Etag, Last-Modified, Location, Vary).
// Set-Cookie and authentication fields are never stored, nor the message's
// framing (Content-Length, Transfer-Encoding and the hop-by-hop fields: the
// replay's own body sets them): listing one is an error. So is a name that
// is not a header field name (a token of RFC 9110), which includes
// net/http's "Trailer:" prefix: a replay carries no trailers.
func WithReplayHeaders(names ...string) Option {
	names = slices.Clone(names)
	return httpOption(func(m *middleware) error {
		m.replay = m.replay[:0:0]
		for _, name := range names {
			c := http.CanonicalHeaderKey(name)
			if slices.Contains(neverStored, c) {
				return fmt.Errorf("WithReplayHeaders: %s is never stored", c)
			}
			if c == "" {
				return errors.New("WithReplayHeaders: empty name")
			}
			if !isToken(c) {
				return fmt.Errorf("WithReplayHeaders: %.60q is not a header field name", c)
			}
			m.replay = append(m.replay, c)
		}
		return nil
	})
}

// WithLogger sets the logger for store failures, stale completions and
// released keys. The default discards everything.
func WithLogger(l *slog.Logger) GuardOption {
	return GuardOption{func(g *Guard) error {
		if l == nil {
			return errors.New("WithLogger(nil)")
		}
		g.log = l
		return nil
	}}
}

// WithObserver reports every keyed request to o (package observe), one
// event of Kind observe.Idempotency each, on the request's goroutine with
// its context, once its outcome is known (for a request that ran, after
// its response was stored or its key released):
//
//   - Name: the name given with [WithName] ("" without one);
//   - Outcome: "new" (the key was claimed for this request: its first
//     sight, or a retry after the key was released or its lock expired;
//     the handler ran, unless the request ended while the key was claimed),
//     "replay" (a stored response was replayed), "in-progress" (another
//     request holds the key), "mismatch" (the key was used for a different
//     request), "invalid" (the request was refused before the store was
//     consulted: a malformed key, a missing one that [WithRequired] asks
//     for, a body over the cap, a caller that could not be identified) or
//     "store-error" (a store call failed, whatever
//     the answer: the claim, so nothing ran, or, after the handler ran,
//     the completion or release, or the lock was lost);
//   - Elapsed: the time spent in store calls for the request (claim,
//     renewals, completion or release);
//   - Err: the store's error for "store-error" (wrapping [ErrLockLost]
//     when the lock was lost), nil otherwise.
//
// A request without a key makes no event, nor does a request whose method
// is not guarded. nil (the default) means no observer: nothing is reported
// and nothing is measured or allocated for it.
func WithObserver(o observe.Observer) GuardOption {
	return GuardOption{func(g *Guard) error {
		g.obs = o
		return nil
	}}
}

// WithName names the guard in its events ([WithObserver]), e.g. the
// service or route it protects: the metrics of package otelstormguard
// carry it as stormguard.name. Give a fixed label, not one per request.
// The default is "".
func WithName(name string) GuardOption {
	return GuardOption{func(g *Guard) error {
		g.name = name
		return nil
	}}
}

// isToken reports whether s is a token of RFC 9110 (section 5.6.2), the
// form of a header field name.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}
