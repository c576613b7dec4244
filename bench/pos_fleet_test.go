package bench

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/internal/sim/live"
)

// posFleetSetup is the row of stormguard per terminal with the budget and
// breaker of package fleet: each terminal's transport has a fleet of its
// own (as each device would run its own process), all of them sharing the
// Redis at STORMGUARD_REDIS_ADDR under one fleet name per run. The
// transports take the same options as the other stormguard rows; the
// breaker's configuration, which the fleet builds, gets the same 2 s window.
// Without STORMGUARD_REDIS_ADDR the row is left out.
func posFleetSetup(keys *live.Keys) (posSetup, bool) {
	addr := os.Getenv("STORMGUARD_REDIS_ADDR")
	if addr == "" {
		return posSetup{}, false
	}
	return posSetup{
		name: "stormguard per terminal + fleet (Redis)",
		how: "httpretry.NewTransport(base, options, httpretry.WithGuards(f.Guards)) per terminal, f a fleet.New of its own " +
			"(fleet.Config{Name: one per run, Breaker: breaker.Config{Window: 2 s}}, other fields default: sync every 100 ms) " +
			"over one shared go-redis client to " + addr,
		prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func()) {
			client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
			name := "pos-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			var mu sync.Mutex
			var fleets []*fleet.Fleet
			done := func() {
				mu.Lock()
				defer mu.Unlock()
				var errs []error
				for _, f := range fleets {
					errs = append(errs, f.Close())
				}
				errs = append(errs, client.Close())
				if err := errors.Join(errs...); err != nil {
					fmt.Fprintln(os.Stderr, "bench: closing the POS fleets:", err)
				}
			}
			return func(int) live.Call {
				f, err := fleet.New(client, fleet.Config{Name: name, Breaker: breaker.Config{Window: 2 * time.Second}})
				if err != nil {
					return failing(err)
				}
				mu.Lock()
				fleets = append(fleets, f)
				mu.Unlock()
				t, err := httpretry.NewTransport(base, append(posStormguardOptions(), httpretry.WithGuards(f.Guards))...)
				if err != nil {
					return failing(err)
				}
				return live.Payment(&http.Client{Transport: t}, url, keys)
			}, done
		},
		stormguard: true,
	}, true
}
