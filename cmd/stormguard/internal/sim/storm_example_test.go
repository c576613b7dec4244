package sim_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// Gateway -> Orders -> Payments -> Bank API, three tries at each layer,
// against a bank that keeps failing.
func ExampleLayers() {
	r, err := sim.Layers(sim.DefaultLayersConfig())
	if err != nil {
		panic(err)
	}
	for _, row := range r.Rows {
		fmt.Printf("%d layers: naive %d, don't-retry signal %d, budget at every layer %.2fx, signal+budget %.2fx\n",
			row.Layers, row.Naive, row.Signal, row.Budget, row.SignalBudget)
	}
	// Output:
	// 1 layers: naive 3, don't-retry signal 3, budget at every layer 1.10x, signal+budget 1.10x
	// 2 layers: naive 9, don't-retry signal 3, budget at every layer 1.21x, signal+budget 1.10x
	// 3 layers: naive 27, don't-retry signal 3, budget at every layer 1.33x, signal+budget 1.10x
	// 4 layers: naive 81, don't-retry signal 3, budget at every layer 1.47x, signal+budget 1.10x
}

// Ten clients update one row at once with no network variance and no
// backoff: every round is a dead heat that one client wins, so the writes
// add up to 10 + 9 + ... + 1 = 55 in ten rounds of four 10 ms hops.
func ExampleContention() {
	c := sim.DefaultContentionConfig()
	c.Clients = []int{10}
	c.Runs = 1
	c.DelayStdDev = 0
	c.Strategies = []sim.ContentionStrategy{sim.ContentionNone}
	r, err := sim.Contention(c)
	if err != nil {
		panic(err)
	}
	p := r.Series[0].Points[0]
	fmt.Printf("%v: %d clients, %.0f write calls, done after %v\n", r.Series[0].Strategy, p.Clients, p.Calls, p.Completion.Round(time.Millisecond))
	// Output:
	// none: 10 clients, 55 write calls, done after 400ms
}
