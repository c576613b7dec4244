package idemtest_test

import (
	"context"
	"fmt"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

// Two servers share one store behind a proxy that resets 10% of the
// requests and drops 20% of the answers; 500 payments go through the
// retrying client. The fault counts depend only on the seed.
func ExampleRun() {
	mem, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := idemtest.Run(context.Background(), idemtest.Config{
		Stores:   []store.Store{mem, mem},
		Payments: 500,
		Seed:     42,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("applied %d of %d, duplicates %d, lost %d\n", res.Applied, res.Payments, res.Duplicates, res.Lost)
	fmt.Printf("proxy: %d requests, %d reset before the handler, %d answers dropped after it\n",
		res.Proxy.Requests, res.Proxy.Resets, res.Proxy.Drops)
	fmt.Println("verdict:", res.Err())
	// Output:
	// applied 500 of 500, duplicates 0, lost 0
	// proxy: 710 requests, 71 reset before the handler, 139 answers dropped after it
	// verdict: <nil>
}
