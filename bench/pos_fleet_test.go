package bench

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/bench/internal/live"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/limit"
)

// posFleetSetup is the row of stormguard per terminal with the budget and
// breaker of package fleet: each terminal's transport has a fleet of its
// own (as each device would run its own process), all of them sharing the
// Redis at STORMGUARD_REDIS_ADDR under one fleet name per run. The
// transports take the same options as the other stormguard rows; the
// breaker's configuration, which the fleet builds, gets the same 2 s window;
// opts are added after those options. Without STORMGUARD_REDIS_ADDR the row
// is left out.
func posFleetSetup(keys *live.Keys, opts ...httpretry.Option) (posSetup, bool) {
	return posFleetSetupLimit(keys, nil, opts...)
}

// posFleetSetupLimit is posFleetSetup with fleet.Config.Limit set to lim
// (nil: none): the fleet-wide concurrency limit shared through Redis.
func posFleetSetupLimit(keys *live.Keys, lim *limit.Config, opts ...httpretry.Option) (posSetup, bool) {
	addr := os.Getenv("STORMGUARD_REDIS_ADDR")
	if addr == "" {
		return posSetup{}, false
	}
	name, limited := "stormguard per terminal + fleet (Redis)", ""
	if lim != nil {
		name, limited = "stormguard per terminal + fleet + limit (Redis)", "Limit &limit.Config{} (a fleet-wide limit shared through Redis), "
	}
	return posSetup{
		name: name,
		how: "httpretry.NewTransport(base, options, httpretry.WithGuards(f.Guards)) per terminal, f a fleet.New of its own " +
			"(posFleetConfig: one fleet name per run, breaker window 2 s, sync every 1 s within 1 s, " + limited + "other fields default: " +
			"one probe call per round, 3 rounds per second for the whole fleet) " +
			"over one shared go-redis client (a pool of 200 connections) to " + addr,
		prepare: func(base http.RoundTripper, url string) (func(int) live.Call, func() string) {
			client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: posFleetPool})
			name := "pos-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			var mu sync.Mutex
			var fleets []*fleet.Fleet
			tl := newFleetTimeline()
			done := func() string {
				tl.stop()
				mu.Lock()
				defer mu.Unlock()
				var st fleet.Stats
				local := 0
				var errs []error
				for _, f := range fleets {
					fs := f.Stats()
					st.RoundTrips += fs.RoundTrips
					st.Failures += fs.Failures
					st.MaxRoundTrip = max(st.MaxRoundTrip, fs.MaxRoundTrip)
					if f.Mode() != fleet.ModeFleet {
						local++
					}
					errs = append(errs, f.Close())
				}
				ps := client.PoolStats()
				errs = append(errs, client.Close())
				if err := errors.Join(errs...); err != nil {
					fmt.Fprintln(os.Stderr, "bench: closing the POS fleets:", err)
				}
				return tl.String() + fmt.Sprintf("%d fleets: %d round trips (syncs, leases, probe rounds), %d failed or late; %d in local mode at the end; longest round trip %v; "+
					"the shared go-redis pool: %d connections at most, %d waits for one (%v in all), %d timed out waiting, %d new",
					len(fleets), st.RoundTrips, st.Failures, local, st.MaxRoundTrip.Round(time.Millisecond),
					client.Options().PoolSize, ps.WaitCount, time.Duration(ps.WaitDurationNs).Round(time.Millisecond), ps.Timeouts, ps.Misses)
			}
			return func(int) live.Call {
				cfg := posFleetConfig(name)
				cfg.Limit = lim
				f, err := fleet.New(client, cfg)
				if err != nil {
					return failing(err)
				}
				g, err := f.Guards(strings.ToLower(strings.TrimPrefix(url, "http://")))
				if err != nil {
					return failing(err)
				}
				b := g.Breaker
				mu.Lock()
				fleets = append(fleets, f)
				mu.Unlock()
				tl.add(b)
				t, err := httpretry.NewTransport(base, append(append(posStormguardOptions(), opts...), httpretry.WithGuards(f.Guards))...)
				if err != nil {
					return failing(err)
				}
				return live.Payment(&http.Client{Transport: t}, url, keys)
			}, done
		},
		stormguard: true,
	}, true
}

// posFleetConfig is the configuration of each terminal's fleet: the
// package's defaults except the breaker's window (2 s, as in the other
// stormguard rows), and a sync every second with a 1 s timeout instead of
// every 100 ms within 100 ms: the 1000 fleets of this scenario share one
// process and two cores with the provider and the other terminals, where
// 10,000 syncs a second do not finish in time and every fleet keeps
// falling back to local mode.
//
// STORMGUARD_LIVE_FLEET_SYNC (a Go duration, e.g. 250ms) replaces the
// sync period, to measure what the fleet's reaction time costs; a value
// that does not parse as a positive duration is ignored.
func posFleetConfig(name string) fleet.Config {
	every := time.Second
	if d, err := time.ParseDuration(os.Getenv("STORMGUARD_LIVE_FLEET_SYNC")); err == nil && d > 0 {
		every = d
	}
	return fleet.Config{
		Name:      name,
		SyncEvery: every,
		Timeout:   time.Second,
		Breaker:   breaker.Config{Window: 2 * time.Second},
	}
}

// fleetTimeline samples, every 500 ms from the first terminal's breaker
// on, how many terminals' breakers are in each state and how many calls
// wait behind them: whether the terminals follow the fleet's breaker (after
// an outage, a terminal left open holds its payments until their
// deadline, which the provider's counts do not show). Time zero is when the
// last terminal was built (the run starts right after).
type fleetTimeline struct {
	mu      sync.Mutex
	brks    []*breaker.Breaker
	zero    time.Time
	samples []fleetSample
	quit    chan struct{}
	ended   chan struct{}
	once    sync.Once
}

// fleetSample is one sample: the terminals' breakers by state, and the
// calls waiting behind them.
type fleetSample struct {
	at                     time.Time
	closed, halfOpen, open int
	waiting                int
}

// newFleetTimeline returns a timeline that samples nothing until add.
func newFleetTimeline() *fleetTimeline {
	return &fleetTimeline{quit: make(chan struct{}), ended: make(chan struct{})}
}

// add tracks one more terminal's breaker, and starts sampling with the
// first.
func (tl *fleetTimeline) add(b *breaker.Breaker) {
	tl.mu.Lock()
	tl.brks = append(tl.brks, b)
	tl.zero = time.Now()
	first := len(tl.brks) == 1
	tl.mu.Unlock()
	if first {
		go tl.run()
	}
}

// run samples every 500 ms until stop.
func (tl *fleetTimeline) run() {
	defer close(tl.ended)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-tl.quit:
			return
		case now := <-t.C:
			tl.mu.Lock()
			brks := tl.brks
			tl.mu.Unlock()
			s := fleetSample{at: now}
			for _, b := range brks {
				sn := b.Snapshot()
				switch sn.State {
				case breaker.Closed:
					s.closed++
				case breaker.HalfOpen:
					s.halfOpen++
				default:
					s.open++
				}
				s.waiting += sn.Waiters
			}
			tl.mu.Lock()
			tl.samples = append(tl.samples, s)
			tl.mu.Unlock()
		}
	}
}

// stop ends the sampling.
func (tl *fleetTimeline) stop() {
	tl.once.Do(func() {
		close(tl.quit)
		tl.mu.Lock()
		started := len(tl.brks) > 0
		tl.mu.Unlock()
		if started {
			<-tl.ended
		}
	})
}

// String returns the samples from 14 s of the run to its end: time, open /
// half-open / closed terminal breakers, calls waiting behind them (a
// sample like the one before it is left out).
func (tl *fleetTimeline) String() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var b strings.Builder
	b.WriteString("terminal breakers (s: open/half-open/closed, waiting):")
	var last fleetSample
	for _, s := range tl.samples {
		at := s.at.Sub(tl.zero)
		if at < 14*time.Second || (s.open == last.open && s.halfOpen == last.halfOpen && s.waiting == last.waiting) {
			continue
		}
		last = s
		fmt.Fprintf(&b, " %.1f: %d/%d/%d, %d;", at.Seconds(), s.open, s.halfOpen, s.closed, s.waiting)
	}
	return b.String() + "\n\n"
}

// posFleetPool is the connection pool of the go-redis client the 1000
// fleets share: real terminals each have a client and a connection of
// their own; one pool of go-redis's default size (20 on two cores) made
// every round trip wait for a connection (tens of milliseconds on
// average), so that the fleet's counts of attempts in flight lagged the
// terminals' by that much.
const posFleetPool = 200
