package idempotency

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/observe"
)

// ErrStoreUnavailable is wrapped by the error [Guard.Run] returns when the
// store could not claim the key: it failed, did not answer within the
// store timeout, had no room, or gave no outcome. The store's own error is
// wrapped too. The operation did not run: answer "unavailable, retry with
// the same key" (503, gRPC UNAVAILABLE).
var ErrStoreUnavailable = errors.New("idempotency: store unavailable")

// ErrLockLost is the cause (see [context.Cause]) with which [Guard.Run]
// (and so the middleware, [NewMiddleware]) cancels an operation's context when the lock
// on its key is lost: the store says another request holds it, or no
// renewal was confirmed for a whole lock timeout (less a twentieth of it,
// so that the operation is told before the store's lock ends). Another
// request may claim the key, so the operation should stop, and its response is not
// stored. The cause also wraps the store's error.
var ErrLockLost = errors.New("idempotency: lock on the key lost while the handler ran")

// Defaults of a Guard.
const (
	defaultLockTimeout  = time.Minute
	defaultRetention    = 24 * time.Hour
	defaultStoreTimeout = 2 * time.Second
)

// Outcome names of the events a Guard reports (see [WithObserver]).
const (
	eventNew        = "new"
	eventReplay     = "replay"
	eventInProgress = "in-progress"
	eventMismatch   = "mismatch"
	eventInvalid    = "invalid"
	eventStoreError = "store-error"
)

// Guard is the protocol-neutral core of server-side idempotency, on which
// the HTTP middleware ([NewMiddleware]) and the gRPC server interceptor (module grpcretry)
// are built; use it to guard any other kind of request (a queue consumer,
// say). [Guard.Run] claims a key in the store and runs the operation at
// most once per key within the retention period, keeping the lock alive
// while it runs and storing its record for replays; what the key and the
// fingerprint are, how a response becomes a [store.Record] and how each
// outcome is answered is the caller's business.
//
// Build a Guard with [NewGuard]. A Guard is immutable and safe for
// concurrent use; many Guards (and Middlewares, in many processes) may
// share one store. The zero Guard is not usable: Run returns an error
// without running anything.
type Guard struct {
	store       store.Store
	local       bool // store is a *MemoryStore: it answers at once
	lockTimeout time.Duration
	retention   time.Duration
	callTimeout time.Duration
	log         *slog.Logger
	obs         observe.Observer
	name        string
}

// newGuard returns a Guard on s with the default settings, or an error if
// s is nil (or a nil pointer).
func newGuard(by string, s store.Store) (Guard, error) {
	if v := reflect.ValueOf(s); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return Guard{}, fmt.Errorf("idempotency: %s: nil store", by)
	}
	g := Guard{
		store:       s,
		lockTimeout: defaultLockTimeout,
		retention:   defaultRetention,
		callTimeout: defaultStoreTimeout,
		log:         slog.New(slog.DiscardHandler),
	}
	_, g.local = s.(*MemoryStore)
	return g, nil
}

// NewGuard returns a Guard that keeps keys in s (a [*MemoryStore], or a
// shared store such as pgstore's or redisstore's). It fails when s is nil
// or an option is invalid.
func NewGuard(s store.Store, opts ...GuardOption) (*Guard, error) {
	g, err := newGuard("NewGuard", s)
	if err != nil {
		return nil, err
	}
	for _, o := range opts {
		if err := o.applyGuard(&g); err != nil {
			return nil, fmt.Errorf("idempotency: NewGuard: %w", err)
		}
	}
	return &g, nil
}

// Run runs fn at most once for the idempotency key key of the caller
// scope within the retention period: it claims the key for a request with
// fingerprint fp in the store and, depending on what the store holds,
// returns
//
//   - [store.Claimed], fn's record, nil: the key was free and fn ran, once.
//     fn runs on a child of ctx that is canceled, with the cause
//     [ErrLockLost], if the lock on the key is lost while it runs; Run
//     renews the lock meanwhile (every third of the lock timeout; a
//     renewal that is slow or fails is tried again, and only the store's
//     word that another request holds the key, or a lock timeout (less a
//     twentieth)
//     without a confirmed renewal, loses it). When fn returns keep, the
//     record is stored for replays (without its body, then without its
//     header, if the store has no room for them: fn must not run again
//     because its answer was large). A completion the store fails or does
//     not answer, or has no room for even without its header, is tried
//     again, with backoff and the lock still renewed,
//     until the store takes it or the lock is lost (at most about a lock
//     timeout): Run returns only then, so during a brief outage of the
//     store the answer waits for it, and a retry meanwhile is told the
//     request is in progress (or, if the store cannot take its claim
//     either, that the store is unavailable), never run again. When fn returns !keep, the
//     key is released so that a retry runs fn again (a release that fails
//     is tried again the same way, so that a retry is not told "in
//     progress" until the lock timeout); a lost lock is left to expire,
//     and nothing is stored. A record that no store takes (see
//     store.Record.MarshalBinary: a Status outside 200-999, a body beside
//     BodyOmitted, a header field with an empty name) is fn's misuse: it
//     is not stored, and the key is released as for !keep, at once. A
//     failure to store or release is
//     logged and reported to the observer, not returned: fn's answer
//     stands. If fn panics (or calls runtime.Goexit) the key is released
//     and the panic goes on.
//   - [store.Completed], the stored record, nil: a previous request with
//     the same fingerprint finished; replay the record. fn does not run.
//     The record may share memory with the store: do not modify it.
//   - [store.InProgress], a zero record, nil: a request with the same
//     fingerprint holds the key; ask the client to retry later. fn does
//     not run.
//   - [store.Mismatch], a zero record, nil: the key is held or was
//     completed for a request with a different fingerprint. fn does not
//     run.
//   - "", a zero record, an error: fn did not run. The error wraps
//     [ErrStoreUnavailable] when the store could not claim the key (fail
//     closed: never run fn unguarded; a claim it may have made, its
//     answer lost, is released in the background, see the package
//     documentation), or answered the claim so late
//     (after a third of the lock timeout or more) that a renewal had to
//     confirm the lock before fn started and did not (the claim is then
//     released, one try), or ctx's cause when ctx ended while the key
//     was claimed (the claim is released, tried again like a
//     completion).
//
// The key reaches the store only as a hash of (scope, key), so keys are
// scoped to the caller and the store never sees them; scope should not be
// empty. ctx is the request's: the claim is not canceled with it (a claim
// whose answer was lost would block the key until the lock timeout), but
// bounded by the store timeout. Run reports one event to the observer
// ([WithObserver]). A nil fn is an error.
func (g *Guard) Run(ctx context.Context, scope, key string, fp store.Fingerprint, fn func(ctx context.Context) (rec store.Record, keep bool)) (store.Outcome, store.Record, error) {
	if g == nil || g.store == nil {
		return "", store.Record{}, errors.New("idempotency: Run on a Guard not built by NewGuard")
	}
	if fn == nil {
		return "", store.Record{}, errors.New("idempotency: Run: nil fn")
	}
	id := hashKey(scope, key)
	claimedAt := time.Now()
	res, err := g.begin(ctx, id, fp)
	var spent time.Duration
	if g.obs != nil {
		spent = time.Since(claimedAt)
	}
	if err == nil {
		switch res.Outcome {
		case store.Claimed, store.Completed, store.InProgress, store.Mismatch:
		default:
			err = fmt.Errorf("no outcome (%q)", res.Outcome)
		}
	}
	if err != nil {
		if res.Owner != (store.Owner{}) {
			// A claim the store may have made, its answer lost: released
			// in the background, so that the retry the error asks for is
			// not told "in progress" until the lock timeout.
			go g.unclaim(context.WithoutCancel(ctx), id, res.Owner, false)
		}
		err = fmt.Errorf("%w: claim: %w", ErrStoreUnavailable, err)
		g.logID(ctx, slog.LevelError, "idempotency: store begin failed", id, err)
		g.report(ctx, eventStoreError, spent, err)
		return "", store.Record{}, err
	}
	switch res.Outcome {
	case store.Completed:
		g.report(ctx, eventReplay, spent, nil)
		return store.Completed, res.Record, nil
	case store.InProgress:
		g.report(ctx, eventInProgress, spent, nil)
		return store.InProgress, store.Record{}, nil
	case store.Mismatch:
		g.report(ctx, eventMismatch, spent, nil)
		return store.Mismatch, store.Record{}, nil
	}
	if el := time.Since(claimedAt); el >= g.lockTimeout/3 {
		// A claim answered late (a store slow to answer, a database
		// waiting on a row lock): its lock may be near its end or past
		// it, and another request may claim the key. Confirm it before
		// fn starts, so that fn never runs without the lock; not
		// canceled with ctx, like the claim.
		start := time.Now()
		err := errNoTimeLeft
		if left := g.lockTimeout - el; left > 0 {
			err = g.extend(context.WithoutCancel(ctx), id, res.Owner, left, nil)
		}
		if g.obs != nil {
			spent += time.Since(start)
		}
		if err != nil {
			err = fmt.Errorf("%w: claim answered %v after it was asked, its lock (%v) not confirmed: %w", ErrStoreUnavailable, el, g.lockTimeout, err)
			g.logID(ctx, slog.LevelError, "idempotency: late claim not confirmed; handler not run, key released", id, err)
			// Released (one try, the lock may be gone already), so that
			// the retry the error asks for is not told "in progress"
			// until the lock timeout.
			rstart := time.Now()
			if rerr := g.storeRelease(context.WithoutCancel(ctx), id, res.Owner); rerr != nil && !errors.Is(rerr, store.ErrStaleOwner) {
				g.logID(ctx, slog.LevelError, "idempotency: release of an unconfirmed late claim failed; the key stays locked until the lock timeout", id, rerr)
			}
			if g.obs != nil {
				spent += time.Since(rstart)
			}
			g.report(ctx, eventStoreError, spent, err)
			if ctx.Err() != nil {
				return "", store.Record{}, fmt.Errorf("idempotency: request ended before it ran: %w", context.Cause(ctx))
			}
			return "", store.Record{}, err
		}
		claimedAt = start
	}
	if ctx.Err() != nil { // gone while the key was claimed
		l := &lease{}
		g.hold(l, context.WithoutCancel(ctx), id, res.Owner, func(error) {}, claimedAt)
		d, rerr := g.drop(l, id, res.Owner, "request ended before it ran")
		_, renewals := l.stop()
		g.settled(ctx, spent+renewals+d, rerr)
		return "", store.Record{}, fmt.Errorf("idempotency: request ended before it ran: %w", context.Cause(ctx))
	}
	return g.run(ctx, id, res.Owner, claimedAt, spent, fn)
}

// run runs fn for the key that owner claimed at claimedAt, keeping the
// lock while it runs and while its record is stored, then stores its
// record or releases the key. spent is the time spent in the store so far
// (measured only with an observer).
func (g *Guard) run(ctx context.Context, id store.ID, owner store.Owner, claimedAt time.Time, spent time.Duration, fn func(context.Context) (store.Record, bool)) (store.Outcome, store.Record, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l := &lease{}
	g.hold(l, context.WithoutCancel(fctx), id, owner, cancel, claimedAt)
	finished := false
	defer func() {
		if finished {
			return
		}
		// fn panicked or called runtime.Goexit: release the key, report,
		// and let it unwind.
		if l.isLost() {
			_, renewals := l.stop()
			g.settled(ctx, spent+renewals, context.Cause(fctx))
			return
		}
		d, err := g.drop(l, id, owner, "handler panicked")
		_, renewals := l.stop()
		g.settled(ctx, spent+renewals+d, err)
	}()
	rec, keep := fn(fctx)
	finished = true
	var err error
	var d time.Duration
	switch {
	case l.isLost():
		err = context.Cause(fctx)
		g.logID(ctx, slog.LevelWarn, "idempotency: lock lost while the handler ran; response not stored", id, err)
	case !keep:
		d, err = g.drop(l, id, owner, "the answer is not stored")
	case checkRecord(rec) != nil:
		// fn's misuse: a record no store takes. Trying to store it would
		// be taken for an outage (a lock timeout of tries).
		cerr := fmt.Errorf("idempotency: the handler's record cannot be stored: %w", checkRecord(rec))
		g.logID(ctx, slog.LevelError, "idempotency: record not stored; key released, a retry runs the handler again", id, cerr)
		d, err = g.drop(l, id, owner, "the record cannot be stored") // "new" if released: no store call failed
	default:
		d, err = g.save(l, id, owner, rec)
	}
	_, renewals := l.stop()
	g.settled(ctx, spent+renewals+d, err)
	return store.Claimed, rec, nil
}

// settled reports a claimed key once it was stored or released: "new", or
// "store-error" with err.
func (g *Guard) settled(ctx context.Context, spent time.Duration, err error) {
	if err != nil {
		g.report(ctx, eventStoreError, spent, err)
	} else {
		g.report(ctx, eventNew, spent, nil)
	}
}

// ReportInvalid reports to the observer ([WithObserver]) a keyed request
// that was refused before the store was consulted: a malformed key, a
// request that cannot be fingerprinted, a caller that cannot be
// identified. The protocol layer calls it, since only it knows; Run never
// does. One event, Outcome "invalid"; nothing without an observer, and
// nothing for a nil or zero Guard.
func (g *Guard) ReportInvalid(ctx context.Context) {
	if g != nil {
		g.report(ctx, eventInvalid, 0, nil)
	}
}

// report sends one Idempotency event to the observer, if there is one.
func (g *Guard) report(ctx context.Context, outcome string, spent time.Duration, err error) {
	if g.obs == nil {
		return
	}
	g.obs.Observe(ctx, observe.Event{Kind: observe.Idempotency, Name: g.name, Outcome: outcome, Elapsed: spent, Err: err})
}

// logID logs msg at level with the key's store ID in hexadecimal and err
// (if not nil) and the pairs in args, formatting nothing when the level is
// not enabled.
func (g *Guard) logID(ctx context.Context, level slog.Level, msg string, id store.ID, err error, args ...any) {
	if !g.log.Enabled(ctx, level) {
		return
	}
	args = append([]any{"id", hex.EncodeToString(id[:])}, args...)
	if err != nil {
		args = append(args, "err", err)
	}
	g.log.Log(ctx, level, msg, args...)
}
