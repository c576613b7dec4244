package fleet

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/retry"
)

// TestSuccessPathAllocs proves that the fleet's success path allocates
// nothing: a deposit, a closed breaker's outcome, a whole successful call
// through a retry policy with a fleet budget and breaker, and a retry from
// a lease.
func TestSuccessPathAllocs(t *testing.T) {
	// No sync runs during the measurement (it allocates, in the background).
	f := mustNew(t, newModelBackend(), Config{Name: "a", SyncEvery: time.Hour})
	g, err := f.Guards("api")
	if err != nil {
		t.Fatal(err)
	}
	p := policy(t, f, "api")
	ctx := context.Background()
	h := f.hostFor("api")
	h.lease.install(math.MaxUint32, slot{}, math.MaxInt64)
	tests := []struct {
		name string
		run  func()
	}{
		{"Deposit", g.Budget.Deposit},
		{"breaker success", func() {
			p, _ := g.Breaker.Allow()
			g.Breaker.Done(p, true)
		}},
		{"retry.Do success", func() { _ = p.Do(ctx, ok) }},
		{"Withdraw from a lease", func() { g.Budget.Withdraw() }},
	}
	for _, tt := range tests {
		if n := testing.AllocsPerRun(1000, tt.run); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", tt.name, n)
		}
	}
}

// benchFleet returns a fleet on the test Redis, syncing every 100ms in
// the background while the benchmark runs.
func benchFleet(b *testing.B) *Fleet {
	b.Helper()
	c := redisClient(b)
	cfg := Config{Name: uniqueName(b), Timeout: time.Second}
	cleanup(b, c, cfg.Name)
	f, err := New(c, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	if f.Mode() != ModeFleet {
		b.Fatalf("mode %v", f.Mode())
	}
	return f
}

// BenchmarkDeposit compares a fleet budget's Deposit with a local
// budget's, on one goroutine and on all of them.
func BenchmarkDeposit(b *testing.B) {
	local, err := budget.New(budget.Config{})
	if err != nil {
		b.Fatal(err)
	}
	fb, err := benchFleet(b).hostBudget("api")
	if err != nil {
		b.Fatal(err)
	}
	for _, bb := range []struct {
		name string
		b    retry.Budget
	}{{"local", local}, {"fleet", fb}} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				bb.b.Deposit()
			}
		})
		b.Run(bb.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bb.b.Deposit()
				}
			})
		})
	}
}

// BenchmarkSuccess compares a successful call through a retry policy with
// a local budget and breaker and one with the fleet's.
func BenchmarkSuccess(b *testing.B) {
	lb, err := budget.New(budget.Config{})
	if err != nil {
		b.Fatal(err)
	}
	lk, err := breaker.New(breaker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := benchFleet(b).Guards("api")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		name string
		bud  retry.Budget
		brk  *breaker.Breaker
	}{{"local", lb, lk}, {"fleet", g.Budget, g.Breaker}} {
		p, err := retry.New(retry.WithGuards(retry.Guards{Budget: c.bud, Breaker: c.brk}))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Do(ctx, ok); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := p.Do(ctx, ok); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkWithdrawLeaseHit measures a retry spent from the process's
// lease (no round trip), against a local budget's Withdraw.
func BenchmarkWithdrawLeaseHit(b *testing.B) {
	f := benchFleet(b)
	fb, err := f.hostBudget("api")
	if err != nil {
		b.Fatal(err)
	}
	local, err := budget.New(budget.Config{Ratio: 1, MinPerSecond: 1e12})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("local", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			local.Withdraw()
		}
	})
	b.Run("fleet", func(b *testing.B) {
		h := f.hostFor("api")
		h.leaseMu.Lock()
		h.expire(0, true)
		h.lease.install(math.MaxUint32, slot{}, math.MaxInt64)
		h.leaseMu.Unlock()
		calls := f.stats().LeaseCalls
		b.ReportAllocs()
		for b.Loop() {
			if !fb.Withdraw() {
				b.Fatal("Withdraw refused with a full lease")
			}
		}
		if n := f.stats().LeaseCalls - calls; n != 0 {
			b.Fatalf("%d lease round trips with a full lease", n)
		}
		h.expire(0, true) // the test lease is not the fleet's: do not return it
		h.retMu.Lock()
		h.returns = nil
		h.retMu.Unlock()
	})
}

// BenchmarkSuccessInterleaved runs the local and the fleet success paths of
// BenchmarkSuccess in alternating chunks of 1024 calls, so that both see the
// same machine load, and reports each one's time per call and their ratio.
func BenchmarkSuccessInterleaved(b *testing.B) {
	lb, err := budget.New(budget.Config{})
	if err != nil {
		b.Fatal(err)
	}
	lk, err := breaker.New(breaker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	local, err := retry.New(retry.WithGuards(retry.Guards{Budget: lb, Breaker: lk}))
	if err != nil {
		b.Fatal(err)
	}
	fleet := policy(b, benchFleet(b), "api")
	ctx := context.Background()
	const chunk = 1024
	var tl, tf time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		for range chunk {
			_ = local.Do(ctx, ok)
		}
		mid := time.Now()
		for range chunk {
			_ = fleet.Do(ctx, ok)
		}
		tl, tf = tl+mid.Sub(start), tf+time.Since(mid)
	}
	n := float64(b.N) * chunk
	b.ReportMetric(float64(tl)/n, "local-ns/call")
	b.ReportMetric(float64(tf)/n, "fleet-ns/call")
	b.ReportMetric(float64(tf)/float64(tl), "fleet/local")
}

// BenchmarkSync measures one sync (the one round trip a process makes per
// interval) against the test Redis, for 1 and 10 hosts with traffic.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1, 10} {
		b.Run(strconv.Itoa(n)+"hosts", func(b *testing.B) {
			f := benchFleet(b)
			var budgets []*Budget
			for i := range n {
				fb, err := f.hostBudget("host" + strconv.Itoa(i))
				if err != nil {
					b.Fatal(err)
				}
				budgets = append(budgets, fb)
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, fb := range budgets {
					fb.Deposit()
				}
				if err := f.sync(false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
