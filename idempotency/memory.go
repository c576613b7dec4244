package idempotency

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/recordcheck"
)

// MemoryConfig configures a [MemoryStore]. The zero value is usable: every
// zero field takes its default.
type MemoryConfig struct {
	// MaxEntries bounds the number of keys held (locks and records); 0
	// means 100,000.
	MaxEntries int
	// MaxBytes bounds the memory held by records, in bytes (bodies, header
	// fields, plus a fixed cost of 160 bytes per key); 0 means 64 MiB. A
	// body is kept only if its record, with the key's fixed cost, fits in
	// half a shard (see [MemoryStore]): with 16 shards, a body of up to
	// MaxBytes/32 less 160 bytes and the size of its header fields (each
	// name and each value counts 16 bytes more than its length).
	MaxBytes int64
}

// Default bounds of a MemoryStore, and its most shards: independently
// locked parts, each with an even share of the bounds. A store has fewer
// when its bounds are small (a shard holds at least minShardEntries keys
// and minShardBytes bytes), so that a small store does not refuse a key
// while most of its room is free in other shards.
const (
	defaultMemoryMaxEntries = 100_000
	defaultMemoryMaxBytes   = 64 << 20
	maxMemoryShards         = 16
	minShardEntries         = 64
	minShardBytes           = minShardEntries * entryOverhead
)

// entryOverhead is the fixed memory cost, in bytes, charged per key.
const entryOverhead = 160

// MemoryStore is the in-memory store of idempotency keys, the embedded
// default (it implements [store.Store]): a sharded map with a mutex per
// shard, whose locks and records expire, bounded in entries and bytes. It
// never evicts a live lock or record to make room: when a shard is full it
// first drops its expired entries; if it is still full it refuses the new
// claim or record with an error wrapping [store.ErrStoreFull] (the
// middleware ([NewMiddleware]) then answers 503 to a new request, and stores a finished
// response without its body).
//
// The room is shared fairly between callers (the scopes of [WithScope]):
// a scope's own keys and bytes count twice against the bounds, so that one
// scope may take at most half of the room the other scopes leave free. A
// caller who floods the store with keys only locks itself out; one scope
// alone (every request in one shared scope) may fill about half the store.
// A record of the status alone always fits in place of its lock.
//
// The bounds are split evenly over the shards (up to 16, each at least
// 64 keys), and the rules above hold shard by shard, a key's shard chosen
// by its hash: one scope is refused once any shard holds its half (at
// about 38% of the store with 1,024 keys in 16 shards, 48% with the
// default 100,000), and a record's body is kept only if the record (its
// body, its header fields and the key's fixed 160 bytes) fits in half a
// shard: with 16 shards, a body of up to MaxBytes/32 less 160 bytes and
// its header fields (just under 2 MiB by default; a larger body is stored
// without it, as [WithMaxResponseBody] says). Set MaxBytes to at least 32
// times the largest record you keep: the largest body plus its header
// fields and 160 bytes.
//
// A MemoryStore serves one process only: servers that share keys need a
// shared store (PostgreSQL, Redis). It is safe for concurrent use. Records
// returned by Begin share memory with the store and must not be modified.
// The zero MemoryStore is an empty store with the default bounds.
type MemoryStore struct {
	once       sync.Once
	now        func() time.Time // time.Now; tests set another clock
	maxEntries int              // per shard
	maxBytes   int64            // per shard
	shards     []memShard
}

type memShard struct {
	mu sync.Mutex
	// Fields below are guarded by mu.
	entries map[store.ID]*memEntry
	scopes  map[uint64]*scopeUse // scopes with entries in the shard
	bytes   int64
	// sweepAt is a lower bound of every entry's expiry: sweeping before
	// it would find nothing.
	sweepAt time.Time
	_       [64]byte // keep shards on separate cache lines
}

// scopeUse is what one scope holds in a shard.
type scopeUse struct {
	entries int
	bytes   int64
}

type memEntry struct {
	fp      store.Fingerprint
	owner   store.Owner
	done    bool // a record is stored; otherwise the key is locked
	rec     store.Record
	expires time.Time
	size    int64
}

// NewMemoryStore returns an empty in-memory store. It fails on negative
// fields of cfg, or bounds under 4 keys (MaxEntries under 4, MaxBytes
// under 640): each scope takes at most half of the room the others leave
// free, and a scope that took its half must still leave a key for another.
func NewMemoryStore(cfg MemoryConfig) (*MemoryStore, error) {
	if cfg.MaxEntries < 0 || cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("idempotency: NewMemoryStore: negative bound in %+v", cfg)
	}
	cfg = cfg.withDefaults()
	if cfg.MaxEntries < 4 || cfg.MaxBytes < 4*entryOverhead {
		return nil, fmt.Errorf("idempotency: NewMemoryStore: MaxEntries %d and MaxBytes %d leave room for less than 4 keys (of %d bytes)", cfg.MaxEntries, cfg.MaxBytes, entryOverhead)
	}
	s := &MemoryStore{}
	s.once.Do(func() { s.setup(cfg) })
	return s, nil
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg MemoryConfig) withDefaults() MemoryConfig {
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = defaultMemoryMaxEntries
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = defaultMemoryMaxBytes
	}
	return cfg
}

// setup sets s up with cfg, whose zero fields take their defaults; cfg
// must be valid.
func (s *MemoryStore) setup(cfg MemoryConfig) {
	cfg = cfg.withDefaults()
	n := int(min(maxMemoryShards, int64(cfg.MaxEntries/minShardEntries), cfg.MaxBytes/minShardBytes))
	n = max(n, 1)
	if s.now == nil {
		s.now = time.Now
	}
	s.maxEntries = cfg.MaxEntries / n
	s.maxBytes = cfg.MaxBytes / int64(n)
	s.shards = make([]memShard, n)
	for i := range s.shards {
		s.shards[i].entries = make(map[store.ID]*memEntry)
		s.shards[i].scopes = make(map[uint64]*scopeUse)
	}
}

// shard returns the shard of id, setting up a zero store first.
func (s *MemoryStore) shard(id store.ID) *memShard {
	s.once.Do(func() { s.setup(MemoryConfig{}) })
	// Bytes past the scope part: the keys of one scope spread over all.
	return &s.shards[binary.LittleEndian.Uint64(id[scopeLen:])%uint64(len(s.shards))]
}

var _ store.Store = (*MemoryStore)(nil)

// Begin implements [store.Store.Begin].
func (s *MemoryStore) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, lockTTL time.Duration) (store.Result, error) {
	if err := ctx.Err(); err != nil {
		return store.Result{}, fmt.Errorf("idempotency: memory store begin: %w", err)
	}
	if lockTTL <= 0 {
		return store.Result{}, fmt.Errorf("idempotency: memory store begin: lock TTL %v, want > 0", lockTTL)
	}
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.entries[id]
	if e != nil && now.Before(e.expires) {
		switch {
		case e.fp != fp:
			return store.Result{Outcome: store.Mismatch}, nil
		case e.done:
			return store.Result{Outcome: store.Completed, Record: e.rec}, nil
		default:
			return store.Result{Outcome: store.InProgress}, nil
		}
	}
	scope := scopeOf(id)
	if e == nil {
		if !s.fits(sh, scope, 1, entryOverhead) {
			sh.sweep(now)
			if !s.fits(sh, scope, 1, entryOverhead) {
				return store.Result{}, fmt.Errorf("idempotency: memory store begin: %w (%d keys, %d bytes in shard; the scope's share is used up)", store.ErrStoreFull, len(sh.entries), sh.bytes)
			}
		}
		e = &memEntry{}
		sh.entries[id] = e
		sh.use(scope).entries++
	}
	sh.grow(scope, entryOverhead-e.size)
	*e = memEntry{fp: fp, owner: store.NewOwner(), expires: now.Add(lockTTL), size: entryOverhead}
	sh.expiresAt(e.expires)
	return store.Result{Outcome: store.Claimed, Owner: e.owner}, nil
}

// fits reports whether the shard has room for entries more keys and bytes
// more bytes of scope, its share counted twice. It requires sh.mu held.
func (s *MemoryStore) fits(sh *memShard, scope uint64, entries int, bytes int64) bool {
	var own scopeUse
	if u := sh.scopes[scope]; u != nil {
		own = *u
	}
	if entries > 0 && len(sh.entries)+own.entries+2*entries > s.maxEntries {
		return false
	}
	return bytes <= 0 || sh.bytes+own.bytes+2*bytes <= s.maxBytes
}

// Complete implements [store.Store.Complete]. It stores a copy of rec.
func (s *MemoryStore) Complete(ctx context.Context, id store.ID, owner store.Owner, rec store.Record, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	if retention <= 0 {
		return fmt.Errorf("idempotency: memory store complete: retention %v, want > 0", retention)
	}
	if err := checkRecord(rec); err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	if e := sh.entries[id]; e != nil && e.done && e.owner == owner && now.Before(e.expires) && sameRecord(e.rec, rec) {
		return nil // resent
	}
	e, err := sh.owned(id, owner, now)
	if err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	scope := scopeOf(id)
	size := entryOverhead + recordSize(rec)
	if !s.fits(sh, scope, 0, size-e.size) {
		sh.sweep(now)
		if !s.fits(sh, scope, 0, size-e.size) {
			return fmt.Errorf("idempotency: memory store complete: %w (record of %d bytes, %d bytes in shard; the scope's share is used up)", store.ErrStoreFull, size, sh.bytes)
		}
	}
	sh.grow(scope, size-e.size)
	e.size = size
	e.done = true
	e.rec = store.Record{Status: rec.Status, Header: cloneHeader(rec.Header), Body: slices.Clone(rec.Body), BodyOmitted: rec.BodyOmitted}
	e.expires = now.Add(retention)
	sh.expiresAt(e.expires)
	return nil
}

// Extend implements [store.Store.Extend].
func (s *MemoryStore) Extend(ctx context.Context, id store.ID, owner store.Owner, lockTTL time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store extend: %w", err)
	}
	if lockTTL <= 0 {
		return fmt.Errorf("idempotency: memory store extend: lock TTL %v, want > 0", lockTTL)
	}
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e, err := sh.owned(id, owner, now)
	if err != nil {
		return fmt.Errorf("idempotency: memory store extend: %w", err)
	}
	e.expires = now.Add(lockTTL)
	sh.expiresAt(e.expires)
	return nil
}

// Release implements [store.Store.Release].
func (s *MemoryStore) Release(ctx context.Context, id store.ID, owner store.Owner) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store release: %w", err)
	}
	sh := s.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, err := sh.owned(id, owner, s.now())
	if err != nil {
		return fmt.Errorf("idempotency: memory store release: %w", err)
	}
	sh.remove(id, e)
	return nil
}

// len returns the number of keys held, expired ones not yet dropped
// included.
func (s *MemoryStore) len() int {
	s.once.Do(func() { s.setup(MemoryConfig{}) })
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// sweep drops every expired lock and record now, and returns how many it
// dropped. The store sweeps a shard by itself when the shard is full.
func (s *MemoryStore) sweep() int {
	s.once.Do(func() { s.setup(MemoryConfig{}) })
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepAt = time.Time{}
		n += sh.sweep(s.now())
		sh.mu.Unlock()
	}
	return n
}

// owned returns the entry for id if owner holds an unexpired lock on it.
// It requires sh.mu held.
func (sh *memShard) owned(id store.ID, owner store.Owner, now time.Time) (*memEntry, error) {
	e := sh.entries[id]
	if e == nil || e.done || e.owner != owner || !now.Before(e.expires) {
		return nil, store.ErrStaleOwner
	}
	return e, nil
}

// use returns the use of scope, creating it. It requires sh.mu held.
func (sh *memShard) use(scope uint64) *scopeUse {
	u := sh.scopes[scope]
	if u == nil {
		u = &scopeUse{}
		sh.scopes[scope] = u
	}
	return u
}

// grow adds n bytes (maybe negative) held by scope. It requires sh.mu
// held.
func (sh *memShard) grow(scope uint64, n int64) {
	sh.bytes += n
	sh.use(scope).bytes += n
}

// remove drops id's entry e. It requires sh.mu held.
func (sh *memShard) remove(id store.ID, e *memEntry) {
	scope := scopeOf(id)
	sh.grow(scope, -e.size)
	u := sh.scopes[scope]
	if u.entries--; u.entries == 0 {
		delete(sh.scopes, scope)
	}
	delete(sh.entries, id)
}

// expiresAt notes an entry expiring at t. It requires sh.mu held.
func (sh *memShard) expiresAt(t time.Time) {
	if t.Before(sh.sweepAt) {
		sh.sweepAt = t
	}
}

// sweep drops expired entries and returns how many. It scans the shard only
// when sweepAt says something may have expired. It requires sh.mu held.
func (sh *memShard) sweep(now time.Time) int {
	if now.Before(sh.sweepAt) {
		return 0
	}
	n := 0
	var next time.Time
	for k, e := range sh.entries {
		if !now.Before(e.expires) {
			sh.remove(k, e)
			n++
			continue
		}
		if next.IsZero() || e.expires.Before(next) {
			next = e.expires
		}
	}
	if next.IsZero() {
		next = now
	}
	sh.sweepAt = next
	return n
}

func cloneHeader(h map[string][]string) map[string][]string {
	if h == nil {
		return nil
	}
	c := maps.Clone(h)
	for k, v := range c {
		c[k] = slices.Clone(v)
	}
	return c
}

// checkRecord reports what makes rec unstorable, if anything: the checks
// of store.Record.MarshalBinary, which the memory store does not call.
func checkRecord(rec store.Record) error {
	return recordcheck.Check(rec.Status, rec.BodyOmitted, len(rec.Body), rec.Header)
}

// recordSize returns the memory rec holds, in bytes: body, header names
// and values (16 bytes more for each, for the slice and string headers).
func recordSize(rec store.Record) int64 {
	n := len(rec.Body)
	for name, vs := range rec.Header {
		n += len(name) + 16
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	return int64(n)
}

// sameRecord reports whether a and b are the same record (nil and empty
// header or body being the same), as a resent completion is.
func sameRecord(a, b store.Record) bool {
	if a.Status != b.Status || a.BodyOmitted != b.BodyOmitted || !bytes.Equal(a.Body, b.Body) || len(a.Header) != len(b.Header) {
		return false
	}
	for name, vs := range a.Header {
		ws, ok := b.Header[name]
		if !ok || !slices.Equal(vs, ws) {
			return false
		}
	}
	return true
}
