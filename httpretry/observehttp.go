package httpretry

import (
	"net/http"
	"time"
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
