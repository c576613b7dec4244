package breaker_test

// Black-box checks of README.md's promises about package breaker.

import (
	"context"
	"sort"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

func rdmOutcomes(b *breaker.Breaker, ok, failed int) {
	for i := 0; i < ok; i++ {
		if p, err := b.Allow(); err == nil {
			b.Done(p, true)
		}
	}
	for i := 0; i < failed; i++ {
		if p, err := b.Allow(); err == nil {
			b.Done(p, false)
		}
	}
}

// README: "breaker: closed, open, half-open over a sliding window (50% of at
// least 20 calls over 10 s)".
func TestAttackReadmeBreakerTripRule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := breaker.New(breaker.Config{})
		rdmOutcomes(b, 0, 19)
		if b.State() != breaker.Closed {
			t.Errorf("open after 19 failures, want closed (at least 20 calls)")
		}
		rdmOutcomes(b, 0, 1)
		if b.State() != breaker.Open {
			t.Errorf("%v after 20 failures, want open", b.State())
		}
		b2, _ := breaker.New(breaker.Config{})
		rdmOutcomes(b2, 11, 9)
		if b2.State() != breaker.Closed {
			t.Errorf("open at 9 of 20 failed (45%%)")
		}
		rdmOutcomes(b2, 0, 2) // 11 of 22: 50%
		if b2.State() != breaker.Open {
			t.Errorf("%v at 11 of 22 failed (50%%), want open", b2.State())
		}
	})
}

// README: "While open it sends only probes (3 about every second); a call
// with time left waits for it (at most 10,000 waiters, no goroutine of their
// own)".
func TestAttackReadmeBreakerProbesAndWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := breaker.New(breaker.Config{})
		b.Trip(0)
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		var probeTimes []time.Duration
		var wg sync.WaitGroup
		const waiters = 10000
		for i := 0; i < waiters; i++ {
			wg.Go(func() {
				p, err := b.Wait(ctx, time.Hour)
				if err != nil {
					return
				}
				mu.Lock()
				if p.Probe() {
					probeTimes = append(probeTimes, time.Since(start))
				}
				mu.Unlock()
				b.Done(p, false) // the dependency is still down
			})
		}
		synctest.Wait()
		if s := b.Snapshot(); s.Waiters != waiters {
			t.Errorf("%d waiting, want %d", s.Waiters, waiters)
		}
		// The 10,001st cannot wait.
		t0 := time.Now()
		if _, err := b.Wait(context.Background(), time.Hour); err == nil || time.Since(t0) != 0 {
			t.Errorf("waiter 10,001: err %v after %v, want a rejection at once", err, time.Since(t0))
		}
		time.Sleep(4500 * time.Millisecond)
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		sort.Slice(probeTimes, func(i, j int) bool { return probeTimes[i] < probeTimes[j] })
		// Rounds: probes within 4.5 s, grouped by second.
		rounds := map[int]int{}
		for _, d := range probeTimes {
			rounds[int(d/time.Second)]++
		}
		t.Logf("probe times: %v", probeTimes)
		if len(probeTimes) < 3 || len(probeTimes) > 3*6 {
			t.Errorf("%d probes in 4.5 s, want 3 about every second", len(probeTimes))
		}
		for s, n := range rounds {
			if n > 3*2 {
				t.Errorf("%d probes in second %d", n, s)
			}
		}
	})
}

// README: "when the probes succeed, the calls that waited are released
// earliest deadline first".
func TestAttackReadmeBreakerReleaseEDF(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, _ := breaker.New(breaker.Config{ReleaseRate: 10})
		b.Trip(0)
		var mu sync.Mutex
		var order []time.Duration
		var wg sync.WaitGroup
		deadlines := []time.Duration{}
		for i := 0; i < 40; i++ {
			deadlines = append(deadlines, time.Duration(10+(i*7)%40)*time.Second)
		}
		for _, d := range deadlines {
			wg.Go(func() {
				p, err := b.Wait(context.Background(), d)
				if err != nil {
					t.Errorf("wait %v: %v", d, err)
					return
				}
				mu.Lock()
				if !p.Probe() {
					order = append(order, d)
				}
				mu.Unlock()
				b.Done(p, true)
			})
			synctest.Wait()
		}
		wg.Wait()
		if !sort.SliceIsSorted(order, func(i, j int) bool { return order[i] < order[j] }) {
			t.Errorf("release order by deadline: %v, want earliest first", order)
		}
	})
}

// README: "Closed, it takes no lock and allocates nothing."
func TestAttackReadmeBreakerClosedAllocs(t *testing.T) {
	b, _ := breaker.New(breaker.Config{})
	a := testing.AllocsPerRun(1000, func() {
		p, err := b.Allow()
		if err == nil {
			b.Done(p, true)
		}
	})
	if a != 0 {
		t.Errorf("closed Allow+Done: %v allocs, want 0", a)
	}
}
