package httpretry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/stormguard/stormguard/retry"
)

// IsRetryable is the HTTP classifier, for a retry loop around HTTP calls
// (retry.WithClassifier(httpretry.IsRetryable)). A give-up of a retry loop
// below ([*retry.Error], [retry.Reason]) is not retryable (one layer
// retries). An error carrying a status code (a StatusCode() int method,
// like [*StatusError]) is retryable if the code is 408, 429, 502, 503 or
// 504, whatever else it carries (a 404 is never retried, even with a
// Retry-After): IsRetryable(&StatusError{Code: code}) says whether a
// status code is worth retrying. Any other failure of a round trip
// that got no response is retryable, whatever its wording (a reset, a
// connection the pool closed under the request, a stream the server
// reset, a server that hung up before answering): the error
// [http.Client.Do] returns for one (a *url.Error), or a failure
// [retry.IsRetryable] knows, io.EOF or a *net.OpError; except the
// caller's cancel, a DNS "no such host", a TLS certificate error or a
// server that does not speak TLS, a malformed URL, and a request that
// net/http refuses to send as it is (a bad method, header, host or body
// length; the redirect limit). An error of another kind (a body that does
// not decode) is not retryable. Like every classifier, it is asked about
// errors without a retry.Permanent mark: the loop stops on a marked error
// itself.
func IsRetryable(err error) bool {
	if err == nil || gaveUp(err) {
		return false
	}
	var sc interface{ StatusCode() int }
	if errors.As(err, &sc) && sc.StatusCode() > 0 {
		return isRetryableStatus(sc.StatusCode())
	}
	if retry.IsRetryable(err) {
		return true
	}
	var ue *url.Error
	var op *net.OpError
	roundTrip := errors.As(err, &ue) && ue.Op != "parse" || errors.Is(err, io.EOF) || errors.As(err, &op)
	return roundTrip && sendFailure(err)
}

// classify is the transport's classifier. The op returns a *StatusError
// only for a status it may retry (anything else is marked Permanent), and
// any other error it returns (but a callerError) is what the base
// RoundTripper returned without a response.
func classify(err error) bool {
	if _, ok := err.(*StatusError); ok {
		return true
	}
	if errors.As(err, new(callerError)) {
		// The caller's side failed (a refresh of credentials whose server
		// refused the connection, say): not the host's failure, whatever
		// it wraps; the breaker judges it so too.
		return false
	}
	return retry.IsRetryable(err) || sendFailure(err)
}

// gaveUp reports whether err is the give-up of a retry loop.
func gaveUp(err error) bool {
	var re *retry.Error
	var r retry.Reason
	return errors.As(err, &re) || errors.As(err, &r)
}

// callerError is a failure of the request on the caller's side, before
// any send: a body that could not be rewound, credentials that could not
// be refreshed. It is not the host's failure, and never retried.
type callerError struct{ error }

func (e callerError) Unwrap() error { return e.error }

// sendFailure reports whether err, which a round trip returned without a
// response, is worth another attempt of a request that is safe to send
// again. The request may not have reached the host, or its answer was
// lost on the way back: whatever net/http or a base transport calls it,
// the error is retryable, but for the failures no retry can mend, which
// are recognized by type where net/http exports one, and otherwise by the
// fixed wording of net/http's checks of a request before it is sent.
func sendFailure(err error) bool {
	if gaveUp(err) || errors.Is(err, context.Canceled) || errors.As(err, new(callerError)) {
		return false
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		// Only "no such host" is an answer no retry mends; a server that
		// failed or did not answer (SERVFAIL, REFUSED, no answer) may do
		// better next time.
		return !dns.IsNotFound || dns.IsTimeout || dns.IsTemporary
	}
	var cert *tls.CertificateVerificationError
	var record tls.RecordHeaderError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &cert) || errors.As(err, &record) || errors.As(err, &unknownAuthority) ||
		errors.As(err, &hostname) || errors.As(err, &invalid) || errors.Is(err, http.ErrSchemeMismatch) {
		return false
	}
	var escape url.EscapeError
	var host url.InvalidHostError
	var ue *url.Error
	if errors.As(err, &escape) || errors.As(err, &host) || errors.As(err, &ue) && ue.Op == "parse" {
		return false
	}
	return !refused(err)
}

// refusals are the beginnings of the errors net/http returns for a request
// it will not send as it is (the same request would fail the same way) and
// for a request canceled through its Cancel channel, as net/http's
// transport.go, request.go, transfer.go and client.go spell them; they
// have no exported type. TestTransportErrors makes each of them through a
// real http.Transport, so a change of wording shows there.
var refusals = [...]string{
	"http: nil Request.",                      // URL, Header
	"unsupported protocol scheme",             // a scheme the transport has no protocol for
	"http: no Host in request URL",            //
	"net/http: invalid method",                //
	"net/http: invalid header",                // a field name or value
	"net/http: invalid trailer",               //
	"http: invalid Host header",               //
	"net/http: can't write control character", // in the URL
	"http: Request.ContentLength=",            // with a nil Body
	"http: ContentLength=",                    // with a Body of another length
	"net/http: cannot rewind body",            // GetBody failed after a connection loss
	"net/http: Transport.Dial",                // a Dial or DialTLS hook that returned (nil, nil)
	"http: Transport does not support",        // unencrypted HTTP/2 on a transport not set for it
	"stopped after",                           // http.Client's redirect limit
	"net/http: request canceled",              // the request's Cancel channel
}

// refused reports whether an error along err's Unwrap chain begins with
// one of the refusals.
func refused(err error) bool {
	for err != nil {
		msg := err.Error()
		for _, r := range refusals {
			if strings.HasPrefix(msg, r) {
				return true
			}
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if refused(e) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
