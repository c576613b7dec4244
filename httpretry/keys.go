package httpretry

import (
	"errors"
	"net/http"
	"strings"

	"github.com/stormguard/stormguard/idempotency"
)

// idempotentMethod reports whether method is idempotent per RFC 9110: GET,
// HEAD, OPTIONS, TRACE, PUT, DELETE ("" means GET).
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// requestKey returns the idempotency key h carries (in the draft's field or
// the older X- form, under any spelling of its name), "" if none: an empty
// or blank value is not a key.
func requestKey(h http.Header) string {
	for _, name := range [...]string{idempotency.Header, "X-Idempotency-Key"} {
		if vs := fieldValues(h, name); len(vs) > 0 {
			if v := strings.TrimSpace(vs[0]); v != "" {
				return v
			}
		}
	}
	return ""
}

// keyed reports whether the request carries an idempotency key, its own or
// the transport's. run reads the header only for a method that is not
// idempotent (whether a failure may be retried depends on it); an
// idempotent request's key matters only for an in-progress 409, and is read
// here, off the success path.
func (c *call) keyed() bool {
	return c.hasKey || c.idempotent && requestKey(c.req.Header) != ""
}

// keyError is a RoundTrip error of a request whose idempotency key the
// transport made: [IdempotencyKey] reads the key back.
type keyError struct {
	err error
	key string
}

func (e *keyError) Error() string { return e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// IdempotencyKey returns the idempotency key a request was sent with, from
// what its RoundTrip (or [http.Client.Do]) returned: the key of resp's request, or
// the key the transport made for a request that ended in err
// ([WithAutoIdempotencyKey]). It returns "" if there is none, and for a
// response whose Request field the base transport left nil (net/http's
// sets it). A caller that
// must know a key before the request is sent sets the Idempotency-Key
// header itself (see idempotency.NewKey).
func IdempotencyKey(resp *http.Response, err error) string {
	if resp != nil && resp.Request != nil {
		if k := requestKey(resp.Request.Header); k != "" {
			return k
		}
	}
	var ke *keyError
	if errors.As(err, &ke) {
		return ke.key
	}
	return ""
}
