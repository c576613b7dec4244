package httpretry_test

// Black-box checks of README.md's promises about package httpretry, through
// the public API, on testing/synctest's fake clock and in-memory bases.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// rdmRT is a RoundTripper made of a function.
type rdmRT func(*http.Request) (*http.Response, error)

func (f rdmRT) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// rdmResp is a response with status code and header fields kv (name, value,
// ...), its body "status N".
func rdmResp(r *http.Request, code int, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	body := "status " + strconv.Itoa(code)
	return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body)), Request: r, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
}

// rdmHandlerRT serves requests in memory with h.
func rdmHandlerRT(h http.Handler) rdmRT {
	return func(r *http.Request) (*http.Response, error) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		resp := rec.Result()
		resp.Request = r
		return resp, nil
	}
}

func rdmDo(t *testing.T, rt http.RoundTripper, ctx context.Context, method, url string, kv ...string) (*http.Response, error) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch {
		body = strings.NewReader(`{"amount":12}`)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := rt.RoundTrip(req)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return resp, err
}

// README: "it retries only transient failures (timeouts, resets,
// 408/429/502/503/504) of idempotent operations or of writes that carry an
// idempotency key"; "it caps attempts per request (3)"; "returns the last
// response when it gives up (marked Stormguard-Gave-Up)"; package doc: 500
// "once, and only for an idempotent method"; "A POST without a key gets
// exactly one attempt".
func TestAttackReadmeRetriedStatuses(t *testing.T) {
	cases := []struct {
		method string
		key    bool
		status int
		want   int
	}{
		{"GET", false, 408, 3}, {"GET", false, 429, 3}, {"GET", false, 502, 3}, {"GET", false, 503, 3}, {"GET", false, 504, 3},
		{"HEAD", false, 503, 3}, {"PUT", false, 503, 3}, {"DELETE", false, 504, 3}, {"OPTIONS", false, 502, 3},
		{"POST", false, 503, 1}, {"PATCH", false, 503, 1}, {"POST", true, 503, 3}, {"PATCH", true, 429, 3},
		{"GET", false, 500, 2}, {"PUT", false, 500, 2}, {"POST", true, 500, 1},
		{"GET", false, 501, 1}, {"GET", false, 404, 1}, {"GET", false, 400, 1}, {"GET", false, 409, 1},
		{"GET", false, 200, 1}, {"GET", false, 301, 1}, {"GET", false, 505, 1},
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s key=%v %d", c.method, c.key, c.status)
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int32
				tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
					calls.Add(1)
					if r.Body != nil {
						_, _ = io.Copy(io.Discard, r.Body)
					}
					return rdmResp(r, c.status), nil
				}))
				if err != nil {
					t.Fatal(err)
				}
				var kv []string
				if c.key {
					kv = []string{"Idempotency-Key", "k-" + strconv.Itoa(c.status)}
				}
				resp, err := rdmDo(t, tr, context.Background(), c.method, "http://pay.test/x", kv...)
				if err != nil {
					t.Fatalf("err = %v, want the last response", err)
				}
				if resp.StatusCode != c.status {
					t.Errorf("status %d, want %d", resp.StatusCode, c.status)
				}
				if got := int(calls.Load()); got != c.want {
					t.Errorf("%s: %d attempts at the base, want %d", name, got, c.want)
				}
				if c.want == 3 {
					g, ok := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader))
					if !ok || g.Reason != "attempts-exhausted" || g.Attempts != 3 {
						t.Errorf("Stormguard-Gave-Up = %q, want attempts-exhausted;attempts=3", resp.Header.Get(wire.GiveUpHeader))
					}
				}
			})
		})
	}
}

// README: "Retries carry Stormguard-Attempt: 2, 3"; "It never modifies the
// request, replays bodies through GetBody".
func TestAttackReadmeAttemptHeaderAndRequestUntouched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var attempts, bodies []string
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			attempts = append(attempts, r.Header.Get(wire.AttemptHeader))
			bodies = append(bodies, string(b))
			mu.Unlock()
			return rdmResp(r, 503), nil
		}), httpretry.WithAutoIdempotencyKey(), httpretry.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", "http://pay.test/charge", strings.NewReader("amount=12"))
		req.Header.Set("X-Merchant", "m-42")
		before := req.Header.Clone()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := []string{"", "2", "3"}; strings.Join(attempts, ",") != strings.Join(want, ",") {
			t.Errorf("Stormguard-Attempt per attempt = %q, want %q", attempts, want)
		}
		for i, b := range bodies {
			if b != "amount=12" {
				t.Errorf("attempt %d body %q, want the whole body again", i+1, b)
			}
		}
		if len(req.Header) != len(before) || req.Header.Get("Idempotency-Key") != "" {
			t.Errorf("the caller's request was modified: %v, before %v", req.Header, before)
		}
		if k := httpretry.IdempotencyKey(resp, err); k == "" {
			t.Errorf("IdempotencyKey: none, want the key the transport made")
		}
	})
}

// README: "Retry-After is a floor, spread above: a hint of 2 s sleeps 2 to
// 3 s ... Hints above 1 minute (retry.WithMaxRetryAfter) give up."
func TestAttackReadmeRetryAfterFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var gaps []time.Duration
		for i := 0; i < 40; i++ {
			var last time.Time
			var n int
			tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
				now := time.Now()
				if n > 0 {
					gaps = append(gaps, now.Sub(last))
				}
				n++
				last = now
				return rdmResp(r, 503, "Retry-After", "2"), nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x"); err != nil {
				t.Fatal(err)
			}
		}
		var lo, hi time.Duration = time.Hour, 0
		for _, g := range gaps {
			lo, hi = min(lo, g), max(hi, g)
			if g < 2*time.Second || g >= 3*time.Second {
				t.Errorf("sleep after Retry-After: 2 was %v, want 2 s to 3 s", g)
			}
		}
		if hi-lo < 100*time.Millisecond {
			t.Errorf("sleeps after Retry-After: 2 all within %v..%v: not spread", lo, hi)
		}

		// Above 1 minute: give up at once with the response.
		var calls int
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			calls++
			return rdmResp(r, 503, "Retry-After", "61"), nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/y")
		if err != nil || resp.StatusCode != 503 || calls != 1 || time.Since(start) != 0 {
			t.Errorf("Retry-After 61: err %v, status %v, %d calls, took %v; want the 503 at once after 1 call", err, resp.StatusCode, calls, time.Since(start))
		}
		if g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); g.Reason != "deadline" {
			t.Errorf("give-up %q, want deadline", resp.Header.Get(wire.GiveUpHeader))
		}
	})
}

// README: "keeps one overall deadline and never sleeps past it".
func TestAttackReadmeNeverSleepsPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls int
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			calls++
			return rdmResp(r, 503, "Retry-After", "5"), nil
		}), httpretry.WithTimeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
		if err != nil {
			t.Fatal(err)
		}
		if calls != 1 || time.Since(start) != 0 || resp.StatusCode != 503 {
			t.Errorf("Retry-After 5 s with a 3 s deadline: %d calls in %v, status %d; want 1 call, no sleep", calls, time.Since(start), resp.StatusCode)
		}
	})
}

// README: "a response with Stormguard-Retry: no ... is not retried, so one
// layer retries: 3 calls at the bottom of three layers instead of 27".
func TestAttackReadmeOneLayerRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var bottom atomic.Int32
		var next http.RoundTripper = rdmRT(func(r *http.Request) (*http.Response, error) {
			bottom.Add(1)
			return rdmResp(r, 503), nil
		})
		for layer := 0; layer < 2; layer++ {
			tr, err := httpretry.NewTransport(next)
			if err != nil {
				t.Fatal(err)
			}
			c := &http.Client{Transport: tr}
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				req, _ := http.NewRequestWithContext(r.Context(), "GET", "http://below.test/x", nil)
				resp, err := c.Do(req)
				if admission.PushBack(w, resp, err) {
					return
				}
				if err != nil {
					w.WriteHeader(599)
					return
				}
				defer resp.Body.Close()
				w.WriteHeader(resp.StatusCode)
			})
			next = rdmHandlerRT(h)
		}
		top, err := httpretry.NewTransport(next)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := rdmDo(t, top, context.Background(), "GET", "http://top.test/x")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 503 {
			t.Errorf("top status %d, want 503", resp.StatusCode)
		}
		if got := bottom.Load(); got != 3 {
			t.Errorf("calls at the bottom of three layers: %d, want 3", got)
		}
		// The same with the don't-retry signal sent by the bottom itself.
		var n int
		tr, _ := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			n++
			return rdmResp(r, 503, "Stormguard-Retry", "no"), nil
		}))
		if _, err := rdmDo(t, tr, context.Background(), "GET", "http://x.test/"); err != nil || n != 1 {
			t.Errorf("Stormguard-Retry: no: %d attempts, err %v; want 1", n, err)
		}
	})
}

// README: "retries per client (10% of requests)" plus "a floor of 1 retry
// per second": over 10 s, retries <= 10% of requests + 10.
func TestAttackReadmeBudgetPerClient(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		b, _ := backoff.New(backoff.Config{Base: time.Millisecond, Cap: time.Millisecond})
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			calls.Add(1)
			return rdmResp(r, 503), nil
		}), httpretry.WithBreaker(nil), httpretry.WithRetry(retry.WithBackoff(b)))
		if err != nil {
			t.Fatal(err)
		}
		const requests = 300
		var budgetGaveUp int
		for i := 0; i < requests; i++ {
			resp, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
			if err != nil {
				t.Fatal(err)
			}
			if g, _ := wire.ParseGiveUp(resp.Header.Get(wire.GiveUpHeader)); g.Reason == "budget-exhausted" {
				budgetGaveUp++
				if resp.StatusCode != 503 {
					t.Errorf("budget refusal returned %d, want the last real answer (503)", resp.StatusCode)
				}
			}
			time.Sleep(20 * time.Millisecond) // 300 requests over about 6 s
		}
		retries := int(calls.Load()) - requests
		if limit := requests/10 + 10; retries > limit {
			t.Errorf("%d retries for %d requests, want at most %d (10%% + 10)", retries, requests, limit)
		}
		if budgetGaveUp == 0 {
			t.Errorf("no request gave up for the budget")
		}
		t.Logf("%d retries for %d requests", retries, requests)
	})
}

// README: "The breaker ... A call waits behind the open breaker only if its
// deadline ... lies beyond the next probe round; without one it fails fast";
// breaker: "50% of at least 20 calls"; probes about every second.
func TestAttackReadmeBreakerWaitOrFailFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		var calls atomic.Int32
		var probeMarks atomic.Int32
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			calls.Add(1)
			if r.Header.Get(wire.ProbeHeader) != "" {
				probeMarks.Add(1)
			}
			if healthy.Load() {
				return rdmResp(r, 200), nil
			}
			return rdmResp(r, 503), nil
		}), httpretry.WithRetry(retry.WithMaxAttempts(1)))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 19; i++ {
			rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
		}
		if g := tr.Hosts()["pay.test"]; g.Breaker == nil || g.Breaker.State() != breaker.Closed {
			t.Errorf("breaker not closed after 19 failed calls, want closed (at least 20 calls)")
		}
		rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
		before := calls.Load()
		// Without a deadline: fails fast.
		start := time.Now()
		_, err = rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
		if !errors.Is(err, retry.CircuitOpen) || time.Since(start) != 0 || calls.Load() != before {
			t.Fatalf("no deadline, open breaker: err %v, took %v, %d sent; want CircuitOpen at once, nothing sent", err, time.Since(start), calls.Load()-before)
		}
		// With a deadline before the next probe round: fails fast too.
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err = rdmDo(t, tr, ctx, "GET", "http://pay.test/x")
		cancel()
		if !errors.Is(err, retry.CircuitOpen) || time.Since(start) != 0 {
			t.Errorf("100 ms deadline: err %v after %v; want CircuitOpen at once", err, time.Since(start))
		}
		// With time to spare: waits and succeeds once the provider is back.
		healthy.Store(true)
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := rdmDo(t, tr, ctx, "GET", "http://pay.test/x")
		waited := time.Since(start)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("10 s deadline: err %v, want the 200 after waiting", err)
		}
		if waited < 700*time.Millisecond || waited > 1300*time.Millisecond {
			t.Errorf("waited %v behind the open breaker, want about 1 s (0.8 to 1.2 s)", waited)
		}
		if probeMarks.Load() == 0 {
			t.Errorf("the released call carried no Stormguard-Probe")
		}
	})
}

// README: "limit the attempts in flight per host ... (cold: 10 ...)".
func TestAttackReadmeColdLimitTen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inFlight, peak atomic.Int32
		release := make(chan struct{})
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			n := inFlight.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			<-release
			inFlight.Add(-1)
			return rdmResp(r, 200), nil
		}), httpretry.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 15; i++ {
			wg.Go(func() { rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x") })
		}
		synctest.Wait()
		if got := inFlight.Load(); got != 10 {
			t.Errorf("attempts in flight to a cold host: %d, want 10", got)
		}
		close(release)
		wg.Wait()
	})
}

// README: "WithHedging sends a copy of a slow GET after a fixed ... delay,
// paid from the budget, never while the host shows overload; the first good
// answer wins"; docs/hedging.md: "A write is never hedged, keyed or not".
func TestAttackReadmeHedging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		var mode atomic.Int32 // 0: first copy slow; 1: 503 with Retry-After
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			n := calls.Add(1)
			if mode.Load() == 1 {
				mode.Store(0)
				return rdmResp(r, 503, "Retry-After", "1"), nil
			}
			if n%2 == 1 { // the first copy hangs until canceled or 2 s
				select {
				case <-r.Context().Done():
					return nil, r.Context().Err()
				case <-time.After(2 * time.Second):
				}
			}
			return rdmResp(r, 200), nil
		}), httpretry.WithHedging(100*time.Millisecond, 0, 1), httpretry.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("hedged GET: %v", err)
		}
		if calls.Load() != 2 || time.Since(start) != 100*time.Millisecond {
			t.Errorf("hedged GET: %d copies, answered after %v; want 2 copies, 100 ms", calls.Load(), time.Since(start))
		}
		// A keyed POST is never hedged.
		calls.Store(0)
		if _, err := rdmDo(t, tr, context.Background(), "POST", "http://pay.test/x", "Idempotency-Key", "k1"); err != nil {
			t.Fatal(err)
		}
		if calls.Load() != 1 {
			t.Errorf("keyed POST: %d copies, want 1 (never hedged)", calls.Load())
		}
		// After a 503 with Retry-After, no hedge for 5 s.
		calls.Store(0)
		mode.Store(1)
		rdmDo(t, tr, context.Background(), "GET", "http://pay.test/y") // 503, RA 1, then the retry's first copy (odd) hangs 2 s...
		got := calls.Load()
		calls.Store(0)
		time.Sleep(500 * time.Millisecond)
		if _, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/z"); err != nil {
			t.Fatal(err)
		}
		if calls.Load() != 1 {
			t.Errorf("GET within 5 s of a pushback: %d copies (before: %d), want 1 (no hedge while the host pushed back)", calls.Load(), got)
		}
	})
}

// README: "WithStaleCache serves the last good GET response instead, RFC 5861
// stale-if-error, marked Stormguard-Stale".
func TestAttackReadmeStaleCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			if down.Load() {
				return rdmResp(r, 503), nil
			}
			resp := rdmResp(r, 200, "Cache-Control", "max-age=1")
			resp.Body = io.NopCloser(strings.NewReader("good"))
			resp.ContentLength = 4
			return resp, nil
		}), httpretry.WithStaleCache(1<<20, time.Hour, false))
		if err != nil {
			t.Fatal(err)
		}
		rdmDo(t, tr, context.Background(), "GET", "http://pay.test/item")
		time.Sleep(5 * time.Second)
		down.Store(true)
		req, _ := http.NewRequest("GET", "http://pay.test/item", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "good" || resp.Header.Get("Stormguard-Stale") == "" {
			t.Errorf("stale GET: %d %q Stormguard-Stale %q; want the kept 200 marked", resp.StatusCode, b, resp.Header.Get("Stormguard-Stale"))
		}
		// A POST is never served from the cache.
		resp, err = rdmDo(t, tr, context.Background(), "POST", "http://pay.test/item", "Idempotency-Key", "k")
		if err != nil || resp.StatusCode != 503 {
			t.Errorf("POST during the outage: %v %v; want the 503", resp.StatusCode, err)
		}
	})
}

// README: "Calls over it wait for a slot, those with a deadline first; a
// call without one waits until a slot comes or it is canceled."
func TestAttackReadmeLimitDeadlineFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var mu sync.Mutex
		var order []string
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			if name := r.Header.Get("X-Name"); name != "" {
				mu.Lock()
				order = append(order, name)
				mu.Unlock()
				return rdmResp(r, 200), nil
			}
			<-gate
			return rdmResp(r, 200), nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 10; i++ {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				rdmDo(t, tr, ctx, "GET", "http://pay.test/x")
			})
		}
		synctest.Wait()
		for _, c := range []struct {
			name string
			d    time.Duration
		}{{"none", 0}, {"30s", 30 * time.Second}, {"20s", 20 * time.Second}} {
			wg.Go(func() {
				ctx := context.Background()
				if c.d > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.d)
					defer cancel()
				}
				if _, err := rdmDo(t, tr, ctx, "GET", "http://pay.test/x", "X-Name", c.name); err != nil {
					t.Errorf("%s: %v", c.name, err)
				}
			})
			synctest.Wait()
		}
		for i := 0; i < 10; i++ {
			gate <- struct{}{}
			synctest.Wait()
		}
		wg.Wait()
		if got := strings.Join(order, ","); got != "20s,30s,none" {
			t.Errorf("order of the waiting calls: %s, want 20s,30s,none", got)
		}
	})
}

// rdmBody is a response body of n bytes that counts what is read of it and
// whether it was closed.
type rdmBody struct {
	left   int
	read   *atomic.Int64
	closed *atomic.Int32
}

func (b *rdmBody) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	n := min(len(p), b.left)
	b.left -= n
	b.read.Add(int64(n))
	return n, nil
}
func (b *rdmBody) Close() error { b.closed.Add(1); return nil }

// README: "drains failed bodies (bounded) so connections are reused";
// package doc: "drained (up to 64 KiB, for at most 50 ms) and closed".
func TestAttackReadmeDrainsFailedBodies(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reads [3]atomic.Int64
		var closes [3]atomic.Int32
		var calls int
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			i := calls
			calls++
			resp := rdmResp(r, 503)
			resp.Body = &rdmBody{left: 1 << 20, read: &reads[i], closed: &closes[i]}
			resp.ContentLength = -1
			return resp, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://pay.test/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ { // the discarded ones
			if closes[i].Load() != 1 || reads[i].Load() > 64<<10+1 {
				t.Errorf("discarded body %d: read %d bytes, closed %d times; want at most 64 KiB, closed once", i, reads[i].Load(), closes[i].Load())
			}
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if n != 1<<20 || closes[2].Load() != 1 {
			t.Errorf("the caller read %d bytes of the last response, want all %d", n, 1<<20)
		}
	})
}

// README: "admission.PushBack(w, resp, err) passes a dependency's give-up
// (attempts, budget, breaker or limiter spent) back as 503"; its doc: a POST
// without an idempotency key that was not retried is not pushed back.
func TestAttackReadmePushBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			return rdmResp(r, 503), nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		check := func(name string, want bool, kv ...string) {
			method := "GET"
			if len(kv) > 0 && kv[0] == "POST" {
				method, kv = "POST", kv[1:]
			}
			var body io.Reader
			if method == "POST" {
				body = strings.NewReader("x")
			}
			req, _ := http.NewRequest(method, "http://pay.test/x", body)
			for i := 0; i+1 < len(kv); i += 2 {
				req.Header.Set(kv[i], kv[i+1])
			}
			resp, err := tr.RoundTrip(req)
			rec := httptest.NewRecorder()
			got := admission.PushBack(rec, resp, err)
			if got != want {
				t.Errorf("%s: PushBack = %v, want %v (give-up %q)", name, got, want, resp.Header.Get(wire.GiveUpHeader))
			}
			if got && (rec.Code != 503 || !wire.DontRetry(rec.Header())) {
				t.Errorf("%s: pushed back %d without the signal", name, rec.Code)
			}
			if !got && resp != nil {
				resp.Body.Close()
			}
		}
		check("GET, attempts exhausted", true)
		check("POST without a key", false, "POST")
		check("keyed POST, attempts exhausted", true, "POST", "Idempotency-Key", "k")
	})
}

// README: "it waits with capped exponential backoff and full jitter, treats
// Retry-After as a floor (spread above it)"; "Retry-After is a floor, spread
// above: a hint of 2 s sleeps 2 to 3 s". Every retryable status that carries
// a Retry-After (docs/hedging.md counts "a failed answer, a 408, 500, 502 or
// 504, with a Retry-After" as the host pushing back) should not be retried
// before it.
func TestAttackReadmeRetryAfterFloorEveryRetryableStatus(t *testing.T) {
	for _, code := range []int{408, 429, 502, 503, 504} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var times []time.Duration
				start := time.Now()
				tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
					times = append(times, time.Since(start))
					return rdmResp(r, code, "Retry-After", "2"), nil
				}))
				if err != nil {
					t.Fatal(err)
				}
				rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
				for i := 1; i < len(times); i++ {
					if gap := times[i] - times[i-1]; gap < 2*time.Second {
						t.Errorf("%d with Retry-After: 2: retry %d sent %v after the answer, want at least 2 s (attempts at %v)", code, i, gap, times)
					}
				}
			})
		})
	}
}

// README: "A call waits behind the open breaker only if its deadline
// (httpretry.WithTimeout, or the context's) lies beyond the next probe round".
func TestAttackReadmeBreakerWaitWithTimeoutOption(t *testing.T) {
	for _, c := range []struct {
		timeout time.Duration
		wait    bool
	}{{10 * time.Second, true}, {200 * time.Millisecond, false}} {
		t.Run(c.timeout.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var healthy atomic.Bool
				tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
					if healthy.Load() {
						return rdmResp(r, 200), nil
					}
					return rdmResp(r, 503), nil
				}), httpretry.WithTimeout(c.timeout), httpretry.WithRetry(retry.WithMaxAttempts(1)))
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 20; i++ {
					rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
				}
				healthy.Store(true)
				start := time.Now()
				resp, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x")
				if c.wait {
					if err != nil || resp.StatusCode != 200 || time.Since(start) == 0 {
						t.Errorf("WithTimeout(%v): err %v after %v, want a wait then the 200", c.timeout, err, time.Since(start))
					}
				} else if !errors.Is(err, retry.CircuitOpen) || time.Since(start) != 0 {
					t.Errorf("WithTimeout(%v): err %v after %v, want CircuitOpen at once", c.timeout, err, time.Since(start))
				}
			})
		})
	}
}

// README: hedges are "paid from the budget": no budget, no hedge.
func TestAttackReadmeHedgingNeedsBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				select {
				case <-r.Context().Done():
					return nil, r.Context().Err()
				case <-time.After(time.Second):
				}
			}
			return rdmResp(r, 200), nil
		}), httpretry.WithHedging(100*time.Millisecond, 0, 1), httpretry.WithBudget(nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rdmDo(t, tr, context.Background(), "GET", "http://pay.test/x"); err != nil {
			t.Fatal(err)
		}
		if calls.Load() != 1 {
			t.Errorf("WithBudget(nil): %d copies, want 1 (no budget, no hedge)", calls.Load())
		}
	})
}

// README: "(cold: 10, doubling per round trip while the host keeps up; no
// cap of its own)".
func TestAttackReadmeLimitGrows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var inFlight, peak atomic.Int32
		tr, err := httpretry.NewTransport(rdmRT(func(r *http.Request) (*http.Response, error) {
			n := inFlight.Add(1)
			for {
				p := peak.Load()
				if n <= p || peak.CompareAndSwap(p, n) {
					break
				}
			}
			time.Sleep(10 * time.Millisecond)
			inFlight.Add(-1)
			return rdmResp(r, 200), nil
		}), httpretry.WithAttemptTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		stop := time.Now().Add(500 * time.Millisecond)
		var wg sync.WaitGroup
		for i := 0; i < 200; i++ {
			wg.Go(func() {
				for time.Now().Before(stop) {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					rdmDo(t, tr, ctx, "GET", "http://pay.test/x")
					cancel()
				}
			})
		}
		wg.Wait()
		if p := peak.Load(); p < 160 {
			t.Errorf("peak attempts in flight with 200 callers on a host that keeps up: %d, want the limit to have grown from 10 to about 200", p)
		} else {
			t.Logf("peak %d", p)
		}
	})
}
