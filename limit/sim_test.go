package limit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// dest is a simulated destination for tests in a testing/synctest bubble:
// servers attempts served at once, each for service, the rest queued
// (first come first served, unbounded); capacity servers/service per
// second. While down, it answers every attempt at once with an overload
// answer (a dropped attempt); while slow, service takes slow times as
// long; while hung, no attempt finishes before its timeout.
type dest struct {
	slots   chan struct{}
	service time.Duration
	down    atomic.Bool
	hung    atomic.Bool
	slow    atomic.Int64 // service multiplier; 0 means 1
	served  atomic.Int64
	// overhead, when set, is the part of an attempt's round trip outside
	// the servers (the network, the client's own work), spent before
	// the attempt reaches the queue.
	overhead func() time.Duration
}

func newDest(servers int, service time.Duration) *dest {
	return &dest{slots: make(chan struct{}, servers), service: service}
}

// call runs one attempt with the attempt timeout and reports whether it
// was dropped (timed out or answered with an overload).
func (d *dest) call(timeout time.Duration) (dropped bool) {
	if d.down.Load() {
		time.Sleep(100 * time.Microsecond)
		return true
	}
	if d.overhead != nil {
		time.Sleep(d.overhead())
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	if d.hung.Load() {
		<-t.C
		return true
	}
	select {
	case d.slots <- struct{}{}:
	case <-t.C:
		return true
	}
	defer func() { <-d.slots }()
	s := d.service
	if m := d.slow.Load(); m > 1 {
		s *= time.Duration(m)
	}
	w := time.NewTimer(s)
	defer w.Stop()
	select {
	case <-w.C:
		d.served.Add(1)
		return false
	case <-t.C:
		return true
	}
}

// load runs clients goroutines that each call through l in a loop until
// stop is closed: Acquire within deadline, the attempt with timeout,
// Release with the outcome. A refusal waits pause before the next call.
func load(l *Limiter, d *dest, clients int, deadline, timeout time.Duration, stop <-chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				p, err := l.Acquire(ctx)
				cancel()
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				l.Release(p, d.call(timeout))
			}
		})
	}
	return &wg
}

// baselineOf returns l's baseline latency.
func baselineOf(l *Limiter) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.learn.base.value
}

// limitTrace samples l's limit every step until stop; read it after.
type limitTrace struct {
	mu  sync.Mutex
	at  []time.Duration
	lim []int
}

func trace(l *Limiter, step time.Duration, stop <-chan struct{}) *limitTrace {
	tr := &limitTrace{}
	start := time.Now()
	go func() {
		tk := time.NewTicker(step)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				tr.mu.Lock()
				tr.at = append(tr.at, time.Since(start))
				tr.lim = append(tr.lim, l.Limit())
				tr.mu.Unlock()
			}
		}
	}()
	return tr
}

// first returns when the limit first reached at least n, or -1.
func (tr *limitTrace) first(n int) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for i, v := range tr.lim {
		if v >= n {
			return tr.at[i]
		}
	}
	return -1
}

// between returns the lowest and highest limit seen in [from, to).
func (tr *limitTrace) between(from, to time.Duration) (lo, hi int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	lo = 1 << 30
	for i, v := range tr.lim {
		if tr.at[i] >= from && tr.at[i] < to {
			lo, hi = min(lo, v), max(hi, v)
		}
	}
	return lo, hi
}

func mustNew(t testing.TB, c Config) *Limiter {
	t.Helper()
	l, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
