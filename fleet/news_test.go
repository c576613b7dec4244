package fleet

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// TestScriptPublishesOpening: a sync whose failures open the fleet's
// breaker publishes the opening on the fleet's channel, as "<epoch>
// <server time, µs> <host's key>"; a sync that opens nothing publishes
// nothing.
func TestScriptPublishesOpening(t *testing.T) {
	s := newLimitScript(t, 100)
	s.set.minCalls = 10
	ps := s.rc.Subscribe(context.Background(), s.key[:strings.Index(s.key, "}")+1]+"/open")
	defer ps.Close()
	if _, err := ps.Receive(context.Background()); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	if w := s.sync(t0, syncHost{successes: 5, failures: 4}); w.state != fleetClosed {
		t.Fatalf("opened at 4 failures of 9 calls (MinCalls 10)")
	}
	if w := s.sync(t0+1000, syncHost{failures: 6}); w.state != fleetOpen || w.epoch != 1 {
		t.Fatalf("after 10 failures of 15 calls: state %d epoch %d, want open, epoch 1", w.state, w.epoch)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := ps.ReceiveMessage(ctx)
	if err != nil {
		t.Fatalf("no opening published: %v", err)
	}
	if want := "1 " + strconv.FormatInt(t0+1000, 10) + " " + s.key; m.Payload != want {
		t.Fatalf("published %q, want %q", m.Payload, want)
	}
	s.sync(t0+2000, syncHost{failures: 6, seen: 1}) // open already: no news
	ctx2, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if m, err := ps.ReceiveMessage(ctx2); err == nil {
		t.Fatalf("a sync that opened nothing published %q", m.Payload)
	}
}

// fakeSync is a backend whose syncs succeed (the fleet's breaker closed,
// epoch 0, no rate) and which records the probe time each report to the
// rate carries; with probes, every probe round is granted (the fleet's
// breaker open, epoch 1).
type fakeSync struct {
	probes  bool
	mu      sync.Mutex
	probeUS []int64 // the probe times the reports to the rate carried (µs, > 0)
}

func (b *fakeSync) eval(_ context.Context, keys, args []string) ([]int64, error) {
	if args[0] == "p" && b.probes {
		return []int64{1, 1, fleetOpen, 1}, nil
	}
	if args[0] != "s" {
		return nil, errDown
	}
	// One host without returns: its ARGV from args[13], the limit's flag at args[19].
	if len(keys) == 1 && len(args) > 20 && args[18] == "0" && args[19] == "1" {
		if us, _ := strconv.ParseInt(args[len(args)-1], 10, 64); us > 0 {
			b.mu.Lock()
			b.probeUS = append(b.probeUS, us)
			b.mu.Unlock()
		}
	}
	out := []int64{1}
	for range keys {
		out = append(out, 0, 0, fleetClosed, 0, 0, 0, 0, 0)
	}
	return out, nil
}

// TestProbeTimeWithoutWaiters: a probe round granted while no call waits
// is taken by the next call, whenever it comes; the probe's time, which
// goes with the close to the fleet (a slow probe's close is refused), is
// that call's, from its attempt to the close, not zero (taken for a fast
// probe) nor from the grant.
func TestProbeTimeWithoutWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &fakeSync{probes: true}
		f := mustNew(t, be, Config{Name: "probe", SyncEvery: time.Hour, Limit: &limit.Config{},
			Breaker: breaker.Config{OpenFor: time.Second}})
		p := policy(t, f, "api", retry.WithMaxAttempts(1))
		time.Sleep(time.Millisecond)
		synctest.Wait()
		h := f.hostFor("api")
		h.brk.Trip(0)
		time.Sleep(3 * time.Second) // rounds due; no call waits
		err := p.Do(context.Background(), func(context.Context, int) error {
			time.Sleep(120 * time.Millisecond) // a slow host
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if st := h.brk.State(); st != breaker.Closed {
			t.Fatalf("the probe did not close the breaker: %v", st)
		}
		be.mu.Lock()
		got := be.probeUS
		be.mu.Unlock()
		if len(got) != 1 || got[0] != 120_000 {
			t.Fatalf("the close's report carried probe times %v µs, want [120000] (the probe's own)", got)
		}
	})
}

// TestSteerNewestOnly: news older than what the breaker last acted on is
// ignored (a sync's reply that left Redis before an opening the channel
// brought first must not close the breaker the opening tripped); newer
// news is acted on whatever its epoch; heard ignores messages it cannot
// parse, of other fleets, of hosts it does not track, and acts on the rest.
func TestSteerNewestOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := mustNew(t, &fakeSync{}, Config{Name: "steer", SyncEvery: time.Hour})
		if _, err := f.Guards("api"); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if !f.fleetMode() {
			t.Fatal("not in fleet mode")
		}
		h := f.hostFor("api")
		if !h.steer(fleetOpen, 5, 100) || h.brk.State() != breaker.Open {
			t.Fatal("an opening did not trip the breaker")
		}
		if h.steer(fleetClosed, 4, 90); h.brk.State() == breaker.Closed {
			t.Fatal("an older reply closed the breaker an opening tripped")
		}
		if h.steer(fleetClosed, 6, 110); h.brk.State() != breaker.Closed {
			t.Fatal("a newer close did not reset the breaker")
		}
		key := f.keyPrefix + "api"
		for _, p := range []string{"", "7", "7 200", "x 200 " + key, "7 x " + key, "-1 200 " + key,
			"7 200 stormguard:fleet:{other}:api", "7 200 " + f.keyPrefix + "web"} {
			f.heard(p)
			if h.brk.State() != breaker.Closed {
				t.Fatalf("%q tripped the breaker", p)
			}
		}
		// From the future (more than a minute past the newest reply): it
		// would make every reply until then ignored.
		f.heard("7 60000111 " + key)
		if h.brk.State() != breaker.Closed {
			t.Fatal("an opening a minute ahead tripped the breaker")
		}
		f.heard("7 200 " + key)
		if h.brk.State() != breaker.Open || f.news.Load() != 1 {
			t.Fatalf("a good opening: state %v, news %d", h.brk.State(), f.news.Load())
		}
		if h.steer(fleetClosed, 8, 300); h.brk.State() != breaker.Closed {
			t.Fatal("a newer reply did not close the breaker after the opening")
		}
	})
}

// FuzzHeard feeds arbitrary messages to heard: it never panics, and trips
// the breaker only for a message that names the tracked host's key.
func FuzzHeard(f *testing.F) {
	f.Add("1 100 stormguard:fleet:{fuzz}:api")
	f.Add("1 100 stormguard:fleet:{fuzz}:api ")
	f.Add("99999999999999999999 1 stormguard:fleet:{fuzz}:api")
	f.Add("")
	f.Fuzz(func(t *testing.T, payload string) {
		synctest.Test(t, func(t *testing.T) {
			fl := mustNew(t, &fakeSync{}, Config{Name: "fuzz", SyncEvery: time.Hour})
			if _, err := fl.Guards("api"); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			fl.heard(payload)
			if fl.hostFor("api").brk.State() != breaker.Closed && !strings.HasSuffix(payload, " "+fl.keyPrefix+"api") {
				t.Fatalf("%q tripped the breaker", payload)
			}
		})
	})
}

// TestOpeningHeardAtOnce: one process's failures open the fleet's breaker
// and another process, which syncs every hour, trips its own at once, on
// the fleet's channel, without a round trip of its own; on one Redis and
// on a Redis Cluster (the channel's hash tag is the fleet's: the script
// publishes on the master of the fleet's slot).
func TestOpeningHeardAtOnce(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		rc := redisClient(t)
		openingHeard(t, rc, func() redis.UniversalClient { return rc })
	})
	t.Run("cluster", func(t *testing.T) {
		redisAddr(t) // the same skip-or-require rule as every Redis test
		c := startRedisCluster(t)
		client := func() redis.UniversalClient {
			cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { cc.Close() })
			return cc
		}
		openingHeard(t, client(), client)
	})
}

func openingHeard(t *testing.T, rc redis.UniversalClient, client func() redis.UniversalClient) {
	cfg := Config{Name: uniqueName(t), SyncEvery: time.Hour, Timeout: 2 * time.Second, MinCalls: 10,
		Breaker: breaker.Config{MinCalls: 1 << 30}}
	cleanup(t, rc, cfg.Name)
	var fs []*Fleet
	for range 2 {
		f, err := New(client(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		fs = append(fs, f)
	}
	a, b := fs[0], fs[1]
	pa := policy(t, a, "api", retry.WithClassifier(always), retry.WithMaxAttempts(1))
	policy(t, b, "api")
	if !eventually(10*time.Second, func() bool { return subscribers(rc, b.newsChannel()) >= 2 }) {
		t.Fatal("the fleets did not subscribe to their channel")
	}
	syncs := b.syncs.Load()
	start := time.Now()
	for range 20 {
		_ = pa.Do(context.Background(), func(context.Context, int) error { return errDependency })
	}
	// The first failure started a sync at once, which may have carried
	// fewer than MinCalls of them (a loaded machine); the next is due in
	// an hour: flush the rest now.
	ha := a.hostFor("api")
	if !eventually(5*time.Second, func() bool {
		_ = a.sync(false)
		return ha.fleetState.Load() == fleetOpen
	}) {
		t.Fatal("20 failures did not open the fleet's breaker")
	}
	hb := b.hostFor("api")
	if !eventually(5*time.Second, func() bool { return hb.brk.State() != breaker.Closed }) {
		t.Fatalf("the other process's breaker did not trip (fleet state seen by the first: %d)", a.hostFor("api").fleetState.Load())
	}
	t.Logf("tripped %v after the first failure", time.Since(start))
	if got := b.syncs.Load(); got != syncs {
		t.Fatalf("the other process synced %d times: it should have heard on the channel", got-syncs)
	}
	if b.news.Load() != 1 {
		t.Fatalf("news heard %d, want 1", b.news.Load())
	}
}

// subscribers returns the subscribers of channel on every node of rc.
func subscribers(rc redis.UniversalClient, channel string) int64 {
	count := func(ctx context.Context, c *redis.Client) int64 {
		n, _ := c.PubSubNumSub(ctx, channel).Result()
		return n[channel]
	}
	switch c := rc.(type) {
	case *redis.Client:
		return count(context.Background(), c)
	case *redis.ClusterClient:
		var mu sync.Mutex
		var sum int64
		_ = c.ForEachShard(context.Background(), func(ctx context.Context, n *redis.Client) error {
			k := count(ctx, n)
			mu.Lock()
			sum += k
			mu.Unlock()
			return nil
		})
		return sum
	}
	return 0
}
