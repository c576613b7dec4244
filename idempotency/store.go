package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStaleOwner is returned (wrapped) by [Store.Complete], [Store.Extend]
// and [Store.Release] when the caller no longer holds the lock on the key:
// it never did, its lock timed out (whether or not another request has
// claimed the key since), or the key was already completed or released.
var ErrStaleOwner = errors.New("idempotency: not the lock owner (lock expired, reclaimed or finished)")

// ErrStoreFull is returned (wrapped) by a bounded store that cannot take a
// new claim or record without evicting a live one. For a claim, the
// [Middleware] answers 503 with Retry-After, as for any store error; for a
// record, it stores the response without its body instead.
var ErrStoreFull = errors.New("idempotency: store full")

// ErrLockLost is the cause (see [context.Cause]) with which the [Middleware]
// cancels a handler's context when it cannot renew the lock on the
// handler's key: another request may claim the key, so the handler should
// stop, and its response is not stored. The cause also wraps the store's
// error.
var ErrLockLost = errors.New("idempotency: lock on the key lost while the handler ran")

// Outcome says what [Store.Begin] found.
type Outcome uint8

const (
	// Claimed: the key was free (new, released or expired) and is now
	// locked by the request; [Result.Owner] holds its token.
	Claimed Outcome = iota + 1
	// InProgress: another request holds an unexpired lock on the key with
	// the same fingerprint.
	InProgress
	// Completed: a response is stored for the key with the same
	// fingerprint; [Result.Record] holds it.
	Completed
	// Mismatch: the key is locked or completed for a request with a
	// different fingerprint.
	Mismatch
)

// String returns the outcome's name ("claimed", "in-progress", "completed",
// "mismatch"), or "Outcome(N)".
func (o Outcome) String() string {
	switch o {
	case Claimed:
		return "claimed"
	case InProgress:
		return "in-progress"
	case Completed:
		return "completed"
	case Mismatch:
		return "mismatch"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Result is what [Store.Begin] returns.
type Result struct {
	// Outcome says what Begin found; never zero when Begin returns a nil
	// error.
	Outcome Outcome
	// Owner is the lock token when Outcome is Claimed; zero otherwise.
	Owner Owner
	// Record is the stored response when Outcome is Completed; zero
	// otherwise.
	Record Record
}

// Store keeps idempotency keys: their locks while the first request runs,
// then the finished responses. Every method is safe for concurrent use, by
// many goroutines and (for shared stores) many processes. Errors are
// wrapped; a non-nil error other than [ErrStaleOwner] means the store is
// unavailable for that call, and the middleware then fails closed (503).
//
// Expiry: a lock taken by Begin lasts lockTTL, and Extend moves its end; a
// record stored by Complete lasts retention. An expired lock or record is
// treated as absent: the next Begin claims the key anew.
//
// A request that reaches a shared store over a network may be executed
// twice (a client that resends after losing the reply): a Begin that finds
// the lock it took itself claims, and a Complete that finds its own
// identical record succeeds.
type Store interface {
	// Begin claims key for a request with fingerprint fp, locking it for
	// lockTTL (> 0), or reports what holds it. It is atomic: of many
	// concurrent Begins on a free key exactly one gets Claimed. A live lock
	// or record with a different fingerprint gives Mismatch.
	Begin(ctx context.Context, key Key, fp Fingerprint, lockTTL time.Duration) (Result, error)
	// Complete stores rec as the response for key and keeps it for
	// retention (> 0). It succeeds only while owner holds an unexpired lock
	// on key; otherwise it changes nothing and returns an error wrapping
	// ErrStaleOwner.
	// Complete also succeeds when owner already completed key with a record
	// equal to rec (a resent Complete).
	Complete(ctx context.Context, key Key, owner Owner, rec Record, retention time.Duration) error
	// Extend moves the end of owner's unexpired lock on key to lockTTL
	// (> 0) from now, so that a request that runs long keeps its key; the
	// middleware calls it about every third of the lock timeout while the
	// handler runs. Without such a lock it changes nothing and returns an
	// error wrapping ErrStaleOwner.
	Extend(ctx context.Context, key Key, owner Owner, lockTTL time.Duration) error
	// Release drops owner's unexpired lock on key so that the next Begin
	// claims it anew (the request's outcome was not worth keeping). Without
	// such a lock it changes nothing and returns an error wrapping
	// ErrStaleOwner.
	Release(ctx context.Context, key Key, owner Owner) error
}

// TTLChecker is implemented by a [Store] that cannot keep every lock
// timeout or retention exactly, e.g. one that keeps them in whole
// milliseconds. [NewMiddleware] checks its lock timeout and retention with
// CheckTTL and fails with the error, so that a duration the store would
// refuse or round to nothing is caught when the middleware is built, not
// when a request comes.
type TTLChecker interface {
	// CheckTTL returns an error if the store cannot keep a lock or record
	// for d.
	CheckTTL(d time.Duration) error
}
