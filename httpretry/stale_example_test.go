package httpretry_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// A client with a stale cache: while the server answers, its responses are
// kept; when it fails, the client gets the last good one, marked stale.
func ExampleWithStaleCache() {
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Cache-Control", "max-age=60, stale-if-error=3600")
		fmt.Fprint(w, `{"price":"2.50"}`)
	}))
	defer srv.Close()

	quick, _ := backoff.New(backoff.Config{Base: time.Millisecond, Cap: 10 * time.Millisecond})
	client, err := httpretry.NewClient(
		httpretry.WithRetry(retry.WithBackoff(quick)),
		httpretry.WithStaleCache(32<<20, 0, false), // 32 MiB; only responses that allow it are served stale
	)
	if err != nil {
		panic(err)
	}
	show := func() {
		resp, err := client.Get(srv.URL + "/price")
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body) // read to the end: the response is kept
		resp.Body.Close()
		if stale := resp.Header.Get("Stormguard-Stale"); stale != "" {
			fmt.Println(resp.StatusCode, string(body), "stale:", stale, "age given:", resp.Header.Get("Age") != "")
			return
		}
		fmt.Println(resp.StatusCode, string(body))
	}
	show()
	down.Store(true)
	show()
	// Output:
	// 200 {"price":"2.50"}
	// 200 {"price":"2.50"} stale: attempts-exhausted;attempts=3;stale=0 age given: true
}
