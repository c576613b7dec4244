package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// lease keeps a claimed key's lock alive while its operation runs and
// while its record is stored, renewing it every third of the lock timeout.
// A renewal that fails or does not answer within the store timeout is
// tried again soon; one that is slow is waited for, up to the time the
// lock has left. The lock is lost only when the store says the caller no
// longer holds it (store.ErrStaleOwner), or when no renewal was confirmed
// for a whole lock timeout, so that the lock may have expired and another
// request claimed the key: then the lease cancels the operation's context
// with ErrLockLost.
type lease struct {
	g      *Guard
	ctx    context.Context // the request's, not canceled with it
	id     store.ID
	owner  store.Owner
	cancel context.CancelCauseFunc
	every  time.Duration

	mu sync.Mutex
	// Fields below are guarded by mu.
	timer   *time.Timer
	lastOK  time.Time     // start of the last confirmed claim or renewal
	spent   time.Duration // time spent in renewals
	stopped bool
	lost    bool
	lostc   chan struct{} // closed when lost; made on demand (see lostChan)
	lastErr error         // the store's error of the last renewal that failed
}

// hold sets l up and starts it renewing owner's lock on id, claimed at
// claimedAt; ctx is the request's context without its cancellation, and
// cancel cancels the operation's context.
func (g *Guard) hold(l *lease, ctx context.Context, id store.ID, owner store.Owner, cancel context.CancelCauseFunc, claimedAt time.Time) {
	l.g, l.ctx, l.id, l.owner, l.cancel = g, ctx, id, owner, cancel
	l.every = max(g.lockTimeout/3, time.Nanosecond)
	l.mu.Lock()
	l.lastOK = claimedAt
	l.timer = time.AfterFunc(l.every, l.renew)
	l.mu.Unlock()
}

// renew renews the lock once, on the timer's goroutine, and sets the timer
// for the next renewal: after a third of the lock timeout when it
// succeeded, sooner when it failed. The store call is made without l.mu
// held, so that stopping the lease never waits for it.
func (l *lease) renew() {
	l.mu.Lock()
	if l.stopped || l.lost {
		l.mu.Unlock()
		return
	}
	start := time.Now()
	end := l.lastOK.Add(l.g.lockTimeout) // the lock's end, as far as we know
	l.mu.Unlock()

	err := errNoTimeLeft
	if left := end.Sub(start); left > 0 {
		err = l.g.extend(l.ctx, l.id, l.owner, left)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	l.spent += time.Since(start)
	if l.stopped || l.lost {
		return
	}
	next := l.every
	switch {
	case err == nil:
		l.lastOK = start
	case errors.Is(err, store.ErrStaleOwner):
		l.loseLocked(err)
		return
	case !time.Now().Before(end):
		if err == errNoTimeLeft && l.lastErr != nil {
			// The store's error, not only that the time ran out: the cause
			// wraps it (ErrLockLost).
			err = fmt.Errorf("%w; the last renewal: %w", err, l.lastErr)
		}
		l.loseLocked(fmt.Errorf("no renewal confirmed within the lock timeout (%v): %w", l.g.lockTimeout, err))
		return
	default:
		l.lastErr = err
		l.g.logID(l.ctx, slog.LevelWarn, "idempotency: lock renewal failed; trying again", l.id, err)
		next = max(l.every/4, time.Millisecond)
	}
	l.timer.Reset(next)
}

// errNoTimeLeft is the renewal error when the lock's time was gone before
// the renewal could be sent.
var errNoTimeLeft = errors.New("the lock's time is gone")

// loseLocked marks the lock lost because of err and cancels the
// operation. It requires l.mu held.
func (l *lease) loseLocked(err error) {
	l.lost = true
	l.cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
	if l.lostc != nil {
		close(l.lostc)
	}
	l.g.logID(l.ctx, slog.LevelWarn, "idempotency: lock lost; canceling the handler", l.id, err)
}

// isLost reports whether the lock was lost.
func (l *lease) isLost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// lostChan returns a channel closed once the lock is lost. It is made on
// the first call only (the store's failures are rare; a request whose
// store works allocates nothing for it).
func (l *lease) lostChan() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lostc == nil {
		l.lostc = make(chan struct{})
		if l.lost {
			close(l.lostc)
		}
	}
	return l.lostc
}

// stop stops the renewals and reports whether the lock was lost and the
// time the renewals spent in the store. A renewal in flight is not waited
// for; its outcome is ignored. Calling stop again returns the same.
func (l *lease) stop() (lost bool, spent time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.timer.Stop()
	return l.lost, l.spent
}
