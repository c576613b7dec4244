package httpretry

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/stormguard/stormguard/observe"
)

// httpObserver is an observer that records each HTTP request the transport
// sends (see [WithObserver]).
type httpObserver interface {
	ObserveHTTP(req *http.Request, resp *http.Response, err error, elapsed time.Duration)
}

// roundTrip sends r through the base transport and returns its response,
// or the error of an answer that is not one (see baseResult). An observer
// of HTTP requests sees each, with the time it took.
func (t *Transport) roundTrip(r *http.Request) (*http.Response, error) {
	if t.httpObs != nil {
		return t.observedRoundTrip(r)
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp == nil {
		return nil, baseResult(resp, err)
	}
	return resp, nil
}

// observedRoundTrip is roundTrip with an observer of HTTP requests.
func (t *Transport) observedRoundTrip(r *http.Request) (*http.Response, error) {
	h := t.httpObs
	start := time.Now()
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp == nil {
		err = baseResult(resp, err)
		h.ObserveHTTP(r, nil, err, time.Since(start))
		return nil, err
	}
	h.ObserveHTTP(r, resp, nil, time.Since(start))
	return resp, nil
}

// hedgeStart reports the start of hedge num to dest to o and returns its
// context (tagged by the observer, if it tags).
func hedgeStart(o observe.Observer, dest *host, ctx context.Context, num int) context.Context {
	e := observe.Event{Kind: observe.AttemptStart, Name: dest.Name, Attempt: num, Hedge: true}
	if tg, ok := o.(interface {
		TagAttempt(context.Context, observe.Event) context.Context
	}); ok {
		return tg.TagAttempt(ctx, e)
	}
	o.Observe(ctx, e)
	return ctx
}

// hedgeEnd reports the end of hedge num to dest to o; parent is the
// attempt's context, ctx the hedge's own. lost: its answer was good but
// another copy had won the race. A hedge that failed because the race
// canceled it or its call's context ended is "canceled"; one that failed
// on its own attempt timeout is a "failure", as a first copy that did.
func hedgeEnd(o observe.Observer, dest *host, parent, ctx context.Context, num int, resp *http.Response, err error, t0 time.Time, lost bool) {
	e := observe.Event{Kind: observe.AttemptEnd, Name: dest.Name, Attempt: num, Hedge: true, Elapsed: time.Since(t0), Err: err}
	switch {
	case lost || !good(resp, err) && (parent.Err() != nil || errors.Is(ctx.Err(), context.Canceled)):
		e.Outcome = "canceled"
	case good(resp, err):
		e.Outcome = "success"
	default: // an error, a retryable status, a 500, a 409 with Retry-After (a keyed copy in progress)
		e.Outcome = "failure"
		if err == nil {
			e.Err = &StatusError{Code: resp.StatusCode}
		}
	}
	o.Observe(ctx, e)
}
