package httpretry_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
)

// A client whose server fails twice with 503, then answers: the caller
// sees only the answer; the server sees the attempt header.
func ExampleNewClient() {
	var (
		mu       sync.Mutex
		attempts []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := httpretry.AttemptFromRequest(r)
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
	client, err := httpretry.NewClient(httpretry.WithBackoff(quick), httpretry.WithTimeout(10*time.Second))
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
// gave up, and the handler tells its own caller not to retry on top.
func ExamplePushBack() {
	dependency := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer dependency.Close()

	quick, _ := backoff.New(backoff.Config{Strategy: backoff.FullJitter, Base: time.Millisecond, Cap: 10 * time.Millisecond})
	client, _ := httpretry.NewClient(httpretry.WithBackoff(quick))
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, dependency.URL, nil)
		resp, err := client.Do(req)
		if httpretry.PushBack(w, resp, err) {
			return
		}
		// ... use resp, err
	})

	w := httptest.NewRecorder()
	handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	fmt.Println(w.Code, httpretry.RetryHeader+":", w.Header().Get(httpretry.RetryHeader))
	// Output:
	// 503 Stormguard-Retry: no
}

// DontRetry marks a response the handler builds itself.
func ExampleDontRetry() {
	w := httptest.NewRecorder()
	httpretry.DontRetry(w)
	w.WriteHeader(http.StatusTooManyRequests)
	fmt.Println(w.Code, w.Header().Get(httpretry.RetryHeader))
	// Output:
	// 429 no
}

func ExampleParseAttempt() {
	for _, v := range []string{"2", " 3 ", "4, 1", "0", "two"} {
		n, ok := httpretry.ParseAttempt(v)
		fmt.Printf("%q: %d %v\n", v, n, ok)
	}
	// Output:
	// "2": 2 true
	// " 3 ": 3 true
	// "4, 1": 4 true
	// "0": 0 false
	// "two": 0 false
}
