package httpretry

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
)

// The 401 refresh (WithRefreshOn401): the hook and the one resend, within
// the attempt that got the 401.

// refreshAndResend handles the 401 resp to attempt n: it calls the
// refresh hook once per RoundTrip and sends the refreshed request once more,
// as part of the same attempt (see WithRefreshOn401). It returns the
// attempt's answer: the resend's, or resp if the hook returned no request.
func (c *call) refreshAndResend(ctx context.Context, n int, resp *http.Response) (*http.Response, error) {
	c.refreshed = true
	// The refresh and the resend are part of the attempt: they end
	// with the attempt's time (its timeout's deadline, on the request
	// that got the 401), not with a new one.
	actx, stop := c.attemptRest(ctx, resp)
	nr, err := c.refresh(actx)
	if err != nil || nr == nil {
		if stop != nil {
			stop()
		}
		if err != nil {
			return nil, retry.Permanent(callerError{err})
		}
	}
	if nr != nil {
		c.discardCur()
		if c.hasKey && c.key == nil && requestKey(nr.Header) == "" {
			// The caller's key, which the refreshed request left out:
			// it goes on every attempt still (a write sent again
			// without its key would run again).
			c.key = []string{requestKey(c.req.Header)}
		}
		c.src = c.resendRequest(nr)
		resp, err = c.send(actx, n)
		if stop != nil {
			if err != nil {
				stop()
			} else { // released with the response, as the send's own context
				inner := c.curCancel
				c.curCancel = func() {
					if inner != nil {
						inner()
					}
					stop()
				}
			}
		}
		if err != nil {
			return nil, c.sendError(err)
		}
	}
	return resp, nil
}

// resendRequest returns the request the resend after a refresh is made
// from: nr, the hook's answer, with the caller's body framing when nr is a
// request of the hook's own (its ContentLength, TransferEncoding and
// GetBody: the caller's body is the one replayed, see WithRefreshOn401).
// A body nr carries is not sent: it is closed.
func (c *call) resendRequest(nr *http.Request) *http.Request {
	if nr.Body != nil && nr.Body != http.NoBody && nr.Body != c.req.Body {
		_ = nr.Body.Close()
	}
	cp := *nr
	cp.Body, cp.ContentLength, cp.TransferEncoding, cp.GetBody = c.req.Body, c.req.ContentLength, c.req.TransferEncoding, c.req.GetBody
	return &cp
}

// attemptRest returns the context of the rest of an attempt whose request
// got resp (a 401 to refresh): ctx bounded by the attempt timeout's
// deadline on that request, with the function that releases it; ctx and
// nil without an attempt timeout.
func (c *call) attemptRest(ctx context.Context, resp *http.Response) (context.Context, context.CancelFunc) {
	if c.t.cfg.attemptTimeout > 0 && resp.Request != nil {
		if dl, ok := resp.Request.Context().Deadline(); ok {
			return context.WithDeadline(ctx, dl)
		}
	}
	return ctx, nil
}

// refresh calls the 401 hook with a copy of the request that got the 401,
// on ctx, the attempt's context.
func (c *call) refresh(ctx context.Context) (*http.Request, error) {
	cp := c.src.Clone(ctx) // the attempt's context: the hook is part of the attempt, bounded by its time
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
	if nr != nil && (nr.URL == nil || !strings.EqualFold(nr.URL.Host, c.src.URL.Host)) {
		// Its sends would count against this host's guards (its budget,
		// breaker and limiter): a refresh keeps the host.
		return nil, fmt.Errorf("httpretry: refresh credentials after 401: the refreshed request goes to another host")
	}
	return nr, nil
}
