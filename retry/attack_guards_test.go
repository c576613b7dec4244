// Black-box attacks on the guards together through the retry loop: probe
// rounds to a dependency that is down, attempts admitted by a closed
// breaker that wait for a limiter slot while it opens, the release after
// an outage.

package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

func g4Half() float64 { return 0.5 }

// g4LearnBaseline runs n attempts of d each through lim so that it learns
// a baseline latency of d.
func g4LearnBaseline(t *testing.T, lim *limit.Limiter, d time.Duration, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		p, err := lim.Acquire(context.Background())
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		time.Sleep(d)
		lim.Release(p, false)
	}
}

type g4Count struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *g4Count) Observe(_ context.Context, e observe.Event) {
	k := string(e.Kind)
	switch e.Kind {
	case observe.GiveUp:
		k += ":" + e.Reason
	case observe.BreakerWait, observe.AttemptEnd:
		k += ":" + e.Outcome
	}
	c.mu.Lock()
	c.m[k]++
	c.mu.Unlock()
}

// Calls admitted by a closed breaker that wait for a limiter slot while
// the breaker trips: are they sent while it is open?
func TestAttackGuardsSentWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: g4Half})
		p, _ := retry.New(retry.WithMaxAttempts(1), retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}))
		hold, _ := lim.Acquire(context.Background())
		var mu sync.Mutex
		sentOpen, sent := 0, 0
		var wg sync.WaitGroup
		for i := 0; i < 50; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				p.Do(ctx, func(ctx context.Context, attempt int) error {
					mu.Lock()
					sent++
					if brk.State() != breaker.Closed {
						sentOpen++
					}
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
					return io.ErrUnexpectedEOF
				})
			}()
		}
		synctest.Wait() // all 50 admitted by the closed breaker, waiting for the slot
		brk.Trip(0)     // the dependency is known down (e.g. another caller's failures, a fleet)
		if brk.State() != breaker.Open {
			t.Fatalf("state %v", brk.State())
		}
		lim.Release(hold, true)
		time.Sleep(5 * time.Second) // still within the open period
		mu.Lock()
		t.Logf("sent %d attempts, %d of them while the breaker was open", sent, sentOpen)
		if sentOpen > 0 {
			t.Errorf("%d attempts sent while the breaker was open (state %v)", sentOpen, brk.State())
		}
		mu.Unlock()
		wg.Wait()
	})
}

// The same, with the breaker tripped by the loop's own failure.
func TestAttackGuardsSentWhileOpenOwnFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{Max: 1})
		brk, _ := breaker.New(breaker.Config{OpenFor: 10 * time.Second, Rand: g4Half, ConsecutiveFailures: 1})
		p, _ := retry.New(retry.WithMaxAttempts(1), retry.WithGuards(retry.Guards{Breaker: brk, Limiter: lim}))
		var mu sync.Mutex
		sentOpen, sent := 0, 0
		var wg sync.WaitGroup
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				p.Do(ctx, func(ctx context.Context, attempt int) error {
					mu.Lock()
					sent++
					if brk.State() != breaker.Closed {
						sentOpen++
					}
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
					return io.ErrUnexpectedEOF // the dependency is down
				})
			}()
		}
		time.Sleep(5 * time.Second) // within the 10 s open period after the first failure
		mu.Lock()
		t.Logf("sent %d attempts, %d of them while the breaker was open (state now %v)", sent, sentOpen, brk.State())
		if sentOpen > 0 {
			t.Errorf("%d attempts sent after the breaker opened", sentOpen)
		}
		mu.Unlock()
		wg.Wait()
	})
}

// The limiter's refusals at the breaker's release after an outage: are
// calls refused as hopeless while the limiter then sits idle?
func TestAttackGuardsHopelessAtRelease(t *testing.T) {
	for _, withBreaker := range []bool{true, false} {
		for _, outage := range []time.Duration{2 * time.Second, 8 * time.Second} {
			t.Run(fmt.Sprintf("breaker=%v/outage=%v", withBreaker, outage), func(t *testing.T) { g4Hopeless(t, withBreaker, outage) })
		}
	}
}

func g4Hopeless(t *testing.T, withBreaker bool, outage time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		lim, _ := limit.New(limit.Config{})
		brk, _ := breaker.New(breaker.Config{ReleaseRate: -1, Rand: g4Half})
		g := retry.Guards{Limiter: lim}
		if withBreaker {
			g.Breaker = brk
		}
		p, _ := retry.New(retry.WithGuards(g))
		const (
			from    = 2 * time.Second
			dl      = 3 * time.Second
			every   = 500 * time.Microsecond
			latency = 20 * time.Millisecond
		)
		to := from + outage
		total := to + 4*time.Second
		start := time.Now()
		var mu sync.Mutex
		inflight, sends := 0, 0
		type refusal struct{ at, left time.Duration }
		var refused []refusal
		served := 0
		var wg sync.WaitGroup
		// a sampler of the limiter: limit and in flight every 10 ms
		done := make(chan struct{})
		go func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(10 * time.Millisecond):
				}
				el := time.Since(start)
				if ((el > to+700*time.Millisecond && el < to+1000*time.Millisecond) || (el > from-100*time.Millisecond && el < from+200*time.Millisecond) || el%(500*time.Millisecond) < 10*time.Millisecond) && el%(50*time.Millisecond) < 10*time.Millisecond {
					mu.Lock()
					in, w := lim.SetCap(-1)
					t.Logf("t=%v breaker=%v limit=%d inflight=%d(op %d) waiting=%d refused so far=%d served=%d sends=%d", el.Round(time.Millisecond), brk.State(), lim.Limit(), in, inflight, w, len(refused), served, sends)
					mu.Unlock()
				}
			}
		}()
		for time.Since(start) < total {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), dl)
				defer cancel()
				dead, _ := ctx.Deadline()
				err := p.Do(ctx, func(ctx context.Context, attempt int) error {
					mu.Lock()
					inflight++
					sends++
					mu.Unlock()
					time.Sleep(latency)
					mu.Lock()
					inflight--
					mu.Unlock()
					if el := time.Since(start); el >= from && el < to {
						return io.ErrUnexpectedEOF
					}
					return nil
				})
				mu.Lock()
				if err == nil && time.Since(start) > to {
					served++
				}
				if errors.Is(err, retry.Limited) && time.Since(start) >= to {
					refused = append(refused, refusal{time.Since(start), time.Until(dead)})
				}
				mu.Unlock()
			}()
			time.Sleep(every)
		}
		wg.Wait()
		close(done)
		// refusals after the recovery with at least 1 s left
		n := 0
		var first, last time.Duration
		for _, r := range refused {
			if r.left >= time.Second {
				if n == 0 {
					first = r.at
				}
				last = r.at
				n++
			}
		}
		t.Logf("after recovery: %d calls refused (Limited), %d of them with >= 1 s (of 3 s) left, at %v..%v; served after recovery %d", len(refused), n, first, last, served)
		if n > 0 {
			t.Errorf("%d calls refused as hopeless with >= 1 s left after the dependency recovered", n)
		}
	})
}

// How many attempts does the dependency see in one probe round while it
// is down, when the waiting calls' deadlines come during the round?
func TestAttackGuardsProbeRoundSends(t *testing.T) {
	for _, withLimiter := range []bool{false, true} {
		t.Run(fmt.Sprintf("limiter=%v", withLimiter), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Rand: g4Half, Probes: 3})
				g := retry.Guards{Breaker: brk}
				if withLimiter {
					g.Limiter, _ = limit.New(limit.Config{})
				}
				p, _ := retry.New(retry.WithGuards(g))
				brk.Trip(0) // the dependency is down; round at 1 s
				start := time.Now()
				var mu sync.Mutex
				type send struct {
					at, left time.Duration
					probe    bool
				}
				var sends []send
				var wg sync.WaitGroup
				// 200 calls, one every 0.5 ms, whose deadlines fall around the round
				for i := 0; i < 200; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						defer cancel()
						dead, _ := ctx.Deadline()
						p.Do(ctx, func(ctx context.Context, attempt int) error {
							mu.Lock()
							sends = append(sends, send{time.Since(start), time.Until(dead), retry.IsProbe(ctx)})
							mu.Unlock()
							time.Sleep(20 * time.Millisecond)
							return io.ErrUnexpectedEOF // down
						})
					}()
					time.Sleep(500 * time.Microsecond)
				}
				wg.Wait()
				time.Sleep(1500 * time.Millisecond)
				t.Logf("sends while down: %d (probes per round 3), state %v", len(sends), brk.State())
				for i, s := range sends {
					if i < 12 {
						t.Logf("  send at %v, %v left, probe %v", s.at, s.left, s.probe)
					}
				}
				if len(sends) > 3 {
					t.Errorf("the dependency saw %d attempts in one probe round of 3 probes while down", len(sends))
				}
			})
		})
	}
}

// Sustained: calls arrive steadily (1 a ms) with a 1 s deadline while the
// dependency is down for good (its failures take fail). The breaker should
// let "a few probes about every second" through; with limiter, the
// limiter first learns a healthy latency of 20 ms.
func TestAttackGuardsProbeRoundSendsSustained(t *testing.T) {
	for _, tc := range []struct {
		limiter bool
		fail    time.Duration
	}{{false, 20 * time.Millisecond}, {true, 20 * time.Millisecond}, {true, 100 * time.Millisecond}} {
		t.Run(fmt.Sprintf("limiter=%v/fail=%v", tc.limiter, tc.fail), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				brk, _ := breaker.New(breaker.Config{OpenFor: time.Second, Rand: g4Half, Probes: 3})
				g := retry.Guards{Breaker: brk}
				if tc.limiter {
					g.Limiter, _ = limit.New(limit.Config{})
					g4LearnBaseline(t, g.Limiter, 20*time.Millisecond, 64)
				}
				rec := &g4Count{m: map[string]int{}}
				p, _ := retry.New(retry.WithGuards(g), retry.WithObserver(rec))
				brk.Trip(0)
				start := time.Now()
				var mu sync.Mutex
				perSec := make([]int, 8)
				var wg sync.WaitGroup
				for time.Since(start) < 6*time.Second {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), time.Second)
						defer cancel()
						p.Do(ctx, func(ctx context.Context, attempt int) error {
							mu.Lock()
							perSec[time.Since(start)/time.Second]++
							mu.Unlock()
							time.Sleep(tc.fail)
							return io.ErrUnexpectedEOF // down for good
						})
					}()
					time.Sleep(time.Millisecond)
				}
				wg.Wait()
				t.Logf("attempts the down dependency saw, per second: %v (breaker %v); events %v", perSec, brk.State(), rec.m)
				total := 0
				for _, n := range perSec {
					total += n
				}
				if total > 3*7 {
					t.Errorf("the dependency, down, saw %d attempts in 6 s through a breaker probing 3 per ~1 s", total)
				}
			})
		})
	}
}
