package limit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/stormguard/stormguard/internal/waitq"
)

// ErrLimited matches (with errors.Is) every refusal of [Limiter.Acquire]:
// the error wraps it with the reason.
var ErrLimited = errors.New("limit: limited")

// Config is the plain-data description of a [Limiter]. Zero fields take
// the defaults.
type Config struct {
	// Max is the most attempts in flight the limit may grow to; 0 means
	// 1000.
	Max int
	// Timeout is the attempt timeout; 0 means none.
	Timeout time.Duration
	// Throttle is K of client-side adaptive throttling; 0 turns it off.
	Throttle float64
	// Waiting bounds the calls waiting for a slot; 0 means 10,000.
	Waiting int
}

const (
	defaultMax     = 1000
	defaultWaiting = 10_000
)

// New validates c and returns a Limiter.
func New(c Config) (*Limiter, error) {
	switch {
	case c.Max < 0:
		return nil, fmt.Errorf("limit: Config.Max %d is negative", c.Max)
	case c.Timeout < 0:
		return nil, fmt.Errorf("limit: Config.Timeout %v is negative", c.Timeout)
	case c.Throttle < 0 || c.Throttle != c.Throttle:
		return nil, fmt.Errorf("limit: Config.Throttle %v is not 0 or positive", c.Throttle)
	case c.Waiting < 0:
		return nil, fmt.Errorf("limit: Config.Waiting %d is negative", c.Waiting)
	}
	if c.Max == 0 {
		c.Max = defaultMax
	}
	if c.Waiting == 0 {
		c.Waiting = defaultWaiting
	}
	l := &Limiter{cfg: c, limit: c.Max, base: time.Now()}
	l.waiters.Max = c.Waiting
	return l, nil
}

// Limiter is a concurrency limit for one destination. It is safe for
// concurrent use.
type Limiter struct {
	cfg  Config
	base time.Time

	mu       sync.Mutex
	limit    int
	inflight int
	waiters  waitq.List[waiter]
}

type waiter struct {
	ch      chan struct{}
	granted bool
}

// Permit is one slot of a [Limiter], to give back with [Limiter.Release].
type Permit struct {
	start time.Duration
	ok    bool
}

var (
	errFull     = fmt.Errorf("%w: limit reached and the call has no deadline", ErrLimited)
	errTooMany  = fmt.Errorf("%w: too many calls waiting", ErrLimited)
	errDeadline = fmt.Errorf("%w: the deadline passed while waiting", ErrLimited)
)

// Acquire returns a slot now, or waits for one earliest deadline first
// within ctx's deadline, or fails with an error wrapping [ErrLimited].
func (l *Limiter) Acquire(ctx context.Context) (Permit, error) {
	if err := ctx.Err(); err != nil {
		return Permit{}, err
	}
	l.mu.Lock()
	if l.inflight < l.limit && l.waiters.Len() == 0 {
		l.inflight++
		l.mu.Unlock()
		return Permit{start: time.Since(l.base), ok: true}, nil
	}
	dl, has := ctx.Deadline()
	if !has {
		l.mu.Unlock()
		return Permit{}, errFull
	}
	now := time.Now()
	left := dl.Sub(now)
	if left <= 0 {
		l.mu.Unlock()
		return Permit{}, errDeadline
	}
	n := &waitq.Waiter[waiter]{Value: waiter{ch: make(chan struct{}, 1)}}
	if !l.waiters.Push(n, waitq.Deadline(now.Sub(l.base), left)) {
		l.mu.Unlock()
		return Permit{}, errTooMany
	}
	l.mu.Unlock()
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-n.Value.ch:
		return Permit{start: time.Since(l.base), ok: true}, nil
	case <-ctx.Done():
		return Permit{}, l.leave(n, context.Cause(ctx))
	case <-t.C:
		return Permit{}, l.leave(n, errDeadline)
	}
}

// leave takes a waiter that gives up off the list; if it was granted a
// slot meanwhile, the slot goes to the next waiter.
func (l *Limiter) leave(n *waitq.Waiter[waiter], err error) error {
	l.mu.Lock()
	if !l.waiters.Remove(n) && n.Value.granted {
		l.inflight--
		l.grantLocked()
	}
	l.mu.Unlock()
	return err
}

func (l *Limiter) grantLocked() {
	for l.inflight < l.limit {
		w := l.waiters.PopFront()
		if w == nil {
			return
		}
		w.Value.granted = true
		l.inflight++
		w.Value.ch <- struct{}{}
	}
}

// Release gives p back; dropped reports that the attempt timed out, was
// cancelled or got an overload answer.
func (l *Limiter) Release(p Permit, dropped bool) {
	if !p.ok {
		return
	}
	l.mu.Lock()
	l.inflight--
	l.grantLocked()
	l.mu.Unlock()
}

// Limit returns the current limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit
}
