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

// lease keeps a claimed key's lock alive while its operation runs,
// renewing it every third of the lock timeout. When it cannot (the lock is
// gone, or the store has not confirmed it for so long that the next
// renewal could come after it expires), it cancels the operation's
// context.
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
	lastOK  time.Time     // start of the last successful claim or renewal
	spent   time.Duration // time spent in renewals
	stopped bool
	lost    bool
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

func (l *lease) renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	start := time.Now()
	err := l.g.extend(l.ctx, l.id, l.owner, l.every)
	l.spent += time.Since(start)
	switch {
	case err == nil:
		l.lastOK = start
	case errors.Is(err, store.ErrStaleOwner) || time.Since(l.lastOK)+l.every >= l.g.lockTimeout:
		l.lost = true
		l.cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
		l.g.logID(l.ctx, slog.LevelWarn, "idempotency: lock lost while the handler runs; canceling it", l.id, err)
		return
	default:
		l.g.logID(l.ctx, slog.LevelWarn, "idempotency: lock renewal failed; trying again", l.id, err)
	}
	l.timer.Reset(l.every)
}

// isLost reports whether the lock was lost.
func (l *lease) isLost() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lost
}

// stop stops the renewals and reports whether the lock was lost and the
// time the renewals spent in the store.
func (l *lease) stop() (lost bool, spent time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.timer.Stop()
	return l.lost, l.spent
}
