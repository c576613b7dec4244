package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/stormguard/stormguard/observe"
)

// ErrStoreUnavailable is wrapped by the error [Guard.Run] returns when the
// store could not claim the key: it failed, did not answer within the
// store timeout, had no room ([ErrStoreFull]) or gave no outcome. The
// store's own error is wrapped too. The operation did not run: answer
// "unavailable, retry with the same key" (503, gRPC UNAVAILABLE).
var ErrStoreUnavailable = errors.New("idempotency: store unavailable")

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
// the HTTP [Middleware] and the gRPC server interceptor (module grpcretry)
// are built; use it to guard any other kind of request. [Guard.Run] claims
// a key in the [Store] and runs the operation at most once per key within
// the retention period, keeping the lock alive while it runs and storing
// its [Record] for replays; what the key and the fingerprint are, how a
// response becomes a Record and how each outcome is answered is the
// caller's business.
//
// Build a Guard with [NewGuard]. A Guard is immutable and safe for
// concurrent use; many Guards (and Middlewares, in many processes) may
// share one Store. The zero Guard is not usable: Run returns an error
// without running anything.
type Guard struct {
	store       Store
	local       bool // store is a *MemoryStore: it answers at once
	lockTimeout time.Duration
	retention   time.Duration
	callTimeout time.Duration
	log         *slog.Logger
	obs         observe.Observer
	name        string
}

// defaultGuard returns a Guard on store with the default settings.
func defaultGuard(store Store) Guard {
	g := Guard{
		store:       store,
		lockTimeout: DefaultLockTimeout,
		retention:   DefaultRetention,
		callTimeout: DefaultStoreTimeout,
		log:         slog.New(slog.DiscardHandler),
	}
	_, g.local = store.(*MemoryStore)
	return g
}

// NewGuard returns a Guard that keeps keys in store, configured by the
// options of the core: [WithLockTimeout], [WithRetention],
// [WithStoreTimeout], [WithLogger], [WithObserver] and [WithName]. It fails
// when store is nil, an option is invalid or applies to a [Middleware]
// only, or the store cannot keep the lock timeout or retention
// ([TTLChecker]).
func NewGuard(store Store, opts ...Option) (*Guard, error) {
	m, err := build("NewGuard", store, opts)
	if err != nil {
		return nil, err
	}
	g := m.g
	return &g, nil
}

// Run runs fn at most once for key within the retention period: it claims
// key for a request with fingerprint fp in the store and, depending on
// what the store holds, returns
//
//   - [Claimed], fn's record, nil: the key was free and fn ran, once. fn
//     runs on a child of ctx that is canceled, with the cause
//     [ErrLockLost], if the lock on the key is lost while it runs; Run
//     renews the lock meanwhile ([Store.Extend], every third of the lock
//     timeout). When fn returns keep, the record is stored for replays
//     (without its body, then without its header, if the store has no room
//     for them: fn must not run again because its answer was large);
//     otherwise, or if the lock was lost, the key is released so that a
//     retry runs fn again. A failure to store or release is logged and
//     reported to the observer, not returned: fn's answer stands. If fn
//     panics (or calls runtime.Goexit) the key is released and the panic
//     goes on.
//   - [Completed], the stored record, nil: a previous request with the
//     same fingerprint finished; replay the record. fn does not run. The
//     record may share memory with the store: do not modify it.
//   - [InProgress], a zero record, nil: a request with the same
//     fingerprint holds the key; ask the client to retry later. fn does not
//     run.
//   - [Mismatch], a zero record, nil: the key is held or was completed for
//     a request with a different fingerprint. fn does not run.
//   - 0, a zero record, an error: fn did not run. The error wraps
//     [ErrStoreUnavailable] when the store could not claim the key (fail
//     closed: never run fn unguarded), or ctx's cause when ctx ended while
//     the key was claimed (the claim is released).
//
// ctx is the request's: the claim is not canceled with it (a claim whose
// answer was lost would block the key until the lock timeout), but bounded
// by the store timeout. Run reports one event to the observer
// ([WithObserver]). A nil fn is an error.
func (g *Guard) Run(ctx context.Context, key Key, fp Fingerprint, fn func(ctx context.Context) (rec Record, keep bool)) (Outcome, Record, error) {
	if g == nil || g.store == nil {
		return 0, Record{}, errors.New("idempotency: Run on a Guard not built by NewGuard")
	}
	if fn == nil {
		return 0, Record{}, errors.New("idempotency: Run: nil fn")
	}
	claimedAt := time.Now()
	res, err := g.begin(ctx, key, fp)
	var spent time.Duration
	if g.obs != nil {
		spent = time.Since(claimedAt)
	}
	if err == nil && (res.Outcome < Claimed || res.Outcome > Mismatch) {
		err = fmt.Errorf("no outcome (%v)", res.Outcome)
	}
	if err != nil {
		err = fmt.Errorf("%w: claim: %w", ErrStoreUnavailable, err)
		g.log.ErrorContext(ctx, "idempotency: store begin failed", "key", key, "err", err)
		g.report(ctx, eventStoreError, spent, err)
		return 0, Record{}, err
	}
	switch res.Outcome {
	case Completed:
		g.report(ctx, eventReplay, spent, nil)
		return Completed, res.Record, nil
	case InProgress:
		g.report(ctx, eventInProgress, spent, nil)
		return InProgress, Record{}, nil
	case Mismatch:
		g.report(ctx, eventMismatch, spent, nil)
		return Mismatch, Record{}, nil
	}
	if ctx.Err() != nil { // gone while the key was claimed
		d, rerr := g.release(ctx, key, res.Owner, "request ended before it ran")
		g.settled(ctx, spent+d, rerr)
		return 0, Record{}, fmt.Errorf("idempotency: request ended before it ran: %w", context.Cause(ctx))
	}
	return g.run(ctx, key, res.Owner, claimedAt, spent, fn)
}

// run runs fn for the key that owner claimed at claimedAt, keeping the
// lock while it runs, then stores its record or releases the key. spent is
// the time spent in the store so far (measured only with an observer).
func (g *Guard) run(ctx context.Context, key Key, owner Owner, claimedAt time.Time, spent time.Duration, fn func(context.Context) (Record, bool)) (Outcome, Record, error) {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l := &lease{}
	g.hold(l, context.WithoutCancel(fctx), key, owner, cancel, claimedAt)
	finished := false
	defer func() {
		if finished {
			return
		}
		// fn panicked or called runtime.Goexit: release the key, report,
		// and let it unwind.
		lost, renewals := l.stop()
		if lost {
			g.settled(ctx, spent+renewals, context.Cause(fctx))
			return
		}
		d, err := g.release(fctx, key, owner, "handler panicked")
		g.settled(ctx, spent+renewals+d, err)
	}()
	rec, keep := fn(fctx)
	finished = true
	lost, renewals := l.stop()
	spent += renewals
	var err error
	var d time.Duration
	switch {
	case lost:
		err = context.Cause(fctx)
		g.log.WarnContext(ctx, "idempotency: lock lost while the handler ran; response not stored", "key", key, "err", err)
	case !keep:
		d, err = g.release(fctx, key, owner, "the answer is not stored")
	default:
		d, err = g.complete(l.ctx, key, owner, rec)
	}
	g.settled(ctx, spent+d, err)
	return Claimed, rec, nil
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
