package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// Pauses between two tries of a store call that settles a key: the first
// is at most saveMinPause, each next one twice the last, up to
// saveMaxPause or an eighth of the lock timeout, whichever is shorter;
// each is jittered (between half and all of it) so that the requests that
// met one outage do not come back to the store in step.
const (
	saveMinPause = 10 * time.Millisecond
	saveMaxPause = time.Second
)

// save stores rec for id, which owner holds under the lease l, and returns
// the time it spent in the store and, if it could not store even part of
// rec, why. When the store has no room for the body (or rec's body was not
// kept) it stores the status and header fields without it, and if need be
// the status alone: the operation must not run again because its record
// was too large. Each completion is tried until it settles (see settle): a
// brief outage of the store at completion does not run a handler twice.
func (g *Guard) save(l *lease, id store.ID, owner store.Owner, rec store.Record) (time.Duration, error) {
	omitted := rec.BodyOmitted || len(rec.Body) > 0 // a record with no body loses none when its body is left out
	recs := [...]store.Record{
		{Status: rec.Status, Header: rec.Header, Body: rec.Body},
		{Status: rec.Status, Header: rec.Header, BodyOmitted: omitted},
		{Status: rec.Status, BodyOmitted: omitted},
	}
	i := 0
	if rec.BodyOmitted || len(rec.Body) == 0 { // without a body, the first two are the same record
		i = 1
	}
	first := i
	var spent time.Duration
	for ; ; i++ {
		// The status alone has no smaller record to fall back on: no room
		// for it is then a failure to try again, as a store that is down
		// (room may come back while the lock is held).
		last := i == len(recs)-1
		d, err := g.settle(l, "complete", last, func() error { return g.storeComplete(l.ctx, id, owner, recs[i]) })
		spent += d
		switch {
		case err == nil:
			if i > first || rec.BodyOmitted {
				g.logID(l.ctx, slog.LevelWarn, "idempotency: response stored without its body (over the size cap, or no room in the store)", id, nil,
					"status", rec.Status, "headers", i == 1, "over_cap", rec.BodyOmitted)
			}
			return spent, nil
		case errors.Is(err, store.ErrStaleOwner):
			g.logID(l.ctx, slog.LevelWarn, "idempotency: completion rejected: lock lost", id, err)
			return spent, fmt.Errorf("%w: %w", ErrLockLost, err)
		case !errors.Is(err, store.ErrStoreFull):
			return spent, err
		case last:
			g.logID(l.ctx, slog.LevelError, "idempotency: no room in the store even for the status until the lock was lost; the key stays locked until the lock timeout", id, err)
			return spent, fmt.Errorf("idempotency: no room even for the status: %w", err)
		}
	}
}

// drop releases owner's lock on id, held under the lease l, so that a
// retry runs the operation again (why says why, for the log), trying
// until the release settles (see settle): a brief outage of the store
// does not leave the key locked, every retry answered "in progress",
// until the lock timeout.
func (g *Guard) drop(l *lease, id store.ID, owner store.Owner, why string) (time.Duration, error) {
	g.logID(l.ctx, slog.LevelDebug, "idempotency: releasing key", id, nil, "why", why)
	d, err := g.settle(l, "release", false, func() error { return g.storeRelease(l.ctx, id, owner) })
	if errors.Is(err, store.ErrStaleOwner) && !errors.Is(err, ErrLockLost) {
		err = fmt.Errorf("%w: %w", ErrLockLost, err) // the store says the lock is no longer ours, as save reports it
	}
	return d, err
}

// settle runs try, a store call (named op) that settles a key held under
// the lease l, and returns the time spent in the store and try's last
// error. A call that fails otherwise than with store.ErrStaleOwner or
// store.ErrStoreFull (the store is down, slow, or lost the answer; or, with
// full set, has no room) is tried again after a pause, while l keeps renewing the lock, until it succeeds
// (a resent call that finds its own work done succeeds), fails so, or l
// finds the lock lost (then one last try is made: a lease may see its
// lock vanish because an earlier try, whose answer was lost, did settle
// the key), or a lock timeout has passed since the first failure (a store
// that refuses the call that long: the lock then expires, as after a
// crash). Until then a retry of the request is answered "in progress".
func (g *Guard) settle(l *lease, op string, full bool, try func() error) (time.Duration, error) {
	var spent time.Duration
	var deadline time.Time // set at the first failure
	pause := min(saveMinPause, g.maxSavePause())
	for tries, last := 1, false; ; tries++ {
		start := g.now()
		err := try()
		spent += g.since(start)
		if err == nil || errors.Is(err, store.ErrStaleOwner) || (!full && errors.Is(err, store.ErrStoreFull)) {
			if err == nil && tries > 1 {
				g.logID(l.ctx, slog.LevelInfo, "idempotency: store "+op+" done after the store failed", l.id, nil, "tries", tries)
			}
			return spent, err
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(g.lockTimeout)
			g.logID(l.ctx, slog.LevelWarn, "idempotency: store "+op+" failed; trying again while the lock is held", l.id, err)
		}
		if last || !now.Before(deadline) {
			g.logID(l.ctx, slog.LevelError, "idempotency: store "+op+" failed until the lock was lost; the key stays locked until the lock timeout", l.id, err, "tries", tries)
			if l.isLost() && !errors.Is(err, ErrLockLost) {
				err = fmt.Errorf("%w: %w", ErrLockLost, err)
			}
			return spent, err
		}
		if l.isLost() {
			last = true
			continue
		}
		t := time.NewTimer(min(pause/2+rand.N(pause/2+1), deadline.Sub(now)))
		select {
		case <-t.C:
		case <-l.lostChan():
			t.Stop()
		}
		pause = min(2*pause, g.maxSavePause())
	}
}

// maxSavePause returns the longest pause between two tries of a store
// call that settles a key.
func (g *Guard) maxSavePause() time.Duration {
	return max(min(saveMaxPause, g.lockTimeout/8), time.Millisecond)
}
