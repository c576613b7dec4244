// Package redisstore is a store of idempotency keys ([store.Store]) on
// Redis (7.0 or later), one server or a Redis Cluster, through
// github.com/redis/go-redis/v9, for the middleware of package idempotency.
//
// Each key is one Redis string under a prefix, named by the hex of the
// key's [store.ID] (a hash: never the raw key), with a TTL: the lock
// timeout while the request runs, the retention once completed. Expiry is
// Redis's own, by the server's clock, so an expired lock or record simply
// disappears.
//
// [Store.Begin] is one command, SET key value NX PX ttl GET: it claims a
// free key or returns what holds it. [Store.Complete], [Store.Extend] and
// [Store.Release] are Lua scripts that check the owner token before they
// write, so a late completion from a lock that expired (or was reclaimed)
// changes nothing. Every command and script touches one key, so the store
// runs on a Redis Cluster as on one server (a *redis.ClusterClient routes
// each key to its master). A new request costs two round trips (Begin,
// Complete), plus one per lock renewal for a handler that runs longer
// than a third of the lock timeout; a replay costs one.
//
// go-redis resends a command after a network error (Options.MaxRetries),
// so a command may run twice: a claim that finds the caller's own lock
// claims, and a completion that finds the caller's own identical record
// succeeds. A claim whose reply is lost (a timeout, a broken connection)
// returns its owner token with the error, so that the idempotency Guard
// releases it (see [store.Result.Owner]). Redis keeps TTLs in whole milliseconds: a lock's duration is
// rounded up and a retention down, and one under 1 ms is an error. An out-of-memory refusal
// (maxmemory reached) wraps [store.ErrStoreFull].
//
// # What the server must keep
//
// The store is as durable as the Redis it runs on, and two server
// settings decide that beyond replication (below). Eviction: every lock
// and record has a TTL, so under any maxmemory-policy but noeviction
// (allkeys-* and volatile-* alike; many managed services default to
// volatile-lru) a full server may evict a lock while its handler runs or a
// record within its retention, and a retry with that key then claims it
// and runs its handler a second time (while the first runs, or after).
// Run it with maxmemory-policy noeviction: a full server then refuses the
// write, which this store reports as [store.ErrStoreFull] (the middleware
// answers 503 and runs nothing, or keeps the lock and tries the
// completion again). Persistence: a server that restarts without its data
// (no persistence, or the writes since its last RDB snapshot) has lost
// every lock and record it held, with the same effect; with appendonly
// yes it keeps what it had written to its log (appendfsync always: every
// acknowledged write; everysec, the default: all but about the last
// second's). Neither setting is checked: a managed Redis often refuses
// CONFIG GET.
//
// A *redis.Ring does not keep a key on one server: when a shard fails its
// health checks (go-redis: 3 failed pings, 500 ms apart by default) the
// Ring sends that shard's keys to the others until it is back, and a
// retry then finds no lock or record there, claims the key and runs its
// handler a second time (and the running handler's renewals and
// completion are refused). With a Ring, a handler runs at most once only
// while no shard is taken out; use a *redis.Client or a
// *redis.ClusterClient where that matters.
//
// # Replication and failover
//
// Redis replicates asynchronously: a master acknowledges a write before
// its replicas have it, and a replica promoted after the master failed
// (Redis Cluster's automatic failover, Sentinel) has lost whatever the
// master acknowledged last. A manual failover (CLUSTER FAILOVER) waits for
// the replica to catch up and loses nothing. For this store a lost claim
// means a retry claims the key again and runs its handler a second time
// while (or after) the first runs; a lost completion means the key falls
// back to its lock, so a retry after the lock timeout runs the handler
// again.
//
// With [Config.Replicas] set to n, every claim, renewal and completion is
// followed, on the same connection, by WAIT n: the store reports it done
// only once n replicas have it, within the call's deadline. A claim that
// n replicas do not confirm is released and reported as an error (the
// middleware answers 503, the handler does not run); a completion or
// renewal that they do not confirm is an error the middleware tries
// again, with the lock held. A write confirmed by n replicas survives the
// failure of its master as long as the replica promoted is one of them:
// with n equal to the number of replicas of each master, any one; with
// fewer, Redis Cluster promotes the replica with the most data first but
// does not promise it. The cost: each write waits for a replica's
// acknowledgement (a round trip from master to replica), and while a
// master has fewer than n replicas (one failed, or promoted) its keys
// answer 503. Replicas 0 (the default) does not wait: the store is then as
// durable as the server's replication, and a failover that loses a write
// may run a handler twice. Redis's own min-replicas-to-write setting
// narrows the window (the master refuses writes when its replicas lag)
// but does not close it.
//
// Give the client ContextTimeoutEnabled: true, so that a command returns
// when its context ends (the Guard's store timeout): without it go-redis
// waits for a blocked read until its ReadTimeout (3 s by default), and the
// Guard's abandoned calls run on past the request that made them (each
// holding a pool connection; a late one changes nothing, the owner token
// is checked).
//
// Usage:
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
//	keys, err := redisstore.New(client, redisstore.Config{Prefix: "myapp:idempotency:"})
//	mw, err := idempotency.NewMiddleware(keys, idempotency.WithScope(tenantOf))
package redisstore

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"reflect"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/store"
)

// defaultPrefix is the key prefix used when Config.Prefix is empty.
const defaultPrefix = "stormguard:idempotency:"

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Prefix is prepended to every Redis key the store writes; empty means
	// "stormguard:idempotency:". Give each application (or test run) its
	// own.
	Prefix string
	// Replicas is the number of replicas that must have each claim,
	// renewal and completion before the store reports it done (WAIT; see
	// "Replication and failover" in the package documentation); 0, the
	// default, does not wait. It needs a *redis.Client or a
	// *redis.ClusterClient.
	Replicas int
}

// Store is a store of idempotency keys on Redis. It is safe for concurrent
// use, and many processes may share one Redis or Redis Cluster.
type Store struct {
	client   redis.UniversalClient
	prefix   string
	replicas int
	node     func(ctx context.Context, key string) (*redis.Client, error) // the master of key, with Replicas
	reload   func(ctx context.Context)                                    // after a failed write on node, if not nil
}

var _ store.Store = (*Store)(nil)

// New returns a store on client (a *redis.Client, *redis.ClusterClient or
// *redis.Ring, which does not keep a key through a shard's outage: see
// What the server must keep; with Config.Replicas, one of the first two).
// It fails when
// client is nil (or a nil pointer, such as a nil *redis.Client), or
// Replicas is negative or set for a client that cannot wait for replicas.
func New(client redis.UniversalClient, cfg Config) (*Store, error) {
	if v := reflect.ValueOf(client); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, errors.New("redisstore: New: nil client")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = defaultPrefix
	}
	if cfg.Replicas < 0 {
		return nil, fmt.Errorf("redisstore: New: Replicas %d, want >= 0", cfg.Replicas)
	}
	s := &Store{client: client, prefix: cfg.Prefix, replicas: cfg.Replicas}
	if cfg.Replicas == 0 {
		return s, nil
	}
	switch c := client.(type) {
	case *redis.ClusterClient:
		s.node = c.MasterForKey
		s.reload = c.ReloadState
	case *redis.Client:
		s.node = func(context.Context, string) (*redis.Client, error) { return c, nil }
	default:
		return nil, fmt.Errorf("redisstore: New: Replicas needs a *redis.Client or *redis.ClusterClient, not a %T", client)
	}
	return s, nil
}

// completeScript replaces owner's live lock with the completed record, or
// finds owner's own identical record (a resent completion: its retention
// is set again, a write that replicas confirm like the first).
// KEYS[1] key; ARGV[1] owner, ARGV[2] record, ARGV[3] retention in ms.
var completeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if (not v) or string.sub(v, 3, 18) ~= ARGV[1] then
	return 0
end
local state = string.sub(v, 1, 2)
if state == '\1c' and string.sub(v, 51) == ARGV[2] then
	redis.call('PEXPIRE', KEYS[1], ARGV[3])
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

func (s *Store) redisKey(id store.ID) string {
	var b [2 * len(store.ID{})]byte
	hex.Encode(b[:], id[:])
	return s.prefix + string(b[:])
}

// Begin implements [store.Store.Begin] with one SET NX PX GET (followed by
// WAIT with Config.Replicas). lockTTL is rounded up to whole
// milliseconds (see store.Store: a lock never ends before its holder
// thinks) and must be at least 1 ms.
func (s *Store) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, lockTTL time.Duration) (store.Result, error) {
	if err := checkTTL("lock TTL", lockTTL); err != nil {
		return store.Result{}, fmt.Errorf("redisstore: begin: %w", err)
	}
	owner := store.NewOwner()
	v := make([]byte, 0, headerLen)
	v = append(v, entryVersion, statePending)
	v = append(v, owner[:]...)
	v = append(v, fp[:]...)
	key := s.redisKey(id)
	args := redis.SetArgs{Mode: "NX", TTL: ceilMS(lockTTL), Get: true}
	var old []byte
	var err error
	if s.replicas == 0 {
		old, err = s.client.SetArgs(ctx, key, v, args).Bytes()
	} else {
		old, err = s.claimReplicated(ctx, key, v, args, owner)
	}
	if errors.Is(err, redis.Nil) {
		return store.Result{Outcome: store.Claimed, Owner: owner}, nil
	}
	if err != nil {
		return store.Result{Owner: lostClaim(err, owner)}, fmt.Errorf("redisstore: begin: %w", full(err))
	}
	e, err := decodeEntry(old)
	if err != nil {
		return store.Result{}, fmt.Errorf("redisstore: begin: key %x: %w", id, err)
	}
	switch {
	case e.owner == owner && !e.completed:
		// The lock this very call took: go-redis resent the command after
		// losing the first reply.
		if s.replicas > 0 {
			// The first SET may have gone out on another connection,
			// whose WAIT this one cannot see: renew the lock, a write
			// that comes after it and that replicas must confirm.
			if err := s.Extend(ctx, id, owner, lockTTL); err != nil {
				return store.Result{}, fmt.Errorf("redisstore: begin: %w", err)
			}
		}
		return store.Result{Outcome: store.Claimed, Owner: owner}, nil
	case e.fp != fp:
		return store.Result{Outcome: store.Mismatch}, nil
	case !e.completed:
		return store.Result{Outcome: store.InProgress}, nil
	}
	return store.Result{Outcome: store.Completed, Record: e.rec}, nil
}

// Complete implements [store.Store.Complete] with one owner-checked Lua
// script (followed by WAIT with Config.Replicas). retention is rounded
// down to whole milliseconds and must be at least 1 ms.
func (s *Store) Complete(ctx context.Context, id store.ID, owner store.Owner, rec store.Record, retention time.Duration) error {
	if err := checkTTL("retention", retention); err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	b, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	n, err := s.script(ctx, completeScript, s.redisKey(id), owner[:], b, retention.Milliseconds())
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", full(err))
	}
	if n == 0 {
		return fmt.Errorf("redisstore: complete: key %x: %w", id, store.ErrStaleOwner)
	}
	return nil
}

// Extend implements [store.Store.Extend] with one owner-checked Lua script
// (followed by WAIT with Config.Replicas). lockTTL is rounded up to
// whole milliseconds and must be at least 1 ms.
func (s *Store) Extend(ctx context.Context, id store.ID, owner store.Owner, lockTTL time.Duration) error {
	if err := checkTTL("lock TTL", lockTTL); err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	n, err := s.script(ctx, extendScript, s.redisKey(id), owner[:], ceilMS(lockTTL).Milliseconds())
	if err != nil {
		return fmt.Errorf("redisstore: extend: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: extend: key %x: %w", id, store.ErrStaleOwner)
	}
	return nil
}

// Release implements [store.Store.Release] with one owner-checked Lua
// script. It does not wait for replicas: a release that a failover loses
// leaves the key locked until its lock timeout, after which a retry runs
// the handler, which is what the release asked for, only later.
func (s *Store) Release(ctx context.Context, id store.ID, owner store.Owner) error {
	n, err := releaseScript.Run(ctx, s.client, []string{s.redisKey(id)}, owner[:]).Int()
	if err != nil {
		return fmt.Errorf("redisstore: release: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("redisstore: release: key %x: %w", id, store.ErrStaleOwner)
	}
	return nil
}

// ceilMS rounds a lock's duration up to whole milliseconds, Redis's
// resolution (saturating: a duration within a millisecond of the largest
// is rounded down).
func ceilMS(d time.Duration) time.Duration {
	if r := d % time.Millisecond; r != 0 && d <= math.MaxInt64-time.Millisecond {
		return d - r + time.Millisecond
	}
	return d.Truncate(time.Millisecond)
}

// checkTTL refuses a duration Redis would round to nothing: it keeps TTLs
// in whole milliseconds.
func checkTTL(what string, d time.Duration) error {
	if d < time.Millisecond {
		return fmt.Errorf("%s %v is under Redis's TTL resolution of 1ms", what, d)
	}
	return nil
}

// lostClaim returns owner when err, the claim's error, leaves it unknown
// whether the claim was made: the command may have reached Redis (a
// timeout on its reply, a connection broken after it was written) and
// Redis did not answer with an error of its own. Nothing was sent when
// the client was closed, when no connection could be had from the pool or
// dialed, or when the context ended while waiting for one (a bare
// context error: a reply's own deadline is a network timeout); the zero
// owner then.
func lostClaim(err error, owner store.Owner) store.Owner {
	var re redis.Error
	var op *net.OpError
	var ne net.Error
	switch {
	case errors.As(err, &re), errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.As(err, &op) && op.Op == "dial",
		(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) && !errors.As(err, &ne):
		return store.Owner{}
	}
	return owner
}

// full wraps err with store.ErrStoreFull too when Redis refused a write
// for lack of memory (maxmemory reached, no key to evict).
func full(err error) error {
	if strings.HasPrefix(err.Error(), "OOM ") {
		return fmt.Errorf("%w: %w", store.ErrStoreFull, err)
	}
	return err
}
