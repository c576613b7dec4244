package idempotency

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// MemoryConfig configures a [MemoryStore]. The zero value is usable: every
// zero field takes its default.
type MemoryConfig struct {
	// Shards is the number of independently locked parts of the store;
	// 0 means 16. More shards mean less lock contention between requests
	// with different keys.
	Shards int
	// MaxEntries bounds the number of keys held (locks and records),
	// divided evenly among the shards; 0 means 100,000.
	MaxEntries int
	// MaxBytes bounds the memory held by records, in bytes (bodies, header
	// fields, plus a fixed cost per key), divided evenly among the shards;
	// 0 means 64 MiB.
	MaxBytes int64
	// Now returns the current time; nil means time.Now. Tests inject a fake
	// clock here to check expiry exactly.
	Now func() time.Time
}

// Default bounds of a [MemoryStore].
const (
	DefaultMemoryShards     = 16
	DefaultMemoryMaxEntries = 100_000
	DefaultMemoryMaxBytes   = 64 << 20
)

// entryOverhead is the fixed memory cost, in bytes, charged per key.
const entryOverhead = 160

// MemoryStore is the in-memory [Store], the embedded default: a sharded map
// with a mutex per shard, whose locks and records expire, bounded in entries
// and bytes. It never evicts a live lock or record to make room: when a
// shard is full it first drops its expired entries; if it is still full it
// refuses the new claim or record with an error wrapping [ErrStoreFull]
// (the [Middleware] then answers 503 to a new request, and stores a
// finished response without its body).
//
// The room is shared fairly between scopes ([Key.Scope]): a scope's own
// keys and bytes count twice against the bounds, so that one scope may take
// at most half of the room the other scopes leave free. A caller who floods
// the store with keys only locks itself out; one scope alone (every
// request in one shared scope) may fill half the store. A record of Size 0
// (status only) always fits in place of its lock.
//
// A MemoryStore serves one process only: servers that share keys need a
// shared store (PostgreSQL, Redis). It is safe for concurrent use. Records
// returned by Begin share memory with the store and must not be modified.
// The zero MemoryStore is an empty store with the default bounds.
type MemoryStore struct {
	once       sync.Once
	now        func() time.Time
	maxEntries int   // per shard
	maxBytes   int64 // per shard
	shards     []memShard
}

type memShard struct {
	mu sync.Mutex
	// Fields below are guarded by mu.
	entries map[Key]*memEntry
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
	fp      Fingerprint
	owner   Owner
	done    bool // a record is stored; otherwise the key is locked
	rec     Record
	expires time.Time
	size    int64
}

// NewMemoryStore returns an empty in-memory store. It fails on negative
// fields of cfg, or bounds too small for each shard to hold two keys (one
// scope takes at most half): MaxEntries under 2×Shards, MaxBytes under
// 2×Shards×160.
func NewMemoryStore(cfg MemoryConfig) (*MemoryStore, error) {
	if cfg.Shards < 0 || cfg.MaxEntries < 0 || cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("idempotency: NewMemoryStore: negative bound in %+v", cfg)
	}
	cfg = cfg.withDefaults()
	if cfg.MaxEntries/cfg.Shards < 2 || cfg.MaxBytes/int64(cfg.Shards) < 2*entryOverhead {
		return nil, fmt.Errorf("idempotency: NewMemoryStore: MaxEntries %d and MaxBytes %d leave less than 2 keys (of %d bytes) per shard of %d", cfg.MaxEntries, cfg.MaxBytes, entryOverhead, cfg.Shards)
	}
	s := &MemoryStore{}
	s.once.Do(func() { s.setup(cfg) })
	return s, nil
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg MemoryConfig) withDefaults() MemoryConfig {
	if cfg.Shards == 0 {
		cfg.Shards = DefaultMemoryShards
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMemoryMaxEntries
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMemoryMaxBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// setup sets s up with cfg, whose zero fields take their defaults; cfg
// must be valid.
func (s *MemoryStore) setup(cfg MemoryConfig) {
	cfg = cfg.withDefaults()
	s.now = cfg.Now
	s.maxEntries = cfg.MaxEntries / cfg.Shards
	s.maxBytes = cfg.MaxBytes / int64(cfg.Shards)
	s.shards = make([]memShard, cfg.Shards)
	for i := range s.shards {
		s.shards[i].entries = make(map[Key]*memEntry)
		s.shards[i].scopes = make(map[uint64]*scopeUse)
	}
}

// shard returns the shard of k, setting up a zero store first.
func (s *MemoryStore) shard(k Key) *memShard {
	s.once.Do(func() { s.setup(MemoryConfig{}) })
	// Bytes past the scope part: the keys of one scope spread over all.
	return &s.shards[binary.LittleEndian.Uint64(k[scopeLen:])%uint64(len(s.shards))]
}

var _ Store = (*MemoryStore)(nil)

// Begin implements [Store.Begin].
func (s *MemoryStore) Begin(ctx context.Context, key Key, fp Fingerprint, lockTTL time.Duration) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, fmt.Errorf("idempotency: memory store begin: %w", err)
	}
	if lockTTL <= 0 {
		return Result{}, fmt.Errorf("idempotency: memory store begin: lock TTL %v, want > 0", lockTTL)
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e := sh.entries[key]
	if e != nil && now.Before(e.expires) {
		switch {
		case e.fp != fp:
			return Result{Outcome: Mismatch}, nil
		case e.done:
			return Result{Outcome: Completed, Record: e.rec}, nil
		default:
			return Result{Outcome: InProgress}, nil
		}
	}
	if e == nil {
		if !s.fits(sh, key.Scope(), 1, entryOverhead) {
			sh.sweep(now)
			if !s.fits(sh, key.Scope(), 1, entryOverhead) {
				return Result{}, fmt.Errorf("idempotency: memory store begin: %w (%d keys, %d bytes in shard; the scope's share is used up)", ErrStoreFull, len(sh.entries), sh.bytes)
			}
		}
		e = &memEntry{}
		sh.entries[key] = e
		sh.use(key.Scope()).entries++
	}
	sh.grow(key.Scope(), entryOverhead-e.size)
	*e = memEntry{fp: fp, owner: NewOwner(), expires: now.Add(lockTTL), size: entryOverhead}
	sh.expiresAt(e.expires)
	return Result{Outcome: Claimed, Owner: e.owner}, nil
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

// Complete implements [Store.Complete]. It stores a copy of rec.
func (s *MemoryStore) Complete(ctx context.Context, key Key, owner Owner, rec Record, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	if retention <= 0 {
		return fmt.Errorf("idempotency: memory store complete: retention %v, want > 0", retention)
	}
	if err := rec.check(); err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	if e := sh.entries[key]; e != nil && e.done && e.owner == owner && now.Before(e.expires) && e.rec.equal(rec) {
		return nil // resent
	}
	e, err := sh.owned(key, owner, now)
	if err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	size := entryOverhead + int64(rec.Size())
	if !s.fits(sh, key.Scope(), 0, size-e.size) {
		sh.sweep(now)
		if !s.fits(sh, key.Scope(), 0, size-e.size) {
			return fmt.Errorf("idempotency: memory store complete: %w (record of %d bytes, %d bytes in shard; the scope's share is used up)", ErrStoreFull, size, sh.bytes)
		}
	}
	sh.grow(key.Scope(), size-e.size)
	e.size = size
	e.done = true
	e.rec = Record{Status: rec.Status, Header: cloneHeader(rec.Header), Body: slices.Clone(rec.Body), BodyOmitted: rec.BodyOmitted}
	e.expires = now.Add(retention)
	sh.expiresAt(e.expires)
	return nil
}

// Extend implements [Store.Extend].
func (s *MemoryStore) Extend(ctx context.Context, key Key, owner Owner, lockTTL time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store extend: %w", err)
	}
	if lockTTL <= 0 {
		return fmt.Errorf("idempotency: memory store extend: lock TTL %v, want > 0", lockTTL)
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e, err := sh.owned(key, owner, now)
	if err != nil {
		return fmt.Errorf("idempotency: memory store extend: %w", err)
	}
	e.expires = now.Add(lockTTL)
	sh.expiresAt(e.expires)
	return nil
}

// Release implements [Store.Release].
func (s *MemoryStore) Release(ctx context.Context, key Key, owner Owner) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store release: %w", err)
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, err := sh.owned(key, owner, s.now())
	if err != nil {
		return fmt.Errorf("idempotency: memory store release: %w", err)
	}
	sh.remove(key, e)
	return nil
}

// Len returns the number of keys held, expired ones not yet dropped
// included.
func (s *MemoryStore) Len() int {
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

// Sweep drops every expired lock and record now, and returns how many it
// dropped. The store also sweeps a shard by itself when the shard is full,
// so calling Sweep is optional: it only returns memory sooner.
func (s *MemoryStore) Sweep() int {
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

// owned returns the entry for key if owner holds an unexpired lock on it.
// It requires sh.mu held.
func (sh *memShard) owned(key Key, owner Owner, now time.Time) (*memEntry, error) {
	e := sh.entries[key]
	if e == nil || e.done || e.owner != owner || !now.Before(e.expires) {
		return nil, ErrStaleOwner
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

// remove drops key's entry e. It requires sh.mu held.
func (sh *memShard) remove(key Key, e *memEntry) {
	scope := key.Scope()
	sh.grow(scope, -e.size)
	u := sh.scopes[scope]
	if u.entries--; u.entries == 0 {
		delete(sh.scopes, scope)
	}
	delete(sh.entries, key)
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
