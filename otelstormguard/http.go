package otelstormguard

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// ObserveHTTP records one HTTP request, req, that took d and ended with
// resp or, without a response, err, as an HTTP client request by the
// semantic conventions: the histogram http.client.request.duration (see
// the package documentation) and, on the attempt span
// [Observer.TagAttempt] started for it (found in the request's context),
// http.request.method, url.full (credentials and signed query values
// redacted), http.response.status_code, and error.type with the status
// Error for a status from 400 on or a request that got no response.
//
// httpretry calls it for every request it hands its base transport when o
// is given with httpretry.WithObserver: a program does not call it for
// those. It is safe for concurrent use.
func (o *Observer) ObserveHTTP(req *http.Request, resp *http.Response, err error, d time.Duration) {
	if (!o.metrics && !o.traces) || req == nil || req.URL == nil {
		return
	}
	o.httpRequest(req, resp, err, d)
}

// httpRequest records one HTTP request that took d and ended with resp or
// err.
func (o *Observer) httpRequest(req *http.Request, resp *http.Response, err error, d time.Duration) {
	ctx := req.Context()
	status := 0
	if err == nil && resp != nil {
		status = resp.StatusCode
	}
	errType := ""
	if err != nil {
		errType = errorType(err)
	}
	method, known := o.httpMethod(req.Method)
	if o.metrics {
		dep := o.deps.get(strings.ToLower(req.URL.Host)) // no allocation when already lower case
		port := urlPort(req.URL)
		if dep == o.deps.other {
			port = 0 // "_OTHER" has no port: one series per port would be unbounded again
		}
		a := dep.get(labels{kind: kindHTTP, n: status, port: port, a: method, b: errType})
		o.httpDuration.Record(ctx, d.Seconds(), a.rec...)
	}
	if !o.traces {
		return
	}
	tag, ok := attemptSpan(ctx)
	if !ok || !tag.span.IsRecording() {
		return // not an attempt span of this observer's
	}
	span := tag.span
	span.SetAttributes(semconv.HTTPRequestMethodKey.String(method), semconv.URLFullKey.String(redactedURL(req.URL)))
	if port := urlPort(req.URL); port > 0 {
		span.SetAttributes(semconv.ServerPortKey.Int(port))
	}
	if !known {
		orig := req.Method
		if orig == "" {
			orig = http.MethodGet // net/http sends "" as GET
		}
		span.SetAttributes(semconv.HTTPRequestMethodOriginalKey.String(orig))
	}
	if status > 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCodeKey.Int(status))
	}
	// The span's error is its last request's, set when the attempt ends
	// (an attempt may send twice: a 401, then the refreshed request's 200).
	// Canceled: the request's error says so, or its context does (a race's
	// loser whose answer was on its way when the race canceled it).
	et, msg := httpErrorType(status, errType), ""
	canceled := errors.Is(err, context.Canceled) || errors.Is(req.Context().Err(), context.Canceled)
	switch {
	case err != nil:
		msg = err.Error()
	case et != "":
		msg = "HTTP " + et
	}
	tag.mu.Lock()
	tag.errType, tag.errMsg, tag.canceled = et, msg, canceled
	tag.mu.Unlock()
}

// httpErrorType is the error.type of an HTTP request that ended with
// status (0: none) and, without a response, an error of type errType: the
// status code from 400 on (as the semantic conventions ask of a client),
// errType for a request that got no response, "" for a success.
func httpErrorType(status int, errType string) string {
	switch {
	case errType != "":
		return errType
	case status >= 400:
		return strconv.Itoa(status)
	}
	return ""
}

// httpMethod returns the http.request.method of m: one of the methods the
// semantic conventions know ("" is GET), or those of the environment's
// OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS when it names any, or "_OTHER"
// (known false).
func (o *Observer) httpMethod(m string) (method string, known bool) {
	if m == "" {
		m = http.MethodGet // net/http sends "" as GET, known or not as GET is
	}
	if o.knownMethods != nil {
		if o.knownMethods[m] {
			return m, true
		}
		return "_OTHER", false
	}
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch, "QUERY":
		return m, true
	}
	return "_OTHER", false
}

// urlPort returns the server.port of u: its explicit port, else the
// default of its scheme (80 for http, 443 for https), else 0.
func urlPort(u *url.URL) int {
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err == nil && n > 0 && n <= 65535 {
			return n
		}
		return 0
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "ws":
		return 80
	case "https", "wss":
		return 443
	}
	return 0
}

// sensitiveQuery are the query keys whose values url.full redacts, the
// semantic conventions' list (compared case-sensitively, as it asks).
var sensitiveQuery = [...]string{"AWSAccessKeyId", "Signature", "sig", "X-Goog-Signature"}

// redactedURL returns u as url.full: credentials become
// REDACTED:REDACTED and the values of the sensitive query keys REDACTED,
// the rest as it is.
func redactedURL(u *url.URL) string {
	if u.User == nil && !hasSensitiveQuery(u.RawQuery) {
		return u.String()
	}
	c := *u
	if c.User != nil {
		c.User = url.UserPassword("REDACTED", "REDACTED")
	}
	if hasSensitiveQuery(c.RawQuery) {
		parts := strings.Split(c.RawQuery, "&")
		for i, p := range parts {
			k, _, hasValue := strings.Cut(p, "=")
			if key, err := url.QueryUnescape(k); err == nil && hasValue && isSensitive(key) {
				parts[i] = k + "=REDACTED"
			}
		}
		c.RawQuery = strings.Join(parts, "&")
	}
	return c.String()
}

// hasSensitiveQuery reports whether the raw query q may hold a sensitive
// key (a quick check before it is parsed).
func hasSensitiveQuery(q string) bool {
	if q == "" {
		return false
	}
	for _, k := range sensitiveQuery {
		if strings.Contains(q, k) {
			return true
		}
	}
	return strings.Contains(q, "%") // an escaped key may spell one
}

func isSensitive(key string) bool {
	for _, k := range sensitiveQuery {
		if key == k {
			return true
		}
	}
	return false
}
