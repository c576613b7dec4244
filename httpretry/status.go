package httpretry

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"time"

	"github.com/stormguard/stormguard/retry"
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

// IsRetryableStatus reports whether an HTTP status code is worth retrying:
// 408 Request Timeout, 429 Too Many Requests, 502 Bad Gateway, 503 Service
// Unavailable and 504 Gateway Timeout. (The [Transport] also retries a 500
// once for an idempotent method, and a 409 that says the request's key is
// still in progress.)
func IsRetryableStatus(code int) bool {
	switch code {
	case 408, 429, 502, 503, 504:
		return true
	}
	return false
}

// IsRetryable is the HTTP classifier, for a retry loop around HTTP calls
// (retry.WithClassifier(httpretry.IsRetryable)). A give-up of a retry loop
// below ([*retry.Error], [retry.Reason]) is not retryable (one layer
// retries). An error carrying a status code (a StatusCode() int method,
// like [*StatusError]) is retryable if [IsRetryableStatus] (a 404 is never
// retried, even with a Retry-After); otherwise an error from a round trip
// that got no response is retryable if it is a transport failure (see
// [retry.IsRetryable], plus io.EOF before any response and any network
// operation error), but not a DNS "no such host", a TLS certificate error
// or a malformed request. Like every classifier, it is asked about errors
// without a retry.Permanent mark: the loop stops on a marked error itself.
func IsRetryable(err error) bool {
	var re *retry.Error
	var r retry.Reason
	if errors.As(err, &re) || errors.As(err, &r) {
		return false // a retry loop below gave up: retry at one layer only
	}
	var sc interface{ StatusCode() int }
	if errors.As(err, &sc) && sc.StatusCode() > 0 {
		return IsRetryableStatus(sc.StatusCode())
	}
	if retry.IsRetryable(err) {
		return true
	}
	if err == nil {
		return false
	}
	return transportFailure(err)
}

// transportFailure reports whether err, returned by a RoundTripper without
// a response, is a failure of the network on the way (the request may not
// have been processed) rather than of the request itself.
func transportFailure(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return dns.IsTimeout || dns.IsTemporary
	}
	var cert *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &cert) || errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) {
		return false
	}
	var escape url.EscapeError
	var host url.InvalidHostError
	if errors.As(err, &escape) || errors.As(err, &host) {
		return false
	}
	if errors.Is(err, io.EOF) {
		return true // the connection closed before any response byte
	}
	var op *net.OpError
	return errors.As(err, &op)
}
