package grpcretry_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/stormguard/stormguard/grpcretry"
)

// TestHedgeStall: 200 calls a second with the learned p95 delay and one
// hedge, and a stall of the server for 1 s in which no answer ends (one
// due then comes at its end): hedges stop once the races that reached
// their delay in the last second are above 3 times 5% of its races (30 at
// 200 a second), where without the bound every race would get one (within
// the budget). From a second after the stall on, the 1% tail gets its
// hedges again at the learned delay: the stall's answers do not count in
// it.
func TestHedgeStall(t *testing.T) {
	if testing.Short() {
		t.Skip("simulation")
	}
	const rate = 200 // calls a second
	const from, to, end = 6 * time.Second, 7 * time.Second, 10 * time.Second
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var sentAt []time.Duration // of each server call, since start
		srv := &legServer{answer: stallAnswers(start, from, to, &sentAt)}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(0, 0.95, 1, unaryMethod))...)
		slowAfter := slowCalls(t, c, start, end, rate, to+time.Second) // calls started from 1 s after the stall that took 100 ms or more
		srv.settle(t)
		srv.mu.Lock()
		perSecond := make([]int, end/time.Second+1)
		inStall := 0
		for i, p := range srv.prev {
			if p == "" {
				continue // a first copy
			}
			perSecond[sentAt[i]/time.Second]++
			if sentAt[i] >= from && sentAt[i] < to {
				inStall++
			}
		}
		srv.mu.Unlock()
		t.Logf("hedges per second: %v; %d in the stall; %d calls started from 1 s after it took 100 ms or more", perSecond, inStall, slowAfter)
		if bound := 3 * (1 - 0.95) * rate; float64(inStall) > bound {
			t.Errorf("%d hedges in the 1 s stall, want at most %.0f", inStall, bound)
		}
		if slowAfter != 0 {
			t.Errorf("%d calls started from 1 s after the stall took 100 ms or more, want 0 (hedged)", slowAfter)
		}
	})
}

// TestHedgeBurst: 500 calls a second with the learned p95 delay and one
// hedge, and a stall of the server of 40 ms in which no answer ends: the
// 20 or so races that start in it queue behind it and reach their delay
// within a few milliseconds of each other. Few against the last second's
// 500 races (75 may reach their delay in a second), but most of the races
// in flight: at most 5 of them (the floor) get a hedge, as httpretry's.
func TestHedgeBurst(t *testing.T) {
	const rate = 500 // calls a second
	const from, to, end = 3 * time.Second, 3*time.Second + 40*time.Millisecond, 4 * time.Second
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var sentAt []time.Duration // of each server call, since start
		srv := &legServer{answer: stallAnswers(start, from, to, &sentAt)}
		// No limiter: the subject is the bound (the default one, its limit
		// learned on answers from memory, would hold calls back itself).
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(0, 0.95, 1, unaryMethod), grpcretry.WithLimit(nil))...)
		var wg sync.WaitGroup
		for range int(end/time.Second) * rate {
			wg.Go(func() {
				if _, _, err := hedgeCall(context.Background(), c); err != nil {
					t.Errorf("call: %v", err)
				}
			})
			time.Sleep(time.Second / rate)
		}
		wg.Wait()
		srv.settle(t)
		srv.mu.Lock()
		inBurst := 0
		for i, p := range srv.prev {
			if p != "" && sentAt[i] >= from && sentAt[i] < to {
				inBurst++
			}
		}
		srv.mu.Unlock()
		t.Logf("%d hedges in the 40 ms stall", inBurst)
		if inBurst > 5 {
			t.Errorf("%d hedges in the 40 ms stall, want at most 5 (the floor)", inBurst)
		}
	})
}

// stallAnswers answers call i, sent at a time it appends to *sentAt (under
// the server's lock) since start, in 8-12 ms, or 100 ms one call in 100;
// an answer due in [from, to) waits until to (a stall of the server).
func stallAnswers(start time.Time, from, to time.Duration, sentAt *[]time.Duration) func(int) legAnswer {
	return func(i int) legAnswer {
		now := time.Since(start)
		*sentAt = append(*sentAt, now)
		d := 8*time.Millisecond + time.Duration(i%5)*time.Millisecond
		if i%100 == 50 {
			d = 100 * time.Millisecond
		}
		if e := now + d; e >= from && e < to {
			d = to - now
		}
		return legAnswer{delay: d}
	}
}

// TestHedgeQueue: 500 calls a second with the learned p95 delay, and 200
// ms in which every call waits 6 ms in the server's queue: each answer is
// late, every race reaches its delay, and a hedge would wait in the same
// queue. Few of the races are past their delay at any instant, so the
// due-share bound's floor does not hold them; once two answers in a row
// came late, no hedge goes (as httpretry's). From a second after the queue
// on, the 1% tail gets its hedges again at the learned delay.
func TestHedgeQueue(t *testing.T) {
	const rate = 500 // calls a second
	const from, to, end = 3 * time.Second, 3*time.Second + 200*time.Millisecond, 5 * time.Second
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var sentAt []time.Duration // of each server call, since start
		srv := &legServer{answer: func(i int) legAnswer {
			now := time.Since(start)
			sentAt = append(sentAt, now)
			d := 8*time.Millisecond + time.Duration(i%5)*time.Millisecond
			if i%100 == 50 {
				d = 100 * time.Millisecond
			}
			if now >= from && now < to {
				d += 6 * time.Millisecond
			}
			return legAnswer{delay: d}
		}}
		c := serveInMemory(t, srv, newClient(t, grpcretry.WithHedging(0, 0.95, 1, unaryMethod), grpcretry.WithLimit(nil))...)
		slowAfter := slowCalls(t, c, start, end, rate, to+time.Second) // calls started from 1 s after the queue that took 100 ms or more
		srv.settle(t)
		srv.mu.Lock()
		inQueue := 0
		for i, p := range srv.prev {
			if p != "" && sentAt[i] >= from && sentAt[i] < to+20*time.Millisecond {
				inQueue++
			}
		}
		srv.mu.Unlock()
		t.Logf("%d hedges from the queue's start to 20 ms after it; %d calls started from 1 s after it took 100 ms or more", inQueue, slowAfter)
		if inQueue > 5 {
			t.Errorf("%d hedges sent into the queue, want at most 5", inQueue)
		}
		if slowAfter != 0 {
			t.Errorf("%d calls started from 1 s after the queue took 100 ms or more, want 0 (hedged)", slowAfter)
		}
	})
}

// slowCalls makes rate calls a second through c for d, each on a goroutine
// of its own, and returns how many of those started from after on (since
// start) took 100 ms or more.
func slowCalls(t *testing.T, c testpb.TestServiceClient, start time.Time, d time.Duration, rate int, after time.Duration) int {
	t.Helper()
	var mu sync.Mutex
	slow := 0
	var wg sync.WaitGroup
	for range int(d/time.Second) * rate {
		wg.Go(func() {
			at := time.Since(start)
			_, took, err := hedgeCall(context.Background(), c)
			if err != nil {
				t.Errorf("call: %v", err)
			}
			if at >= after && took >= 100*time.Millisecond {
				mu.Lock()
				slow++
				mu.Unlock()
			}
		})
		time.Sleep(time.Second / time.Duration(rate))
	}
	wg.Wait()
	return slow
}
