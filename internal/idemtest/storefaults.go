package idemtest

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

// Timings of [CompletionBlip] and [SlowRenewal], on real time with a real
// store, or on a synctest bubble's fake time.
const (
	blipLock    = time.Second             // CompletionBlip's lock timeout
	blipFor     = 400 * time.Millisecond  // how long the store is down
	slowLock    = 1500 * time.Millisecond // SlowRenewal's lock timeout: renewals every 500 ms
	slowFrom    = 300 * time.Millisecond  // the store turns slow this long into the handler...
	slowTo      = 1100 * time.Millisecond // ...until this long into it,
	slowBy      = 700 * time.Millisecond  // answering this late
	slowHandler = 2 * time.Second         // how long SlowRenewal's handler runs
)

// CompletionBlip checks that a handler runs once when its store fails just
// as the handler's answer is being stored: a middleware on s (lock timeout
// 1 s, store timeout 200 ms) guards a handler that answers 201 [Charged]
// and, before it returns, calls down(true), which must make every call to
// the store fail, and 400 ms later down(false). The request must get the
// handler's answer, and a retry with its key after the lock timeout the
// replay, not a second run. It calls the handler directly (no network), so
// it runs on real time, or in a synctest bubble on fake time.
func CompletionBlip(tb testing.TB, s store.Store, down func(on bool)) {
	tb.Helper()
	var runs atomic.Int64
	h := guarded(tb, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(Charged))
		down(true)
		time.AfterFunc(blipFor, func() { down(false) })
	}), idempotency.WithLockTimeout(blipLock), idempotency.WithStoreTimeout(blipLock/5))
	key := idempotency.NewKey()
	first := postTo(h, key)
	if first.Code != http.StatusCreated || first.Body.String() != Charged || first.Header().Get(idempotency.ReplayHeader) != "" {
		tb.Fatalf("request whose completion met the store down: %d %q (replayed %q), want the handler's 201 %q",
			first.Code, first.Body, first.Header().Get(idempotency.ReplayHeader), Charged)
	}
	time.Sleep(blipLock * 3 / 2) // the blip long over, a lock left behind long expired
	second := postTo(h, key)
	if n := runs.Load(); n != 1 || second.Code != http.StatusCreated || second.Header().Get(idempotency.ReplayHeader) != "true" {
		tb.Fatalf("retry after the lock timeout: %d %q (replayed %q), handler runs %d; want the replay of 201 and 1 run",
			second.Code, second.Body, second.Header().Get(idempotency.ReplayHeader), n)
	}
}

// SlowRenewal checks that a slow renewal of the lock is taken as slow, not
// as a lost lock: a middleware on s (lock timeout 1.5 s, so renewed every
// 500 ms; the default store timeout, 2 s) guards a handler that runs 2 s; from 300 ms into it to 1.1 s,
// slow(700ms) must make the store answer 700 ms late, then slow(0) makes
// it answer at once again. The renewal sent at 500 ms is answered at about
// 1.2 s: later than the renewal period, before the lock's end. The handler
// must not be canceled, the request must get its answer, and a retry after
// the lock timeout the replay. Like [CompletionBlip], it runs on real time
// or in a synctest bubble.
func SlowRenewal(tb testing.TB, s store.Store, slow func(d time.Duration)) {
	tb.Helper()
	var runs atomic.Int64
	var canceled atomic.Pointer[error]
	h := guarded(tb, s, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.AfterFunc(slowFrom, func() { slow(slowBy) })
		time.AfterFunc(slowTo, func() { slow(0) })
		t := time.NewTimer(slowHandler)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
			cause := context.Cause(r.Context())
			canceled.Store(&cause)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(Charged))
	}), idempotency.WithLockTimeout(slowLock))
	key := idempotency.NewKey()
	first := postTo(h, key)
	if cause := canceled.Load(); cause != nil || first.Code != http.StatusCreated {
		why := "ran to its end"
		if cause != nil {
			why = "canceled: " + (*cause).Error()
		}
		tb.Fatalf("request whose lock renewal was slow: %d %q, handler %s; want the handler's 201, not canceled", first.Code, first.Body, why)
	}
	time.Sleep(2 * slowLock)
	second := postTo(h, key)
	if n := runs.Load(); n != 1 || second.Header().Get(idempotency.ReplayHeader) != "true" {
		tb.Fatalf("retry after the lock timeout: %d %q (replayed %q), handler runs %d; want the replay and 1 run",
			second.Code, second.Body, second.Header().Get(idempotency.ReplayHeader), n)
	}
}

// guarded returns h behind a middleware on s with opts, every caller in
// one scope.
func guarded(tb testing.TB, s store.Store, h http.Handler, opts ...idempotency.Option) http.Handler {
	tb.Helper()
	mw, err := idempotency.NewMiddleware(s, append([]idempotency.Option{SharedScope}, opts...)...)
	if err != nil {
		tb.Fatalf("idempotency.NewMiddleware: %v", err)
	}
	return mw(h)
}

// postTo serves a POST with key to h and returns the answer.
func postTo(h http.Handler, key string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{"amount":100}`))
	req.Header.Set(idempotency.Header, key)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// StoreBlip is how long a store blip of [Config.StoreBlipRate] lasts; a
// server's link to its store blips at most once per 10 StoreBlip (so
// that the tries of the completions a blip failed do not start the next
// one at once): it is down at most a tenth of the time.
const StoreBlip = 20 * time.Millisecond

// errBlip is the error of a store call made during a blip.
var errBlip = errors.New("idemtest: store blip: connection refused")

// blipStore is a server's link to its store that blips: a completion
// starts a blip at the configured rate (if none started within 10
// StoreBlip), and every call during the blip fails. It is safe for
// concurrent use.
type blipStore struct {
	store.Store
	rate  float64
	blips *atomic.Int64

	mu sync.Mutex
	// Fields below are guarded by mu.
	rng   *rand.Rand
	until time.Time // the blip's end
}

func newBlipStore(s store.Store, rate float64, seed uint64, blips *atomic.Int64) *blipStore {
	return &blipStore{Store: s, rate: rate, blips: blips, rng: rand.New(rand.NewPCG(seed, 0xb11b))}
}

// down reports whether a blip is on.
func (b *blipStore) down() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return time.Now().Before(b.until)
}

func (b *blipStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, ttl time.Duration) (store.Result, error) {
	if b.down() {
		return store.Result{}, errBlip
	}
	return b.Store.Begin(ctx, id, fp, ttl)
}

// Complete starts a blip at the configured rate: it then fails, half the
// time after the store took the record (its answer lost).
func (b *blipStore) Complete(ctx context.Context, id store.ID, owner store.Owner, rec store.Record, retention time.Duration) error {
	b.mu.Lock()
	now := time.Now()
	down := now.Before(b.until)
	start := !down && now.After(b.until.Add(9*StoreBlip)) && b.rng.Float64() < b.rate
	after := b.rng.IntN(2) == 0
	if start {
		b.until = now.Add(StoreBlip)
		b.blips.Add(1)
	}
	b.mu.Unlock()
	switch {
	case down:
		return errBlip
	case !start:
		return b.Store.Complete(ctx, id, owner, rec, retention)
	case after:
		_ = b.Store.Complete(ctx, id, owner, rec, retention)
	}
	return errBlip
}

func (b *blipStore) Extend(ctx context.Context, id store.ID, owner store.Owner, ttl time.Duration) error {
	if b.down() {
		return errBlip
	}
	return b.Store.Extend(ctx, id, owner, ttl)
}

func (b *blipStore) Release(ctx context.Context, id store.ID, owner store.Owner) error {
	if b.down() {
		return errBlip
	}
	return b.Store.Release(ctx, id, owner)
}
