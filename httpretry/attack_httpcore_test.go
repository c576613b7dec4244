// Black-box attack on the core retry transport (AREA httpcore): which
// requests and statuses are retried, Retry-After, the wire headers, bodies,
// the 401 refresh, the fallback, guards, cancellation.
package httpretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// hcRT is a RoundTripper of a function.
type hcRT func(*http.Request) (*http.Response, error)

func (f hcRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// hcBody is a response body that records whether it was closed.
type hcBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *hcBody) Close() error { b.closed.Store(true); return nil }

func hcResp(r *http.Request, code int, h http.Header, body string) (*http.Response, *hcBody) {
	if h == nil {
		h = http.Header{}
	}
	b := &hcBody{Reader: strings.NewReader(body)}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: h, Body: b,
		Request: r, ProtoMajor: 1, ProtoMinor: 1, ContentLength: -1}, b
}

func hcBackoff(t *testing.T, rnd float64) *backoff.Backoff {
	t.Helper()
	b, err := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: 100 * time.Millisecond, Cap: time.Second,
		Rand: func() float64 { return rnd }})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func hcTransport(t *testing.T, base http.RoundTripper, opts ...httpretry.Option) *httpretry.Transport {
	t.Helper()
	tr, err := httpretry.NewTransport(base, append([]httpretry.Option{httpretry.WithRetry(retry.WithBackoff(hcBackoff(t, 0.5)))}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// DOC (Transport): "The breaker counts as failures the network errors and
// retryable statuses (...); any other answer is a success (the host
// answered)." A 401 is an answer of the host; a refresh hook whose own
// call (to an auth server) failed with a connection error is not a failure
// of this host (classify.go: callerError "is not the host's failure").
func TestAttackHCRefreshErrorNotHostFailure(t *testing.T) {
	base := hcRT(func(r *http.Request) (*http.Response, error) {
		resp, _ := hcResp(r, http.StatusUnauthorized, nil, "no")
		return resp, nil
	})
	authDown := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	tr := hcTransport(t, base,
		httpretry.WithBreaker(&breaker.Config{MinCalls: 4, FailureRatio: 0.5}),
		httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			return nil, fmt.Errorf("token endpoint: %w", authDown)
		}))
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequest("GET", "http://api.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("refresh error: want an error, got %d", resp.StatusCode)
		}
	}
	// Control: the same 401s with a refresh that returns nil leave the breaker closed.
	ctl := hcTransport(t, base,
		httpretry.WithBreaker(&breaker.Config{MinCalls: 4, FailureRatio: 0.5}),
		httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) { return nil, nil }))
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequest("GET", "http://api.example/", nil)
		resp, err := ctl.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if c := ctl.Hosts()["api.example"].Breaker.Snapshot(); c.State != breaker.Closed || c.Failures != 0 {
		t.Fatalf("control: %+v", c)
	}
	s := tr.Hosts()["api.example"].Breaker.Snapshot()
	if s.State != breaker.Closed || s.Failures != 0 {
		t.Fatalf("host answered 401 six times (the auth server failed): breaker state %v, calls %d, failures %d; want closed with 0 failures",
			s.State, s.Calls, s.Failures)
	}
}

// DOC (retry.Do, used by the transport): "A canceled call is never retried,
// and a cancel during a sleep ends the sleep at once"; WithFallback: "whose
// context was canceled gets no fallback"; failed bodies are closed.
func TestAttackHCCancelDuringSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var bodies []*hcBody
		var mu sync.Mutex
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			h := http.Header{"Retry-After": {"10"}}
			resp, b := hcResp(r, 503, h, "busy")
			mu.Lock()
			bodies = append(bodies, b)
			mu.Unlock()
			return resp, nil
		})
		var fellBack atomic.Bool
		tr := hcTransport(t, base, httpretry.WithFallback(func(*http.Request, *retry.Error) (*http.Response, error) {
			fellBack.Store(true)
			return nil, errors.New("fallback")
		}))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(2*time.Second, cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example/", nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		el := time.Since(start)
		if resp != nil {
			resp.Body.Close()
		}
		if el != 2*time.Second {
			t.Errorf("returned after %v, want at the cancel (2s)", el)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err %v, want context.Canceled", err)
		}
		var re *retry.Error
		if !errors.As(err, &re) || re.Reason != retry.Canceled {
			t.Errorf("err %v: want a *retry.Error with Reason Canceled", err)
		}
		if fellBack.Load() {
			t.Errorf("fallback called for a canceled request")
		}
		mu.Lock()
		defer mu.Unlock()
		if len(bodies) != 1 || !bodies[0].closed.Load() {
			t.Errorf("bodies %d, closed %v: want 1, closed", len(bodies), len(bodies) == 1 && bodies[0].closed.Load())
		}
	})
}

// DOC (WithFallback): "err says why ([retry.Error].Reason), after how many
// attempts, and carries the last failure (with the server's hint ...:
// retry.RetryAfter(err)). The last response, if any, has been drained and
// closed."
func TestAttackHCFallbackGets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var bodies []*hcBody
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			resp, b := hcResp(r, 503, http.Header{"Retry-After": {"2"}}, "busy")
			mu.Lock()
			bodies = append(bodies, b)
			mu.Unlock()
			return resp, nil
		})
		var got *retry.Error
		var closedAtCall bool
		tr := hcTransport(t, base,
			httpretry.WithRetry(retry.WithBackoff(hcBackoff(t, 0))),
			httpretry.WithFallback(func(r *http.Request, err *retry.Error) (*http.Response, error) {
				got = err
				mu.Lock()
				closedAtCall = len(bodies) > 0 && bodies[len(bodies)-1].closed.Load()
				mu.Unlock()
				resp, _ := hcResp(r, 200, nil, "fallback")
				return resp, nil
			}))
		req, _ := http.NewRequest("GET", "http://api.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got == nil {
			t.Fatal("fallback not called")
		}
		if got.Reason != retry.AttemptsExhausted || got.Attempts != 3 {
			t.Errorf("reason %v attempts %d, want attempts-exhausted after 3", got.Reason, got.Attempts)
		}
		if ra := retry.RetryAfter(got); ra != 2*time.Second {
			t.Errorf("RetryAfter(err) = %v, want the server's 2s", ra)
		}
		var se *httpretry.StatusError
		if !errors.As(got, &se) || se.Code != 503 {
			t.Errorf("last failure %v, want a StatusError 503", got.Err)
		}
		if !closedAtCall {
			t.Errorf("last response not closed when the fallback ran")
		}
	})
}

// DOC (retry.WithGuards): "an attempt that ends after the parent context
// has ended (canceled ...) is given back ... and counts neither way".
// Through the transport: a caller's cancel mid-attempt is no failure of the
// host and is not retried.
func TestAttackHCCancelMidAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sends atomic.Int32
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			sends.Add(1)
			<-r.Context().Done()
			return nil, &net.OpError{Op: "read", Net: "tcp", Err: r.Context().Err()}
		})
		tr := hcTransport(t, base, httpretry.WithAttemptTimeout(5*time.Second))
		for i := 0; i < 3; i++ {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(time.Second, cancel)
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example/", nil)
			resp, err := tr.RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err %v, want context.Canceled", err)
			}
		}
		if n := sends.Load(); n != 3 {
			t.Errorf("sends %d, want 3 (a canceled call is never retried)", n)
		}
		s := tr.Hosts()["api.example"].Breaker.Snapshot()
		if s.Failures != 0 {
			t.Errorf("breaker failures %d after 3 caller cancels, want 0", s.Failures)
		}
	})
}

// DOC (doc.go): every attempt with a deadline carries the time it has left,
// Stormguard-Timeout-Ms: "the earlier of the attempt timeout and the
// request's deadline, whole milliseconds". After a sleep, the value is what
// is left then.
func TestAttackHCTimeoutHeaderAfterSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			got = append(got, r.Header.Get(wire.TimeoutHeader)+"|"+r.Header.Get(wire.AttemptHeader))
			n := len(got)
			mu.Unlock()
			if n < 3 {
				resp, _ := hcResp(r, 503, http.Header{"Retry-After": {"1"}}, "")
				return resp, nil
			}
			resp, _ := hcResp(r, 200, nil, "ok")
			return resp, nil
		})
		tr := hcTransport(t, base, httpretry.WithRetry(retry.WithBackoff(hcBackoff(t, 0))), httpretry.WithTimeout(5*time.Second))
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := []string{"4000|", "3000|2", "2000|3"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("timeout|attempt headers %q, want %q", got, want)
		}
	})
}

// DOC (doc.go): "every retry carries wire.AttemptHeader (Stormguard-Attempt:
// 2, 3, ...)". A policy with 20 attempts numbers them 2..20.
func TestAttackHCAttemptNumbersBeyond16(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			got = append(got, r.Header.Get(wire.AttemptHeader))
			mu.Unlock()
			resp, _ := hcResp(r, 502, nil, "")
			return resp, nil
		})
		tr := hcTransport(t, base, httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
			httpretry.WithRetry(retry.WithMaxAttempts(20)))
		req, _ := http.NewRequest("GET", "http://api.example/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := []string{""}
		for i := 2; i <= 20; i++ {
			want = append(want, fmt.Sprint(i))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("attempt headers %q, want %q", got, want)
		}
		g, ok := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
		if !ok || g.Attempts != 20 {
			t.Errorf("give-up %q (%v), want attempts=20", resp.Header.Get(wire.GiveUpHeader), ok)
		}
	})
}

// DOC (retry.WithGuards via WithBreaker): a call refused by the open breaker
// on its first attempt gets an error with errors.Is retry.CircuitOpen and
// breaker.ErrOpen, and retry.RetryAfter the time until the next probe
// round; nothing is sent; the body is closed.
func TestAttackHCOpenBreakerError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sends atomic.Int32
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			sends.Add(1)
			return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
		})
		tr := hcTransport(t, base, httpretry.WithBreaker(&breaker.Config{MinCalls: 2, OpenFor: 5 * time.Second}),
			httpretry.WithAutoIdempotencyKey())
		for i := 0; i < 3; i++ {
			req, _ := http.NewRequest("GET", "http://api.example/", nil)
			tr.RoundTrip(req)
		}
		if s := tr.Hosts()["api.example"].Breaker.Snapshot(); s.State != breaker.Open {
			t.Fatalf("breaker %v, want open", s.State)
		}
		before := sends.Load()
		b := &hcBody{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest("POST", "http://api.example/", b)
		resp, err := tr.RoundTrip(req)
		if resp != nil {
			t.Fatalf("got a response %d", resp.StatusCode)
		}
		if !errors.Is(err, retry.CircuitOpen) || !errors.Is(err, breaker.ErrOpen) {
			t.Errorf("err %v: want Is CircuitOpen and breaker.ErrOpen", err)
		}
		if ra := retry.RetryAfter(err); ra <= 0 || ra > 6*time.Second { // OpenFor ±20%
			t.Errorf("RetryAfter %v, want in (0, 6s]", ra)
		}
		if sends.Load() != before {
			t.Errorf("sent %d while open", sends.Load()-before)
		}
		if !b.closed.Load() {
			t.Errorf("request body not closed")
		}
	})
}

// DOC (WithGuards): "an error fails that request"; f is called "when the
// host is first seen": a failed f leaves the host unseen, so the next
// request calls f again and may succeed.
func TestAttackHCGuardsErrorThenOK(t *testing.T) {
	var calls atomic.Int32
	base := hcRT(func(r *http.Request) (*http.Response, error) {
		resp, _ := hcResp(r, 200, nil, "ok")
		return resp, nil
	})
	tr := hcTransport(t, base, httpretry.WithGuards(func(host string) (retry.Guards, error) {
		if calls.Add(1) == 1 {
			return retry.Guards{}, errors.New("store down")
		}
		b, _ := breaker.New(breaker.Config{})
		return retry.Guards{Breaker: b}, nil
	}))
	req, _ := http.NewRequest("GET", "http://API.example/", nil)
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
		t.Fatal("want the guards' error")
	}
	req, _ = http.NewRequest("GET", "http://API.example/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("second request: %v", err)
	}
	resp.Body.Close()
	if _, ok := tr.Hosts()["api.example"]; !ok || calls.Load() != 2 {
		t.Errorf("hosts %v, calls %d", tr.Hosts(), calls.Load())
	}
}

// A body read partly by a failed attempt is sent whole on the retry
// (GetBody, or WithBufferBodies for a body without one). Passes.
func TestAttackHCPartlyReadBodyReplayed(t *testing.T) {
	for _, buffered := range []bool{false, true} {
		t.Run(fmt.Sprint("buffered=", buffered), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var bodies []string
				n := 0
				base := hcRT(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					n++
					k := n
					mu.Unlock()
					defer r.Body.Close()
					if k == 1 {
						p := make([]byte, 3)
						io.ReadFull(r.Body, p)
						mu.Lock()
						bodies = append(bodies, string(p))
						mu.Unlock()
						return nil, &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
					}
					b, _ := io.ReadAll(r.Body)
					mu.Lock()
					bodies = append(bodies, string(b))
					mu.Unlock()
					resp, _ := hcResp(r, 200, nil, "ok")
					return resp, nil
				})
				var opts []httpretry.Option
				var body io.Reader = strings.NewReader("hello world")
				if buffered {
					opts = append(opts, httpretry.WithBufferBodies(1<<10))
					body = io.MultiReader(strings.NewReader("hello world")) // no GetBody
				}
				tr := hcTransport(t, base, opts...)
				req, _ := http.NewRequest("POST", "http://api.example/", body)
				req.Header.Set("Idempotency-Key", "k1")
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if fmt.Sprint(bodies) != "[hel hello world]" {
					t.Errorf("bodies %q", bodies)
				}
			})
		})
	}
}

// DOC (doc.go): the Retry-After floor is "spread by up to half of it
// again ...; If the wait would end past the deadline ([WithTimeout], or
// the request context's) ..., the transport gives up at once and returns
// that response." Probe: where the drawn spread would end past the
// deadline but the hint itself would not.
func TestAttackHCRetryAfterSpreadPastDeadline(t *testing.T) {
	for _, rnd := range []float64{0, 0.5, 0.9} {
		t.Run(fmt.Sprint(rnd), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var mu sync.Mutex
				var at []string
				base := hcRT(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					at = append(at, fmt.Sprintf("%v/%s", time.Since(start), r.Header.Get(wire.TimeoutHeader)))
					mu.Unlock()
					resp, _ := hcResp(r, 503, http.Header{"Retry-After": {"2"}}, "")
					return resp, nil
				})
				tr := hcTransport(t, base, httpretry.WithRetry(retry.WithBackoff(hcBackoff(t, rnd))),
					httpretry.WithTimeout(2500*time.Millisecond))
				req, _ := http.NewRequest("GET", "http://api.example/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				t.Logf("rand %v: attempts %q, gave up %q after %v", rnd, at, resp.Header.Get(wire.GiveUpHeader), time.Since(start))
			})
		})
	}
}

// DOC (WithTimeout): "an overall deadline for each request: d from the
// start of RoundTrip, covering every attempt, every sleep ..."; the 401
// refresh runs "as part of the same attempt", and refresh gets "a copy of
// the request that got it" (which carried the call's deadline). A hook that
// honours its request's context (the usual Go way) must be cut off at d.
func TestAttackHCRefreshBoundedByTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sent []string
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			sent = append(sent, fmt.Sprintf("timeout-ms=%q ctx=%v", r.Header.Get(wire.TimeoutHeader), r.Context().Err()))
			mu.Unlock()
			resp, _ := hcResp(r, http.StatusUnauthorized, nil, "")
			return resp, nil
		})
		var sawDeadline atomic.Bool
		tr := hcTransport(t, base, httpretry.WithTimeout(time.Second),
			httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
				_, ok := r.Context().Deadline()
				sawDeadline.Store(ok)
				select {
				case <-r.Context().Done(): // the token endpoint call, on the request's context
					return nil, r.Context().Err()
				case <-time.After(30 * time.Second):
					r.Header.Set("Authorization", "Bearer late")
					return r, nil
				}
			}))
		start := time.Now()
		req, _ := http.NewRequest("GET", "http://api.example/", nil)
		resp, err := tr.RoundTrip(req)
		el := time.Since(start)
		if resp != nil {
			resp.Body.Close()
		}
		if !sawDeadline.Load() || el > time.Second {
			mu.Lock()
			defer mu.Unlock()
			t.Errorf("WithTimeout(1s): refresh saw a deadline: %v; RoundTrip took %v (err %v), want at most 1s; sends: %q", sawDeadline.Load(), el, err, sent)
		}
	})
}

// DOC (doc.go): "Bodies of discarded responses are drained (up to 64 KiB,
// for at most 50 ms) and closed so their connections are reused". The 401
// discarded by a refresh, the 503s discarded by retries, and a 500 retried
// once: one connection for all of them.
func TestAttackHCDiscardedReuseConnectionRealServer(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k := n.Add(1)
		io.Copy(io.Discard, r.Body)
		page := strings.Repeat("x", 4096)
		switch {
		case r.Header.Get("Authorization") != "Bearer new":
			w.WriteHeader(401)
		case k%4 == 2:
			w.WriteHeader(503)
		case k%4 == 3:
			w.WriteHeader(500)
		default:
			w.WriteHeader(200)
		}
		io.WriteString(w, page)
	}))
	var conns atomic.Int32
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	base := srv.Client().Transport.(*http.Transport)
	tr := hcTransport(t, base, httpretry.WithRetry(retry.WithBackoff(hcBackoff(t, 0))), httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
		httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			r.Header.Set("Authorization", "Bearer new")
			return r, nil
		}))
	for i := 0; i < 10; i++ {
		req, _ := http.NewRequest("PUT", srv.URL, strings.NewReader("body"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v (server saw %d; breaker %+v)", i, err, n.Load(), tr.Hosts()[strings.TrimPrefix(srv.URL, "http://")].Breaker.Snapshot())
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if c := conns.Load(); c != 1 {
		t.Errorf("connections %d for %d requests, want 1", c, n.Load())
	}
}

// DOC (doc.go): "A request is safe to repeat when its method is idempotent
// ... or it carries a non-empty Idempotency-Key ... A POST without a key
// gets exactly one attempt." WithRefreshOn401 allows the hook to "return a
// new request to the same host", which "later retries ... send". A POST
// whose refreshed request carries no key is a POST without a key: it must
// not be sent again.
func TestAttackHCRefreshedRequestWithoutKeyNotRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var keys []string
		base := hcRT(func(r *http.Request) (*http.Response, error) {
			if r.Body != nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
			}
			mu.Lock()
			keys = append(keys, r.Header.Get("Idempotency-Key")+"/"+r.Header.Get("Authorization"))
			mu.Unlock()
			if r.Header.Get("Authorization") == "" {
				resp, _ := hcResp(r, 401, nil, "")
				return resp, nil
			}
			resp, _ := hcResp(r, 503, nil, "")
			return resp, nil
		})
		tr := hcTransport(t, base, httpretry.WithRefreshOn401(func(r *http.Request) (*http.Request, error) {
			nr, err := http.NewRequestWithContext(r.Context(), r.Method, r.URL.String(), nil)
			if err != nil {
				return nil, err
			}
			nr.Header.Set("Authorization", "Bearer new")
			return nr, nil
		}))
		req, _ := http.NewRequest("POST", "http://api.example/pay", strings.NewReader("100 EUR"))
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mu.Lock()
		defer mu.Unlock()
		unkeyed := 0
		for _, k := range keys {
			if strings.HasPrefix(k, "/") {
				unkeyed++
			}
		}
		if unkeyed > 1 {
			t.Errorf("POST sent %d times without an Idempotency-Key (sends key/auth: %q); want at most once", unkeyed, keys)
		}
	})
}

// DOC (doc.go): "every attempt with a deadline carries the time it has
// left, "Stormguard-Timeout-Ms: 950" (wire.TimeoutHeader: the earlier of
// the attempt timeout and the request's deadline ...)"; such an attempt "is
// a copy of the request with its own header map". A proxy that forwards the
// fields of the request it got (the case the doc handles for the attempt
// and probe marks, in canonical and lower-case spelling) forwards a stale
// timeout: a copy must carry the transport's value only (package admission
// takes the fewest milliseconds of all lines).
func TestAttackHCTimeoutHeaderForwardedSpelling(t *testing.T) {
	for _, key := range []string{"Stormguard-Timeout-Ms", "stormguard-timeout-ms"} {
		t.Run(key, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var got []string
				base := hcRT(func(r *http.Request) (*http.Response, error) {
					for k, v := range r.Header {
						if strings.EqualFold(k, wire.TimeoutHeader) {
							got = append(got, v...)
						}
					}
					resp, _ := hcResp(r, 200, nil, "")
					return resp, nil
				})
				tr := hcTransport(t, base, httpretry.WithTimeout(10*time.Second))
				req, _ := http.NewRequest("GET", "http://api.example/", nil)
				req.Header[key] = []string{"5"} // forwarded from the inbound request
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if fmt.Sprint(got) != "[10000]" {
					t.Errorf("timeout field values sent %q, want only the transport's [10000]", got)
				}
			})
		})
	}
}

// DOC (Transport.RoundTrip): "RoundTrip never modifies req and always
// closes its body"; doc.go: a body with GetBody is "replayed through it
// (called as soon as an attempt fails, the last one too ...)". The body
// GetBody hands out after the last attempt is the request's body for a send
// that never comes: it must be closed when RoundTrip gives up.
func TestAttackHCGetBodyAfterLastAttemptClosed(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fallback bool
	}{{"given-back", false}, {"fallback", true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := hcRT(func(r *http.Request) (*http.Response, error) {
					io.Copy(io.Discard, r.Body)
					r.Body.Close()
					resp, _ := hcResp(r, 503, nil, "")
					return resp, nil
				})
				var opts []httpretry.Option
				if tc.fallback {
					opts = append(opts, httpretry.WithFallback(func(r *http.Request, err *retry.Error) (*http.Response, error) {
						resp, _ := hcResp(r, 299, nil, "")
						return resp, nil
					}))
				}
				tr := hcTransport(t, base, opts...)
				first := &hcBody{Reader: strings.NewReader("payload")}
				var mu sync.Mutex
				var got []*hcBody
				req, _ := http.NewRequest("PUT", "http://api.example/", first)
				req.ContentLength = 7
				req.GetBody = func() (io.ReadCloser, error) {
					b := &hcBody{Reader: strings.NewReader("payload")}
					mu.Lock()
					got = append(got, b)
					mu.Unlock()
					return b, nil
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				mu.Lock()
				defer mu.Unlock()
				open := 0
				for _, b := range got {
					if !b.closed.Load() {
						open++
					}
				}
				if open > 0 {
					t.Errorf("status %d: GetBody called %d times, %d of its bodies left open after RoundTrip returned", resp.StatusCode, len(got), open)
				}
			})
		})
	}
}
