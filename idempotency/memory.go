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
// and bytes. When a shard is full it first drops its expired entries; if it
// is still full it refuses the new claim or record with an error wrapping
// [ErrStoreFull]. It never evicts a live lock or record to make room.
//
// A MemoryStore serves one process only: servers that share keys need a
// shared store (PostgreSQL, Redis). It is safe for concurrent use. Records
// returned by Begin share memory with the store and must not be modified.
type MemoryStore struct {
	now        func() time.Time
	maxEntries int   // per shard
	maxBytes   int64 // per shard
	shards     []memShard
}

type memShard struct {
	mu sync.Mutex
	// Fields below are guarded by mu.
	entries map[Key]*memEntry
	bytes   int64
	// sweepAt is a lower bound of every entry's expiry: sweeping before
	// it would find nothing.
	sweepAt time.Time
	_       [64]byte // keep shards on separate cache lines
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
// fields of cfg or when MaxEntries is smaller than Shards.
func NewMemoryStore(cfg MemoryConfig) (*MemoryStore, error) {
	if cfg.Shards < 0 || cfg.MaxEntries < 0 || cfg.MaxBytes < 0 {
		return nil, fmt.Errorf("idempotency: NewMemoryStore: negative bound in %+v", cfg)
	}
	if cfg.Shards == 0 {
		cfg.Shards = DefaultMemoryShards
	}
	if cfg.MaxEntries == 0 {
		cfg.MaxEntries = DefaultMemoryMaxEntries
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = DefaultMemoryMaxBytes
	}
	if cfg.MaxEntries < cfg.Shards {
		return nil, fmt.Errorf("idempotency: NewMemoryStore: MaxEntries %d < Shards %d", cfg.MaxEntries, cfg.Shards)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	s := &MemoryStore{
		now:        cfg.Now,
		maxEntries: cfg.MaxEntries / cfg.Shards,
		maxBytes:   cfg.MaxBytes / int64(cfg.Shards),
		shards:     make([]memShard, cfg.Shards),
	}
	for i := range s.shards {
		s.shards[i].entries = make(map[Key]*memEntry)
	}
	return s, nil
}

var _ Store = (*MemoryStore)(nil)

func (s *MemoryStore) shard(k Key) *memShard {
	return &s.shards[binary.LittleEndian.Uint64(k[:8])%uint64(len(s.shards))]
}

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
		if len(sh.entries) >= s.maxEntries || sh.bytes+entryOverhead > s.maxBytes {
			sh.sweep(now)
		}
		if len(sh.entries) >= s.maxEntries || sh.bytes+entryOverhead > s.maxBytes {
			return Result{}, fmt.Errorf("idempotency: memory store begin: %w (%d keys, %d bytes in shard)", ErrStoreFull, len(sh.entries), sh.bytes)
		}
		e = &memEntry{}
		sh.entries[key] = e
	}
	sh.bytes += entryOverhead - e.size
	*e = memEntry{fp: fp, owner: NewOwner(), expires: now.Add(lockTTL), size: entryOverhead}
	if e.expires.Before(sh.sweepAt) {
		sh.sweepAt = e.expires
	}
	return Result{Outcome: Claimed, Owner: e.owner}, nil
}

// Complete implements [Store.Complete]. It stores a copy of rec.
func (s *MemoryStore) Complete(ctx context.Context, key Key, owner Owner, rec Record, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	if retention <= 0 {
		return fmt.Errorf("idempotency: memory store complete: retention %v, want > 0", retention)
	}
	if rec.Status < 200 || rec.Status > 999 {
		return fmt.Errorf("idempotency: memory store complete: status %d outside 200-999", rec.Status)
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	e, err := sh.owned(key, owner, now)
	if err != nil {
		return fmt.Errorf("idempotency: memory store complete: %w", err)
	}
	size := entryOverhead + int64(rec.Size())
	if sh.bytes-e.size+size > s.maxBytes {
		sh.sweep(now)
		if sh.bytes-e.size+size > s.maxBytes {
			return fmt.Errorf("idempotency: memory store complete: %w (record of %d bytes, %d bytes in shard)", ErrStoreFull, size, sh.bytes)
		}
	}
	sh.bytes += size - e.size
	e.size = size
	e.done = true
	e.rec = Record{Status: rec.Status, Header: cloneHeader(rec.Header), Body: slices.Clone(rec.Body)}
	e.expires = now.Add(retention)
	if e.expires.Before(sh.sweepAt) {
		sh.sweepAt = e.expires
	}
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
	sh.bytes -= e.size
	delete(sh.entries, key)
	return nil
}

// Len returns the number of keys held, expired ones not yet dropped
// included.
func (s *MemoryStore) Len() int {
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
			sh.bytes -= e.size
			delete(sh.entries, k)
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
