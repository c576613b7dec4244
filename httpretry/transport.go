package httpretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
)

// Transport is an [http.RoundTripper] that retries what is worth retrying,
// per the rules in the package documentation, on top of a base
// RoundTripper. Build one with [NewTransport]; the zero value is not
// usable.
//
// A Transport is safe for concurrent use by any number of goroutines and
// is immutable once built, apart from its table of per-host budgets and
// breakers. It never modifies the caller's request, always closes the
// request body, and returns a nil error whenever it returns a response.
//
// Per host, every request deposits in the budget and every retry withdraws
// from it; every attempt asks the breaker first. The breaker counts as
// failures the network errors and retryable statuses (408, 429, 500, 502,
// 503, 504), those of requests that may not be retried included; a 4xx is
// a success (the host answered). A second 500 and a failure carrying
// "Stormguard-Retry: no" stop the loop at once and still count as failures
// ([retry.Final]).
type Transport struct {
	base        http.RoundTripper
	cfg         config
	attemptVals [][]string // attemptVals[n-1] is the AttemptHeader value of attempt n
	hosts       *hosts
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport sending through base; a nil base means
// [http.DefaultTransport]. Without options it makes up to 3 attempts with
// full-jitter backoff (base 100 ms, cap 10 s), honours Retry-After up to 1
// minute, keeps a retry budget ([budget.DefaultConfig]) and a circuit
// breaker ([breaker.DefaultConfig]) per destination host (at most
// [DefaultMaxHosts] hosts), has no timeout of its own (the request
// context's deadline counts), does not buffer bodies or make idempotency
// keys, and logs nothing.
//
// A bad option value makes NewTransport return an error wrapping
// [ErrInvalidOption]; it never panics.
func NewTransport(base http.RoundTripper, opts ...Option) (*Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	bc, brc := budget.DefaultConfig(), breaker.DefaultConfig()
	c := config{
		maxAttempts:   retry.DefaultMaxAttempts,
		backoff:       backoff.Default(),
		maxRetryAfter: retry.DefaultMaxRetryAfter,
		budget:        &bc,
		breaker:       &brc,
		clock:         retry.SystemClock{},
		maxHosts:      DefaultMaxHosts,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	t := &Transport{base: base, cfg: c, attemptVals: attemptValues(c.maxAttempts)}
	t.hosts = newHosts(c.maxHosts, t.newHost)
	// Build one host's state now, so that a bad budget or breaker
	// configuration is reported here and never by RoundTrip.
	if _, err := t.newHost(""); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
	}
	return t, nil
}

// NewClient returns an [http.Client] whose Transport is a [Transport] over
// [http.DefaultTransport], configured by opts. The client has no Timeout of
// its own; use [WithTimeout]. Errors are those of [NewTransport].
func NewClient(opts ...Option) (*http.Client, error) {
	t, err := NewTransport(nil, opts...)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// newHost builds the state of one destination host: its budget, its
// breaker, and the two policies that share them.
func (t *Transport) newHost(name string) (*host, error) {
	c := &t.cfg
	opts := []retry.Option{
		retry.WithBackoff(c.backoff),
		retry.WithMaxRetryAfter(c.maxRetryAfter),
		retry.WithClassifier(classify),
		retry.WithClock(c.clock),
	}
	_, realClock := c.clock.(retry.SystemClock) // then nil Now: time.Now, one call less
	var logger *slog.Logger
	if c.logger != nil {
		logger = c.logger.With(slog.String("host", name))
		opts = append(opts, retry.WithLogger(logger))
	}
	if c.budget != nil {
		cfg := *c.budget
		if cfg.Now == nil && !realClock {
			cfg.Now = c.clock.Now
		}
		b, err := budget.New(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, retry.WithBudget(b))
	}
	if c.breaker != nil {
		cfg := *c.breaker
		if cfg.Now == nil && !realClock {
			cfg.Now = c.clock.Now
		}
		if cfg.OnStateChange == nil && logger != nil {
			cfg.OnStateChange = func(from, to breaker.State) {
				logger.LogAttrs(context.Background(), slog.LevelWarn, "httpretry: circuit breaker state change",
					slog.String("from", from.String()), slog.String("to", to.String()))
			}
		}
		b, err := breaker.New(cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, retry.WithBreaker(b))
	}
	retrying, err := retry.New(append(opts, retry.WithMaxAttempts(c.maxAttempts))...)
	if err != nil {
		return nil, err
	}
	single := retrying
	if c.maxAttempts > 1 {
		if single, err = retry.New(append(opts, retry.WithMaxAttempts(1))...); err != nil {
			return nil, err
		}
	}
	return &host{retrying: retrying, single: single}, nil
}

// idempotentMethod reports whether method is idempotent per RFC 9110: GET,
// HEAD, OPTIONS, TRACE, PUT, DELETE ("" means GET).
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// hasIdempotencyKey reports whether h carries an idempotency key, in the
// draft's field or the older X- form net/http also knows.
func hasIdempotencyKey(h http.Header) bool {
	return len(h[idempotency.Header]) > 0 || len(h["X-Idempotency-Key"]) > 0
}

// classify is the transport's classifier: retryable statuses (the op only
// returns those, or marks them Permanent), and the loop's default rules
// for errors, plus io.EOF: a connection closed before any response byte
// arrived (the request may not have been processed, and it is only retried
// when it is safe to repeat anyway).
func classify(err error) bool {
	if _, ok := err.(*retry.StatusError); ok {
		return true // the op returns only retryable statuses (and 500s it may retry)
	}
	return retry.IsRetryable(err) || errors.Is(err, io.EOF)
}

// RoundTrip sends req, retrying as the package documentation describes, and
// returns the response of the last attempt, or an error if it has none.
//
// When it gives up on a retryable status it returns that last response
// with a nil error, marked with [GaveUpHeader]; the bodies of earlier failed attempts
// are drained (up to 64 KiB) and closed. When the last attempt failed
// without a response, the error is a [*retry.Error] saying why it stopped
// (errors.Is with retry.ErrAttemptsExhausted, retry.ErrDeadline, ...) and
// wrapping the cause. RoundTrip never modifies req and always closes its
// body. It is safe for concurrent use.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req == nil {
		return nil, errors.New("httpretry: nil request")
	}
	if req.URL == nil {
		closeReqBody(req)
		return nil, errors.New("httpretry: nil request URL")
	}
	h, err := t.hosts.get(req.URL.Host)
	if err != nil {
		closeReqBody(req)
		return nil, err
	}
	c := call{t: t, req: req, src: req}
	return c.run(h)
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// call is the state of one RoundTrip.
type call struct {
	t   *Transport
	req *http.Request // the caller's request, never modified
	src *http.Request // what attempts copy: req, or the request refresh returned

	key        []string // Idempotency-Key value made by the transport; nil if none
	idempotent bool     // the method is idempotent: a 500 may be retried once
	retryable  bool     // failures may be retried at all
	replayable bool     // the body can be sent again

	data  []byte        // buffered body (WithBufferBodies); nil if none
	once  io.ReadCloser // body to send once; nil if none
	owned io.Closer     // the caller's body while no attempt took it over
	sends int           // requests handed to the base transport

	got500    bool
	refreshed bool

	cur       *http.Response     // the last attempt's response, until given back or discarded
	curCancel context.CancelFunc // its attempt context's cancel; nil if none
	cancel    context.CancelFunc // the call context's cancel; nil if none
}

func (c *call) run(h *host) (*http.Response, error) {
	req, cfg := c.req, &c.t.cfg
	c.idempotent = idempotentMethod(req.Method)
	hasKey := hasIdempotencyKey(req.Header)
	if !c.idempotent && !hasKey && cfg.autoKey {
		c.key = []string{idempotency.NewKey()}
		hasKey = true
	}
	c.replayable = true
	if req.Body != nil && req.Body != http.NoBody {
		c.owned = req.Body
		if req.GetBody == nil {
			c.replayable = false
			if cfg.bufferBodies > 0 {
				data, once, ok, err := bufferBody(req.Body, req.ContentLength, cfg.bufferBodies)
				if err != nil {
					return nil, fmt.Errorf("httpretry: read request body: %w", err)
				}
				c.data, c.once, c.replayable = data, once, ok
				if ok {
					c.owned = nil // closed by bufferBody
					if c.data == nil {
						c.data = []byte{}
					}
				}
			}
		}
	}
	c.retryable = (c.idempotent || hasKey) && c.replayable

	ctx := req.Context()
	if cfg.timeout > 0 {
		ctx, c.cancel = context.WithTimeout(ctx, cfg.timeout)
	}
	p := h.retrying
	if !c.retryable {
		p = h.single
	}
	resp, err := retry.DoValue(ctx, p, c.attempt)
	if resp != nil && resp == c.cur {
		re, isRetryErr := err.(*retry.Error)
		switch {
		case err == nil:
			return c.giveBack(resp, 0, 0), nil
		case isRetryErr && re.Reason != retry.Canceled:
			reason := re.Reason
			if reason == retry.AttemptsExhausted && !c.retryable {
				reason = retry.NotRetryable // no retry was allowed, none was exhausted
			}
			return c.giveBack(resp, reason, re.Attempts), nil
		}
	}
	c.discardCur()
	if c.owned != nil {
		_ = c.owned.Close()
	}
	if c.cancel != nil {
		c.cancel()
	}
	if re, ok := err.(*retry.Error); ok && re.Reason == retry.AttemptsExhausted && !c.retryable {
		re.Reason = retry.NotRetryable // no retry was allowed, none was exhausted
	}
	return nil, err
}

// giveBack hands resp, the last attempt's response, to the caller: marked
// with GaveUpHeader if the transport gave up on it (reason not 0), and with
// a body that releases the contexts made for the call when closed.
func (c *call) giveBack(resp *http.Response, reason retry.Reason, attempts int) *http.Response {
	c.cur = nil
	if c.owned != nil {
		_ = c.owned.Close()
	}
	if reason != 0 {
		if resp.Header == nil {
			resp.Header = make(http.Header)
		}
		resp.Header[GaveUpHeader] = []string{gaveUpValue(reason, attempts)}
	}
	if resp.Body == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		// A 101's body is the connection itself (an io.ReadWriteCloser);
		// leave it alone. Its contexts only end with the parent's.
		return resp
	}
	if c.curCancel != nil || c.cancel != nil {
		resp.Body = &body{ReadCloser: resp.Body, cancelAttempt: c.curCancel, cancelCall: c.cancel}
	}
	return resp
}

// discardCur drains and closes the last attempt's response, if any, and
// releases its attempt context.
func (c *call) discardCur() {
	if c.cur != nil {
		if c.cur.Body != nil {
			drainClose(c.cur.Body)
		}
		c.cur = nil
	}
	if c.curCancel != nil {
		c.curCancel()
		c.curCancel = nil
	}
}

// attempt is the loop's operation: one attempt (plus, after a 401, the one
// resend with refreshed credentials).
func (c *call) attempt(ctx context.Context, n int) (*http.Response, error) {
	c.discardCur()
	resp, err := c.send(ctx, n)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusUnauthorized && c.t.cfg.refresh != nil && !c.refreshed && c.replayable {
		c.refreshed = true
		nr, err := c.refresh()
		if err != nil {
			return nil, retry.Permanent(err)
		}
		if nr != nil {
			c.discardCur()
			c.src = nr
			if resp, err = c.send(ctx, n); err != nil {
				return nil, err
			}
		}
	}
	code := resp.StatusCode
	if !retry.IsRetryableStatus(code) && code != http.StatusInternalServerError {
		return resp, nil // success, or a failure that is the caller's business
	}
	// The attempt's answer, for the loop: the status, and Retry-After on
	// 429 and 503 (the loop's floor on the next sleep).
	se := &retry.StatusError{Code: code}
	if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
		if v := resp.Header["Retry-After"]; len(v) > 0 {
			se.After, _ = ParseRetryAfter(v[0], c.t.cfg.clock.Now())
		}
	}
	if code == http.StatusInternalServerError {
		// At most one retry, and only for an idempotent method (a
		// request that may not be retried at all runs on a one-attempt
		// policy, so its 500 still counts as a failure for the breaker).
		again := c.idempotent && !c.got500
		c.got500 = true
		if !again && c.retryable {
			return resp, retry.Final(se)
		}
	}
	if dontRetry(resp.Header) {
		return resp, retry.Final(se)
	}
	return resp, se
}

// send makes one request to the base transport and records the response as
// the current one.
func (c *call) send(ctx context.Context, n int) (*http.Response, error) {
	b, err := c.body()
	if err != nil {
		return nil, retry.Permanent(fmt.Errorf("httpretry: rewind request body: %w", err))
	}
	var cancel context.CancelFunc
	if d := c.t.cfg.attemptTimeout; d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	r := c.src.WithContext(ctx) // the shallow copy this attempt may change
	r.Header = c.header(n)
	r.Body = b
	if data := c.data; data != nil {
		r.GetBody = func() (io.ReadCloser, error) { return bytesBody(data), nil }
	}
	c.sends++
	resp, err := c.t.base.RoundTrip(r)
	if err != nil {
		if cancel != nil {
			cancel()
		}
		return nil, err
	}
	c.cur, c.curCancel = resp, cancel
	return resp, nil
}

// body returns the request body for the next send.
func (c *call) body() (io.ReadCloser, error) {
	req := c.req
	switch {
	case c.data != nil:
		return bytesBody(c.data), nil
	case c.once != nil:
		b := c.once
		c.once, c.owned = nil, nil
		return b, nil
	case req.Body == nil || req.Body == http.NoBody:
		return req.Body, nil
	case c.sends == 0:
		c.owned = nil // the base transport closes it from now on
		return req.Body, nil
	case req.GetBody != nil:
		return req.GetBody()
	}
	// Only reached if a non-replayable body were sent twice, which the
	// Permanent marks prevent.
	return nil, errors.New("httpretry: request body cannot be replayed")
}

// header returns the header of attempt n: the source request's fields
// (their values shared, never modified), the attempt number and the
// transport's idempotency key, if any.
func (c *call) header(n int) http.Header {
	src := c.src.Header
	h := make(http.Header, len(src)+2)
	for k, v := range src {
		h[k] = v
	}
	h[AttemptHeader] = c.t.attemptVals[n-1]
	if c.key != nil {
		h[idempotency.Header] = c.key
	}
	return h
}

// refresh calls the 401 hook with a copy of the request that got the 401.
func (c *call) refresh() (*http.Request, error) {
	cp := c.src.Clone(c.src.Context())
	cp.Body, cp.GetBody = nil, nil
	if cp.Header == nil {
		cp.Header = make(http.Header)
	}
	if c.key != nil {
		cp.Header[idempotency.Header] = []string{c.key[0]}
	}
	nr, err := c.t.cfg.refresh(cp)
	if err != nil {
		return nil, fmt.Errorf("httpretry: refresh credentials after 401: %w", err)
	}
	return nr, nil
}
