package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Get returns a [Call] that sends GET url with client and succeeds on a
// 2xx answer. It reads and closes the body.
func Get(client *http.Client, url string) Call {
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		return Do(client, req)
	}
}

// Do sends req with client and returns nil for a 2xx answer, an error
// otherwise. It reads (up to 1 MiB) and closes the body.
func Do(client *http.Client, req *http.Request) error {
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return &StatusError{Method: req.Method, URL: req.URL.String(), Code: resp.StatusCode,
			RetryAfter: resp.Header.Get("Retry-After"), Header: resp.Header.Clone()}
	}
	return nil
}

// StatusError is a non-2xx answer to a [Call]'s request.
type StatusError struct {
	Method, URL string
	// Code is the status code; RetryAfter the Retry-After header, if any.
	Code       int
	RetryAfter string
	// Header is the response's header (a copy), for what a client under
	// test wrote into it.
	Header http.Header
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("live: %s %s: %d %s", e.Method, e.URL, e.Code, http.StatusText(e.Code))
}

// Counter is an [http.RoundTripper] that counts the requests it passes on
// to Base (nil: http.DefaultTransport): the attempts a client sent, to set
// against what the provider counted. It is safe for concurrent use.
type Counter struct {
	Base http.RoundTripper
	n    atomic.Int64
}

// RoundTrip counts r and sends it through Base.
func (c *Counter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	base := c.Base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// N returns the number of requests counted.
func (c *Counter) N() int64 { return c.n.Load() }

// PaymentBody is what a payment request sends.
const PaymentBody = `{"amount":1250,"currency":"IDR"}`

// NewPayment returns a payment: a POST of [PaymentBody] to url with
// Idempotency-Key key, whose body can be sent again (GetBody is set).
func NewPayment(ctx context.Context, url, key string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(PaymentBody))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	return req, nil
}

// Keys makes idempotency keys that are unique across runs: a random
// prefix and a counter. It is safe for concurrent use; the zero value is
// not usable (use [NewKeys]).
type Keys struct {
	prefix string
	n      atomic.Uint64
}

// NewKeys returns a new key source.
func NewKeys() *Keys {
	var b [8]byte
	rand.Read(b[:])
	return &Keys{prefix: hex.EncodeToString(b[:]) + "-"}
}

// Next returns a key not returned before.
func (k *Keys) Next() string { return k.prefix + strconv.FormatUint(k.n.Add(1), 10) }

// Payment returns a [Call] that makes one payment through client (whose
// transport does whatever retrying it does): a new key from keys, one
// client.Do of [NewPayment].
func Payment(client *http.Client, url string, keys *Keys) Call {
	return func(ctx context.Context) error {
		req, err := NewPayment(ctx, url, keys.Next())
		if err != nil {
			return err
		}
		return Do(client, req)
	}
}

// Loop returns a [Call] of a hand-rolled retry loop as many real clients
// have it: for each call, begin(ctx) returns the call's attempt (so that
// every attempt of one call can share state, such as an idempotency key);
// it runs, and on any failure the loop waits exactly every and runs it
// again, ignoring Retry-After, up to attempts tries in all (0: until ctx
// ends).
func Loop(begin func() func(ctx context.Context) error, every time.Duration, attempts int) Call {
	return func(ctx context.Context) error {
		attempt := begin()
		var err error
		for i := 0; attempts <= 0 || i < attempts; i++ {
			if i > 0 {
				t := time.NewTimer(every)
				select {
				case <-ctx.Done():
					t.Stop()
					return errors.Join(err, ctx.Err())
				case <-t.C:
				}
			}
			if err = attempt(ctx); err == nil {
				return nil
			}
			if ctx.Err() != nil {
				// The call ended during the attempt (or as the wait ended,
				// when the timer and the end come together): say so, with
				// what the attempt said.
				return errors.Join(err, ctx.Err())
			}
		}
		return err
	}
}

// Naive returns the [Call] of a hand-rolled retry loop as many real clients
// have it: GET url, and on any failure wait exactly every and try again, up
// to attempts tries in all, ignoring Retry-After. It is the thundering herd
// the demo compares against.
func Naive(client *http.Client, url string, every time.Duration, attempts int) Call {
	get := Get(client, url)
	return Loop(func() func(context.Context) error { return get }, every, attempts)
}
