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
// for a whole lock timeout less a twentieth (lockMargin), so that the lock
// may soon expire and another request claim the key: then the lease
// cancels the operation's context with ErrLockLost, at that moment (a
// renewal that failed is tried again no later than then).
type lease struct {
	g       *Guard
	ctx     context.Context // the request's, not canceled with it
	rctx    context.Context // ctx, canceled by stop: the renewals'
	rcancel context.CancelFunc
	id      store.ID
	owner   store.Owner
	cancel  context.CancelCauseFunc
	every   time.Duration

	mu sync.Mutex
	// Fields below are guarded by mu.
	timer    *time.Timer
	inflight chan struct{} // closed when the store call of the renewal in flight returns
	lastOK   time.Time     // start of the last confirmed claim or renewal
	spent    time.Duration // time spent in renewals
	stopped  bool
	lost     bool
	lostc    chan struct{} // closed when lost; made on demand (see lostChan)
	lastErr  error         // the store's error of the last renewal that failed
}

// hold sets l up and starts it renewing owner's lock on id, claimed at
// claimedAt; ctx is the request's context without its cancellation, and
// cancel cancels the operation's context.
func (g *Guard) hold(l *lease, ctx context.Context, id store.ID, owner store.Owner, cancel context.CancelCauseFunc, claimedAt time.Time) {
	l.g, l.ctx, l.id, l.owner, l.cancel = g, ctx, id, owner, cancel
	l.rctx, l.rcancel = context.WithCancel(ctx)
	l.every = max(g.lockTimeout/3, time.Nanosecond)
	l.mu.Lock()
	l.lastOK = claimedAt
	l.timer = time.AfterFunc(time.Until(claimedAt.Add(l.every)), l.renew) // a third of the lock from the claim, not from now
	l.mu.Unlock()
}

// renew renews the lock once, on the timer's goroutine, and sets the timer
// for the next renewal: a third of the lock timeout after this one was
// sent when it succeeded, sooner when it failed. The store call is made without l.mu
// held, so that stopping the lease never waits for it.
func (l *lease) renew() {
	l.mu.Lock()
	if l.stopped || l.lost {
		l.mu.Unlock()
		return
	}
	start := time.Now()
	end := l.lastOK.Add(l.g.lockTimeout - lockMargin(l.g.lockTimeout)) // the lock's end, as far as we know, less the margin
	var ended chan struct{}
	left := end.Sub(start)
	if left > 0 {
		ended = make(chan struct{})
		l.inflight = ended
	}
	l.mu.Unlock()

	err := errNoTimeLeft
	if left > 0 {
		err = l.g.extend(l.rctx, l.id, l.owner, left, func() { close(ended) })
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inflight == ended {
		l.inflight = nil
	}
	now := time.Now()
	l.spent += now.Sub(start)
	if l.stopped || l.lost {
		return
	}
	var next time.Duration
	switch {
	case err == nil:
		l.lastOK = start
		// A third of the lock timeout after this renewal was sent, not
		// after it was answered (at once if that has passed): a store
		// steadily slow, well within the lock's time, would otherwise
		// push each renewal a slow answer later, until the lock ran out.
		next = max(start.Add(l.every).Sub(now), 0)
	case errors.Is(err, store.ErrStaleOwner):
		l.loseLocked(err)
		return
	case !now.Before(end):
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
		// Soon, and no later than the lock's end: a lock that ends
		// unconfirmed is lost then, not a pause later (another request
		// may claim the key from then on).
		next = min(max(l.every/4, time.Millisecond), end.Sub(now))
	}
	l.timer.Reset(next)
}

// lockMargin is how long before a lock's end, as far as this process
// knows it, the lease takes it for lost: a twentieth of the lock timeout,
// so that a timer that fires late still cancels the operation before the
// store lets another request claim the key (the store's lock began a
// round trip after the time this process counts from).
func lockMargin(lockTimeout time.Duration) time.Duration { return lockTimeout / 20 }

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
// time the renewals spent in the store. A renewal in flight is canceled
// and its store call waited for (at most the store timeout); its outcome
// is ignored. Calling stop again returns the same.
func (l *lease) stop() (lost bool, spent time.Duration) {
	l.mu.Lock()
	l.stopped = true
	l.timer.Stop()
	lost, spent, ended := l.lost, l.spent, l.inflight
	l.inflight = nil
	l.mu.Unlock()
	l.rcancel()
	if ended != nil {
		// A renewal in flight is canceled and waited for (a store that
		// ignores its context, at most the store timeout), so that no
		// store call of the request outlives it.
		t := time.NewTimer(l.g.callTimeout)
		select {
		case <-ended:
		case <-t.C:
		}
		t.Stop()
	}
	return lost, spent
}
