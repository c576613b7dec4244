package fleet_test

import (
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/httpretry"
)

// A fleet whose Redis is not there starts in local mode: each host's
// budget and breaker decide alone (here the local budget's default: 10% of
// the requests plus 10 per window), and the fleet switches to fleet mode by
// itself once Redis answers.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, MaxRetries: -1})
	defer client.Close()
	f, err := fleet.New(client, fleet.Config{Name: "pos-terminals"})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	fmt.Println("mode:", f.Mode())

	g, err := f.Guards("payments.example.com")
	if err != nil {
		log.Fatal(err)
	}
	for range 100 {
		g.Budget.Deposit()
	}
	retries := 0
	for g.Budget.Withdraw() {
		retries++
	}
	fmt.Println("retries allowed after 100 requests:", retries)
	fmt.Println("last error:", f.Stats().LastError != nil)
	// Output:
	// mode: local
	// retries allowed after 100 requests: 20
	// last error: true
}

// Every process of a fleet of POS terminals builds its HTTP client like
// this: each payment host gets a budget and a breaker shared with every
// other terminal through Redis. The whole fleet retries at most 10% of its
// requests plus 5 per second, trips when half of its calls fail (at least
// 50 of them, fleet-wide, in 10 s), and probes with one round of 3 calls
// per second when open, however many terminals there are.
func ExampleFleet_Guards() {
	client := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 []string{"127.0.0.1:6379"}, // several addresses: a Cluster
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	f, err := fleet.New(client, fleet.Config{
		Name:      "pos-terminals",
		SyncEvery: 100 * time.Millisecond,
		Budget:    budget.Config{Ratio: 0.1, MinPerSecond: 5, Window: 10 * time.Second},
		Breaker:   breaker.Config{FailureRatio: 0.5, OpenFor: time.Second, Probes: 3},
		MinCalls:  50,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()

	rt, err := httpretry.NewTransport(nil, httpretry.WithGuards(f.Guards), httpretry.WithTimeout(15*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	c := &http.Client{Transport: rt}
	resp, err := c.Get("https://payments.example.com/health")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	for host, g := range rt.Hosts() { // the fleet's window, as of the last reply from Redis
		w := g.Budget.(interface{ Stats() budget.Stats }).Stats()
		fmt.Printf("%s, fleet mode %v: %d requests, %d retries\n", host, f.Mode(), w.Requests, w.Retries)
	}
}
