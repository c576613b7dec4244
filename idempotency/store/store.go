// Package store is what a store of idempotency keys implements: the
// [Store] interface that package idempotency's middleware and Guard call,
// and the values it keeps ([ID], [Fingerprint], [Owner], [Record]).
//
// A user of the middleware does not import this package: it passes a store
// (idempotency.MemoryStore, pgstore, redisstore) to idempotency.NewMiddleware.
// It is for whoever writes a store, and for a protocol's face on
// idempotency.Guard (the gRPC interceptor of module grpcretry stores its
// answers as Records): it is to package idempotency what
// database/sql/driver is to database/sql. Package idempotency/storetest is
// the conformance suite every store passes.
package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"time"
)

// ErrStaleOwner is returned (wrapped) by [Store.Complete], [Store.Extend]
// and [Store.Release] when the caller no longer holds the lock on the key:
// it never did, its lock timed out (whether or not another request has
// claimed the key since), or the key was already completed or released.
var ErrStaleOwner = errors.New("idempotency: not the lock owner (lock expired, reclaimed or finished)")

// ErrStoreFull is returned (wrapped) by a store that cannot take a new
// claim or record without evicting a live one (a bounded store that is
// full, a database out of disk). For a claim, the middleware answers 503
// with Retry-After, as for any store error; for a record, it stores the
// response without its body instead (then without its header fields).
var ErrStoreFull = errors.New("idempotency: store full")

// ID identifies an idempotency key inside a [Store]: a hash of the
// caller's scope and the key the caller sent, so that a store never sees
// the raw key or the scope, and one caller's key never names another's
// operation. Its first 8 bytes hash the scope alone (equal for every ID of
// one scope, and but for a one in 2^64 chance different between two
// scopes): a bounded store may share its room fairly between scopes by
// them. The other 24 bytes are spread uniformly. Package idempotency makes
// IDs; a store only compares and keeps them.
type ID [sha256.Size]byte

// Fingerprint identifies what a request asked for, built by
// [NewFingerprint]: a key sent again with a different fingerprint is a
// different request (answered 422), never a replay.
type Fingerprint [sha256.Size]byte

// NewFingerprint returns the fingerprint of a request with the given
// method, route (the target, e.g. "/accounts/7/charges"; for gRPC the full
// method name) and body hash (SHA-256 of the body bytes, or of the
// deterministically marshaled request message). Each part is
// length-prefixed, so no two different requests share a fingerprint by
// moving bytes from one part to the next.
func NewFingerprint(method, route string, bodySHA256 [sha256.Size]byte) Fingerprint {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte("stormguard-idempotency-fingerprint\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(method)))])
	h.Write([]byte(method))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(route)))])
	h.Write([]byte(route))
	h.Write(bodySHA256[:])
	var f Fingerprint
	h.Sum(f[:0])
	return f
}

// Owner is the token that proves which request holds the lock on a key. A
// [Store] makes a new one with [NewOwner] each time [Store.Begin] claims a
// key; only that owner may complete, extend or release it. The zero Owner
// is never issued.
type Owner [16]byte

// NewOwner returns a random owner token from crypto/rand, never the zero
// Owner. It is safe for concurrent use.
func NewOwner() Owner {
	var o Owner
	for o == (Owner{}) {
		_, _ = rand.Read(o[:]) // never fails (Go 1.24+: it crashes the program instead)
	}
	return o
}

// Outcome says what [Store.Begin] found: one of the four constants below,
// each named by its value; "" is none.
type Outcome string

const (
	// Claimed: the key was free (new, released or expired) and is now
	// locked by the request; [Result.Owner] holds its token.
	Claimed Outcome = "claimed"
	// InProgress: another request holds an unexpired lock on the key with
	// the same fingerprint.
	InProgress Outcome = "in-progress"
	// Completed: a response is stored for the key with the same
	// fingerprint; [Result.Record] holds it.
	Completed Outcome = "completed"
	// Mismatch: the key is locked or completed for a request with a
	// different fingerprint.
	Mismatch Outcome = "mismatch"
)

// Result is what [Store.Begin] returns.
type Result struct {
	// Outcome says what Begin found; never "" when Begin returns a nil
	// error.
	Outcome Outcome
	// Owner is the lock token when Outcome is Claimed. With a non-nil
	// error from Begin (Outcome empty), a non-zero Owner is the token of a
	// claim the store may have made though its answer was lost (the call
	// timed out or its connection broke after the command was sent): the
	// caller must not run the operation under it, and should release it
	// (the idempotency Guard does, in the background). Zero otherwise.
	Owner Owner
	// Record is the stored response when Outcome is Completed; zero
	// otherwise. It may share memory with the store: do not modify it.
	Record Record
}

// Store keeps idempotency keys: their locks while the first request runs,
// then the finished responses. Every method is safe for concurrent use, by
// many goroutines and (for shared stores) many processes. Errors are
// wrapped; a non-nil error other than [ErrStaleOwner] and [ErrStoreFull]
// means the store is unavailable for that call (the middleware then fails
// closed: 503), and the caller may try the call again.
//
// Expiry: a lock taken by Begin lasts lockTTL, and Extend moves its end; a
// record stored by Complete lasts retention. An expired lock or record is
// treated as absent: the next Begin claims the key anew. Durations are at
// least a millisecond (the middleware refuses shorter ones); a store may
// round a retention down to its resolution, never to zero, but a lock's
// duration only up: a lock that ends before its holder's Guard thinks lets
// another request claim the key while the operation still runs. A shared store should
// judge expiry by one clock for all its clients (the database's or the
// server's, not each caller's).
//
// A call that reaches a shared store over a network may be executed twice
// (a client that resends after losing the reply): a Begin that finds the
// lock it took itself claims, and a Complete that finds its own identical
// record succeeds.
type Store interface {
	// Begin claims id for a request with fingerprint fp, locking it for
	// lockTTL, or reports what holds it. It is atomic: of many concurrent
	// Begins on a free key exactly one gets Claimed. A live lock or
	// record with a different fingerprint gives Mismatch. A Begin that
	// fails once its claim may have reached the server returns the
	// claim's owner token with the error (see [Result.Owner]), so that
	// the claim can be released rather than hold the key until lockTTL.
	Begin(ctx context.Context, id ID, fp Fingerprint, lockTTL time.Duration) (Result, error)
	// Complete stores rec as the response for id and keeps it for
	// retention. It succeeds only while owner holds an unexpired lock on
	// id, or when owner already completed id with a record equal to rec
	// (a resent Complete); otherwise it changes nothing and returns an
	// error wrapping ErrStaleOwner. A record the store has no room for
	// gives an error wrapping ErrStoreFull.
	Complete(ctx context.Context, id ID, owner Owner, rec Record, retention time.Duration) error
	// Extend moves the end of owner's unexpired lock on id to lockTTL
	// from now, so that a request that runs long keeps its key; the
	// idempotency Guard calls it about every third of the lock timeout
	// while the request runs. Without such a lock it changes nothing and
	// returns an error wrapping ErrStaleOwner.
	Extend(ctx context.Context, id ID, owner Owner, lockTTL time.Duration) error
	// Release drops owner's unexpired lock on id so that the next Begin
	// claims it anew (the request's outcome was not worth keeping).
	// Without such a lock it changes nothing and returns an error wrapping
	// ErrStaleOwner.
	Release(ctx context.Context, id ID, owner Owner) error
}
