package httpretry_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/wire"
)

// A GET whose first attempt hangs: after 20 ms the transport sends a
// hedge (attempt 2 on the wire, paid from the host's retry budget), whose
// answer wins; the hung attempt is canceled, and its server sees it go.
func ExampleWithHedging() {
	canceled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(wire.AttemptHeader) == "" { // the first attempt: hang
			<-r.Context().Done()
			close(canceled)
			return
		}
		fmt.Fprint(w, "hello from attempt ", r.Header.Get(wire.AttemptHeader))
	}))
	defer srv.Close()

	// A fixed delay of 20 ms; 0 would learn it per host (the p95 of the
	// host's recent answers, with q = 0).
	client, err := httpretry.NewClient(httpretry.WithHedging(20*time.Millisecond, 0, 1))
	if err != nil {
		fmt.Println(err)
		return
	}
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(body))
	select {
	case <-canceled:
		fmt.Println("the first attempt was canceled")
	case <-time.After(5 * time.Second):
		fmt.Println("the first attempt is still running")
	}
	// Output:
	// 200 hello from attempt 2
	// the first attempt was canceled
}
