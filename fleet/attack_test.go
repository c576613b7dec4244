// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package fleet_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/fleet"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
)

func atkAddr(t *testing.T) string {
	a := os.Getenv("STORMGUARD_REDIS_ADDR")
	if a == "" {
		a = "127.0.0.1:6379"
	}
	return a
}

func atkClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	return c
}

func atkName(t *testing.T, c *redis.Client) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "attack-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		keys, _ := c.Keys(ctx, "stormguard:fleet:{"+name+"}:*").Result()
		if len(keys) > 0 {
			c.Del(ctx, keys...)
		}
	})
	return name
}

func atkEventually(d time.Duration, cond func() bool) bool {
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

// A huge (finite) floor must admit retries: the bound is
// Ratio·requests + MinPerSecond·Window.Seconds() (budget.Config: "It must
// be finite"; math.MaxFloat64 and 1e18 are).
func TestAttackHugeFloorAdmitsRetries(t *testing.T) {
	for _, floor := range []float64{1e18, math.MaxFloat64} {
		t.Run(fmt.Sprint(floor), func(t *testing.T) {
			// The same config as a local budget admits the retries.
			lb, err := budget.New(budget.Config{MinPerSecond: floor})
			if err != nil {
				t.Fatal(err)
			}
			lb.Deposit()
			if !lb.Withdraw() {
				t.Fatal("local budget refuses")
			}
			c := atkClient(t, atkAddr(t))
			name := atkName(t, c)
			f, err := fleet.New(c, fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: time.Second,
				Budget: budget.Config{MinPerSecond: floor}})
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			g, err := f.Guards("h")
			if err != nil {
				t.Fatal(err)
			}
			g.Budget.Deposit()
			// Let a sync or two happen.
			s0 := f.Stats().RoundTrips
			atkEventually(2*time.Second, func() bool { return f.Stats().RoundTrips > s0+2 })
			granted := 0
			for range 5 {
				if g.Budget.Withdraw() {
					granted++
				}
			}
			st := g.Budget.(*fleet.Budget).Stats()
			if f.Mode() != fleet.ModeFleet {
				t.Fatalf("mode %v: %v", f.Mode(), f.Stats().LastError)
			}
			if granted != 5 {
				t.Fatalf("fleet mode granted %d of 5 retries with a floor of %g retries per window (Budget.Stats %+v)",
					granted, floor*10, st)
			}
		})
	}
}

// Close flushes the counts: another process sees the requests deposited
// just before Close.
func TestAttackCloseFlushesCounts(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: time.Hour, Timeout: time.Second}
	a, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ga, _ := a.Guards("h")
	for range 7 {
		ga.Budget.Deposit()
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err2 := a.Close(); err2 != nil {
		t.Fatal(err2)
	}
	if a.Mode() != fleet.ModeLocal {
		t.Fatalf("mode after close %v", a.Mode())
	}
	cfg.SyncEvery = 10 * time.Millisecond
	b, err := fleet.New(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	gb, _ := b.Guards("h")
	ok := atkEventually(2*time.Second, func() bool { return gb.Budget.(*fleet.Budget).Stats().Requests == 7 })
	if !ok {
		t.Fatalf("b sees %+v, want 7 requests", gb.Budget.(*fleet.Budget).Stats())
	}
	// After Close, a's budget keeps working in local mode.
	ga.Budget.Deposit()
	if !ga.Budget.Withdraw() {
		t.Fatal("local budget after Close refuses its floor")
	}
}

type atkShared struct{}

func (atkShared) Outcome(bool)                        {}
func (atkShared) ProbeRound() bool                    { return true }
func (atkShared) StateChanged(from, to breaker.State) {}

func TestAttackConfigValidation(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	cases := map[string]fleet.Config{
		"empty":         {},
		"brace":         {Name: "a{b"},
		"brace2":        {Name: "a}"},
		"sync<1ms":      {Name: "x", SyncEvery: 999 * time.Microsecond},
		"sync<0":        {Name: "x", SyncEvery: -1},
		"timeout<0":     {Name: "x", Timeout: -1},
		"mincalls<0":    {Name: "x", MinCalls: -1},
		"rounds<0":      {Name: "x", ProbeRounds: -1},
		"hosts<0":       {Name: "x", MaxHosts: -1},
		"shared":        {Name: "x", Breaker: breaker.Config{Shared: atkShared{}}},
		"limit":         {Name: "x", Limit: &limit.Config{Max: -1}},
		"slices":        {Name: "x", Budget: budget.Config{Slices: 1001, Window: 1001 * time.Second}},
		"buckets":       {Name: "x", Breaker: breaker.Config{Buckets: 1001, Window: 1001 * time.Second}},
		"slice µs":      {Name: "x", Budget: budget.Config{Slices: 1, Window: 10*time.Millisecond + 1}},
		"bucket µs":     {Name: "x", Breaker: breaker.Config{Buckets: 1, Window: 10*time.Millisecond + 1}},
		"ratio nan":     {Name: "x", Budget: budget.Config{Ratio: nanF()}},
		"fratio nan":    {Name: "x", Breaker: breaker.Config{FailureRatio: nanF()}},
		"local ratio 2": {Name: "x", LocalBudget: budget.Config{Ratio: 2}},
		"floor inf":     {Name: "x", Budget: budget.Config{MinPerSecond: infF()}},
	}
	for n, cfg := range cases {
		t.Run(n, func(t *testing.T) {
			var f *fleet.Fleet
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Fatalf("panic: %v", r)
					}
				}()
				f, err = fleet.New(c, cfg)
			}()
			if err == nil {
				f.Close()
				t.Fatalf("no error for %s", n)
			}
			if !errors.Is(err, fleet.ErrInvalidConfig) {
				t.Fatalf("error %v does not wrap ErrInvalidConfig", err)
			}
		})
	}
	var nilc *redis.Client
	if _, err := fleet.New(nilc, fleet.Config{Name: "x"}); err == nil {
		t.Fatal("typed nil accepted")
	}
	if _, err := fleet.New(nil, fleet.Config{Name: "x"}); err == nil {
		t.Fatal("nil accepted")
	}
}

func nanF() float64 { z := 0.0; return z / z }
func infF() float64 { z := 0.0; return 1 / z }

func TestAttackMaxHostsAndZeroBudget(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	f, err := fleet.New(c, fleet.Config{Name: name, MaxHosts: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Guards("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Guards("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Guards("c"); !errors.Is(err, fleet.ErrTooManyHosts) {
		t.Fatalf("third host: %v", err)
	}
	if _, err := f.Guards("a"); err != nil {
		t.Fatal(err)
	}
	var zb fleet.Budget
	zb.Deposit()
	if zb.Withdraw() || zb.WithdrawWithin(time.Second) {
		t.Fatal("zero budget granted")
	}
	if zb.Stats() != (budget.Stats{}) {
		t.Fatal("zero budget stats")
	}
	for m, s := range map[fleet.Mode]string{fleet.ModeFleet: "fleet", fleet.ModeLocal: "local", 0: "Mode(0)", 9: "Mode(9)"} {
		if m.String() != s {
			t.Fatalf("%d: %q", m, m.String())
		}
	}
}

// The fleet-wide floor binds the whole fleet: with no ratio, 10 processes
// share a floor of 5 retries per window.
func TestAttackFleetFloorBinds(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	cfg := fleet.Config{Name: name, SyncEvery: 5 * time.Millisecond, Timeout: 2 * time.Second,
		Budget: budget.Config{Ratio: -1, MinPerSecond: 0.5, Window: 10 * time.Second}}
	var granted atomic.Int64
	var wg sync.WaitGroup
	var fs []*fleet.Fleet
	for range 10 {
		cl := atkClient(t, atkAddr(t))
		f, err := fleet.New(cl, cfg)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
		g, _ := f.Guards("h")
		for j := range 4 {
			wg.Go(func() {
				for k := range 30 {
					g.Budget.Deposit()
					left := time.Duration(0)
					if (j+k)%2 == 0 {
						left = time.Duration(1+k%3) * time.Millisecond
					}
					if g.Budget.(*fleet.Budget).WithdrawWithin(left) {
						granted.Add(1)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, f := range fs {
		if f.Mode() != fleet.ModeFleet {
			t.Errorf("a fleet went local: %v", f.Stats().LastError)
		}
		f.Close()
	}
	if granted.Load() > 5 {
		t.Fatalf("granted %d retries, fleet floor 5", granted.Load())
	}
	t.Logf("granted %d", granted.Load())
}

// The fleet's breaker opens every process's breaker when the fleet's
// window holds MinCalls calls with failures >= ratio, though no process
// alone reaches its own MinCalls.
func TestAttackFleetBreakerOpensAll(t *testing.T) {
	c := atkClient(t, atkAddr(t))
	name := atkName(t, c)
	var events atomic.Int64
	cfg := fleet.Config{Name: name, SyncEvery: 10 * time.Millisecond, Timeout: time.Second, MinCalls: 6,
		Breaker: breaker.Config{MinCalls: 100, OpenFor: time.Hour},
		Observer: observe.Func(func(_ context.Context, e observe.Event) {
			if e.Kind == observe.BreakerState {
				events.Add(1)
			}
		})}
	var brks []*breaker.Breaker
	for range 3 {
		f, err := fleet.New(atkClient(t, atkAddr(t)), cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		g, _ := f.Guards("h")
		brks = append(brks, g.Breaker)
	}
	for _, b := range brks[:2] {
		for range 3 {
			p, err := b.Allow()
			if err != nil {
				t.Fatal(err)
			}
			b.Done(p, false)
		}
	}
	ok := atkEventually(3*time.Second, func() bool {
		for _, b := range brks {
			if b.State() == breaker.Closed {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("states %v %v %v", brks[0].State(), brks[1].State(), brks[2].State())
	}
	if events.Load() < 3 {
		t.Fatalf("observer saw %d breaker events", events.Load())
	}
}
