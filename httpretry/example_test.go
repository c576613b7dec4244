package httpretry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// A client whose server fails twice with 503, then answers: the caller
// sees only the answer; the server sees the attempt header.
func ExampleNewClient() {
	var (
		mu       sync.Mutex
		attempts []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, ok := wire.ParseAttempt(r.Header.Get(wire.AttemptHeader))
		if !ok {
			n = 1 // no header: a first attempt
		}
		mu.Lock()
		attempts = append(attempts, fmt.Sprint(n))
		mu.Unlock()
		if n < 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "hello")
	}))
	defer srv.Close()

	// Short delays so that the example runs fast; the default is full
	// jitter from 100 ms, capped at 10 s.
	quick, _ := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond})
	client, err := httpretry.NewClient(httpretry.WithRetry(retry.WithBackoff(quick)), httpretry.WithTimeout(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("server saw attempts", strings.Join(attempts, ", "))
	// Output:
	// 200 hello
	// server saw attempts 1, 2, 3
}

// A handler whose dependency is down: its client retried (3 attempts),
// gave up, and the handler tells its own caller not to retry on top
// (package admission holds the server's side of the protocol).
func Example_pushBack() {
	dependency := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer dependency.Close()

	quick, _ := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond})
	client, _ := httpretry.NewClient(httpretry.WithRetry(retry.WithBackoff(quick)))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, dependency.URL, nil)
		resp, err := client.Do(req)
		if admission.PushBack(w, resp, err) {
			return
		}
		// ... use resp, err
	})

	w := httptest.NewRecorder()
	handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, "don't retry:", wire.DontRetry(w.Header()))
	// Output:
	// 503 don't retry: true
}

// A client with a fallback: when the dependency is down (here: three
// 503s), the caller gets a response of its own, e.g. from a cache.
func ExampleWithFallback() {
	dependency := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer dependency.Close()

	quick, _ := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond})
	cached := func(req *http.Request, err *retry.Error) (*http.Response, error) {
		fmt.Println("fallback after", err.Attempts, "attempts:", err.Reason)
		return &http.Response{
			StatusCode: http.StatusOK,
			Header:     http.Header{"Content-Type": {"text/plain"}},
			Body:       io.NopCloser(strings.NewReader("yesterday's data")),
			Request:    req,
		}, nil
	}
	client, _ := httpretry.NewClient(httpretry.WithRetry(retry.WithBackoff(quick)), httpretry.WithFallback(cached))
	resp, err := client.Get(dependency.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output:
	// fallback after 3 attempts: retry: attempts exhausted
	// 200 yesterday's data
}

// IdempotencyKey tells the caller which idempotency key the transport made for a
// POST, to log it or to look the payment up later.
func ExampleIdempotencyKey() {
	var (
		mu   sync.Mutex
		seen string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = r.Header.Get("Idempotency-Key")
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client, _ := httpretry.NewClient(httpretry.WithAutoIdempotencyKey())
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader(`{"amount": 100}`))
	key := httpretry.IdempotencyKey(resp, err)
	if err != nil {
		fmt.Println(err, key)
		return
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(resp.StatusCode, key != "" && key == seen)
	// Output:
	// 201 true
}

// A client and a server: a payment handler behind the idempotency
// middleware, and a client that retries it safely with one key per
// payment. The first answer is lost on its way back (the connection drops
// after the payment went through); the client sends the payment again
// with the same key, and the server replays the stored answer instead of
// charging twice. The README shows this program.
func Example_clientAndServer() {
	// Server: a retried POST with the same Idempotency-Key is answered from
	// the stored response; the handler runs once.
	store, _ := idempotency.NewMemoryStore(idempotency.MemoryConfig{}) // or pgstore / redisstore
	guard, err := idempotency.NewMiddleware(store,
		idempotency.WithScope(func(r *http.Request) (string, error) { return r.Header.Get("X-Merchant"), nil }))
	if err != nil {
		panic(err)
	}
	var charges, arrivals atomic.Int32
	pay := guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if arrivals.Add(1) == 1 { // the payment goes through, but its answer is lost: the connection drops
			pay.ServeHTTP(httptest.NewRecorder(), r)
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		pay.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// Client: 3 attempts, full jitter, a retry budget and a breaker per host,
	// one deadline for everything, one key per payment.
	client, err := httpretry.NewClient(httpretry.WithTimeout(10*time.Second), httpretry.WithAutoIdempotencyKey())
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL, strings.NewReader(`{"amount":12}`))
	req.Header.Set("X-Merchant", "m-42")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true",
		"charges:", charges.Load(), "arrivals:", arrivals.Load())
	// Output: 201 replayed: true charges: 1 arrivals: 2
}
