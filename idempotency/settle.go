package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// now returns the time for measuring a store call, if there is an
// observer to report it to; the zero time otherwise.
func (g *Guard) now() time.Time {
	if g.obs == nil {
		return time.Time{}
	}
	return time.Now()
}

// since returns the time since start (from g.now), 0 without an observer.
func (g *Guard) since(start time.Time) time.Duration {
	if g.obs == nil {
		return 0
	}
	return time.Since(start)
}

// complete stores rec for key, and returns the time it spent in the store
// and, if it could not store even part of rec, why. When the store has no
// room for the body (or rec's body was not kept) it stores the status and
// header fields without it, and if need be the status alone: the operation
// must not run again because its record was too large. A call that fails
// otherwise is tried once more (a resent completion is harmless); if that
// fails too, the key stays locked until the lock timeout.
func (g *Guard) complete(ctx context.Context, key Key, owner Owner, rec Record) (time.Duration, error) {
	start := g.now()
	recs := [...]Record{
		{Status: rec.Status, Header: rec.Header, Body: rec.Body},
		{Status: rec.Status, Header: rec.Header, BodyOmitted: true},
		{Status: rec.Status, BodyOmitted: true},
	}
	first := 0
	if rec.BodyOmitted {
		first = 1
	}
	for i := first; i < len(recs); i++ {
		err := g.storeComplete(ctx, key, owner, recs[i])
		if err != nil && !errors.Is(err, ErrStaleOwner) && !errors.Is(err, ErrStoreFull) {
			g.log.WarnContext(ctx, "idempotency: store complete failed; trying once more", "key", key, "err", err)
			err = g.storeComplete(ctx, key, owner, recs[i])
		}
		switch {
		case err == nil:
			if i > 0 {
				g.log.WarnContext(ctx, "idempotency: response stored without its body (over the size cap, or no room in the store)",
					"key", key, "status", rec.Status, "headers", i == 1, "over_cap", rec.BodyOmitted)
			}
			return g.since(start), nil
		case errors.Is(err, ErrStaleOwner):
			g.log.WarnContext(ctx, "idempotency: completion rejected: lock lost", "key", key, "err", err)
			return g.since(start), fmt.Errorf("%w: %w", ErrLockLost, err)
		case !errors.Is(err, ErrStoreFull):
			g.log.ErrorContext(ctx, "idempotency: store complete failed; the key stays locked until the lock timeout", "key", key, "err", err)
			return g.since(start), err
		}
	}
	g.log.ErrorContext(ctx, "idempotency: no room in the store even for the status; the key stays locked until the lock timeout", "key", key)
	return g.since(start), fmt.Errorf("idempotency: no room even for the status: %w", ErrStoreFull)
}

// release drops owner's lock on key (why says why, for the log), and
// returns the time it spent in the store and the store's error.
func (g *Guard) release(ctx context.Context, key Key, owner Owner, why string) (time.Duration, error) {
	ctx = context.WithoutCancel(ctx)
	g.log.DebugContext(ctx, "idempotency: releasing key", "key", key, "why", why)
	start := g.now()
	var err error
	if g.local {
		err = g.store.Release(ctx, key, owner)
	} else {
		_, err = call(ctx, g.callTimeout, "release", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, g.store.Release(ctx, key, owner)
		}, nil)
	}
	d := g.since(start)
	if err != nil {
		g.log.WarnContext(ctx, "idempotency: release failed; the key stays locked until the lock timeout", "key", key, "err", err)
	}
	return d, err
}

// begin claims key in the store, within the store timeout. A shared store
// is not called with the request's cancellation: a claim canceled in
// flight may still be made by the server while its answer (and so the
// owner) is lost, which would block the key until the lock timeout.
func (g *Guard) begin(ctx context.Context, key Key, fp Fingerprint) (Result, error) {
	if g.local {
		return g.store.Begin(ctx, key, fp, g.lockTimeout)
	}
	return call(context.WithoutCancel(ctx), g.callTimeout, "begin", func(ctx context.Context) (Result, error) {
		return g.store.Begin(ctx, key, fp, g.lockTimeout)
	}, func(res Result, err error) {
		if err == nil && res.Outcome == Claimed { // nobody will run it
			_, _ = g.release(context.Background(), key, res.Owner, "claim landed after the store timeout")
		}
	})
}

// storeComplete completes key with rec, within the store timeout.
func (g *Guard) storeComplete(ctx context.Context, key Key, owner Owner, rec Record) error {
	if g.local {
		return g.store.Complete(ctx, key, owner, rec, g.retention)
	}
	_, err := call(ctx, g.callTimeout, "complete", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, g.store.Complete(ctx, key, owner, rec, g.retention)
	}, nil)
	return err
}

// extend renews owner's lock on key, within the store timeout or bound,
// whichever is shorter.
func (g *Guard) extend(ctx context.Context, key Key, owner Owner, bound time.Duration) error {
	if g.local {
		return g.store.Extend(ctx, key, owner, g.lockTimeout)
	}
	_, err := call(ctx, min(g.callTimeout, bound), "extend", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, g.store.Extend(ctx, key, owner, g.lockTimeout)
	}, nil)
	return err
}

// call runs the store call f (named op) with a context bounded by d and
// waits for it at most d, even if f ignores its context: then it returns
// an error, and orphan (if not nil) gets f's results once f returns.
func call[T any](ctx context.Context, d time.Duration, op string, f func(context.Context) (T, error), orphan func(T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	type answer struct {
		v   T
		err error
	}
	done := make(chan answer, 1)
	var state atomic.Int32 // 0 waiting, 1 answered, 2 abandoned
	go func() {
		defer cancel()
		v, err := f(ctx)
		done <- answer{v, err}
		if !state.CompareAndSwap(0, 1) && orphan != nil {
			orphan(v, err)
		}
	}()
	select {
	case a := <-done:
		return a.v, a.err
	case <-ctx.Done():
		if !state.CompareAndSwap(0, 2) { // answered meanwhile
			a := <-done
			return a.v, a.err
		}
		var zero T
		return zero, fmt.Errorf("idempotency: store %s: no answer within %v: %w", op, d, context.Cause(ctx))
	}
}

// lease keeps a claimed key's lock alive while its operation runs,
// renewing it every third of the lock timeout. When it cannot (the lock is
// gone, or the store has not confirmed it for so long that the next
// renewal could come after it expires), it cancels the operation's
// context.
type lease struct {
	g      *Guard
	ctx    context.Context // the request's, not canceled with it
	key    Key
	owner  Owner
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

// hold sets l up and starts it renewing owner's lock on key, claimed at
// claimedAt; ctx is the request's context without its cancellation, and
// cancel cancels the operation's context.
func (g *Guard) hold(l *lease, ctx context.Context, key Key, owner Owner, cancel context.CancelCauseFunc, claimedAt time.Time) {
	l.g, l.ctx, l.key, l.owner, l.cancel = g, ctx, key, owner, cancel
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
	err := l.g.extend(l.ctx, l.key, l.owner, l.every)
	l.spent += time.Since(start)
	switch {
	case err == nil:
		l.lastOK = start
	case errors.Is(err, ErrStaleOwner) || time.Since(l.lastOK)+l.every >= l.g.lockTimeout:
		l.lost = true
		l.cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
		l.g.log.WarnContext(l.ctx, "idempotency: lock lost while the handler runs; canceling it", "key", l.key, "err", err)
		return
	default:
		l.g.log.WarnContext(l.ctx, "idempotency: lock renewal failed; trying again", "key", l.key, "err", err)
	}
	l.timer.Reset(l.every)
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
