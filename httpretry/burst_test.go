package httpretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// TestBurstOverSmallIdlePool: 1,000 GETs in a burst through one shared
// transport whose idle pool (MaxIdleConns 2) is smaller than what one host
// may keep (MaxIdleConnsPerHost 64, as in a transport shared by many
// hosts); the server answers each GET first with a 503 and Retry-After: 1,
// then with a 204. The pool overflows: net/http puts a connection that
// just read a bodiless answer back in the pool before it hands the answer
// over, another connection put back meanwhile evicts it, and its request
// fails with "net/http: HTTP/1.x transport connection broken: http:
// putIdleConn: too many idle connections" although the server answered.
// No answer reached the caller, so every GET is retried and gets its 204.
// Before, each of those failed at once after one attempt (739 of 1,000 in
// one run). The race window is a few instructions wide; the attack hit it
// about once in 40 requests, this machine hardly ever: each GET's
// httptrace PutIdleConn hook, which net/http calls inside that window,
// yields the processor once, so that every run hits it hundreds of times.
func TestBurstOverSmallIdlePool(t *testing.T) {
	const n = 1000
	var seen sync.Map // request id -> answered 503 already
	srv := countingServer(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if _, again := seen.LoadOrStore(r.URL.Query().Get("id"), true); !again {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	pool := &http.Transport{MaxIdleConns: 2, MaxIdleConnsPerHost: 64}
	t.Cleanup(pool.CloseIdleConnections)
	var connErrors atomic.Int64
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := pool.RoundTrip(r)
		if err != nil {
			connErrors.Add(1)
		}
		return resp, err
	})
	// Only the attempt limit bounds the retries: this is about which
	// errors are retried, not about the guards.
	tr, err := httpretry.NewTransport(base, httpretry.WithBudget(nil), httpretry.WithBreaker(nil),
		httpretry.WithRetry(retry.WithMaxAttempts(10), retry.WithBackoff(smallBackoff(t))))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	failures := map[string]int{}
	for i := range n {
		wg.Go(func() {
			var yielded atomic.Bool // once per GET: at most one of its answers is lost
			trace := &httptrace.ClientTrace{PutIdleConn: func(error) {
				if !yielded.Swap(true) {
					runtime.Gosched()
				}
			}}
			ctx, cancel := context.WithTimeout(httptrace.WithClientTrace(context.Background(), trace), time.Minute)
			defer cancel()
			resp, err := tr.RoundTrip(newRequest(t, ctx, "GET", fmt.Sprintf("%s/?id=%d", srv.URL, i), nil))
			what := ""
			switch {
			case err != nil:
				what = err.Error()
			case resp.StatusCode != http.StatusNoContent:
				what = resp.Status
			}
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
			}
			if what != "" {
				mu.Lock()
				failures[what]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d GETs in %v; the pool broke %d attempts' connections", n, time.Since(start), connErrors.Load())
	for what, count := range failures {
		t.Errorf("%d of %d GETs failed: %s", count, n, what)
	}
}
