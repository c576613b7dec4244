package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"

	"github.com/stormguard/stormguard/idempotency/internal/capture"
	"github.com/stormguard/stormguard/idempotency/store"
)

// Default body caps of the middleware, in bytes.
const (
	defaultMaxRequestBody  = 1 << 20
	defaultMaxResponseBody = 1 << 20
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
// the allow-list: credentials and cookies must not be replayed, and the
// message's framing (its length, its transfer coding, hop-by-hop fields) is
// the replay's own: a stored Content-Length with an omitted body broke the
// replayed response.
var neverStored = []string{
	"Set-Cookie", "Set-Cookie2", "Authorization", "Proxy-Authorization",
	"Www-Authenticate", "Proxy-Authenticate", "Authentication-Info", "Proxy-Authentication-Info", "Cookie",
	"Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Upgrade",
	ReplayHeader, BodyOmittedHeader,
}

// middleware is what [NewMiddleware] builds (see there).
type middleware struct {
	g           Guard
	scope       func(*http.Request) (string, error)
	required    bool
	methods     []string
	route       func(*http.Request) string
	maxReqBody  int64
	maxRespBody int
	storeStatus func(int) bool
	replay      []string // canonical header names
}

// NewMiddleware returns server-side idempotency for net/http handlers, as
// a middleware: wrap each handler to guard with it (after authentication),
// handler = mw(handler). See the package documentation for its answers.
// It keeps keys in s: a [*MemoryStore] for one process, or a store that
// servers share (idempotency/pgstore, idempotency/redisstore). It fails
// when s is nil, an option is invalid, or no scope is set (pass
// [WithScope]; it says how to share one scope between all callers,
// deliberately).
//
// The middleware is an HTTP face on a [Guard]: the Guard claims, renews,
// stores, releases and replays; the middleware reads the key and the
// body, fingerprints the request, records the handler's response and
// answers. It is immutable and safe for concurrent use; it may wrap many
// handlers, and many servers may share one store. A nil handler gives a
// handler that answers every request 500 without running anything.
func NewMiddleware(s store.Store, opts ...Option) (func(next http.Handler) http.Handler, error) {
	g, err := newGuard("NewMiddleware", s)
	if err != nil {
		return nil, err
	}
	m := &middleware{
		g:           g,
		methods:     []string{http.MethodPost, http.MethodPatch},
		route:       defaultRoute,
		maxReqBody:  defaultMaxRequestBody,
		maxRespBody: defaultMaxResponseBody,
		storeStatus: defaultStoreStatus,
		replay:      defaultReplayHeaders,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.applyMiddleware(m); err != nil {
			return nil, fmt.Errorf("idempotency: NewMiddleware: %w", err)
		}
	}
	if m.scope == nil {
		return nil, errors.New("idempotency: NewMiddleware: no scope: pass WithScope (map each request to its caller, or deliberately every request to one constant)")
	}
	return m.handler, nil
}

func defaultRoute(r *http.Request) string {
	if r.URL.RawQuery == "" {
		return r.URL.EscapedPath()
	}
	return r.URL.EscapedPath() + "?" + r.URL.RawQuery
}

// handler returns next guarded by m. A nil next, or a zero or nil m, gives
// a handler that answers every request 500 without running anything.
func (m *middleware) handler(next http.Handler) http.Handler {
	if m == nil || m.g.store == nil || next == nil {
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

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !slices.Contains(m.methods, r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	raw, err := requestKey(r.Header)
	switch {
	case err != nil:
		m.g.ReportInvalid(r.Context())
		problem(w, http.StatusBadRequest, "key-invalid", "Idempotency-Key invalid", keyProblem(err))
		return
	case raw == "" && m.required:
		m.g.ReportInvalid(r.Context())
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
		m.g.log.ErrorContext(r.Context(), "idempotency: cannot scope request", "err", err)
		m.g.ReportInvalid(r.Context())
		problem(w, http.StatusInternalServerError, "scope-unavailable", "Caller unknown",
			"The caller of this request could not be identified.")
		return
	}

	body, err := m.readBody(r)
	if err != nil {
		m.g.ReportInvalid(r.Context())
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
				fmt.Sprintf("Requests with an Idempotency-Key may carry at most %d bytes.", m.maxReqBody))
			return
		}
		problem(w, http.StatusBadRequest, "body-unreadable", "Request body unreadable", "")
		return
	}
	fp := store.NewFingerprint(r.Method, m.route(r), sha256.Sum256(body))
	outcome, rec, err := m.g.Run(r.Context(), scope, raw, fp, func(ctx context.Context) (store.Record, bool) {
		return m.handle(ctx, w, r, body, next)
	})
	switch {
	case errors.Is(err, ErrStoreUnavailable):
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusServiceUnavailable, "store-unavailable", "Idempotency store unavailable",
			"The request was not processed; retry it with the same Idempotency-Key.")
	case err != nil: // gone while the key was claimed
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusServiceUnavailable, "canceled", "Request canceled",
			"The request was canceled before it was processed; retry it with the same Idempotency-Key.")
	case outcome == store.Mismatch:
		problem(w, http.StatusUnprocessableEntity, "key-reused", "Idempotency-Key reused",
			"This Idempotency-Key was used for a different request (method, route or body).")
	case outcome == store.InProgress:
		w.Header().Set("Retry-After", retryAfterSeconds)
		problem(w, http.StatusConflict, "in-progress", "Request in progress",
			"A request with this Idempotency-Key is still being processed.")
	case outcome == store.Completed:
		m.replayRecord(w, rec)
	}
}

// handle runs next for the request r with body, on the Guard's context
// ctx, passing its response through to w, and returns the record of the
// response and whether to store it.
func (m *middleware) handle(ctx context.Context, w http.ResponseWriter, r *http.Request, body []byte, next http.Handler) (store.Record, bool) {
	x := capture.New(w, m.replay, m.maxRespBody, body) // one allocation for both
	r = r.WithContext(ctx)
	r.Body = &x.Body
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	rec := &x.W
	next.ServeHTTP(rec, r)
	var why string
	switch {
	case rec.Hijacked:
		why = "connection hijacked"
	case !rec.WroteHeader && ctx.Err() != nil:
		// Most likely the handler gave up because its request was
		// canceled (or its lock lost): nothing was produced, nothing to
		// replay.
		why = "handler returned no answer after its request was canceled"
	default:
		if !rec.WroteHeader {
			rec.Snapshot(http.StatusOK)
		}
		switch {
		case rec.Status < 200:
			why = "informational final status"
		case !m.storeStatus(rec.Status):
			why = "status not stored"
		default:
			return store.Record{Status: rec.Status, Header: rec.Fields, Body: rec.Body, BodyOmitted: rec.Overflow}, true
		}
	}
	m.g.log.DebugContext(ctx, "idempotency: the response is not stored", "why", why)
	return store.Record{}, false
}

// Errors of requestKey.
var (
	errKeyLines   = errors.New("more than one key header line")
	errKeysDiffer = errors.New("the Idempotency-Key and X-Idempotency-Key fields differ")
)

// requestKey returns the raw idempotency key of a request with header h,
// from [Header] or [legacyHeader]; "" if it has neither. A request may
// carry both if they give the same key. More than one line of either
// field, an empty or malformed value, or two different keys are errors.
func requestKey(h http.Header) (string, error) {
	draft, legacy := h[Header], h[legacyHeader]
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

// growFirst is the most a request body's buffer is grown to before its
// bytes arrive (1 MiB, the default cap).
const growFirst = 1 << 20

// readBody reads the whole body, at most m.maxReqBody bytes.
func (m *middleware) readBody(r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > m.maxReqBody {
		return nil, &http.MaxBytesError{Limit: m.maxReqBody}
	}
	var buf bytes.Buffer
	if r.ContentLength > 0 {
		// Room for the declared length, +1 for reading to EOF, but no more
		// than growFirst: the length is the client's word, and the buffer
		// grows as the bytes come.
		buf.Grow(int(min(r.ContentLength, growFirst)) + 1)
	}
	// One byte past the cap tells a longer body (the cap at MaxInt64 has
	// no byte past it).
	n, err := buf.ReadFrom(io.LimitReader(r.Body, min(m.maxReqBody, math.MaxInt64-1)+1))
	if err != nil {
		return nil, err
	}
	if n > m.maxReqBody {
		return nil, &http.MaxBytesError{Limit: m.maxReqBody}
	}
	return buf.Bytes(), nil
}

func (m *middleware) replayRecord(w http.ResponseWriter, rec store.Record) {
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
