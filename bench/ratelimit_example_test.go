package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
)

// A client-side rate limit from golang.org/x/time/rate, which the core
// module does not import: retry.WithRateLimit takes anything with a method
// Wait(context.Context) error. Here a burst of 2 and no refill: the third
// request would have to wait past its deadline, so the limiter refuses it
// and nothing is sent.
func Example_rateLimit() {
	var sent atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent.Add(1)
		fmt.Fprint(w, "ok")
	}))
	defer srv.Close()

	lim := rate.NewLimiter(rate.Every(time.Hour), 2)
	client, err := httpretry.NewClient(httpretry.WithRetry(retry.WithRateLimit(lim)))
	if err != nil {
		panic(err)
	}
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
		resp, err := client.Do(req)
		cancel()
		var re *retry.Error
		switch {
		case err == nil:
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			fmt.Println(resp.StatusCode, string(body))
		case errors.As(err, &re):
			fmt.Println(re)
		default:
			fmt.Println(err)
		}
	}
	fmt.Println("sent:", sent.Load())
	// Output:
	// 200 ok
	// 200 ok
	// retry: deadline after 0 attempts (cause: retry: rate limit: rate: Wait(n=1) would exceed context deadline)
	// sent: 2
}
