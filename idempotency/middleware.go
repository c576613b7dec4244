package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Defaults of a [Middleware].
const (
	DefaultLockTimeout     = time.Minute
	DefaultRetention       = 24 * time.Hour
	DefaultMaxRequestBody  = 1 << 20 // bytes
	DefaultMaxResponseBody = 1 << 20 // bytes
)

// retryAfterSeconds is the Retry-After value sent with 409 (in progress) and
// 503 (store unavailable) answers.
const retryAfterSeconds = "1"

// defaultReplayHeaders are the response header fields stored and replayed
// unless [WithReplayHeaders] says otherwise.
var defaultReplayHeaders = []string{
	"Cache-Control", "Content-Encoding", "Content-Language", "Content-Type",
	"Etag", "Last-Modified", "Location", "Vary",
}

// neverStored are response header fields that are never stored, whatever
// the allow-list: credentials and cookies must not be replayed.
var neverStored = []string{
	"Set-Cookie", "Set-Cookie2", "Authorization", "Proxy-Authorization",
	"Www-Authenticate", "Proxy-Authenticate", "Authentication-Info", "Cookie",
}

// ScopeFunc maps an authenticated request to its caller (tenant, user, API
// key...). Keys are scoped to it: the same raw key sent by two callers names
// two unrelated operations. It must return a non-empty string; an error (or
// "") means the caller cannot be identified, and the middleware answers 500
// without running the handler, since it runs after authentication.
type ScopeFunc func(*http.Request) (string, error)

// Middleware is server-side idempotency for net/http handlers; see the
// package documentation for its answers. Build it with [New] and wrap
// handlers with [Middleware.Handler]. A Middleware is immutable and safe
// for concurrent use; one Middleware may wrap many handlers, and many
// servers may share one [Store].
type Middleware struct {
	store       Store
	scope       ScopeFunc
	required    bool
	methods     []string
	route       func(*http.Request) string
	maxReqBody  int64
	maxRespBody int
	lockTimeout time.Duration
	retention   time.Duration
	storeStatus func(int) bool
	replay      []string // canonical header names
	log         *slog.Logger
}

// Option configures a [Middleware] in [New]. Options are values made by
// the With functions; the zero Option does nothing. Once New has returned,
// nothing can change the Middleware.
type Option struct {
	apply func(*Middleware) error
}

// WithScope sets the function that maps a request to its caller. Every
// Middleware needs one, or an explicit [WithSharedScope].
func WithScope(f ScopeFunc) Option {
	return Option{func(m *Middleware) error {
		if f == nil {
			return errors.New("WithScope(nil)")
		}
		if m.scope != nil {
			return errors.New("scope set twice (WithScope / WithSharedScope)")
		}
		m.scope = f
		return nil
	}}
}

// WithSharedScope puts every caller in one shared scope: any caller who
// sends a key another caller used gets that caller's stored response. Use
// it only when there is a single caller (e.g. one internal service) or keys
// cannot be guessed and responses hold nothing private.
func WithSharedScope() Option {
	return WithScope(func(*http.Request) (string, error) { return "shared", nil })
}

// WithRequired makes the key mandatory on guarded methods: a request
// without one is answered 400. By default a request without a key runs
// unguarded.
func WithRequired() Option {
	return Option{func(m *Middleware) error { m.required = true; return nil }}
}

// WithMethods sets the guarded methods (default POST and PATCH). Requests
// with other methods pass through untouched, key or not.
func WithMethods(methods ...string) Option {
	return Option{func(m *Middleware) error {
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
	}}
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
	return Option{func(m *Middleware) error {
		if f == nil {
			return errors.New("WithRoute(nil)")
		}
		m.route = f
		return nil
	}}
}

// WithMaxRequestBody caps the request body, in bytes (default 1 MiB): the
// middleware reads the body to fingerprint it, and a larger body is
// answered 413.
func WithMaxRequestBody(n int64) Option {
	return Option{func(m *Middleware) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxRequestBody(%d): want > 0", n)
		}
		m.maxReqBody = n
		return nil
	}}
}

// WithMaxResponseBody caps the stored response body, in bytes (default
// 1 MiB). A larger response still reaches the client but is not stored: the
// key is released, so a retry of the same request runs the handler again.
func WithMaxResponseBody(n int) Option {
	return Option{func(m *Middleware) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxResponseBody(%d): want > 0", n)
		}
		m.maxRespBody = n
		return nil
	}}
}

// WithLockTimeout sets how long a claim locks a key (default 1 min). After
// it, a request whose server vanished stops blocking the key, and its late
// completion is rejected. Set it above the handler's longest run time.
func WithLockTimeout(d time.Duration) Option {
	return Option{func(m *Middleware) error {
		if d <= 0 {
			return fmt.Errorf("WithLockTimeout(%v): want > 0", d)
		}
		m.lockTimeout = d
		return nil
	}}
}

// WithRetention sets how long a finished response is kept for replays
// (default 24 h).
func WithRetention(d time.Duration) Option {
	return Option{func(m *Middleware) error {
		if d <= 0 {
			return fmt.Errorf("WithRetention(%v): want > 0", d)
		}
		m.retention = d
		return nil
	}}
}

// WithStoreStatus sets which final statuses are stored for replay. The
// default stores everything except 5xx, 401 and 429: those release the key
// so that a retry runs the handler again. Stripe stores 500s too; pass
// func(code int) bool { return true } for that.
func WithStoreStatus(f func(code int) bool) Option {
	return Option{func(m *Middleware) error {
		if f == nil {
			return errors.New("WithStoreStatus(nil)")
		}
		m.storeStatus = f
		return nil
	}}
}

// DefaultStoreStatus reports whether the middleware stores a response with
// status code by default: everything but 5xx, 401 and 429.
func DefaultStoreStatus(code int) bool {
	return code < 500 && code != http.StatusUnauthorized && code != http.StatusTooManyRequests
}

// WithReplayHeaders replaces the allow-list of response header fields that
// are stored and replayed (default Cache-Control, Content-Encoding,
// Content-Language, Content-Type, Etag, Last-Modified, Location, Vary).
// Set-Cookie and authentication fields are never stored: listing one is an
// error.
func WithReplayHeaders(names ...string) Option {
	return Option{func(m *Middleware) error {
		m.replay = m.replay[:0:0]
		for _, name := range names {
			c := http.CanonicalHeaderKey(name)
			if slices.Contains(neverStored, c) {
				return fmt.Errorf("WithReplayHeaders: %s is never stored", c)
			}
			if c == "" {
				return errors.New("WithReplayHeaders: empty name")
			}
			m.replay = append(m.replay, c)
		}
		return nil
	}}
}

// WithLogger sets the logger for store failures, stale completions and
// released keys. The default discards everything.
func WithLogger(l *slog.Logger) Option {
	return Option{func(m *Middleware) error {
		if l == nil {
			return errors.New("WithLogger(nil)")
		}
		m.log = l
		return nil
	}}
}

// New returns a middleware that keeps keys in store. It fails when store is
// nil, an option is invalid, or no scope is set: pass [WithScope] or,
// deliberately, [WithSharedScope].
func New(store Store, opts ...Option) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: New: nil store")
	}
	m := &Middleware{
		store:       store,
		methods:     []string{http.MethodPost, http.MethodPatch},
		route:       defaultRoute,
		maxReqBody:  DefaultMaxRequestBody,
		maxRespBody: DefaultMaxResponseBody,
		lockTimeout: DefaultLockTimeout,
		retention:   DefaultRetention,
		storeStatus: DefaultStoreStatus,
		replay:      defaultReplayHeaders,
		log:         slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		if o.apply == nil {
			continue
		}
		if err := o.apply(m); err != nil {
			return nil, fmt.Errorf("idempotency: New: %w", err)
		}
	}
	if m.scope == nil {
		return nil, errors.New("idempotency: New: no scope: pass WithScope (map each request to its caller) or, deliberately, WithSharedScope")
	}
	return m, nil
}

func defaultRoute(r *http.Request) string {
	if r.URL.RawQuery == "" {
		return r.URL.EscapedPath()
	}
	return r.URL.EscapedPath() + "?" + r.URL.RawQuery
}

// Handler returns next guarded by m.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(Header)
	switch {
	case len(values) == 0 && m.required:
		problem(w, http.StatusBadRequest, "key-missing", "Idempotency-Key missing",
			"This request needs an Idempotency-Key header.")
		return
	case len(values) == 0:
		next.ServeHTTP(w, r)
		return
	case len(values) > 1:
		problem(w, http.StatusBadRequest, "key-invalid", "Idempotency-Key invalid",
			"Send exactly one Idempotency-Key header line.")
		return
	}
	raw, err := ParseKey(values[0])
	if err != nil {
		problem(w, http.StatusBadRequest, "key-invalid", "Idempotency-Key invalid",
			"The Idempotency-Key must be 1 to 255 printable ASCII characters, bare or as a quoted string.")
		return
	}
	scope, err := m.scope(r)
	if err == nil && scope == "" {
		err = errors.New("empty scope")
	}
	if err != nil {
		m.log.ErrorContext(r.Context(), "idempotency: cannot scope request", "err", err)
		problem(w, http.StatusInternalServerError, "scope-unavailable", "Caller unknown",
			"The caller of this request could not be identified.")
		return
	}

	body, err := m.readBody(r)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
				fmt.Sprintf("Requests with an Idempotency-Key may carry at most %d bytes.", m.maxReqBody))
			return
		}
		problem(w, http.StatusBadRequest, "body-unreadable", "Request body unreadable", "")
		return
	}
	key := HashKey(scope, raw)
	fp := NewFingerprint(r.Method, m.route(r), sha256.Sum256(body))

	res, err := m.store.Begin(r.Context(), key, fp, m.lockTimeout)
	if err != nil {
		m.log.ErrorContext(r.Context(), "idempotency: store begin failed", "key", key, "err", err)
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusServiceUnavailable, "store-unavailable", "Idempotency store unavailable",
			"The request was not processed; retry it with the same Idempotency-Key.")
		return
	}
	switch res.Outcome {
	case Mismatch:
		problem(w, http.StatusUnprocessableEntity, "key-reused", "Idempotency-Key reused",
			"This Idempotency-Key was used for a different request (method, route or body).")
	case InProgress:
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusConflict, "in-progress", "Request in progress",
			"A request with this Idempotency-Key is still being processed.")
	case Completed:
		m.replayRecord(w, res.Record)
	case Claimed:
		r2 := new(http.Request)
		*r2 = *r
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		r2.ContentLength = int64(len(body))
		m.run(w, r2, next, key, res.Owner)
	default:
		m.log.ErrorContext(r.Context(), "idempotency: store returned no outcome", "key", key, "outcome", res.Outcome)
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusServiceUnavailable, "store-unavailable", "Idempotency store unavailable", "")
	}
}

// readBody reads the whole body, at most m.maxReqBody bytes.
func (m *Middleware) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > m.maxReqBody {
		return nil, &http.MaxBytesError{Limit: m.maxReqBody}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength) + 1) // +1: reading to EOF needs room
	}
	n, err := buf.ReadFrom(io.LimitReader(r.Body, m.maxReqBody+1))
	if err != nil {
		return nil, err
	}
	if n > m.maxReqBody {
		return nil, &http.MaxBytesError{Limit: m.maxReqBody}
	}
	return buf.Bytes(), nil
}

// run runs the handler for a claimed key, then stores or releases the key.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, next http.Handler, key Key, owner Owner) {
	rec := &recorder{w: w, replay: m.replay, max: m.maxRespBody}
	finished := false
	defer func() {
		if !finished { // panic or runtime.Goexit: release the key, let it unwind
			m.release(r.Context(), key, owner, "handler panicked")
		}
	}()
	next.ServeHTTP(rec, r)
	finished = true
	if !rec.wroteHeader {
		rec.snapshot(http.StatusOK)
	}
	switch {
	case rec.status < 200:
		m.release(r.Context(), key, owner, "informational final status")
	case !m.storeStatus(rec.status):
		m.release(r.Context(), key, owner, "status not stored")
	case rec.overflow:
		m.release(r.Context(), key, owner, "response over the size cap")
	default:
		ctx, cancel := m.afterContext(r.Context())
		defer cancel()
		err := m.store.Complete(ctx, key, owner, Record{Status: rec.status, Header: rec.header, Body: rec.body}, m.retention)
		switch {
		case errors.Is(err, ErrStaleOwner):
			m.log.WarnContext(ctx, "idempotency: completion rejected: lock lost (handler ran longer than the lock timeout?)", "key", key, "err", err)
		case err != nil:
			m.log.ErrorContext(ctx, "idempotency: store complete failed; releasing the key", "key", key, "err", err)
			m.release(r.Context(), key, owner, "completion failed")
		}
	}
}

// afterContext returns the context for store calls after the handler: not
// canceled with the request (the client may be gone, the key must still be
// settled), bounded by the lock timeout (after which the lock is moot).
func (m *Middleware) afterContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), m.lockTimeout)
}

func (m *Middleware) release(ctx context.Context, key Key, owner Owner, why string) {
	ctx, cancel := m.afterContext(ctx)
	defer cancel()
	m.log.DebugContext(ctx, "idempotency: releasing key", "key", key, "why", why)
	if err := m.store.Release(ctx, key, owner); err != nil {
		m.log.WarnContext(ctx, "idempotency: release failed; the key stays locked until the lock timeout", "key", key, "err", err)
	}
}

func (m *Middleware) replayRecord(w http.ResponseWriter, rec Record) {
	h := w.Header()
	for _, name := range m.replay {
		if vs, ok := rec.Header[name]; ok {
			h[name] = slices.Clone(vs)
		}
	}
	h.Set(ReplayHeader, "true")
	w.WriteHeader(rec.Status)
	_, _ = w.Write(rec.Body)
}

// problem writes an RFC 9457 problem details response.
func problem(w http.ResponseWriter, status int, typ, title, detail string) {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{"urn:stormguard:idempotency:" + typ, title, status, detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// recorder passes a response through to the client and keeps what a
// replay needs: final status, allow-listed header fields, body up to max.
type recorder struct {
	w           http.ResponseWriter
	replay      []string
	max         int
	wroteHeader bool
	status      int
	header      http.Header
	body        []byte
	overflow    bool
}

func (rw *recorder) Header() http.Header { return rw.w.Header() }

func (rw *recorder) WriteHeader(code int) {
	if !rw.wroteHeader && (code >= 200 || code == http.StatusSwitchingProtocols) {
		rw.snapshot(code)
	}
	rw.w.WriteHeader(code)
}

// snapshot records the final status and the allow-listed header fields as
// they are when the header is written.
func (rw *recorder) snapshot(code int) {
	rw.wroteHeader = true
	rw.status = code
	h := rw.w.Header()
	for _, name := range rw.replay {
		if vs, ok := h[name]; ok {
			if rw.header == nil {
				rw.header = make(http.Header, len(rw.replay))
			}
			rw.header[name] = slices.Clone(vs)
		}
	}
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	n, err := rw.w.Write(p)
	if !rw.overflow {
		if len(rw.body)+n > rw.max {
			rw.overflow = true
			rw.body = nil
		} else {
			rw.body = append(rw.body, p[:n]...)
		}
	}
	return n, err
}

// FlushError flushes the underlying writer through http.ResponseController.
func (rw *recorder) FlushError() error {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(rw.w).Flush()
}

// Flush implements http.Flusher for handlers that type-assert it.
func (rw *recorder) Flush() { _ = rw.FlushError() }

// Unwrap returns the underlying writer, for http.ResponseController.
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }
