package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrStaleOwner is returned (wrapped) by [Store.Complete] and
// [Store.Release] when the caller no longer holds the lock on the key: it
// never did, its lock timed out (whether or not another request has claimed
// the key since), or the key was already completed or released.
var ErrStaleOwner = errors.New("idempotency: not the lock owner (lock expired, reclaimed or finished)")

// ErrStoreFull is returned (wrapped) by a bounded store that cannot take a
// new claim or record without evicting a live one. The [Middleware] answers
// 503 with Retry-After, as for any store error.
var ErrStoreFull = errors.New("idempotency: store full")

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
// Expiry: a lock taken by Begin lasts lockTTL; a record stored by Complete
// lasts retention. An expired lock or record is treated as absent: the next
// Begin claims the key anew.
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
	Complete(ctx context.Context, key Key, owner Owner, rec Record, retention time.Duration) error
	// Release drops owner's unexpired lock on key so that the next Begin
	// claims it anew (the request's outcome was not worth keeping). Without
	// such a lock it changes nothing and returns an error wrapping
	// ErrStaleOwner.
	Release(ctx context.Context, key Key, owner Owner) error
}
