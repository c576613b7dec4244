package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// Pauses between two tries to store a record: the first is at most
// saveMinPause, each next one twice the last, up to saveMaxPause or an
// eighth of the lock timeout, whichever is shorter; each is jittered
// (between half and all of it) so that the requests that met one outage
// do not come back to the store in step.
const (
	saveMinPause = 10 * time.Millisecond
	saveMaxPause = time.Second
)

// save stores rec for id, which owner holds under the lease l, and returns
// the time it spent in the store and, if it could not store even part of
// rec, why.
//
// When the store has no room for the body (or rec's body was not kept) it
// stores the status and header fields without it, and if need be the
// status alone: the operation must not run again because its record was
// too large. A call that fails otherwise (the store is down, slow, or
// lost the answer) is tried again after a pause, while l keeps renewing
// the lock, until the store takes the record (a resent completion that
// finds its own record succeeds), says the lock is lost, or l finds the
// lock lost (then one last try is made: a lease that saw its lock vanish
// because the record was stored by a try whose answer was lost finds it
// so), or a lock timeout has passed since the first try (a store that
// refuses the record that long: the lock then expires, as after a crash).
// Until then a retry of the request is answered "in progress", never run:
// a brief outage of the store at completion does not run a handler twice.
func (g *Guard) save(l *lease, id store.ID, owner store.Owner, rec store.Record) (time.Duration, error) {
	recs := [...]store.Record{
		{Status: rec.Status, Header: rec.Header, Body: rec.Body},
		{Status: rec.Status, Header: rec.Header, BodyOmitted: true},
		{Status: rec.Status, BodyOmitted: true},
	}
	i := 0
	if rec.BodyOmitted {
		i = 1
	}
	var spent time.Duration
	var deadline time.Time // set at the first failure
	pause := min(saveMinPause, g.maxSavePause())
	tries, last := 0, false
	for {
		start := g.now()
		err := g.storeComplete(l.ctx, id, owner, recs[i])
		spent += g.since(start)
		tries++
		switch {
		case err == nil:
			if i > 0 {
				g.logID(l.ctx, slog.LevelWarn, "idempotency: response stored without its body (over the size cap, or no room in the store)", id, nil,
					"status", rec.Status, "headers", i == 1, "over_cap", rec.BodyOmitted)
			}
			if tries > 1 {
				g.logID(l.ctx, slog.LevelInfo, "idempotency: response stored after the store failed", id, nil, "tries", tries)
			}
			return spent, nil
		case errors.Is(err, store.ErrStaleOwner):
			g.logID(l.ctx, slog.LevelWarn, "idempotency: completion rejected: lock lost", id, err)
			return spent, fmt.Errorf("%w: %w", ErrLockLost, err)
		case errors.Is(err, store.ErrStoreFull):
			if i++; i == len(recs) {
				g.logID(l.ctx, slog.LevelError, "idempotency: no room in the store even for the status; the key stays locked until the lock timeout", id, err)
				return spent, fmt.Errorf("idempotency: no room even for the status: %w", err)
			}
			continue
		}
		now := time.Now()
		if deadline.IsZero() {
			deadline = now.Add(g.lockTimeout)
			g.logID(l.ctx, slog.LevelWarn, "idempotency: store complete failed; trying again while the lock is held", id, err)
		}
		if last || !now.Before(deadline) {
			g.logID(l.ctx, slog.LevelError, "idempotency: store complete failed until the lock was lost; the key stays locked until the lock timeout", id, err, "tries", tries)
			return spent, err
		}
		if l.isLost() {
			last = true
			continue
		}
		wait := min(pause/2+rand.N(pause/2+1), deadline.Sub(now))
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-l.lostChan():
			t.Stop()
		}
		pause = min(2*pause, g.maxSavePause())
	}
}

// maxSavePause returns the longest pause between two tries to store a
// record.
func (g *Guard) maxSavePause() time.Duration {
	return max(min(saveMaxPause, g.lockTimeout/8), time.Millisecond)
}
