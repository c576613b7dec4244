package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
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
		// Answered after the store timeout: nobody will run a claim made
		// (the goroutine is the abandoned call's own).
		switch {
		case err == nil && res.Outcome == store.Claimed:
			g.unclaim(context.WithoutCancel(ctx), id, res.Owner, true)
		case err != nil && res.Owner != store.Owner{}:
			g.unclaim(context.WithoutCancel(ctx), id, res.Owner, false)
		}
	})
}

// unclaim releases owner's claim on id, which nobody runs: one answered
// after the store timeout (made, so released at once), or one the store
// may have made though its answer was lost (see [store.Result.Owner]).
// Such a claim may land after the failure that reported it (a command a
// stalled server reads only later), so its release is
// first tried a store timeout later, and one that finds no such lock does
// not end the tries: they go on after pauses that double (each jittered
// between half and all of it) until a release succeeds or a lock timeout
// has passed since the failure; a claim made after that is left to its
// own expiry. A claim known to be made ends its tries when the store says
// it is gone (store.ErrStaleOwner). Each lost claim costs at most
// log2(lock timeout / store timeout) + 2 releases (7 with the defaults),
// so that a store slow enough to lose many answers is not sent many
// more calls. It runs on the caller's goroutine, at most a lock timeout.
func (g *Guard) unclaim(ctx context.Context, id store.ID, owner store.Owner, made bool) {
	start := time.Now()
	end := start.Add(g.lockTimeout)
	pause := max(g.callTimeout, saveMinPause)
	if !made {
		sleepJittered(pause, end.Sub(start))
	}
	for tries := 1; ; tries++ {
		err := g.storeRelease(ctx, id, owner)
		if err == nil {
			g.logID(ctx, slog.LevelInfo, "idempotency: released a claim whose answer was lost or late", id, nil, "tries", tries)
			return
		}
		now := time.Now()
		if (made && errors.Is(err, store.ErrStaleOwner)) || !now.Before(end) {
			g.logID(ctx, slog.LevelDebug, "idempotency: no claim whose answer was lost or late to release", id, err, "tries", tries)
			return
		}
		pause *= 2
		sleepJittered(pause, end.Sub(now))
	}
}

// sleepJittered sleeps between half and all of d, at most left.
func sleepJittered(d, left time.Duration) {
	t := time.NewTimer(min(d/2+rand.N(d/2+1), max(left, 0)))
	<-t.C
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
