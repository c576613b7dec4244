package idempotency

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// save stores rec for id, and returns the time it spent in the store and,
// if it could not store even part of rec, why. When the store has no room
// for the body (or rec's body was not kept) it stores the status and
// header fields without it, and if need be the status alone: the
// operation must not run again because its record was too large. A call
// that fails otherwise is tried once more (a resent completion is
// harmless); if that fails too, the key stays locked until the lock
// timeout.
func (g *Guard) save(l *lease, id store.ID, owner store.Owner, rec store.Record) (time.Duration, error) {
	ctx := l.ctx
	start := g.now()
	recs := [...]store.Record{
		{Status: rec.Status, Header: rec.Header, Body: rec.Body},
		{Status: rec.Status, Header: rec.Header, BodyOmitted: true},
		{Status: rec.Status, BodyOmitted: true},
	}
	first := 0
	if rec.BodyOmitted {
		first = 1
	}
	for i := first; i < len(recs); i++ {
		err := g.storeComplete(ctx, id, owner, recs[i])
		if err != nil && !errors.Is(err, store.ErrStaleOwner) && !errors.Is(err, store.ErrStoreFull) {
			g.logID(ctx, slog.LevelWarn, "idempotency: store complete failed; trying once more", id, err)
			err = g.storeComplete(ctx, id, owner, recs[i])
		}
		switch {
		case err == nil:
			if i > 0 {
				g.logID(ctx, slog.LevelWarn, "idempotency: response stored without its body (over the size cap, or no room in the store)", id, nil,
					"status", rec.Status, "headers", i == 1, "over_cap", rec.BodyOmitted)
			}
			return g.since(start), nil
		case errors.Is(err, store.ErrStaleOwner):
			g.logID(ctx, slog.LevelWarn, "idempotency: completion rejected: lock lost", id, err)
			return g.since(start), fmt.Errorf("%w: %w", ErrLockLost, err)
		case !errors.Is(err, store.ErrStoreFull):
			g.logID(ctx, slog.LevelError, "idempotency: store complete failed; the key stays locked until the lock timeout", id, err)
			return g.since(start), err
		}
	}
	g.logID(ctx, slog.LevelError, "idempotency: no room in the store even for the status; the key stays locked until the lock timeout", id, nil)
	return g.since(start), fmt.Errorf("idempotency: no room even for the status: %w", store.ErrStoreFull)
}
