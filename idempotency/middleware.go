package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Defaults of a [Middleware].
const (
	DefaultLockTimeout     = time.Minute
	DefaultRetention       = 24 * time.Hour
	DefaultStoreTimeout    = 2 * time.Second
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
	ReplayHeader, BodyOmittedHeader,
}

// ScopeFunc maps an authenticated request to its caller (tenant, user, API
// key...). Keys are scoped to it: the same raw key sent by two callers names
// two unrelated operations. It must return a non-empty string; an error (or
// "") means the caller cannot be identified, and the middleware answers 500
// without running the handler, since it runs after authentication.
type ScopeFunc func(*http.Request) (string, error)

// Middleware is server-side idempotency for net/http handlers; see the
// package documentation for its answers. Build it with [NewMiddleware] and
// wrap handlers with [Middleware.Handler]. A Middleware is immutable and
// safe for concurrent use; one Middleware may wrap many handlers, and many
// servers may share one [Store]. A zero (or nil) Middleware is not usable:
// its handlers answer every request 500 without running it.
type Middleware struct {
	store       Store
	local       bool // store is a *MemoryStore: it answers at once
	scope       ScopeFunc
	required    bool
	methods     []string
	route       func(*http.Request) string
	maxReqBody  int64
	maxRespBody int
	lockTimeout time.Duration
	retention   time.Duration
	callTimeout time.Duration
	storeStatus func(int) bool
	replay      []string // canonical header names
	log         *slog.Logger
}

// Option configures a [Middleware] in [NewMiddleware]. Options are values
// made by the With functions; the zero Option does nothing. Once
// NewMiddleware has returned, nothing can change the Middleware.
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
// without one (in [Header] or [LegacyHeader]) is answered 400. By default a
// request without a key runs unguarded.
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
// 1 MiB). A larger response still reaches the client, and its status and
// allow-listed header fields are stored without the body: a retry gets them
// with [BodyOmittedHeader] and an empty body, and the handler does not run
// again. The same happens when the store has no room for the body.
func WithMaxResponseBody(n int) Option {
	return Option{func(m *Middleware) error {
		if n <= 0 {
			return fmt.Errorf("WithMaxResponseBody(%d): want > 0", n)
		}
		m.maxRespBody = n
		return nil
	}}
}

// WithLockTimeout sets how long a claim locks a key (default 1 min). While
// the handler runs, the middleware renews the lock about every third of
// this time ([Store.Extend]), so a slow handler keeps its key; if a renewal
// finds the lock lost, or the store does not answer before the lock could
// expire, the handler's context is canceled with [ErrLockLost] and its
// response is not stored. A server that dies stops renewing: after the lock
// timeout its key is free again. Shorter means faster recovery after a
// crash and more renewals.
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

// WithStoreTimeout bounds each call to the store (claim, renewal,
// completion, release), default 2 s. A call that has not answered by then
// counts as failed, even if the store ignores its context: a claim is
// answered 503 (fail closed), a completion is tried once more and then
// left to the lock timeout. A claim is not canceled when the request is
// (its answer, with the owner token, must not be lost); one that the store
// reports after the timeout, or after the client left, is released. The
// in-memory store answers at once and is called directly.
func WithStoreTimeout(d time.Duration) Option {
	return Option{func(m *Middleware) error {
		if d <= 0 {
			return fmt.Errorf("WithStoreTimeout(%v): want > 0", d)
		}
		m.callTimeout = d
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

// NewMiddleware returns a middleware that keeps keys in store. It fails
// when store is nil, an option is invalid, no scope is set (pass
// [WithScope] or, deliberately, [WithSharedScope]), or the store cannot
// keep the lock timeout or retention ([TTLChecker]).
func NewMiddleware(store Store, opts ...Option) (*Middleware, error) {
	if v := reflect.ValueOf(store); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, errors.New("idempotency: NewMiddleware: nil store")
	}
	m := &Middleware{
		store:       store,
		methods:     []string{http.MethodPost, http.MethodPatch},
		route:       defaultRoute,
		maxReqBody:  DefaultMaxRequestBody,
		maxRespBody: DefaultMaxResponseBody,
		lockTimeout: DefaultLockTimeout,
		retention:   DefaultRetention,
		callTimeout: DefaultStoreTimeout,
		storeStatus: DefaultStoreStatus,
		replay:      defaultReplayHeaders,
		log:         slog.New(slog.DiscardHandler),
	}
	_, m.local = store.(*MemoryStore)
	for _, o := range opts {
		if o.apply == nil {
			continue
		}
		if err := o.apply(m); err != nil {
			return nil, fmt.Errorf("idempotency: NewMiddleware: %w", err)
		}
	}
	if m.scope == nil {
		return nil, errors.New("idempotency: NewMiddleware: no scope: pass WithScope (map each request to its caller) or, deliberately, WithSharedScope")
	}
	if c, ok := store.(TTLChecker); ok {
		for _, d := range []struct {
			what string
			d    time.Duration
		}{{"lock timeout", m.lockTimeout}, {"retention", m.retention}} {
			if err := c.CheckTTL(d.d); err != nil {
				return nil, fmt.Errorf("idempotency: NewMiddleware: %s %v: %w", d.what, d.d, err)
			}
		}
	}
	return m, nil
}

func defaultRoute(r *http.Request) string {
	if r.URL.RawQuery == "" {
		return r.URL.EscapedPath()
	}
	return r.URL.EscapedPath() + "?" + r.URL.RawQuery
}

// Handler returns next guarded by m. A nil next, or a zero or nil m, gives
// a handler that answers every request 500 without running anything.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if m == nil || m.store == nil || next == nil {
		return http.HandlerFunc(unconfigured)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

// unconfigured answers a request that reached a middleware not built by
// NewMiddleware, or without a handler.
func unconfigured(w http.ResponseWriter, _ *http.Request) {
	problem(w, http.StatusInternalServerError, "not-configured", "Idempotency middleware not configured",
		"The request was not processed.")
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	raw, err := requestKey(r.Header)
	switch {
	case err != nil:
		problem(w, http.StatusBadRequest, "key-invalid", "Idempotency-Key invalid", keyProblem(err))
		return
	case raw == "" && m.required:
		problem(w, http.StatusBadRequest, "key-missing", "Idempotency-Key missing",
			"This request needs an Idempotency-Key header.")
		return
	case raw == "":
		next.ServeHTTP(w, r)
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

	claimedAt := time.Now()
	res, err := m.begin(r.Context(), key, fp)
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
		if r.Context().Err() != nil { // gone while the key was claimed
			m.release(r.Context(), key, res.Owner, "request canceled before the handler ran")
			w.Header().Set("Retry-After", retryAfterSeconds)
			problem(w, http.StatusServiceUnavailable, "canceled", "Request canceled",
				"The request was canceled before it was processed; retry it with the same Idempotency-Key.")
			return
		}
		m.run(w, r, body, next, key, res.Owner, claimedAt)
	default:
		m.log.ErrorContext(r.Context(), "idempotency: store returned no outcome", "key", key, "outcome", res.Outcome)
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusServiceUnavailable, "store-unavailable", "Idempotency store unavailable", "")
	}
}

// Errors of requestKey.
var (
	errKeyLines   = errors.New("more than one key header line")
	errKeysDiffer = errors.New("the Idempotency-Key and X-Idempotency-Key fields differ")
)

// requestKey returns the raw idempotency key of a request with header h,
// from [Header] or [LegacyHeader]; "" if it has neither. A request may
// carry both if they give the same key. More than one line of either
// field, an empty or malformed value, or two different keys are errors.
func requestKey(h http.Header) (string, error) {
	draft, legacy := h[Header], h[LegacyHeader]
	if len(draft) > 1 || len(legacy) > 1 {
		return "", errKeyLines
	}
	var key string
	for _, vs := range [2][]string{draft, legacy} {
		if len(vs) == 0 {
			continue
		}
		k, err := ParseKey(vs[0])
		if err != nil {
			return "", err
		}
		if key != "" && k != key {
			return "", errKeysDiffer
		}
		key = k
	}
	return key, nil
}

// keyProblem returns the problem detail for an error of requestKey.
func keyProblem(err error) string {
	switch {
	case errors.Is(err, errKeyLines):
		return "Send exactly one Idempotency-Key header line."
	case errors.Is(err, errKeysDiffer):
		return "Idempotency-Key and X-Idempotency-Key carry different keys; send one key."
	}
	return "The Idempotency-Key must be 1 to 255 printable ASCII characters, bare or as a quoted string."
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

func (m *Middleware) replayRecord(w http.ResponseWriter, rec Record) {
	h := w.Header()
	for _, name := range m.replay {
		if vs, ok := rec.Header[name]; ok {
			h[name] = slices.Clone(vs)
		}
	}
	h.Set(ReplayHeader, "true")
	if rec.BodyOmitted {
		h.Set(BodyOmittedHeader, "true")
	}
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
