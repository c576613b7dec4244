// Package redisstore is an [idempotency.Store] on Redis (7.0 or later),
// through github.com/redis/go-redis/v9.
//
// Each key is one Redis string under a prefix, named by the hex of the
// hashed [idempotency.Key] (never the raw key), with a TTL: the lock timeout
// while the request runs, the retention once completed. Expiry is Redis's
// own, so an expired lock or record simply disappears.
//
// [Store.Begin] is one command, SET key value NX PX ttl GET: it claims a
// free key or returns what holds it. [Store.Complete], [Store.Extend] and
// [Store.Release] are Lua scripts that check the owner token before they
// write, so a late completion from a lock that expired (or was reclaimed)
// changes nothing. A new request costs two round trips (Begin, Complete),
// plus one per lock renewal for a handler that runs longer than a third of
// the lock timeout; a replay costs one.
//
// go-redis resends a command after a network error (Options.MaxRetries),
// so a command may run twice: a claim that finds the caller's own lock
// claims, and a completion that finds the caller's own identical record
// succeeds. Redis keeps TTLs in whole milliseconds: durations are rounded
// down, and the middleware refuses a lock timeout or retention under 1 ms
// ([Store.CheckTTL]). An out-of-memory refusal (maxmemory reached) wraps
// [idempotency.ErrStoreFull].
//
// Usage:
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store, err := redisstore.New(client, redisstore.Config{Prefix: "myapp:idempotency:"})
//	mw, err := idempotency.NewMiddleware(store, idempotency.WithScope(tenantOf))
package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency"
)

// Client is what the store needs from Redis; *redis.Client,
// *redis.ClusterClient and *redis.Ring satisfy it.
type Client interface {
	redis.Scripter
	SetArgs(ctx context.Context, key string, value any, a redis.SetArgs) *redis.StatusCmd
}

// DefaultPrefix is the key prefix used when [Config.Prefix] is empty.
const DefaultPrefix = "stormguard:idempotency:"

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Prefix is prepended to every Redis key the store writes; empty means
	// [DefaultPrefix]. Give each application (or test run) its own.
	Prefix string
}

// Store is an [idempotency.Store] on Redis. It is safe for concurrent use,
// and many processes may share one Redis.
type Store struct {
	client Client
	prefix string
}

var (
	_ idempotency.Store      = (*Store)(nil)
	_ idempotency.TTLChecker = (*Store)(nil)
)

// New returns a store on client. It fails when client is nil (or a nil
// pointer, such as a nil *redis.Client).
func New(client Client, cfg Config) (*Store, error) {
	if v := reflect.ValueOf(client); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, errors.New("redisstore: New: nil client")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	return &Store{client: client, prefix: cfg.Prefix}, nil
}

// Entry layout (the Redis value):
//
//	byte 0      version (1)
//	byte 1      state: 'p' locked (in progress), 'c' completed
//	bytes 2-17  owner token
//	bytes 18-49 fingerprint
//	bytes 50-   the record (idempotency.Record encoding), completed only
const (
	entryVersion   = 1
	statePending   = 'p'
	stateCompleted = 'c'
	headerLen      = 2 + len(idempotency.Owner{}) + len(idempotency.Fingerprint{})
)

// completeScript replaces owner's live lock with the completed record, or
// finds owner's own identical record (a resent completion).
// KEYS[1] key; ARGV[1] owner, ARGV[2] record, ARGV[3] retention in ms.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 3, 18) ~= ARGV[1] then
	return 0
end
local state = string.sub(v, 1, 2)
if state == '\1c' and string.sub(v, 51) == ARGV[2] then
	return 1
end
if state ~= '\1p' then
	return 0
end
redis.call('SET', KEYS[1], '\1c' .. string.sub(v, 3, 50) .. ARGV[2], 'PX', ARGV[3])
return 1
`)

// extendScript sets owner's live lock to expire ttl from now.
// KEYS[1] key; ARGV[1] owner, ARGV[2] lock TTL in ms.
var extendScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, 2) ~= '\1p' or string.sub(v, 3, 18) ~= ARGV[1] then
	return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
`)

// releaseScript deletes owner's live lock. KEYS[1] key; ARGV[1] owner.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 1, 2) ~= '\1p' or string.sub(v, 3, 18) ~= ARGV[1] then
	return 0
end
redis.call('DEL', KEYS[1])
return 1
`)

func (s *Store) redisKey(k idempotency.Key) string {
	var b [2 * len(idempotency.Key{})]byte
	hex.Encode(b[:], k[:])
	return s.prefix + string(b[:])
}

// Begin implements [idempotency.Store.Begin] with one SET NX PX GET.
// lockTTL is rounded down to whole milliseconds and must be at least 1 ms.
func (s *Store) Begin(ctx context.Context, key idempotency.Key, fp idempotency.Fingerprint, lockTTL time.Duration) (idempotency.Result, error) {
	if err := s.CheckTTL(lockTTL); err != nil {
		return idempotency.Result{}, fmt.Errorf("redisstore: begin: %w", err)
	}
	owner := idempotency.NewOwner()
	v := make([]byte, 0, headerLen)
	v = append(v, entryVersion, statePending)
	v = append(v, owner[:]...)
	v = append(v, fp[:]...)
	old, err := s.client.SetArgs(ctx, s.redisKey(key), v, redis.SetArgs{
		Mode: "NX",
		TTL:  lockTTL.Truncate(time.Millisecond),
		Get:  true,
	}).Bytes()
	if errors.Is(err, redis.Nil) {
		return idempotency.Result{Outcome: idempotency.Claimed, Owner: owner}, nil
	}
	if err != nil {
		return idempotency.Result{}, fmt.Errorf("redisstore: begin: %w", full(err))
	}
	e, err := decodeEntry(old)
	if err != nil {
		return idempotency.Result{}, fmt.Errorf("redisstore: begin: key %v: %w", key, err)
	}
	switch {
	case e.owner == owner && !e.completed:
		// The lock this very call took: go-redis resent the command after
		// losing the first reply.
		return idempotency.Result{Outcome: idempotency.Claimed, Owner: owner}, nil
	case e.fp != fp:
		return idempotency.Result{Outcome: idempotency.Mismatch}, nil
	case !e.completed:
		return idempotency.Result{Outcome: idempotency.InProgress}, nil
	}
	return idempotency.Result{Outcome: idempotency.Completed, Record: e.rec}, nil
}

// Complete implements [idempotency.Store.Complete] with one owner-checked
// Lua script. retention is rounded down to whole milliseconds and must be
// at least 1 ms.
func (s *Store) Complete(ctx context.Context, key idempotency.Key, owner idempotency.Owner, rec idempotency.Record, retention time.Duration) error {
	if err := s.CheckTTL(retention); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	b, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	n, err := completeScript.Run(ctx, s.client, []string{s.redisKey(key)}, owner[:], b, retention.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", full(err))
	}
	if n == 0 {
		return fmt.Errorf("redisstore: complete: key %v: %w", key, idempotency.ErrStaleOwner)
	}
	return nil
}

// Extend implements [idempotency.Store.Extend] with one owner-checked Lua
// script. lockTTL is rounded down to whole milliseconds and must be at
// least 1 ms.
func (s *Store) Extend(ctx context.Context, key idempotency.Key, owner idempotency.Owner, lockTTL time.Duration) error {
	if err := s.CheckTTL(lockTTL); err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	n, err := extendScript.Run(ctx, s.client, []string{s.redisKey(key)}, owner[:], lockTTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: extend: key %v: %w", key, idempotency.ErrStaleOwner)
	}
	return nil
}

// CheckTTL implements [idempotency.TTLChecker]: Redis keeps TTLs in whole
// milliseconds, so d must be at least 1 ms (it is rounded down).
func (s *Store) CheckTTL(d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("redisstore: %v is under Redis's TTL resolution of 1ms", d)
	}
	return nil
}

// full wraps err with idempotency.ErrStoreFull too when Redis refused a
// write for lack of memory (maxmemory reached, no key to evict).
func full(err error) error {
	if strings.HasPrefix(err.Error(), "OOM ") {
		return fmt.Errorf("%w: %w", idempotency.ErrStoreFull, err)
	}
	return err
}

// Release implements [idempotency.Store.Release] with one owner-checked
// Lua script.
func (s *Store) Release(ctx context.Context, key idempotency.Key, owner idempotency.Owner) error {
	n, err := releaseScript.Run(ctx, s.client, []string{s.redisKey(key)}, owner[:]).Int()
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: release: key %v: %w", key, idempotency.ErrStaleOwner)
	}
	return nil
}

// LoadScripts loads the store's Lua scripts into Redis, so that the first
// Complete or Release does not pay the extra round trip of a NOSCRIPT
// fallback. Calling it is optional.
func (s *Store) LoadScripts(ctx context.Context) error {
	for _, sc := range []*redis.Script{completeScript, extendScript, releaseScript} {
		if err := sc.Load(ctx, s.client).Err(); err != nil {
			return fmt.Errorf("redisstore: load scripts: %w", err)
		}
	}
	return nil
}

type entry struct {
	completed bool
	owner     idempotency.Owner
	fp        idempotency.Fingerprint
	rec       idempotency.Record
}

// errCorruptEntry is wrapped by decodeEntry's errors, together with
// idempotency.ErrCorruptRecord.
var errCorruptEntry = fmt.Errorf("%w: bad Redis entry", idempotency.ErrCorruptRecord)

// decodeEntry parses a Redis value written by the store. It never panics.
func decodeEntry(b []byte) (entry, error) {
	if len(b) < headerLen {
		return entry{}, fmt.Errorf("%w: %d bytes, want at least %d", errCorruptEntry, len(b), headerLen)
	}
	if b[0] != entryVersion {
		return entry{}, fmt.Errorf("%w: version %d", errCorruptEntry, b[0])
	}
	var e entry
	copy(e.owner[:], b[2:18])
	copy(e.fp[:], b[18:headerLen])
	switch b[1] {
	case statePending:
		if len(b) != headerLen {
			return entry{}, fmt.Errorf("%w: %d trailing bytes after a lock", errCorruptEntry, len(b)-headerLen)
		}
		return e, nil
	case stateCompleted:
		rec, err := idempotency.DecodeRecord(b[headerLen:])
		if err != nil {
			return entry{}, fmt.Errorf("%w: %w", errCorruptEntry, err)
		}
		e.completed = true
		e.rec = rec
		return e, nil
	}
	return entry{}, fmt.Errorf("%w: state %q", errCorruptEntry, b[1])
}
