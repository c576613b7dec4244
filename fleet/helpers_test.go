package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/idempotency/storetest"
	"github.com/stormguard/stormguard/retry"
)

const redisAddrEnv = "STORMGUARD_REDIS_ADDR"

// redisAddr returns the address of the Redis the tests use, skipping t
// without one (failing it if STORMGUARD_REQUIRE_SERVICES=1).
func redisAddr(t testing.TB) string {
	t.Helper()
	return storetest.ServiceAddress(t, redisAddrEnv, "Redis", "127.0.0.1:6379")
}

// newClient returns a client of addr that gives up on a round trip at its
// context's deadline and does not retry by itself, closed with t.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, PoolSize: 32})
	t.Cleanup(func() { c.Close() })
	return c
}

// redisClient connects to the test Redis, and fails t if it does not
// answer.
func redisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := newClient(t, redisAddr(t))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s: %v", redisAddr(t), err)
	}
	return c
}

// uniqueName returns a fleet name no other test run uses.
func uniqueName(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "test-" + hex.EncodeToString(b[:])
}

// cleanup deletes the keys of fleet name when t ends.
func cleanup(t testing.TB, c redis.UniversalClient, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := c.Keys(ctx, keyPrefix+"{"+name+"}*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
}

// eventually polls cond every 5 ms until it holds or d has passed (real
// time: for tests where Redis is involved), and reports whether it held.
func eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// policy returns a retry policy on the fleet guards of host, with opts.
func policy(t testing.TB, f *Fleet, host string, opts ...retry.Option) *retry.Policy {
	t.Helper()
	g, err := f.Guards(host)
	if err != nil {
		t.Fatal(err)
	}
	p, err := retry.New(append([]retry.Option{retry.WithGuards(g)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// keepCalling starts n goroutines that call p.Do(op), each call with a
// timeout, over and over until the test ends (its cleanups run before
// those registered earlier, such as the fleets' Close).
func keepCalling(t testing.TB, p *retry.Policy, n int, timeout time.Duration, op func(context.Context, int) error) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		until(&wg, stop, func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			_ = p.Do(ctx, op)
			cancel()
		})
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// until runs fn over and over on a goroutine of wg until stop is closed.
func until(wg *sync.WaitGroup, stop <-chan struct{}, fn func()) {
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			fn()
		}
	})
}

// sumRing returns the requests and retries a fleet hash holds, in every
// slice.
func sumRing(h map[string]int64) (q, r int64) {
	for f, v := range h {
		switch {
		case strings.HasPrefix(f, "bq"):
			q += v
		case strings.HasPrefix(f, "br"):
			r += v
		}
	}
	return q, r
}

// mustNew builds a fleet on be, closed with t.
func mustNew(t testing.TB, be backend, c Config) *Fleet {
	t.Helper()
	f, err := newFleet(be, c)
	if err != nil {
		t.Fatalf("newFleet(%+v): %v", c, err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// hostBudget returns the fleet budget of host name (the Budget of its
// guards).
func (f *Fleet) hostBudget(name string) (*Budget, error) {
	h, err := f.host(name)
	if err != nil {
		return nil, err
	}
	return &h.budget, nil
}

// hostBreaker returns the breaker of host name (the Breaker of its guards).
func (f *Fleet) hostBreaker(name string) (*breaker.Breaker, error) {
	h, err := f.host(name)
	if err != nil {
		return nil, err
	}
	return h.brk, nil
}

// testStats is what the tests read of a Fleet: its Stats, its mode and
// the counters behind them.
type testStats struct {
	Stats
	Mode                             Mode
	ModeChanges, Syncs, SyncFailures int64
	LeaseCalls, ProbeCalls           int64
	Hosts                            int
}

// stats returns a snapshot of f's Stats and counters.
func (f *Fleet) stats() testStats {
	return testStats{Stats: f.Stats(), Mode: f.Mode(), ModeChanges: f.modeChanges.Load(),
		Syncs: f.syncs.Load(), SyncFailures: f.syncFailures.Load(),
		LeaseCalls: f.leaseCalls.Load(), ProbeCalls: f.probeCalls.Load(), Hosts: len(*f.list.Load())}
}

// hostStats is a snapshot of one host's share of the fleet.
type hostStats struct {
	// Requests and Retries are the fleet budget's window as of the last
	// reply from Redis (a sync or a lease), and Limit the retries it
	// allows: Ratio·Requests + the fleet's floor.
	Requests, Retries int64
	Limit             float64
	// Lease is the number of leased retries this process holds.
	Lease int64
	// Granted counts the retries leased to this process, Used those it
	// spent (in fleet mode), Returned those it gave back unused.
	Granted, Used, Returned int64
	// Breaker is the fleet breaker's state (Closed or Open) and Epoch its
	// number of state changes, as of the last reply; Calls and Failures
	// its window.
	Breaker         breaker.State
	Epoch           int64
	Calls, Failures int64
	// ProbeRounds counts the probe rounds the fleet granted this process.
	ProbeRounds int64
}

// hostStats returns a snapshot of host name's fleet state, and false if f
// does not track the host.
func (f *Fleet) hostStats(name string) (hostStats, bool) {
	f.mu.Lock()
	h := f.hosts[name]
	f.mu.Unlock()
	if h == nil {
		return hostStats{}, false
	}
	s := hostStats{
		Requests: h.fleetRequests.Load(), Retries: h.fleetRetries.Load(),
		Lease:   h.lease.left(f.since()),
		Granted: h.granted.Load(), Used: h.used.Load(), Returned: h.returnedN.Load(),
		Breaker: breaker.Closed, Epoch: h.fleetEpoch.Load(),
		Calls: h.fleetCalls.Load(), Failures: h.fleetFailures.Load(),
		ProbeRounds: h.probeRounds.Load(),
	}
	s.Limit = float64(f.set.ratio*float64(s.Requests)) + f.set.reserve
	if h.fleetState.Load() == fleetOpen {
		s.Breaker = breaker.Open
	}
	return s, true
}
