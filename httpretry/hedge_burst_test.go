package httpretry_test

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/httpretry"
	"github.com/stormguard/stormguard/retry"
	"github.com/stormguard/stormguard/wire"
)

// stallBase is a simulated provider that stalls: each request takes its
// latency (seeded: 99% uniform in [8, 12] ms, 1% 100 ms) unless canceled
// first, but no answer ends during [stallFrom, stallTo): one due then
// comes at stallTo. A request sent during [queueFrom, queueTo) waits
// queueWait more first (a queue). It records when each request and each
// hedge was sent.
type stallBase struct {
	start              time.Time
	stallFrom, stallTo time.Duration
	queueFrom, queueTo time.Duration
	queueWait          time.Duration

	mu     sync.Mutex
	rng    *rand.Rand
	sent   []time.Duration // since start
	hedges []time.Duration // since start
}

func (b *stallBase) RoundTrip(r *http.Request) (*http.Response, error) {
	now := time.Since(b.start)
	b.mu.Lock()
	b.sent = append(b.sent, now)
	if r.Header.Get(wire.AttemptHeader) != "" {
		b.hedges = append(b.hedges, now)
	}
	d := time.Duration(8e6 + b.rng.Float64()*4e6)
	if b.rng.IntN(100) == 0 {
		d = 100 * time.Millisecond
	}
	b.mu.Unlock()
	if now >= b.queueFrom && now < b.queueTo {
		d += b.queueWait
	}
	if end := now + d; end >= b.stallFrom && end < b.stallTo {
		d = b.stallTo - now
	}
	return okAfter(r, d)
}

// in counts the times of ts within [from, to).
func in(ts []time.Duration, from, to time.Duration) int {
	n := 0
	for _, x := range ts {
		if x >= from && x < to {
			n++
		}
	}
	return n
}

// TestHedgeStall: 500 GETs a second with the learned p95 delay and one
// hedge, and a stall of the provider for 1 s in which no answer ends: the
// races that reach their delay in the stall are not a tail, and hedges
// stop once those of the last second are above 3 times 5% of its races (75
// at 500 a second), where without the bound every race would get one
// (within the budget). From a second after the stall on, the 1% tail gets
// its hedges again at the learned delay: the stall's answers do not count in
// it.
func TestHedgeStall(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	const rate = 500 // calls a second
	synctest.Test(t, func(t *testing.T) {
		base := &stallBase{start: time.Now(), rng: rand.New(rand.NewPCG(2, 3)), stallFrom: 10 * time.Second, stallTo: 11 * time.Second}
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(0, 0.95, 1))
		if err != nil {
			t.Fatal(err)
		}
		slowAfter := slowCalls(t, tr, base.start, "http://stall.test/", 16*rate, rate) // by start
		for s := time.Duration(0); s < 16*time.Second; s += time.Second {
			t.Logf("second %2d: %3d requests, %3d hedges, %d calls of 100 ms or more", s/time.Second,
				in(base.sent, s, s+time.Second), in(base.hedges, s, s+time.Second), in(slowAfter, s, s+time.Second))
		}
		bound := 3 * (1 - 0.95) * rate
		if n := in(base.hedges, base.stallFrom, base.stallTo); float64(n) > bound {
			t.Errorf("%d hedges in the 1 s stall, want at most %.0f", n, bound)
		}
		// 1% of the requests take 100 ms: from a second after the stall
		// on, every one of those is hedged at the learned delay again.
		if n := in(slowAfter, 12*time.Second, 16*time.Second); n != 0 {
			t.Errorf("%d calls started from 1 s after the stall took 100 ms or more, want 0 (hedged)", n)
		}
	})
}

// TestHedgeDueFloor: with a fixed delay (q defaulting to 0.95) and a budget
// that grants every hedge, 10 GETs at once whose copies all take 1 s: at
// low traffic the bound lets 5 races a second reach the delay with their
// hedge, then holds the others; once those seconds are past, 5 hedges go
// again.
func TestHedgeDueFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &legBase{answer: delays(time.Second)}
		// No limiter (WithLimit(nil)): the subject is the hedge floor. A
		// cold default limiter (10 slots, all held by the 10 GETs) would
		// leave no free slot for any hedge.
		tr, err := httpretry.NewTransport(base, httpretry.WithHedging(50*time.Millisecond, 0, 1), httpretry.WithLimit(nil),
			httpretry.WithGuards(func(string) (retry.Guards, error) { return retry.Guards{Budget: granter{}}, nil }))
		if err != nil {
			t.Fatal(err)
		}
		for round := range 2 {
			before := len(base.sent())
			var wg sync.WaitGroup
			for range 10 {
				wg.Go(func() {
					if _, _, err := hedgeGet(t, tr, context.Background()); err != nil {
						t.Errorf("GET: %v", err)
					}
				})
			}
			wg.Wait()
			hedges := 0
			for _, h := range attemptHeaders(base.sent()[before:]) {
				if h != "" {
					hedges++
				}
			}
			if hedges != 5 {
				t.Errorf("round %d: %d hedges for 10 GETs, want 5 (the floor)", round, hedges)
			}
			time.Sleep(2 * time.Second)
		}
		base.settle(t)
	})
}

// TestHedgeBurst: 500 GETs a second with the learned p95 delay and one
// hedge, and a stall of 40 ms in which no answer ends: the 20 or so races
// that start in it queue behind it and reach their delay within a few
// milliseconds of each other. Those are few against the 500 races of the
// last second (75 may reach their delay in a second), so the per-second
// share alone let every one of them have a hedge, each only lengthening
// the queue; but they are most of the races in flight, and at most 5 of
// them (the floor) get one. Once they have ended, the 1% tail gets its
// hedges again at once.
func TestHedgeBurst(t *testing.T) {
	const rate = 500 // calls a second
	const from, to, end = 3 * time.Second, 3*time.Second + 40*time.Millisecond, 5 * time.Second
	synctest.Test(t, func(t *testing.T) {
		base := &stallBase{start: time.Now(), rng: rand.New(rand.NewPCG(2, 3)), stallFrom: from, stallTo: to}
		slowAfter := boundCalls(t, base, base.start, "http://burst.test/", end, rate) // by start
		n := in(base.hedges, from, to)
		t.Logf("%d requests and %d hedges in the 40 ms stall; %d hedges in the 100 ms after it; calls of 100 ms or more started from 100 ms after it: %d",
			in(base.sent, from, to), n, in(base.hedges, to, to+100*time.Millisecond), in(slowAfter, to+100*time.Millisecond, end))
		if n > 5 {
			t.Errorf("%d hedges in the 40 ms stall, want at most 5 (the floor)", n)
		}
		if n := in(slowAfter, to+100*time.Millisecond, end); n != 0 {
			t.Errorf("%d calls started from 100 ms after the stall took 100 ms or more, want 0 (hedged)", n)
		}
	})
}

// boundCalls sends rate GETs a second to url for d through a transport
// over base with the learned p95 delay and one hedge, and returns when
// each call that took 100 ms or more started, since start. No limiter
// (WithLimit(nil)): the subject is the hedges' bounds. The default
// limiter, its limit learned on answers that come from memory, would hold
// some of the calls back itself.
func boundCalls(t *testing.T, base http.RoundTripper, start time.Time, url string, d time.Duration, rate int) []time.Duration {
	t.Helper()
	tr, err := httpretry.NewTransport(base, httpretry.WithHedging(0, 0.95, 1), httpretry.WithLimit(nil))
	if err != nil {
		t.Fatal(err)
	}
	return slowCalls(t, tr, start, url, int(d/time.Second)*rate, rate)
}

// slowCalls sends n GETs to url through tr, rate a second, each on a
// goroutine of its own, and returns when each of those that took 100 ms or
// more started, since start.
func slowCalls(t *testing.T, tr http.RoundTripper, start time.Time, url string, n, rate int) []time.Duration {
	t.Helper()
	var mu sync.Mutex
	var slow []time.Duration
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
			at := time.Since(start)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("GET: %v", err)
				return
			}
			resp.Body.Close()
			if time.Since(start)-at >= 100*time.Millisecond {
				mu.Lock()
				slow = append(slow, at)
				mu.Unlock()
			}
		})
		time.Sleep(time.Second / time.Duration(rate))
	}
	wg.Wait()
	return slow
}

// TestHedgeQueue: 500 GETs a second with the learned p95 delay (about
// 12 ms), and 200 ms in which every request waits 6 ms in the provider's
// queue: each answer is late, every race reaches its delay, and a hedge
// would wait in the same queue and lengthen it. Few of the races are past
// their delay at any instant (the answers come 2 to 6 ms after it), so the
// due-share bound's floor does not hold them. Once two answers in a row
// came late, no hedge goes: only the races that reached their delay before
// those answers came get one. From a second after the queue on, the 1%
// tail gets its hedges again at the learned delay (its races reached their
// delay, and the due-share bound holds hedges for up to a second after).
func TestHedgeQueue(t *testing.T) {
	const rate = 500 // calls a second
	const from, to, end = 3 * time.Second, 3*time.Second + 200*time.Millisecond, 5 * time.Second
	synctest.Test(t, func(t *testing.T) {
		base := &stallBase{start: time.Now(), rng: rand.New(rand.NewPCG(2, 3)), queueFrom: from, queueTo: to, queueWait: 6 * time.Millisecond}
		slowAfter := boundCalls(t, base, base.start, "http://queue.test/", end, rate) // by start
		n := in(base.hedges, from, to+20*time.Millisecond)
		t.Logf("%d hedges from the queue's start to 20 ms after it; calls of 100 ms or more started from 1 s after it: %d",
			n, in(slowAfter, to+time.Second, end))
		if n > 5 {
			t.Errorf("%d hedges sent into the queue, want at most 5", n)
		}
		if n := in(slowAfter, to+time.Second, end); n != 0 {
			t.Errorf("%d calls started from 1 s after the queue took 100 ms or more, want 0 (hedged)", n)
		}
	})
}
