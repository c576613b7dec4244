// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package httpretry_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

type ratkRT func(*http.Request) (*http.Response, error)

func (f ratkRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func ratkResp(r *http.Request, code int, h http.Header) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader("")), Request: r, ProtoMajor: 1, ProtoMinor: 1}
}

// Push-backs to a write and hedging of the host's GETs. The doc lists what
// holds hedges: "a 429 or a 503, or any failed answer, a 408, 500, 502 or
// 504, with a Retry-After or a don't-retry mark".
func TestReattackHedgePushback(t *testing.T) {
	cases := []struct {
		name     string
		method   string
		key      bool
		code     int
		h        http.Header
		wantHeld bool
	}{
		{"none", "", false, 0, nil, false},
		{"503 to POST", http.MethodPost, false, 503, nil, true},
		{"429 to PUT", http.MethodPut, false, 429, nil, true},
		{"500 dont-retry to POST", http.MethodPost, false, 500, http.Header{"Stormguard-Retry": {"no"}}, true},
		{"502 plain to POST", http.MethodPost, false, 502, nil, false},
		{"409 in progress to keyed POST", http.MethodPost, true, 409, http.Header{"Retry-After": {"2"}}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var gets atomic.Int32
				base := ratkRT(func(r *http.Request) (*http.Response, error) {
					if r.Method == http.MethodGet {
						gets.Add(1)
						select {
						case <-time.After(time.Second):
						case <-r.Context().Done():
							return nil, r.Context().Err()
						}
						return ratkResp(r, 200, nil), nil
					}
					if r.Body != nil {
						io.Copy(io.Discard, r.Body)
					}
					return ratkResp(r, c.code, c.h.Clone()), nil
				})
				tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1),
					httpretry.WithRetry(retry.WithMaxAttempts(1)), httpretry.WithLimit(nil))
				if err != nil {
					t.Fatal(err)
				}
				if c.method != "" {
					req, _ := http.NewRequest(c.method, "http://h.example/w", strings.NewReader("x"))
					if c.key {
						req.Header.Set("Idempotency-Key", "k")
					}
					resp, err := tr.RoundTrip(req)
					if err == nil {
						resp.Body.Close()
					}
				}
				req, _ := http.NewRequest(http.MethodGet, "http://h.example/r", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				held := gets.Load() == 1
				if held != c.wantHeld {
					t.Errorf("GETs sent %d: held %v, want held %v", gets.Load(), held, c.wantHeld)
				}
			})
		})
	}
}
