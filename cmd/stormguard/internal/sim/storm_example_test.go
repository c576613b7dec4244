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

// The outage story: a provider that returns 503 for ten seconds (from t=5 s
// to t=15 s) to a fleet sending 80% of its capacity, once per retry policy
// (the default run of stormguard sim outage). Waiting behind the breaker
// alone keeps the provider's queue full after the outage (its release
// goes at the rate before the trip, on top of the new load); with the
// concurrency limiter, the last row, the fleet sends what the provider
// serves and gets every request of the outage served.
func ExampleOutage() {
	c := sim.DefaultOutageConfig()
	r, err := sim.Outage(c)
	if err != nil {
		panic(err)
	}
	for _, p := range r.Policies {
		recovered := "never"
		if p.Recovered {
			recovered = "+" + p.RecoverAfter.String()
		}
		fmt.Printf("%-42s peak %4d per %v, %.2fx offered during the outage, %3.0f%% of its requests served, recovered %s\n",
			p.Policy.Name, p.Peak, c.Window, p.OutageAmplification, 100*p.OutageGoodput, recovered)
	}
	// Output:
	// fixed-1s                                   peak 1639 per 100ms, 5.43x offered during the outage,  13% of its requests served, recovered never
	// fixed-1s+budget                            peak  187 per 100ms, 1.11x offered during the outage,   0% of its requests served, recovered +0s
	// exponential                                peak  280 per 100ms, 2.91x offered during the outage,   6% of its requests served, recovered +0s
	// full                                       peak  292 per 100ms, 2.96x offered during the outage,   3% of its requests served, recovered +0s
	// full+budget                                peak  201 per 100ms, 1.11x offered during the outage,   0% of its requests served, recovered +0s
	// full+budget+breaker                        peak  106 per 100ms, 0.03x offered during the outage,   0% of its requests served, recovered +800ms
	// full+budget+breaker+retry-after            peak  104 per 100ms, 0.02x offered during the outage,   0% of its requests served, recovered +3.8s
	// full+budget+breaker+retry-after+wait       peak  215 per 100ms, 0.02x offered during the outage,  60% of its requests served, recovered never
	// fleet+retry-after+wait                     peak  298 per 100ms, 0.10x offered during the outage,  35% of its requests served, recovered never
	// full+budget+breaker+retry-after+wait+limit peak  158 per 100ms, 0.02x offered during the outage, 100% of its requests served, recovered +0s
}
