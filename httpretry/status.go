package httpretry

import (
	"strconv"
	"time"
)

// StatusError is an attempt's failure status as the retry loop sees it: the
// status code and the server's hint. The [Transport] builds one for every
// retryable status it gets; it is exported for code that runs the retry
// loop itself around HTTP calls (retry.WithClassifier([IsRetryable])). The
// zero value is a status-less error that is not retryable.
type StatusError struct {
	// Code is the status code, e.g. 503.
	Code int
	// After is the server's Retry-After hint; 0 means none.
	After time.Duration
}

// Error returns "HTTP 503", with " (retry after 1.5s)" when After is set.
func (e *StatusError) Error() string {
	s := "HTTP " + strconv.Itoa(e.Code)
	if e.After > 0 {
		s += " (retry after " + e.After.String() + ")"
	}
	return s
}

// StatusCode returns e.Code.
func (e *StatusError) StatusCode() int { return e.Code }

// RetryAfter returns e.After: a floor on the next sleep of the retry loop.
func (e *StatusError) RetryAfter() time.Duration { return e.After }

// isRetryableStatus reports whether an HTTP status code is worth retrying:
// 408 Request Timeout, 429 Too Many Requests, 502 Bad Gateway, 503 Service
// Unavailable and 504 Gateway Timeout. (The [Transport] also retries a 500
// once for an idempotent method, and a 409 that says the request's key is
// still in progress.) [IsRetryable] answers the same for an error that
// carries the code.
func isRetryableStatus(code int) bool {
	switch code {
	case 408, 429, 502, 503, 504:
		return true
	}
	return false
}
