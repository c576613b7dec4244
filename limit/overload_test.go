package limit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// queueDest is a destination that serves the work it accepted even after
// its caller left: workers serve a first-in-first-out queue, and a caller
// that leaves (its context done) does not take its work back.
type queueDest struct {
	queue   chan *queueJob
	service time.Duration
	slow    atomic.Int64 // service multiplier; 0 means 1
	// served counts the answers taken by a waiting caller, wasted the
	// ones served after their caller left, shed the work refused by a
	// full queue.
	served, wasted, shed atomic.Int64
}

type queueJob struct {
	done chan struct{}
	left atomic.Bool
}

// newQueueDest starts workers that serve a queue of queue jobs; stop
// ends them.
func newQueueDest(workers, queue int, service time.Duration) (d *queueDest, stop func()) {
	d = &queueDest{queue: make(chan *queueJob, queue), service: service}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for j := range d.queue {
				s := d.service
				if m := d.slow.Load(); m > 1 {
					s *= time.Duration(m)
				}
				time.Sleep(s)
				if j.left.Load() {
					d.wasted.Add(1)
				} else {
					d.served.Add(1)
				}
				close(j.done)
			}
		})
	}
	return d, func() { close(d.queue); wg.Wait() }
}

// call sends one attempt and waits for its answer within ctx; it reports
// whether the attempt was dropped (shed, or ctx ended first).
func (d *queueDest) call(ctx context.Context) (dropped bool) {
	j := &queueJob{done: make(chan struct{})}
	select {
	case d.queue <- j:
	default:
		d.shed.Add(1)
		return true
	}
	select {
	case <-j.done:
		return false
	case <-ctx.Done():
		j.left.Store(true)
		return true
	}
}

// At 95% of a destination's capacity, its service 5 times slower for 5 s:
// calls (each with a 2 s deadline, the attempt within it) that get a slot
// with less time left than the destination's latency while later calls
// wait fail instead, so the slowed destination serves calls that are
// still waiting for the answer. Before (the front waiter got every slot),
// the slots went to calls whose deadline passed before their answer: the
// destination served almost nothing but abandoned work, each abandoned
// attempt a drop that lowered the limit further, for the whole trigger.
// And the limit settles at the slowed destination's servers or above: the
// gradient, which compares with the baseline (10 ms) until a window at a
// low limit shows the destination's own latency (50 ms), brings the limit
// down to about 4 and no lower, so a low limit must include 4 or the
// limit stays there, under the 10 servers (it did, when low meant 2 with
// no healthy limit learned at 95% load).
func TestOverloadSlotsGoToCallsThatCanUseThem(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const (
			workers  = 10
			service  = 10 * time.Millisecond
			rate     = 950 // calls per second: 95% of 1000
			deadline = 2 * time.Second
		)
		d, stopDest := newQueueDest(workers, 100, service)
		l := mustNew(t, Config{})
		var ok, refused atomic.Int64
		var wg sync.WaitGroup
		run := func(dur time.Duration) {
			every := time.Second / rate
			for at := time.Duration(0); at < dur; at += every {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					defer cancel()
					p, err := l.Acquire(ctx)
					if err != nil {
						refused.Add(1)
						return
					}
					dropped := d.call(ctx)
					l.Release(p, dropped)
					if !dropped {
						ok.Add(1)
					}
				})
				time.Sleep(every)
			}
		}
		run(5 * time.Second) // warm
		served0, wasted0 := d.served.Load(), d.wasted.Load()
		d.slow.Store(5)
		stopTr := make(chan struct{})
		tr := trace(l, 50*time.Millisecond, stopTr)
		run(5 * time.Second)
		close(stopTr)
		lo, hi := tr.between(2*time.Second, 5*time.Second)
		d.slow.Store(1)
		served, wasted := d.served.Load()-served0, d.wasted.Load()-wasted0
		run(5 * time.Second)
		wg.Wait()
		stopDest()
		// The slowed destination serves 10 / 50 ms = 200 a second.
		t.Logf("limit %d..%d in the last 3 s of the slowdown (10 servers)", lo, hi)
		t.Logf("in 5 s of a x5 slowdown at 95%% load: %d answers to waiting callers (capacity 1000), %d served after the caller left; whole run: %d ok, %d refused, %d shed, limit %d at the end",
			served, wasted, ok.Load(), refused.Load(), d.shed.Load(), l.Limit())
		if served < 800 {
			t.Errorf("%d answers to waiting callers in the slowdown, want at least 80%% of its capacity (1000)", served)
		}
		if lo < 10 {
			t.Errorf("limit down to %d in the last 3 s of the slowdown, want at least the 10 servers", lo)
		}
		if wasted > served/10 {
			t.Errorf("%d answers served after their caller left in the slowdown (%d to waiting callers), want at most a tenth", wasted, served)
		}
	})
}

// At its turn a call with a deadline needs twice the destination's
// latency left when a later call that has that much waits: the lower of
// the smoothed latency and the last round trip's, so that a destination
// that just recovered (smoothed 100 ms, last round trip 10 ms) is seen at
// once. The last waiter gets its slot whatever its time left, and so does
// the first when no later one has the time either.
func TestTurnNeedsTwiceTheLatency(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		srtt, recent time.Duration
		left, second time.Duration // the waiters' time left (second 0: none)
		wantNoTime   bool
	}{
		{"slow destination", 100 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 10 * time.Second, true},
		{"slow destination, enough time", 100 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond, 10 * time.Second, false},
		{"recovered destination", 100 * time.Millisecond, 10 * time.Millisecond, 150 * time.Millisecond, 10 * time.Second, false},
		{"latency rising", 10 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 10 * time.Second, false},
		{"last waiter", 100 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 0, false},
		{"no later waiter has the time", 100 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond, 190 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l := mustNew(t, Config{Max: 1})
				l.mu.Lock()
				l.learn.base.value, l.learn.srtt, l.learn.recent = 5*time.Millisecond, tc.srtt, tc.recent
				l.mu.Unlock()
				p, err := l.Acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				// wait starts a call that waits with left to its deadline.
				wait := func(left time.Duration) <-chan error {
					done := make(chan error, 1)
					go func() {
						ctx, cancel := context.WithTimeout(context.Background(), left)
						defer cancel()
						p, err := l.Acquire(ctx)
						if err == nil {
							l.Release(p, false)
						}
						done <- err
					}()
					synctest.Wait()
					return done
				}
				first := wait(tc.left)
				var second <-chan error
				if tc.second > 0 {
					second = wait(tc.second)
				}
				// Dropped: a latency sample would end a window and set
				// the latencies this case sets.
				l.Release(p, true)
				err = <-first
				if got := errors.Is(err, errNoTime); got != tc.wantNoTime {
					t.Errorf("the first waiter (%v left; latency smoothed %v, last %v) got %v, want errNoTime %v", tc.left, tc.srtt, tc.recent, err, tc.wantNoTime)
				}
				if second != nil {
					if err := <-second; err != nil {
						t.Errorf("the second waiter got %v, want its slot", err)
					}
				}
			})
		})
	}
}
