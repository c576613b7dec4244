// Black-box attacks with extreme and hostile configuration and input
// values: Config at its edges, odd fleet names and host names (braces,
// the key separator, spaces, unicode, empty, huge), on a real Redis.

package fleet_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
)

const ex2X2Addr = "127.0.0.1:6379"

// ex2X2Client returns a client of the local Redis, or skips the test.
func ex2X2Client(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: ex2X2Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv("STORMGUARD_REQUIRE_SERVICES") == "1" {
			t.Fatalf("no redis at %s and STORMGUARD_REQUIRE_SERVICES=1: %v", ex2X2Addr, err)
		}
		t.Skip("no redis at", ex2X2Addr, err)
	}
	return c
}

// ex2X2Tag returns a random tag for this test's fleet names.
func ex2X2Tag() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "ex2x2-" + hex.EncodeToString(b[:])
}

// ex2X2Keys returns the documented keys of host in fleet name: its hash
// and its registry.
func ex2X2Keys(name, host string) []string {
	return []string{"stormguard:fleet:{" + name + "}:" + host, "stormguard:fleet:{" + name + "}/r:" + host}
}

// ex2X2Cleanup deletes the documented keys of every (name, host) given,
// at the end of the test.
func ex2X2Cleanup(t *testing.T, c *redis.Client, name string, hosts ...string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, h := range hosts {
			c.Del(ctx, ex2X2Keys(name, h)...)
		}
	})
}

func ex2X2New(t *testing.T, c redis.UniversalClient, cfg fleet.Config) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatalf("New(%q...): %v", cfg.Name, err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func ex2X2Eventually(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// Odd fleet names and host names. Config.Name: "It must not be empty and
// must not contain '{' or '}' ... A host's key is "stormguard:fleet:{" +
// Name + "}:" + host"; the package doc: "with Config.Limit, the host's
// registry of processes is a second hash, "stormguard:fleet:{" + Name +
// "}/r:" + host ... (no host's key is another host's registry, whatever
// the host names)". Every (name, host) pair gets its own budget: a floor
// of one retry per window each, spent once, refused the second time,
// whatever the other pairs did; the keys are the documented ones.
func TestAttackExtremes2OddNamesAndHostsNeverCollide(t *testing.T) {
	c := ex2X2Client(t)
	tag := ex2X2Tag()
	names := []string{"", ":", "a:", "a:b", "a b", " ", "/r", "/r:", "a/r:x", "名前", "\x00", "\xff\xfe", "a\nb", "*?[", "%s%d", strings.Repeat("n", 64<<10)}
	hosts := []string{"", ":", "::", "}", "}:", "{", "{x}", "{}", "a b", "/r:x", "x/r:y", "r:x", "ü", "\x00", "a\nb",
		"host:443", "host", "x}:/r:y", strings.Repeat("h", 1<<20)}
	cfg := fleet.Config{SyncEvery: time.Hour, Timeout: 5 * time.Second, Limit: &limit.Config{},
		Budget: budget.Config{Ratio: -1, MinPerSecond: 0.1, Window: 10 * time.Second}}
	type pair struct{ name, host string }
	var gs = map[pair]*fleet.Budget{}
	var fleets []*fleet.Fleet
	for _, n := range names {
		name := tag + n
		cfg.Name = name
		ex2X2Cleanup(t, c, name, hosts...)
		f := ex2X2New(t, c, cfg)
		if f.Mode() != fleet.ModeFleet {
			t.Fatalf("name %q: mode %v: %v", n, f.Mode(), f.Stats().LastError)
		}
		fleets = append(fleets, f)
		for _, h := range hosts {
			g, err := f.Guards(h)
			if err != nil {
				t.Fatalf("name %q host %.20q: %v", n, h, err)
			}
			gs[pair{name, h}] = g.Budget.(*fleet.Budget)
		}
	}
	// First withdrawal of every pair: the pair's floor of one.
	for p, b := range gs {
		if !b.Withdraw() {
			t.Errorf("name %.20q host %.20q: the first retry of its own floor refused (stats %+v): its window is another pair's", p.name, p.host, b.Stats())
		}
	}
	for p, b := range gs {
		if b.Withdraw() {
			t.Errorf("name %.20q host %.20q: a second retry granted beyond a floor of one", p.name, p.host)
		}
	}
	for _, f := range fleets {
		if f.Mode() != fleet.ModeFleet {
			t.Errorf("mode %v: %v", f.Mode(), f.Stats().LastError)
		}
		if err := f.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	}
	ctx := context.Background()
	for p := range gs {
		k := ex2X2Keys(p.name, p.host)
		if n, err := c.Exists(ctx, k...).Result(); err != nil || n != 1 {
			// The host's hash exists; the registry is left by Close (the
			// final report removes the process), so only the hash counts.
			if n2, _ := c.Exists(ctx, k[0]).Result(); n2 != 1 {
				t.Errorf("name %.20q host %.20q: documented key %.60q missing (%d, %v)", p.name, p.host, k[0], n, err)
			}
		}
	}
}

// News on a channel with hostile host names: "An opening of a host's
// breaker ... is published ... as "<epoch> <server time, µs> <host's
// key>" ... trips the breaker of a host it tracks when it hears its
// opening". A host name with spaces, the separator "}:", braces and a
// newline is heard; a host whose name is a prefix of it, or equal but for
// its tail, is not tripped.
func TestAttackExtremes2NewsForHostileHostNames(t *testing.T) {
	c := ex2X2Client(t)
	name := ex2X2Tag() + " odd:name"
	odd := "a b}: c\n{d} 1 2 "
	others := []string{"a b", "a b}: c", "a b}: c\n{d} 1 2", "", " "}
	ex2X2Cleanup(t, c, name, append(others, odd)...)
	cfg := fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: 2 * time.Second, MinCalls: 3,
		Breaker: breaker.Config{MinCalls: 1000, OpenFor: time.Hour}}
	a := ex2X2New(t, c, cfg)
	cfg.SyncEvery = time.Hour // b learns only from the channel
	b := ex2X2New(t, ex2X2Client(t), cfg)
	gb, err := b.Guards(odd)
	if err != nil {
		t.Fatal(err)
	}
	var otherBrk []*breaker.Breaker
	for _, h := range others {
		g, err := b.Guards(h)
		if err != nil {
			t.Fatal(err)
		}
		otherBrk = append(otherBrk, g.Breaker)
	}
	time.Sleep(50 * time.Millisecond) // b's subscription is up
	ga, _ := a.Guards(odd)
	for range 3 {
		p, err := ga.Breaker.Allow()
		if err != nil {
			t.Fatal(err)
		}
		ga.Breaker.Done(p, false)
	}
	if !ex2X2Eventually(3*time.Second, func() bool { return gb.Breaker.State() == breaker.Open }) {
		t.Fatalf("b's breaker of %q: %v after the fleet opened (a's %v)", odd, gb.Breaker.State(), ga.Breaker.State())
	}
	for i, br := range otherBrk {
		if br.State() != breaker.Closed {
			t.Errorf("host %q tripped by the opening of %q", others[i], odd)
		}
	}
}

// Config.Timeout at its smallest (1 ns): every round trip "takes longer"
// and the fleet is local: New returns at once in local mode, retries come
// from the local budget, nothing waits, Close returns (its last sync
// bounded by Timeout), and the fleet never panics.
func TestAttackExtremes2TimeoutOneNanosecond(t *testing.T) {
	c := ex2X2Client(t)
	name := ex2X2Tag()
	ex2X2Cleanup(t, c, name, "h")
	start := time.Now()
	f, err := fleet.New(c, fleet.Config{Name: name, Timeout: 1, SyncEvery: time.Millisecond, Limit: &limit.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("New took %v with a 1 ns timeout", el)
	}
	if f.Mode() != fleet.ModeLocal {
		t.Errorf("mode %v", f.Mode())
	}
	g, err := f.Guards("h")
	if err != nil {
		t.Fatal(err)
	}
	b := g.Budget.(*fleet.Budget)
	granted := 0
	start = time.Now()
	for range 100 {
		b.Deposit()
		if b.WithdrawWithin(0) {
			granted++
		}
	}
	if el := time.Since(start); el > 500*time.Millisecond {
		t.Errorf("100 withdrawals took %v", el)
	}
	// The local budget: 10% of 100 plus 10 (1 per second over 10 s).
	if granted < 10 || granted > 21 {
		t.Errorf("%d retries granted of 100 calls by the local budget", granted)
	}
	time.Sleep(50 * time.Millisecond)
	st := f.Stats()
	if st.Failures == 0 || st.LastError == nil || st.Failures > st.RoundTrips {
		t.Errorf("stats %+v", st)
	}
	start = time.Now()
	_ = f.Close()
	if el := time.Since(start); el > time.Second {
		t.Errorf("Close took %v", el)
	}
}

// SyncEvery at its smallest (1 ms) with many hosts: "one round trip per
// interval per process, whatever the traffic" — the background sync never
// spins beyond its interval (nor piles round trips up).
func TestAttackExtremes2SyncEveryOneMillisecondDoesNotSpin(t *testing.T) {
	c := ex2X2Client(t)
	name := ex2X2Tag()
	var hosts []string
	for i := range 64 {
		hosts = append(hosts, fmt.Sprint("h", i))
	}
	ex2X2Cleanup(t, c, name, hosts...)
	f := ex2X2New(t, c, fleet.Config{Name: name, SyncEvery: time.Millisecond, Timeout: time.Second})
	for _, h := range hosts {
		if _, err := f.Guards(h); err != nil {
			t.Fatal(err)
		}
	}
	r0 := f.Stats().RoundTrips
	start := time.Now()
	time.Sleep(500 * time.Millisecond)
	n := f.Stats().RoundTrips - r0
	el := time.Since(start)
	t.Logf("%d round trips in %v", n, el)
	if max := int64(el/time.Millisecond) + 10; n > max {
		t.Errorf("%d round trips in %v at SyncEvery 1ms: more than one per interval", n, el)
	}
	if f.Mode() != fleet.ModeFleet {
		t.Errorf("mode %v: %v", f.Mode(), f.Stats().LastError)
	}
}

// MaxHosts at its smallest (1), with the empty host: the one host is
// tracked and handed out again; any other is ErrTooManyHosts, whatever it
// is.
func TestAttackExtremes2MaxHostsOneEmptyHost(t *testing.T) {
	c := ex2X2Client(t)
	name := ex2X2Tag()
	ex2X2Cleanup(t, c, name, "")
	f := ex2X2New(t, c, fleet.Config{Name: name, MaxHosts: 1, SyncEvery: time.Hour})
	g1, err := f.Guards("")
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{" ", "\x00", ":", strings.Repeat("x", 1<<16)} {
		if _, err := f.Guards(h); !errors.Is(err, fleet.ErrTooManyHosts) {
			t.Errorf("host %.10q: %v, want ErrTooManyHosts", h, err)
		}
	}
	g2, err := f.Guards("")
	if err != nil || g2.Breaker != g1.Breaker || g2.Budget != g1.Budget {
		t.Errorf("the tracked host again: %v, same guards %v", err, g2.Breaker == g1.Breaker)
	}
}

// New rejects exactly what Config says it must: names with braces only,
// a SyncEvery below a millisecond; and accepts odd but valid values.
func TestAttackExtremes2NewAcceptsOddButValid(t *testing.T) {
	c := ex2X2Client(t)
	tag := ex2X2Tag()
	bad := map[string]fleet.Config{
		"brace only":   {Name: "{"},
		"close only":   {Name: "}"},
		"brace in":     {Name: tag + "a{b"},
		"close at end": {Name: tag + "}"},
		"empty braces": {Name: tag + "{}"},
		"sync 1ms-1ns": {Name: tag, SyncEvery: time.Millisecond - 1},
		"sync minint":  {Name: tag, SyncEvery: math.MinInt64},
		"timeout -1":   {Name: tag, Timeout: -1},
	}
	for n, cfg := range bad {
		t.Run("bad/"+n, func(t *testing.T) {
			f, err := fleet.New(c, cfg)
			if err == nil {
				f.Close()
				t.Fatal("accepted")
			}
			if !errors.Is(err, fleet.ErrInvalidConfig) {
				t.Fatalf("%v does not wrap ErrInvalidConfig", err)
			}
		})
	}
	good := map[string]fleet.Config{
		"space":       {Name: " "},
		"colons":      {Name: "::"},
		"star":        {Name: "*"},
		"sync 1ms":    {SyncEvery: time.Millisecond},
		"timeout 1ns": {Timeout: 1},
		"maxhosts":    {MaxHosts: math.MaxInt},
		"probes":      {Breaker: breaker.Config{Probes: math.MaxInt32}},
		"limit max 1": {Limit: &limit.Config{Max: 1}},
	}
	for n, cfg := range good {
		t.Run("good/"+n, func(t *testing.T) {
			cfg.Name = tag + cfg.Name
			ex2X2Cleanup(t, c, cfg.Name, "h")
			f, err := fleet.New(c, cfg)
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			g, err := f.Guards("h")
			if err != nil {
				t.Fatal(err)
			}
			g.Budget.Deposit()
			_ = g.Budget.Withdraw()
			if err := f.Close(); err != nil && cfg.Timeout != 1 {
				t.Errorf("close: %v", err)
			}
		})
	}
}

// The fleet's rate with a SyncEvery longer than a host key's life.
// Config.Limit: the fleet learns its rate "in windows of SyncEvery or one
// second, whichever is longer"; the package doc, The fleet's rate: "Cold
// (no R yet: no gate), R becomes the demand per second (attempts done
// plus calls waiting), at least 10, of the second window that carries
// any", and each process's
// limiter is gated at its share. Its state lives in the host's hash,
// which "expires when no process has synced it for twice the longest
// window plus 10 s": the longest of the budget's and the breaker's
// windows, not the rate's. With SyncEvery above that expiry (30 s with
// the default windows; 10.5 s here, with windows of 10 ms), every sync
// finds the hash gone, each rate window is the first one again, and R is
// never learned: no gate, ever. The control, at SyncEvery 9 s, is gated
// after its fourth sync (the second window with demand closed).
func TestAttackExtremes2RateLearnedWhateverSyncEvery(t *testing.T) {
	if testing.Short() {
		t.Skip("waits four sync intervals of about 10 s each")
	}
	for _, every := range []time.Duration{9 * time.Second, 10500 * time.Millisecond} {
		t.Run(every.String(), func(t *testing.T) {
			t.Parallel()
			c := ex2X2Client(t)
			name := ex2X2Tag()
			ex2X2Cleanup(t, c, name, "h")
			f := ex2X2New(t, c, fleet.Config{Name: name, SyncEvery: every, Timeout: 2 * time.Second, Limit: &limit.Config{},
				Budget:  budget.Config{Window: 10 * time.Millisecond, Slices: 1},
				Breaker: breaker.Config{Window: 10 * time.Millisecond, Buckets: 1, OpenFor: 10 * time.Millisecond}})
			g, err := f.Guards("h") // kicks a sync: the first window of the rate
			if err != nil {
				t.Fatal(err)
			}
			if !ex2X2Eventually(2*time.Second, func() bool { return f.Stats().RoundTrips >= 2 }) {
				t.Fatalf("no sync for the new host: %+v", f.Stats())
			}
			ctx := context.Background()
			pttl, _ := c.PTTL(ctx, ex2X2Keys(name, "h")[0]).Result()
			t.Logf("host key expires in %v after a sync; SyncEvery %v", pttl, every)
			// Demand for the rate: calls (breaker outcomes) in each window,
			// reported at the next sync; the window they were reported in
			// closes at the sync after it. Only the ticker syncs: successes
			// start no sync of their own. The first ticker sync comes at a
			// random fraction of the interval (Config.SyncEvery), maybe too
			// soon after the first for a report to the rate: one more.
			for n := 3; n <= 6; n++ {
				for range 20 {
					p, err := g.Breaker.Allow()
					if err != nil {
						t.Fatal(err)
					}
					g.Breaker.Done(p, true)
				}
				// The successes also go to the fleet's count of attempts
				// in flight (a round trip of its own, at once): the sync
				// is the round trip after those.
				time.Sleep(200 * time.Millisecond)
				rt := f.Stats().RoundTrips
				if !ex2X2Eventually(every+3*time.Second, func() bool { return f.Stats().RoundTrips > rt }) {
					t.Fatalf("no sync %d: %+v", n, f.Stats())
				}
			}
			time.Sleep(300 * time.Millisecond) // its reply is taken in
			if f.Mode() != fleet.ModeFleet {
				t.Fatalf("mode %v: %v", f.Mode(), f.Stats().LastError)
			}
			rr, _ := c.HGet(ctx, ex2X2Keys(name, "h")[0], "rr").Result()
			// A done context takes a slot and a token only if both are free
			// now (limit.Limiter.Acquire): ungated, all 30 go; gated at a
			// share of at most R (10 a second, cold, with no demand), with a
			// burst of one token, one or two.
			done, cancel := context.WithCancel(ctx)
			cancel()
			went := 0
			for range 30 {
				p, err := g.Limiter.Acquire(done)
				if err == nil {
					went++
					g.Limiter.Release(p, false)
				}
			}
			t.Logf("SyncEvery %v: %d of 30 starts at once; the hash's rate field %q", every, went, rr)
			if went > 5 {
				t.Errorf("SyncEvery %v (a valid value, at least a millisecond): after four syncs (three windows of demand) the fleet's rate is still cold (%d of 30 starts at once, no gate): the host's hash expired between the syncs (it lives %v after a sync), so every window of the rate is its first",
					every, went, pttl)
			}
		})
	}
}

// Many goroutines asking for guards of hostile host names at once while
// the fleet syncs every millisecond: no panic, no race, every name tracked
// once.
func TestAttackExtremes2ConcurrentHostileHosts(t *testing.T) {
	c := ex2X2Client(t)
	name := ex2X2Tag()
	hosts := []string{"", "}", "}:", "{", "a b", "\x00", "ü", strings.Repeat("z", 1<<12)}
	ex2X2Cleanup(t, c, name, hosts...)
	f := ex2X2New(t, c, fleet.Config{Name: name, SyncEvery: time.Millisecond, Timeout: time.Second, Limit: &limit.Config{}})
	var wg sync.WaitGroup
	brks := make([][]*breaker.Breaker, 16)
	for i := range brks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, h := range hosts {
				g, err := f.Guards(h)
				if err != nil {
					t.Error(err)
					return
				}
				g.Budget.Deposit()
				_ = g.Budget.Withdraw()
				brks[i] = append(brks[i], g.Breaker)
			}
		}()
	}
	wg.Wait()
	for i := range brks {
		for j := range brks[i] {
			if brks[i][j] != brks[0][j] {
				t.Fatalf("host %q: two breakers", hosts[j])
			}
		}
	}
}
