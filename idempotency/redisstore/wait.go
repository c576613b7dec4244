package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stormguard/stormguard/idempotency/store"
)

// errNotReplicated is wrapped by the error of a write that fewer than
// Config.Replicas replicas confirmed in time.
var errNotReplicated = errors.New("not confirmed by enough replicas")

// noDeadlineWait bounds WAIT for a call whose context has no deadline (the
// idempotency Guard always gives one: its store timeout).
const noDeadlineWait = time.Second

// script runs sc on key with args and returns its integer reply. With
// Config.Replicas, a reply of 1 (the script wrote) stands only once enough
// replicas confirmed the write.
func (s *Store) script(ctx context.Context, sc *redis.Script, key string, args ...any) (int64, error) {
	if s.replicas == 0 {
		return sc.Run(ctx, s.client, []string{key}, args...).Int64()
	}
	var cmd *redis.Cmd
	acked, err := s.replicated(ctx, key, func(p redis.Pipeliner) redis.Cmder {
		// EVAL, not EVALSHA: a master just promoted has an empty script
		// cache, and a pipeline cannot fall back on NOSCRIPT.
		cmd = sc.Eval(ctx, p, []string{key}, args...)
		return cmd
	})
	if err != nil {
		return 0, err
	}
	n, err := cmd.Int64()
	if err == nil && n == 1 && acked < s.replicas {
		return 0, fmt.Errorf("%w: %d of %d replicas", errNotReplicated, acked, s.replicas)
	}
	return n, err
}

// claimReplicated sets key to v with args (SET NX PX GET), on key's master
// followed by WAIT, and returns what SET returned: redis.Nil when it
// claimed the key. A claim that enough replicas did not confirm, or whose
// answer did not come back, is released (as far as Redis answers) and is
// an error.
func (s *Store) claimReplicated(ctx context.Context, key string, v []byte, args redis.SetArgs, owner store.Owner) ([]byte, error) {
	var set *redis.StatusCmd
	acked, err := s.replicated(ctx, key, func(p redis.Pipeliner) redis.Cmder {
		set = p.SetArgs(ctx, key, v, args)
		return set
	})
	if err != nil {
		// The claim may have been made, its answer lost: release it
		// while the master still answers, rather than leave it to the
		// lock timeout.
		s.releaseClaim(ctx, key, owner)
		return nil, err
	}
	old, err := set.Bytes()
	if errors.Is(err, redis.Nil) && acked < s.replicas {
		s.releaseClaim(ctx, key, owner)
		return nil, fmt.Errorf("%w: %d of %d replicas confirmed the claim (released)", errNotReplicated, acked, s.replicas)
	}
	return old, err
}

// releaseClaim releases owner's lock on key, if there is one, as far as
// Redis answers within a second: best effort, its error ignored.
func (s *Store) releaseClaim(ctx context.Context, key string, owner store.Owner) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), noDeadlineWait)
	defer cancel()
	_ = releaseScript.Run(rctx, s.client, []string{key}, owner[:]).Err()
}

// replicated sends the write that queue adds to a pipeline on key's
// master, followed on the same connection by WAIT for Config.Replicas
// replicas within the context's deadline, and returns the number of
// replicas that confirmed it. The write's own reply is the returned
// command's (redis.Nil included); err is set when the write could not be
// sent or the master refused it. After such an error a cluster client
// reloads the cluster's layout (in the background): a failover or a
// resharding may have moved the key's slot, and the next call goes to its
// new master.
func (s *Store) replicated(ctx context.Context, key string, queue func(redis.Pipeliner) redis.Cmder) (acked int, err error) {
	node, err := s.node(ctx, key)
	if err != nil {
		return 0, err
	}
	var write redis.Cmder
	var wait *redis.Cmd
	// Pipelined returns the first command's error, redis.Nil too: read
	// each command's own.
	_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		write = queue(p)
		wait = p.Do(ctx, "wait", s.replicas, waitTimeout(ctx).Milliseconds())
		return nil
	})
	if err := write.Err(); err != nil && !errors.Is(err, redis.Nil) {
		s.reloadState(ctx) // the slot may have moved (MOVED, CLUSTERDOWN, a dead node)
		return 0, err
	}
	n, err := wait.Int64()
	if err != nil {
		return 0, fmt.Errorf("WAIT: %w", err)
	}
	return int(n), nil
}

// reloadState has a cluster client learn the cluster's layout anew.
func (s *Store) reloadState(ctx context.Context) {
	if s.reload != nil {
		s.reload(ctx)
	}
}

// waitTimeout returns the WAIT timeout for a call with ctx: most of the
// time left before its deadline, so that the answer comes back before it,
// and at least a millisecond (WAIT 0 would wait forever).
func waitTimeout(ctx context.Context) time.Duration {
	d := noDeadlineWait
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl) * 3 / 4
	}
	return max(d, time.Millisecond)
}
