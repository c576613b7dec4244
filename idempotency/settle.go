package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// run runs the handler for the key claimed at claimedAt, keeping the lock
// while it runs, then stores the response or releases the key.
func (m *Middleware) run(w http.ResponseWriter, r *http.Request, body []byte, next http.Handler, key Key, owner Owner, claimedAt time.Time) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	r = r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	r.ContentLength = int64(len(body))
	// One allocation for the recorder and the lease.
	x := &struct {
		rec recorder
		l   lease
	}{rec: recorder{w: w, replay: m.replay, max: m.maxRespBody}}
	rec, l := &x.rec, &x.l
	m.hold(l, context.WithoutCancel(ctx), key, owner, cancel, claimedAt)
	finished := false
	defer func() {
		if !finished && !l.stop() { // panic or runtime.Goexit: release the key, let it unwind
			m.release(ctx, key, owner, "handler panicked")
		}
	}()
	next.ServeHTTP(rec, r)
	finished = true
	switch {
	case l.stop():
		m.log.WarnContext(ctx, "idempotency: lock lost while the handler ran; response not stored", "key", key, "err", context.Cause(ctx))
	case rec.hijacked:
		m.release(ctx, key, owner, "connection hijacked")
	case !rec.wroteHeader && ctx.Err() != nil:
		// Most likely the handler gave up because its request was
		// canceled: nothing was produced, nothing to replay.
		m.release(ctx, key, owner, "handler returned no answer after its request was canceled")
	default:
		if !rec.wroteHeader {
			rec.snapshot(http.StatusOK)
		}
		switch {
		case rec.status < 200:
			m.release(ctx, key, owner, "informational final status")
		case !m.storeStatus(rec.status):
			m.release(ctx, key, owner, "status not stored")
		default:
			m.complete(l.ctx, key, owner, rec)
		}
	}
}

// complete stores what the handler produced. When the store has no room
// for the body (or the body is over the cap) it stores the status and
// header fields without it, and if need be the status alone: the handler
// must not run again because a record was too large. A call that fails
// otherwise is tried once more (a resent completion is harmless); if that
// fails too, the key stays locked until the lock timeout.
func (m *Middleware) complete(ctx context.Context, key Key, owner Owner, rec *recorder) {
	recs := [...]Record{
		{Status: rec.status, Header: rec.header, Body: rec.body},
		{Status: rec.status, Header: rec.header, BodyOmitted: true},
		{Status: rec.status, BodyOmitted: true},
	}
	first := 0
	if rec.overflow {
		first = 1
	}
	for i := first; i < len(recs); i++ {
		err := m.storeComplete(ctx, key, owner, recs[i])
		if err != nil && !errors.Is(err, ErrStaleOwner) && !errors.Is(err, ErrStoreFull) {
			m.log.WarnContext(ctx, "idempotency: store complete failed; trying once more", "key", key, "err", err)
			err = m.storeComplete(ctx, key, owner, recs[i])
		}
		switch {
		case err == nil:
			if i > 0 {
				m.log.WarnContext(ctx, "idempotency: response stored without its body (over the size cap, or no room in the store)",
					"key", key, "status", rec.status, "headers", i == 1, "over_cap", rec.overflow)
			}
			return
		case errors.Is(err, ErrStaleOwner):
			m.log.WarnContext(ctx, "idempotency: completion rejected: lock lost", "key", key, "err", err)
			return
		case !errors.Is(err, ErrStoreFull):
			m.log.ErrorContext(ctx, "idempotency: store complete failed; the key stays locked until the lock timeout", "key", key, "err", err)
			return
		}
	}
	m.log.ErrorContext(ctx, "idempotency: no room in the store even for the status; the key stays locked until the lock timeout", "key", key)
}

func (m *Middleware) release(ctx context.Context, key Key, owner Owner, why string) {
	ctx = context.WithoutCancel(ctx)
	m.log.DebugContext(ctx, "idempotency: releasing key", "key", key, "why", why)
	var err error
	if m.local {
		err = m.store.Release(ctx, key, owner)
	} else {
		_, err = call(ctx, m.callTimeout, "release", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, m.store.Release(ctx, key, owner)
		}, nil)
	}
	if err != nil {
		m.log.WarnContext(ctx, "idempotency: release failed; the key stays locked until the lock timeout", "key", key, "err", err)
	}
}

// begin claims key in the store, within the store timeout. A shared store
// is not called with the request's cancellation: a claim canceled in
// flight may still be made by the server while its answer (and so the
// owner) is lost, which would block the key until the lock timeout.
func (m *Middleware) begin(ctx context.Context, key Key, fp Fingerprint) (Result, error) {
	if m.local {
		return m.store.Begin(ctx, key, fp, m.lockTimeout)
	}
	return call(context.WithoutCancel(ctx), m.callTimeout, "begin", func(ctx context.Context) (Result, error) {
		return m.store.Begin(ctx, key, fp, m.lockTimeout)
	}, func(res Result, err error) {
		if err == nil && res.Outcome == Claimed { // nobody will run it
			m.release(context.Background(), key, res.Owner, "claim landed after the store timeout")
		}
	})
}

// storeComplete completes key with rec, within the store timeout.
func (m *Middleware) storeComplete(ctx context.Context, key Key, owner Owner, rec Record) error {
	if m.local {
		return m.store.Complete(ctx, key, owner, rec, m.retention)
	}
	_, err := call(ctx, m.callTimeout, "complete", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.store.Complete(ctx, key, owner, rec, m.retention)
	}, nil)
	return err
}

// extend renews owner's lock on key, within the store timeout or bound,
// whichever is shorter.
func (m *Middleware) extend(ctx context.Context, key Key, owner Owner, bound time.Duration) error {
	if m.local {
		return m.store.Extend(ctx, key, owner, m.lockTimeout)
	}
	_, err := call(ctx, min(m.callTimeout, bound), "extend", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.store.Extend(ctx, key, owner, m.lockTimeout)
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

// lease keeps a claimed key's lock alive while its handler runs, renewing
// it every third of the lock timeout. When it cannot (the lock is gone, or
// the store has not confirmed it for so long that the next renewal could
// come after it expires), it cancels the handler's context.
type lease struct {
	m      *Middleware
	ctx    context.Context // the request's, not canceled with it
	key    Key
	owner  Owner
	cancel context.CancelCauseFunc
	every  time.Duration

	mu sync.Mutex
	// Fields below are guarded by mu.
	timer   *time.Timer
	lastOK  time.Time // start of the last successful claim or renewal
	stopped bool
	lost    bool
}

// hold sets l up and starts it renewing owner's lock on key, claimed at
// claimedAt; ctx is the request's context without its cancellation, and
// cancel cancels the handler's context.
func (m *Middleware) hold(l *lease, ctx context.Context, key Key, owner Owner, cancel context.CancelCauseFunc, claimedAt time.Time) {
	l.m, l.ctx, l.key, l.owner, l.cancel = m, ctx, key, owner, cancel
	l.every = max(m.lockTimeout/3, time.Nanosecond)
	l.mu.Lock()
	l.lastOK = claimedAt
	l.timer = time.AfterFunc(l.every, l.renew)
	l.mu.Unlock()
}

func (l *lease) renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	start := time.Now()
	err := l.m.extend(l.ctx, l.key, l.owner, l.every)
	switch {
	case err == nil:
		l.lastOK = start
	case errors.Is(err, ErrStaleOwner) || time.Since(l.lastOK)+l.every >= l.m.lockTimeout:
		l.lost = true
		l.cancel(fmt.Errorf("%w: %w", ErrLockLost, err))
		l.m.log.WarnContext(l.ctx, "idempotency: lock lost while the handler runs; canceling it", "key", l.key, "err", err)
		return
	default:
		l.m.log.WarnContext(l.ctx, "idempotency: lock renewal failed; trying again", "key", l.key, "err", err)
	}
	l.timer.Reset(l.every)
}

// stop stops the renewals and reports whether the lock was lost.
func (l *lease) stop() (lost bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	l.timer.Stop()
	return l.lost
}
