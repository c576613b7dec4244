package wire_test

import (
	"fmt"
	"net/http"

	"github.com/stormguard/stormguard/wire"
)

// A server reads the attempt number of a request and tells its caller not
// to retry a failure; the caller reads why a client below it gave up.
func Example() {
	req, _ := http.NewRequest("GET", "http://payments.test/charge", nil)
	req.Header.Set(wire.AttemptHeader, "2") // what a client's retry carries
	n, ok := wire.ParseAttempt(req.Header.Get(wire.AttemptHeader))
	fmt.Println("attempt:", n, ok)

	h := http.Header{}
	wire.SetDontRetry(h)
	fmt.Println("don't retry:", wire.DontRetry(h))

	g, ok := wire.ParseGiveUp("circuit-open;attempts=2;retry-after=3")
	fmt.Println(g.Reason, g.Attempts, g.RetryAfter, ok)
	// Output:
	// attempt: 2 true
	// don't retry: true
	// circuit-open 2 3s true
}

func ExampleParseAttempt() {
	for _, v := range []string{"2", " 3 ", "4, 1", "0", "two", ""} {
		n, ok := wire.ParseAttempt(v)
		fmt.Printf("%q: %d %v\n", v, n, ok)
	}
	// Output:
	// "2": 2 true
	// " 3 ": 3 true
	// "4, 1": 4 true
	// "0": 0 false
	// "two": 0 false
	// "": 0 false
}
