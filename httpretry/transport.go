package httpretry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// Transport is an [http.RoundTripper] that retries what is worth retrying,
// per the rules in the package documentation, on top of a base
// RoundTripper. Build one with [NewTransport]; the zero value is usable and
// behaves like NewTransport(nil) without options.
//
// A Transport is safe for concurrent use by any number of goroutines and
// is immutable once built, apart from its table of per-host budgets and
// breakers. It never modifies the caller's request, always closes the
// request body, and returns a nil error whenever it returns a response.
// It has no CloseIdleConnections: an http.Client over it that is asked to
// close its idle connections does not reach the base transport's pool;
// call it on the base.
//
// Per host, every request deposits in the budget and every retry withdraws
// from it; every attempt asks the breaker first. The breaker counts as
// failures the network errors and retryable statuses (408, 429, 500, 502,
// 503, 504, an in-progress 409), those of requests that may not be retried
// included; any other answer is a success (the host answered).
type Transport struct {
	once    sync.Once
	base    http.RoundTripper
	cfg     config
	hosts   *hosts
	httpObs httpObserver              // the observer, if it observes HTTP requests; nil if not
	stale   *staleCache               // nil: none (WithStaleCache)
	hedges  *guards.Table[*hedgeHost] // nil: no hedging
	races   sync.Pool                 // of *raceState
	// timeouts are the wire.TimeoutHeader values sent lately.
	timeouts timeoutValues
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport sending through base; a nil base means
// [http.DefaultTransport]. Without options it makes up to 3 attempts with
// full-jitter backoff (base 100 ms, cap 10 s), honours Retry-After up to 1
// minute (spread above it), keeps a retry budget (10% plus 1 per second)
// and a circuit breaker (50% of at least 20 calls over 10 s; probes every
// second) per destination host (at most 1024 hosts, see [WithMaxHosts]),
// has no timeout of its own (the request context's deadline counts, and lets a
// request wait behind an open breaker), does not buffer bodies or make
// idempotency keys, and logs nothing.
//
// A bad option value makes NewTransport return an error that says which;
// it never panics.
func NewTransport(base http.RoundTripper, opts ...Option) (*Transport, error) {
	t := new(Transport)
	var err error
	t.once.Do(func() { err = t.init(base, opts) })
	if err != nil {
		return nil, err
	}
	return t, nil
}

// init builds t; it runs once per Transport. The options are applied, and
// one destination built, in one pass down the layers (the policy's options
// are checked by retry.New, the guards' configurations by budget.New and
// breaker.New): nothing is built to be read back.
func (t *Transport) init(base http.RoundTripper, opts []Option) error {
	if base == nil {
		base = http.DefaultTransport
	}
	def := &limit.Config{Max: defaultLimitMax}
	c := config{budget: &budget.Config{}, breaker: &breaker.Config{}, limit: def, maxHosts: defaultMaxHosts}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(&c); err != nil {
			return err
		}
	}
	t.httpObs, _ = c.observer.(httpObserver)
	layer := &guards.Layer{Component: "httpretry", Label: "host", Schedule: c.schedule, Classify: classify,
		Budget: c.budget, Breaker: c.breaker, Supply: c.guards, Logger: c.logger, Observer: c.observer,
		Limit: c.limit, LimitPaces: c.limit != def, AttemptTimeout: c.attemptTimeout}
	t.base, t.cfg = base, c
	t.hosts = newHosts(c.maxHosts, layer.New)
	t.stale = newStaleCache(c.stale)
	t.hedges = hedgeTable(&c)
	return layer.Check() // a bad option is reported here, never by RoundTrip
}

// ready sets up a zero Transport with the defaults on its first use.
func (t *Transport) ready() {
	t.once.Do(func() { _ = t.init(nil, nil) })
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

// attemptValues are the wire.AttemptHeader values of attempts 1 to 16,
// shared by every transport and never modified.
var attemptValues = func() [][]string {
	vs := make([][]string, 16)
	for i := range vs {
		vs[i] = []string{strconv.Itoa(i + 1)}
	}
	return vs
}()

// attemptValue returns the wire.AttemptHeader value of attempt n: from the
// shared values up to 16; beyond (a policy with more attempts, or a call
// that waited behind the breaker and was handed probes that do not count
// against its attempts) formatted on the spot.
func attemptValue(n int) []string {
	if n-1 < len(attemptValues) {
		return attemptValues[n-1]
	}
	return []string{strconv.Itoa(n)}
}

// Hosts returns the guards of every destination host the transport holds,
// by host (lower-cased): read a host's breaker state with
// Breaker.Snapshot, its budget's window with the Stats method of a
// *budget.Budget. It is safe to call at any time; the map is the caller's.
func (t *Transport) Hosts() map[string]retry.Guards {
	t.ready()
	hs := t.hosts.all()
	out := make(map[string]retry.Guards, len(hs))
	for _, h := range hs {
		out[h.Name] = h.Guards
	}
	return out
}

// RoundTrip sends req, retrying as the package documentation describes, and
// returns the response of the last attempt, or an error if it has none.
//
// When it gives up on a retryable status it returns that last response
// with a nil error, marked with [wire.GiveUpHeader]; the bodies of earlier
// failed attempts are drained (up to 64 KiB, for at most 50 ms) and closed.
// When it gives up without a response, errors.As finds a [*retry.Error] in
// the error saying why it stopped (errors.Is with retry.AttemptsExhausted,
// retry.Deadline, retry.CircuitOpen, ...) and wrapping the cause (the error
// is a wrapper when the transport made the request's key, so that
// [IdempotencyKey] can read it back). With [WithFallback], a
// request the host's failure defeated gets the fallback's answer instead.
// RoundTrip never modifies req and always closes its body. It is safe for
// concurrent use.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.ready()
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
	c := call{t: t, req: req, src: req, dest: h}
	if t.hedges != nil { // no hedging state to look up without WithHedging
		c.hh, c.hedged = t.hedgeState(req, h.Name)
	}
	return c.run(h)
}

// call is the state of one RoundTrip.
type call struct {
	t   *Transport
	req *http.Request // the caller's request, never modified
	src *http.Request // what attempts copy: req, or the request refresh returned

	key        []string // Idempotency-Key value made by the transport; nil if none
	hasKey     bool     // the request carries a key, its own or the transport's (set for a method that is not idempotent; see keyed)
	idempotent bool     // the method is idempotent: a 500 may be retried once
	retryable  bool     // failures may be retried at all
	replayable bool     // the body can be sent again

	data   []byte        // buffered body (WithBufferBodies); nil if none
	once   io.ReadCloser // body to send once; nil if none
	owned  io.Closer     // the caller's body while no attempt took it over
	sends  int           // requests handed to the base transport
	extra  int           // hedges sent: the wire numbers run this far ahead of the loop's
	dest   *host
	hh     *hedgeHost // the host's hedging state (its push-back, its latencies); nil: no hedging
	hedged bool       // the request may be hedged (hh is not nil)

	got500    bool
	refreshed bool

	next      io.ReadCloser      // the next send's body, got from GetBody when the last attempt failed (see rewind)
	cur       *http.Response     // the last attempt's response, until given back or discarded
	curCancel context.CancelFunc // its attempt context's cancel; nil if none
	cancel    context.CancelFunc // the call context's cancel; nil if none
}

func (c *call) run(h *host) (*http.Response, error) {
	req, cfg := c.req, &c.t.cfg
	c.idempotent = idempotentMethod(req.Method)
	if !c.idempotent { // an idempotent request's key matters only at a 409 (see keyed)
		c.hasKey = requestKey(req.Header) != ""
		if !c.hasKey && cfg.autoKey {
			c.key = []string{idempotency.NewKey()}
			c.hasKey = true
		}
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
	c.retryable = (c.idempotent || c.hasKey) && c.replayable

	ctx := req.Context()
	if cfg.timeout > 0 {
		ctx, c.cancel = context.WithTimeout(ctx, cfg.timeout)
	}
	sc := c.t.stale // nil without WithStaleCache: none of its work is done
	if sc != nil {
		if sr := c.staleAtOnce(h); sr != nil {
			return sr, nil
		}
	}
	resp, err := retry.DoValue(ctx, h.Policy, c.attempt)
	re, _ := err.(*retry.Error)
	var stale *http.Response
	if sc != nil && err != nil {
		stale = sc.serve(c.src, c.req, re, resp) // the stale cache's answer to a give-up, if any: for the request sent (after a refresh, with its credentials)
	}
	if resp != nil && resp == c.cur {
		switch {
		case err == nil:
			resp = c.giveBack(resp, nil)
			if sc != nil {
				// The request that was sent: after a refresh, one with the
				// credentials the refresh added, which decide whether and
				// under what the answer is kept.
				resp = sc.keep(c.src, resp)
			}
			return resp, nil
		case re != nil && re.Reason != retry.Canceled && stale == nil:
			if cfg.fallback == nil || !fallsBack(re.Reason) {
				return c.giveBack(resp, re), nil
			}
		}
	}
	c.discardCur()
	if c.owned != nil {
		_ = c.owned.Close()
	}
	if c.next != nil {
		_ = c.next.Close()
	}
	if c.cancel != nil {
		c.cancel()
	}
	if stale != nil {
		return stale, nil
	}
	if re != nil && cfg.fallback != nil && fallsBack(re.Reason) {
		return c.fallback(req, re)
	}
	if c.key != nil {
		return nil, &keyError{err: err, key: c.key[0]}
	}
	return nil, err
}

// fallback returns WithFallback's answer to the give-up re: exactly one
// of a response and an error, as a RoundTripper must (a response that
// comes with an error is closed, and neither is an error); an error
// carries the key the transport made ([IdempotencyKey]).
func (c *call) fallback(req *http.Request, re *retry.Error) (*http.Response, error) {
	if c.key != nil {
		// The fallback gets the request as it was sent, with the key the
		// transport made, and so does a response of its that names no
		// request or the caller's: IdempotencyKey finds the key there.
		keyed := req.Clone(req.Context())
		if keyed.Header == nil { // a request made by hand may have none
			keyed.Header = make(http.Header, 1)
		}
		keyed.Header[idempotency.Header] = []string{c.key[0]}
		resp, err := c.t.cfg.fallback(keyed, re)
		if resp != nil && (resp.Request == nil || resp.Request == req) {
			resp.Request = keyed
		}
		return c.fallbackAnswer(resp, err, re)
	}
	resp, err := c.t.cfg.fallback(req, re)
	return c.fallbackAnswer(resp, err, re)
}

// fallbackAnswer makes the fallback's resp and err exactly one of a
// response and an error, an error carrying the key the transport made.
func (c *call) fallbackAnswer(resp *http.Response, err error, re *retry.Error) (*http.Response, error) {
	switch {
	case resp != nil && err != nil:
		if resp.Body != nil {
			_ = resp.Body.Close()
		}
		resp = nil
	case resp == nil && err == nil:
		err = fmt.Errorf("httpretry: the fallback returned neither a response nor an error after: %w", re)
	}
	if err != nil && c.key != nil {
		err = &keyError{err: err, key: c.key[0]}
	}
	return resp, err
}

// giveBack hands resp, the last attempt's response, to the caller: marked
// with wire.GiveUpHeader if the transport gave up on it (re not nil), and with
// a body that releases the contexts made for the call when closed.
func (c *call) giveBack(resp *http.Response, re *retry.Error) *http.Response {
	c.cur = nil
	if c.owned != nil {
		_ = c.owned.Close()
	}
	if c.next != nil {
		_ = c.next.Close() // the body got for a next attempt that will not be sent
		c.next = nil
	}
	if re != nil {
		if resp.Header == nil {
			resp.Header = make(http.Header)
		}
		resp.Header[wire.GiveUpHeader] = []string{giveUpValue(re)}
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
			discardBody(c.cur.Body)
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
	var resp *http.Response
	var err error
	if c.hedged { // a request the host's hedging may race
		resp, err = c.first(ctx, n)
	} else {
		resp, err = c.send(ctx, n)
	}
	if err != nil {
		return nil, c.sendError(err)
	}
	if resp.StatusCode == http.StatusUnauthorized && c.t.cfg.refresh != nil && !c.refreshed && c.replayable {
		if resp, err = c.refreshAndResend(ctx, n, resp); err != nil {
			return nil, err
		}
	}
	code := resp.StatusCode
	// A 409 with a Retry-After for a keyed request: the key's first
	// request is still running (idempotency middleware); ask again after.
	failed := isRetryableStatus(code) || code == http.StatusInternalServerError
	var hint time.Duration
	var hasHint bool
	if v := resp.Header["Retry-After"]; len(v) > 0 && (failed || code == http.StatusConflict) {
		hint, hasHint = ParseRetryAfter(v[0], time.Now())
	}
	inProgress := code == http.StatusConflict && hasHint && c.keyed()
	if !failed && !inProgress {
		return resp, nil // success, or a failure that is the caller's business
	}
	// No hedge to a host that pushes back: a 429 or 503, or a failure
	// with a Retry-After or a don't-retry mark; not an in-progress 409
	// (the key's first request still runs: no load).
	if c.hh != nil && !inProgress {
		c.hh.pushback(code, hint, resp.Header)
	}
	capacityHint(c.dest, code, resp.Header)
	// The attempt's answer, for the loop: the status, and its Retry-After
	// (the loop's floor on the next sleep), on every failure it may retry.
	se := &StatusError{Code: code, After: hint}
	detachBody(ctx, resp)
	switch {
	case !c.retryable:
		return resp, retry.Permanent(se)
	case code == http.StatusInternalServerError:
		// At most one retry, and only for an idempotent method.
		again := c.idempotent && !c.got500
		c.got500 = true
		if !again {
			return resp, retry.Permanent(se)
		}
	}
	if dontRetry(resp.Header) {
		// The layer below said not to retry, or already retried and
		// gave up (a Transport under this one, or a handler that copied
		// its dependency's give-up): one layer retries.
		return resp, retry.Permanent(se)
	}
	if rerr := c.rewind(); rerr != nil {
		// The call ends with this answer, handed back as any give-up's
		// (the caller gets the host's 503, not an error of ours).
		return resp, retry.Permanent(rewindError(se, rerr))
	}
	return resp, se
}

// sendError marks err, a send that got no response, Permanent if the
// request is not safe to repeat or its body cannot be rewound: the breaker
// still counts it as the classifier judges it.
func (c *call) sendError(err error) error {
	if !c.retryable {
		return retry.Permanent(err)
	}
	if rerr := c.rewind(); rerr != nil {
		return retry.Permanent(rewindError(err, rerr))
	}
	return err
}

// send makes one request to the base transport and records the response as
// the current one. The first attempt of a request that needs nothing added
// (no key of the transport's, no context of its own, no buffered body) is
// the caller's request itself: no copy, no header map.
func (c *call) send(ctx context.Context, n int) (*http.Response, error) {
	cfg := &c.t.cfg
	// The caller's request can go as it is when this is its first send,
	// with its own body, header and context (the attempt runs on the
	// request's context unless the transport or a tagging observer made
	// one).
	// A copy (any attempt but an unchanged first one) also tells the server
	// that it is the breaker's probe (wire.ProbeHeader) and how long its
	// caller waits (wire.TimeoutHeader). The first attempt of a plain
	// request goes as it is, so that a successful one costs no allocation:
	// an original needs no probe mark, and its deadline is the call's own.
	asIs := n == 1 && c.sends == 0 && c.src == c.req && c.key == nil && c.data == nil && c.once == nil &&
		cfg.attemptTimeout == 0 && ctx == c.req.Context() && !callerMarks(c.req.Header)
	b, err := c.body()
	if err != nil {
		return nil, retry.Permanent(callerError{fmt.Errorf("httpretry: rewind request body: %w", err)})
	}
	var cancel context.CancelFunc
	if d := cfg.attemptTimeout; d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	r := c.req
	if !asIs {
		r = c.src.WithContext(ctx) // the shallow copy this attempt may change
		r.Header = c.header(n + c.extra)
		if retry.IsProbe(ctx) { // the header has no probe mark of src's (attemptHeader)
			r.Header[wire.ProbeHeader] = probeValue
		}
		if dl, ok := ctx.Deadline(); ok {
			r.Header[wire.TimeoutHeader] = c.t.timeouts.get(time.Until(dl))
		}
		r.Body = b
		if data := c.data; data != nil {
			r.GetBody = func() (io.ReadCloser, error) { return bytesBody(data), nil }
		}
	}
	c.sends++
	var resp *http.Response
	if c.t.httpObs == nil { // roundTrip without an observer, written out: one call less per send
		if resp, err = c.t.base.RoundTrip(r); err != nil || resp == nil {
			resp, err = nil, baseResult(resp, err)
		}
	} else {
		resp, err = c.t.observedRoundTrip(r)
	}
	if err != nil {
		if cancel != nil {
			cancel()
		}
		return nil, err
	}
	c.cur, c.curCancel = resp, cancel
	return resp, nil
}

// baseResult is the error of a base RoundTripper's answer that is not a
// response: its error (a response sent beside it, which breaks the
// RoundTripper contract, is closed and dropped, as net/http's Client does),
// or, for a nil response with a nil error, an error saying so, marked
// Permanent: the base transport is broken, and sending again would not
// help.
func baseResult(resp *http.Response, err error) error {
	if err != nil {
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		return err
	}
	return retry.Permanent(errNilResponse)
}

// errNilResponse is the error of a base RoundTripper that returned neither
// a response nor an error.
var errNilResponse = errors.New("httpretry: base RoundTripper returned a nil *Response with a nil error")

// header returns the header of attempt n: the source request's fields
// (their values shared, never modified) but its attempt number and probe
// mark, the attempt number from the second attempt on, and the transport's
// idempotency key, if any.
func (c *call) header(n int) http.Header {
	return attemptHeader(c.src.Header, c.key, n)
}
