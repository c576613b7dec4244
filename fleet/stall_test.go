package fleet

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// TestScriptStallOpens drives the script's stall rule at explicit times:
// with 4500 requests in the budget's window of 10 s (450 a second) and a
// stall threshold of 160 ms, the span is 160 ms and the fleet's breaker
// opens at the 9th unanswered attempt reported in it (an eighth of the
// 72 the fleet starts in a span), not at the 8th; reports further apart
// than a span never add up; a report of an epoch the fleet has left does
// not count; and the opening is published on the fleet's channel.
func TestScriptStallOpens(t *testing.T) {
	const after = 160_000 // µs
	stall := func(s *limitScript, now, n, seen int64) hostWindow {
		t.Helper()
		return s.sync(now, syncHost{stalled: n, stallAfter: after, stallAge: after, answerAge: -1, seen: seen})
	}
	// steady sets the rate's state of a warm fleet whose last window was
	// clean: stalls count only then.
	steady := func(s *limitScript) {
		t.Helper()
		if err := s.rc.HSet(context.Background(), s.key, "rw", 1, "rc", 1).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("not in a release or a slow start", func(t *testing.T) {
		for _, f := range []string{"rw", "rc", "zw"} {
			s := newLimitScript(t, 100)
			s.sync(t0, syncHost{requests: 4500, answerAge: 200_000})
			steady(s)
			v := 0
			if f == "zw" { // a backlog: calls waiting, more than a tenth of the 450 served
				s.rc.HSet(context.Background(), s.key, "zd", 450)
				v = 46
			}
			s.rc.HSet(context.Background(), s.key, f, v)
			if w := stall(s, t0+1000, 100, 0); w.state != fleetClosed {
				t.Fatalf("%s 0: 100 stalled attempts opened the breaker", f)
			}
		}
	})
	t.Run("an eighth of a span's attempts", func(t *testing.T) {
		s := newLimitScript(t, 100)
		ps := s.rc.Subscribe(context.Background(), s.key[:strings.Index(s.key, "}")+1]+"/open")
		defer ps.Close()
		if _, err := ps.Receive(context.Background()); err != nil { // the subscription's confirmation
			t.Fatal(err)
		}
		s.sync(t0, syncHost{requests: 4500, answerAge: 200_000})
		steady(s)
		for i := range int64(8) {
			if w := stall(s, t0+1000+i*1000, 1, 0); w.state != fleetClosed {
				t.Fatalf("opened at the %dth stalled attempt of a span, want the 9th", i+1)
			}
		}
		w := stall(s, t0+20_000, 1, 0)
		if w.state != fleetOpen || w.epoch != 1 {
			t.Fatalf("after 9 stalled attempts in a span: state %d epoch %d, want open, epoch 1", w.state, w.epoch)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		m, err := ps.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("no opening published: %v", err)
		}
		if want := "1 " + strconv.FormatInt(t0+20_000, 10) + " " + s.key; m.Payload != want {
			t.Fatalf("published %q, want %q", m.Payload, want)
		}
		// Open: stalls no longer count, and a stale epoch's never did.
		if w := stall(s, t0+30_000, 100, 0); w.state != fleetOpen || w.epoch != 1 {
			t.Fatalf("a stale report moved the breaker: state %d epoch %d", w.state, w.epoch)
		}
	})
	t.Run("answered since", func(t *testing.T) {
		s := newLimitScript(t, 100)
		s.sync(t0, syncHost{requests: 4500, answerAge: 500_000})
		steady(s)
		// Another process heard an answer 100 ms ago: the host answers,
		// and attempts unanswered for 160 ms are slow, not stalled.
		s.sync(t0+1000, syncHost{answerAge: 100_000})
		for i := range int64(40) {
			if w := stall(s, t0+2000+i*1000, 1, 0); w.state != fleetClosed {
				t.Fatalf("opened by attempts that started before an answer (report %d)", i+1)
			}
		}
		// 150 ms on, the answer is older than the stalled attempts.
		for i := range int64(9) {
			stall(s, t0+150_000+i*1000, 1, 0)
		}
		if w := stall(s, t0+170_000, 1, 0); w.state != fleetOpen {
			t.Fatalf("attempts that started after the last answer did not open the breaker")
		}
	})
	t.Run("no recent answer", func(t *testing.T) {
		// The last answer the fleet heard of is 3 spans and more old (as
		// after an outage, before the processes report the release's
		// answers): it cannot tell a hang from a queue; stalls wait.
		s := newLimitScript(t, 100)
		s.sync(t0, syncHost{requests: 4500, answerAge: 500_000})
		steady(s)
		for i := range int64(40) {
			if w := stall(s, t0+1000+i*1000, 1, 0); w.state != fleetClosed {
				t.Fatalf("opened with the last answer %d µs old", 501_000+i*1000)
			}
		}
	})
	t.Run("one process's many", func(t *testing.T) {
		s := newLimitScript(t, 100)
		s.sync(t0, syncHost{requests: 4500, answerAge: 200_000})
		steady(s)
		if w := stall(s, t0+1000, 9, 0); w.state != fleetOpen {
			t.Fatalf("9 unanswered attempts in one report: state %d, want open", w.state)
		}
	})
	t.Run("spread out", func(t *testing.T) {
		s := newLimitScript(t, 100)
		s.sync(t0, syncHost{requests: 4500, answerAge: 200_000})
		steady(s)
		for i := range int64(40) {
			now := t0 + 1000 + i*(after+1000)/2*3
			s.sync(now, syncHost{answerAge: 170_000}) // the host answered just before: the fleet knows it
			if w := stall(s, now, 8, 0); w.state != fleetClosed {
				t.Fatalf("opened by reports a span and a half apart (report %d)", i+1)
			}
		}
	})
	t.Run("at least 3", func(t *testing.T) {
		s := newLimitScript(t, 100)
		s.sync(t0, syncHost{requests: 10, answerAge: 200_000}) // 1 a second: a quarter of a span's is nothing
		steady(s)
		stall(s, t0+1000, 1, 0)
		if w := stall(s, t0+2000, 1, 0); w.state != fleetClosed {
			t.Fatalf("opened at 2 stalled attempts")
		}
		if w := stall(s, t0+3000, 1, 0); w.state != fleetOpen {
			t.Fatalf("not open at 3 stalled attempts")
		}
	})
}

// fakeSync is a backend whose syncs succeed with a baseline of 20 ms for
// every host (the fleet's breaker closed, epoch 0, no rate), and which
// records the stall each sync reports for its first host.
type fakeSync struct {
	probes  bool // grant every probe round ("p"), the fleet's breaker open
	mu      sync.Mutex
	stalls  [][2]int64 // unanswered attempts, threshold (µs)
	probeUS []int64    // the probe times the reports to the rate carried
}

func (b *fakeSync) eval(_ context.Context, keys, args []string) ([]int64, error) {
	if args[0] == "p" && b.probes {
		return []int64{1, 1, fleetOpen, 1}, nil // a round granted, the fleet open (epoch 1)
	}
	if args[0] != "s" {
		return nil, errDown
	}
	var n, after int64
	if len(keys) > 0 {
		n, _ = strconv.ParseInt(args[19], 10, 64)
		after, _ = strconv.ParseInt(args[20], 10, 64)
	}
	if len(keys) == 1 && len(args) > 24 && args[18] == "0" && args[23] == "1" { // no returns, a report to the rate
		if us, _ := strconv.ParseInt(args[len(args)-1], 10, 64); us > 0 {
			b.mu.Lock()
			b.probeUS = append(b.probeUS, us)
			b.mu.Unlock()
		}
	}
	if n > 0 {
		b.mu.Lock()
		b.stalls = append(b.stalls, [2]int64{n, after})
		b.mu.Unlock()
	}
	out := []int64{1}
	for range keys {
		out = append(out, 0, 0, fleetClosed, 0, 0, 0, 0, 0, 20_000)
	}
	return out, nil
}

func (b *fakeSync) reported() [][2]int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([][2]int64(nil), b.stalls...)
}

// TestStallWatch: with a baseline of 20 ms the watch's threshold is
// 120 ms; an attempt unanswered that long is reported once, by a sync at
// once (the fleet syncs every hour here), with the attempts unanswered
// since; an answer before the threshold, or a breaker that is not closed,
// reports nothing; after an answer the next stall is reported again; half
// of Limit.Timeout caps the threshold.
func TestStallWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &fakeSync{}
		f := mustNew(t, be, Config{Name: "stall", SyncEvery: time.Hour, Limit: &limit.Config{}})
		g, err := f.Guards("api")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond) // the new host's first sync: the baseline
		synctest.Wait()
		h := f.hostFor("api")
		if got := time.Duration(h.stallAfter.Load()); got != 120*time.Millisecond {
			t.Fatalf("threshold %v, want 120ms (6 x the 20 ms baseline)", got)
		}
		// Answered in time: nothing.
		g.Budget.Deposit()
		time.Sleep(110 * time.Millisecond)
		h.Outcome(true)
		time.Sleep(time.Second)
		synctest.Wait()
		if r := be.reported(); len(r) != 0 {
			t.Fatalf("an attempt answered in 110 ms reported as stalled: %v", r)
		}
		// Three attempts, none answered: one report at 120 ms, with 3.
		g.Budget.Deposit()
		time.Sleep(50 * time.Millisecond)
		g.Budget.Deposit()
		g.Budget.Deposit()
		time.Sleep(69 * time.Millisecond)
		synctest.Wait()
		if r := be.reported(); len(r) != 0 {
			t.Fatalf("reported at 119 ms: %v", r)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if r := be.reported(); len(r) != 1 || r[0] != [2]int64{3, 120_000} {
			t.Fatalf("reported %v, want one stall of 3 attempts at 120000 µs", r)
		}
		time.Sleep(time.Second)
		g.Budget.Deposit()
		time.Sleep(time.Second)
		synctest.Wait()
		if r := be.reported(); len(r) != 1 {
			t.Fatalf("one stall reported %d times: %v", len(r), r)
		}
		// An answer ends it; the next is reported again.
		h.Outcome(false)
		g.Budget.Deposit()
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		if r := be.reported(); len(r) != 2 || r[1][0] != 1 {
			t.Fatalf("after an answer: reported %v, want a second stall of 1", r)
		}
		// Not closed: nothing.
		h.Outcome(true)
		h.brk.Trip(0)
		g.Budget.Deposit()
		time.Sleep(time.Second)
		synctest.Wait()
		if r := be.reported(); len(r) != 2 {
			t.Fatalf("a stall reported while the breaker is open: %v", r)
		}
		if h.brk.State() == breaker.Closed {
			t.Fatal("the breaker closed")
		}
	})
	synctest.Test(t, func(t *testing.T) {
		f := mustNew(t, &fakeSync{}, Config{Name: "stall", SyncEvery: time.Hour, Limit: &limit.Config{Timeout: 200 * time.Millisecond}})
		if _, err := f.Guards("api"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if got := time.Duration(f.hostFor("api").stallAfter.Load()); got != 100*time.Millisecond {
			t.Fatalf("threshold %v with Limit.Timeout 200ms, want 100ms", got)
		}
	})
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
		f.heard("7 200 " + key)
		if h.brk.State() != breaker.Open || f.news.Load() != 1 {
			t.Fatalf("a good opening: state %v, news %d", h.brk.State(), f.news.Load())
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

// TestHangIsNews runs ten processes of a fleet with a limit on Redis,
// each starting a call to a dependency every 10 ms (whatever the calls in
// flight, as terminals do), with a 3 s attempt timeout. Once the fleet
// knows its baseline, the dependency hangs (every attempt waits until the
// test ends the hang): every process's breaker trips long before the
// first attempt times out, the fleet's breaker opened by the processes'
// stall reports (not by failures), and the attempts that met the hang are
// fewer than a third of a second of calls (before the stall reports, the
// fleet learned of a hang from the timeouts: 3 s of calls, up to the
// limiters' limits).
func TestHangIsNews(t *testing.T) {
	rc := redisClient(t)
	cfg := Config{Name: uniqueName(t), SyncEvery: 250 * time.Millisecond, Timeout: 2 * time.Second,
		Limit: &limit.Config{Max: 64}, Breaker: breaker.Config{Window: 2 * time.Second, MinCalls: 1 << 30}}
	cleanup(t, rc, cfg.Name)
	fs := newFleets(t, rc, 10, cfg)
	var hung atomic.Bool
	var intoHang atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	op := func(ctx context.Context, _ int) error {
		if hung.Load() {
			intoHang.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		time.Sleep(2 * time.Millisecond)
		return nil
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, f := range fs {
		p := policy(t, f, "api", retry.WithClassifier(always), retry.WithMaxAttempts(2), retry.WithAttemptTimeout(3*time.Second))
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_ = p.Do(ctx, op)
					cancel()
				})
			}
		})
	}
	t.Cleanup(func() { close(stop); once.Do(func() { close(release) }); wg.Wait() })
	h0 := fs[0].hostFor("api")
	if !eventually(20*time.Second, func() bool { return h0 != nil && h0.stallAfter.Load() > 0 }) {
		t.Fatal("no baseline learned from the fast calls")
	}
	time.Sleep(time.Second)
	hung.Store(true)
	start := time.Now()
	allOpen := func() bool {
		for _, f := range fs {
			if f.hostFor("api").brk.State() == breaker.Closed {
				return false
			}
		}
		return true
	}
	if !eventually(10*time.Second, allOpen) {
		t.Fatal("the breakers did not all trip during the hang")
	}
	took := time.Since(start)
	var stalls, news int64
	for _, f := range fs {
		stalls += f.hostFor("api").stalls.Load()
		news += f.news.Load()
	}
	t.Logf("threshold %v; every breaker open %v into the hang; %d attempts met the hang; %d stall reports, %d openings heard",
		time.Duration(h0.stallAfter.Load()), took, intoHang.Load(), stalls, news)
	if took >= 3*time.Second {
		t.Errorf("the breakers tripped %v into the hang: not before the attempt timeout (3 s)", took)
	}
	if stalls == 0 {
		t.Errorf("no stall reported")
	}
	// Ten processes, a call every 10 ms each: 1000 calls a second.
	if n := intoHang.Load(); n > 330 {
		t.Errorf("%d attempts met the hang, more than a third of a second of calls", n)
	}
}
