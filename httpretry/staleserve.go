package httpretry

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/internal/sat"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// staleAtOnce returns the stale cache's answer to a request that meets its
// host's breaker open, with the call's resources released, or nil.
func (c *call) staleAtOnce(h *host) *http.Response {
	if c.t.stale == nil {
		return nil
	}
	sr, re := c.t.stale.serveOpen(c.req, h.Guards.Breaker)
	if sr != nil {
		if c.owned != nil {
			_ = c.owned.Close()
		}
		if c.cancel != nil {
			c.cancel()
		}
		if o := c.t.cfg.observer; o != nil { // a give-up, as the loop reports one
			o.Observe(c.req.Context(), observe.Event{Kind: observe.GiveUp, Name: h.Name, Reason: giveUpTokens[re.Reason], Err: re.Err})
		}
	}
	return sr
}

// serveOpen returns the kept response for req if brk is open (its open
// period not over), as the give-up re of a request the breaker refused, or
// nil: a request the cache can answer does not wait behind the breaker.
func (s *staleCache) serveOpen(req *http.Request, brk *breaker.Breaker) (*http.Response, *retry.Error) {
	if brk == nil || brk.State() != breaker.Open || req.Context().Err() != nil {
		return nil, nil // closed or probing, or the caller has gone
	}
	snap := brk.Snapshot()
	if snap.State != breaker.Open {
		return nil, nil
	}
	re := &retry.Error{Reason: retry.CircuitOpen, Err: &breaker.OpenError{State: breaker.Open, Wait: snap.HalfOpenIn}}
	return s.serve(req, req, re, nil), re
}

// serve returns the kept response for req, the request sent, when the
// transport gave up on it with re (resp is the last attempt's response, if
// any), or nil (always for a nil s: no cache, and a nil re: no give-up).
// The copy's Request is caller, the caller's request (req differs after a
// refresh of its credentials).
func (s *staleCache) serve(req, caller *http.Request, re *retry.Error, resp *http.Response) *http.Response {
	if s == nil || re == nil || re.Reason == retry.Canceled {
		return nil
	}
	if !fallsBack(re.Reason) && (resp == nil || !errorStatus(resp.StatusCode)) {
		return nil
	}
	ri, ok := s.requestInfo(req)
	if !ok {
		return nil
	}
	now := time.Now()
	s.mu.Lock()
	var e *staleEntry
	if g := s.groups[ri.key]; g != nil {
		for i := len(g.entries) - 1; i >= 0; i-- {
			if g.entries[i].matches(ri.cred, ri.h) {
				e = g.entries[i]
				break
			}
		}
	}
	if e == nil {
		s.mu.Unlock()
		return nil
	}
	// Saturating: a Date centuries old makes the age the largest
	// Duration, which must stay the oldest, not wrap to a negative one.
	age := sat.Add(e.initialAge, max(now.Sub(e.received), 0))
	stale := max(age-e.lifetime, 0)
	limit := s.maxStale
	if e.sie >= 0 {
		limit = e.sie
	}
	if ri.cc.staleIfError >= 0 {
		limit = min(limit, seconds(ri.cc.staleIfError))
	}
	if stale > limit {
		s.mu.Unlock()
		return nil
	}
	s.lru.MoveToFront(e.elem)
	s.mu.Unlock()
	// e is immutable once stored: build the copy without the lock.
	out := &http.Response{
		Status: e.statusText, StatusCode: e.status,
		Proto: e.proto, ProtoMajor: e.major, ProtoMinor: e.minor,
		Header: e.header.Clone(), ContentLength: e.length, Uncompressed: e.uncompressed,
		Body: http.NoBody, Request: caller,
	}
	if len(e.body) > 0 && req.Method != http.MethodHead {
		out.Body = io.NopCloser(bytes.NewReader(e.body))
	}
	out.Header["Age"] = []string{strconv.FormatInt(int64(age/time.Second), 10)}
	out.Header[staleHeader] = []string{giveUpValue(re) + ";stale=" + strconv.FormatInt(int64(stale/time.Second), 10)}
	return out
}

// fallsBack reports whether a give-up for reason r gets the fallback: the
// host's failure defeated the request (not the request's own answer, not the
// caller's cancel).
func fallsBack(r retry.Reason) bool {
	switch r {
	case retry.AttemptsExhausted, retry.Deadline, retry.BudgetExhausted, retry.CircuitOpen, retry.Limited:
		return true
	}
	return false
}

// errorStatus reports whether code is one of the errors RFC 5861 serves
// stale content for: 500, 502, 503, 504.
func errorStatus(code int) bool {
	switch code {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}
