package idempotency

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
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

// release drops owner's lock on id once (why says why, for the log), and
// returns the time it spent in the store and the store's error. A release
// that fails is not tried again: the key is then free after the lock
// timeout, which is what a release asks for, only later. A key held under
// a lease is released by drop instead, which tries again.
func (g *Guard) release(ctx context.Context, id store.ID, owner store.Owner, why string) (time.Duration, error) {
	ctx = context.WithoutCancel(ctx)
	g.logID(ctx, slog.LevelDebug, "idempotency: releasing key", id, nil, "why", why)
	start := g.now()
	err := g.storeRelease(ctx, id, owner)
	d := g.since(start)
	if err != nil {
		g.logID(ctx, slog.LevelWarn, "idempotency: release failed; the key stays locked until the lock timeout", id, err)
	}
	return d, err
}

// storeRelease releases owner's lock on id, within the store timeout.
func (g *Guard) storeRelease(ctx context.Context, id store.ID, owner store.Owner) error {
	if g.local {
		return g.store.Release(ctx, id, owner)
	}
	_, err := call(ctx, g.callTimeout, "release", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, g.store.Release(ctx, id, owner)
	}, nil)
	return err
}

// begin claims key in the store, within the store timeout. No store is
// called with the request's cancellation: a claim canceled in flight may
// still be made by a shared store's server while its answer (and so the
// owner) is lost, which would block the key until the lock timeout; and
// the claim is not the request's (a request gone by then takes the
// canceled path after it, not a store failure's).
func (g *Guard) begin(ctx context.Context, id store.ID, fp store.Fingerprint) (store.Result, error) {
	if g.local {
		return g.store.Begin(context.WithoutCancel(ctx), id, fp, g.lockTimeout)
	}
	return call(context.WithoutCancel(ctx), g.callTimeout, "begin", func(ctx context.Context) (store.Result, error) {
		return g.store.Begin(ctx, id, fp, g.lockTimeout)
	}, func(res store.Result, err error) {
		if err == nil && res.Outcome == store.Claimed { // nobody will run it
			_, _ = g.release(context.Background(), id, res.Owner, "claim landed after the store timeout")
		}
	})
}

// storeComplete completes id with rec, within the store timeout.
func (g *Guard) storeComplete(ctx context.Context, id store.ID, owner store.Owner, rec store.Record) error {
	if g.local {
		return g.store.Complete(ctx, id, owner, rec, g.retention)
	}
	_, err := call(ctx, g.callTimeout, "complete", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, g.store.Complete(ctx, id, owner, rec, g.retention)
	}, nil)
	return err
}

// extend renews owner's lock on id, within the store timeout or bound,
// whichever is shorter. ended, if not nil, is called once the store's
// Extend has returned (which may be after extend did, for a store that
// answers late).
func (g *Guard) extend(ctx context.Context, id store.ID, owner store.Owner, bound time.Duration, ended func()) error {
	if g.local {
		err := g.store.Extend(ctx, id, owner, g.lockTimeout)
		if ended != nil {
			ended()
		}
		return err
	}
	_, err := call(ctx, min(g.callTimeout, bound), "extend", func(ctx context.Context) (struct{}, error) {
		if ended != nil {
			defer ended()
		}
		return struct{}{}, g.store.Extend(ctx, id, owner, g.lockTimeout)
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
