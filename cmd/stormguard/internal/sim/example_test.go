package sim_test

import (
	"os"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// The experiment of the reference table in docs/backoff.md, full jitter
// only.
func ExampleJitter() {
	c := sim.DefaultJitterConfig()
	c.Strategies = []backoff.Strategy{backoff.FullJitter}
	r, err := sim.Jitter(c)
	if err != nil {
		panic(err)
	}
	r.WriteText(os.Stdout)
	// Output:
	// clients=1000 all fail at t=0, base=100ms cap=10000ms, window=50ms, seed=42
	//
	// full
	//   retry 1: occupied windows=4, peak retries in one window=277
	//   retry 2: occupied windows=12, peak retries in one window=147
	//   retry 3: occupied windows=26, peak retries in one window=72
	//   retry 4: occupied windows=52, peak retries in one window=48
}
