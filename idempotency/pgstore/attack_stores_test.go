// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package pgstore_test

import (
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/pgstore"
	"github.com/stormguard/stormguard/idempotency/store"
)

// A record with an empty header name (which the encoding cannot tell from
// corruption): a black-box attack found the store taking it and every
// retry then failing to decode it (503 for the whole retention). Now no
// store takes it (store.Record.MarshalBinary refuses it) and the Guard
// releases the key at once (Guard.Run: "a record that no store takes ...
// is fn's misuse"), the same on every store.
func TestAttackGuardReleasesRecordWithEmptyHeaderName(t *testing.T) {
	p, _ := pool(t, 4)
	g, err := idempotency.NewGuard(newStore(t, p))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fp := store.NewFingerprint("PUBLISH", "queue/payments", [32]byte{1})
	key := idempotency.NewKey()
	runs := 0
	fn := func(context.Context) (store.Record, bool) {
		runs++
		return store.Record{Status: 200, Header: http.Header{"": {"meta"}}, Body: []byte("done")}, true
	}
	out, _, err := g.Run(ctx, "tenant", key, fp, fn)
	if err != nil || out != store.Claimed {
		t.Fatalf("first Run = %q, %v", out, err)
	}
	out, rec, err := g.Run(ctx, "tenant", key, fp, fn)
	if err != nil || out != store.Claimed || runs != 2 {
		t.Fatalf("retry Run = %q %q, %v; want claimed, fn run again (runs %d)", out, rec.Body, err, runs)
	}
}

func TestAttackGuardConcurrentClaims(t *testing.T) {
	p, _ := pool(t, 16)
	s := newStore(t, p)
	const n = 48
	var runs atomic.Int32
	key := idempotency.NewKey()
	fp := store.NewFingerprint("POST", "/pay", [32]byte{})
	var wg sync.WaitGroup
	start := make(chan struct{})
	var mu sync.Mutex
	outs := map[store.Outcome]int{}
	var errs []error
	for range n {
		g, err := idempotency.NewGuard(s, idempotency.WithLockTimeout(5*time.Second), idempotency.WithStoreTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			<-start
			out, _, err := g.Run(context.Background(), "s", key, fp, func(context.Context) (store.Record, bool) {
				runs.Add(1)
				time.Sleep(time.Millisecond)
				return store.Record{Status: 201, Body: []byte("x")}, true
			})
			mu.Lock()
			defer mu.Unlock()
			outs[out]++
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if runs.Load() != 1 || outs[store.Claimed] != 1 || len(errs) > 0 {
		t.Fatalf("runs %d, outcomes %v, errors %v", runs.Load(), outs, errors.Join(errs...))
	}
}

func TestAttackGuardHugeDurations(t *testing.T) {
	p, _ := pool(t, 4)
	for _, d := range []time.Duration{1<<63 - 1, 100 * 365 * 24 * time.Hour} {
		g, err := idempotency.NewGuard(newStore(t, p), idempotency.WithLockTimeout(d), idempotency.WithRetention(d))
		if err != nil {
			t.Fatal(err)
		}
		fp := store.NewFingerprint("POST", "/", [32]byte{})
		key := idempotency.NewKey()
		fn := func(context.Context) (store.Record, bool) { return store.Record{Status: 200}, true }
		if out, _, err := g.Run(context.Background(), "s", key, fp, fn); out != store.Claimed || err != nil {
			t.Fatalf("%v: Run = %q, %v", d, out, err)
		}
		if out, _, err := g.Run(context.Background(), "s", key, fp, fn); out != store.Completed || err != nil {
			t.Fatalf("%v: second Run = %q, %v", d, out, err)
		}
	}
}

// Concurrent Begins on a key whose row is present but expired: exactly one
// claims.
func TestAttackConcurrentBeginsOnExpiredRow(t *testing.T) {
	p, _ := pool(t, 16)
	s, table := newTable(t, p)
	ctx := context.Background()
	for round := range 5 {
		k := testID("attack-expired", idempotency.NewKey())
		fp := store.NewFingerprint("POST", "/x", [32]byte{})
		a, err := s.Begin(ctx, k, fp, time.Hour)
		if err != nil || a.Outcome != store.Claimed {
			t.Fatalf("Begin = %v %v", a.Outcome, err)
		}
		if round%2 == 1 {
			if err := s.Complete(ctx, k, a.Owner, store.Record{Status: 200}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Exec(ctx, "UPDATE "+table+" SET expires_at = now() - interval '1 second'"); err != nil {
			t.Fatal(err)
		}
		const n = 32
		var wg sync.WaitGroup
		var mu sync.Mutex
		outs := map[store.Outcome]int{}
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				f := fp
				if i%2 == 0 {
					f = store.NewFingerprint("POST", "/y", [32]byte{})
				}
				res, err := s.Begin(ctx, k, f, time.Hour)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					outs["error"]++
					return
				}
				outs[res.Outcome]++
			})
		}
		close(start)
		wg.Wait()
		if outs[store.Claimed] != 1 || outs[store.Completed] != 0 || outs["error"] != 0 {
			t.Fatalf("round %d: %v", round, outs)
		}
	}
}

// The lock TTL reaches the row as given (microsecond resolution).
func TestAttackTTLPrecision(t *testing.T) {
	p, _ := pool(t, 4)
	s, table := newTable(t, p)
	ctx := context.Background()
	for _, ttl := range []time.Duration{2500*time.Millisecond + 1500*time.Microsecond, 36 * time.Hour, 1000 * 24 * time.Hour, 400*24*time.Hour + 7*time.Microsecond} {
		k := testID("attack-ttl", idempotency.NewKey())
		if _, err := s.Begin(ctx, k, store.Fingerprint{}, ttl); err != nil {
			t.Fatal(err)
		}
		var left time.Duration
		var us int64
		if err := p.QueryRow(ctx, "SELECT (extract(epoch from (expires_at - now()))*1000000)::bigint FROM "+table+" WHERE key = $1", k[:]).Scan(&us); err != nil {
			t.Fatal(err)
		}
		left = time.Duration(us) * time.Microsecond
		if left > ttl || left < ttl-200*time.Millisecond {
			t.Errorf("ttl %v: row expires in %v", ttl, left)
		}
	}
}

// "Migrate creates the table and its expiry index if they do not exist":
// two valid table names (at most 63 characters) that share their first 51
// characters.
func TestAttackMigrateIndexOfLongTableNames(t *testing.T) {
	p, _ := pool(t, 4)
	ctx := context.Background()
	base := "attack_stores_" + strings.ToLower(rand.Text())[:20] // 37 chars
	base += strings.Repeat("x", 51-len(base))
	tables := []string{base + "_first", base + "_second"}
	for _, table := range tables {
		s, err := pgstore.New(p, pgstore.Config{Table: table})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, table := range tables {
		var n int
		if err := p.QueryRow(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)%'`, table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("table %s (%d chars): %d expiry indexes after Migrate, want 1", table, len(table), n)
		}
	}
}

// DeleteExpired running all the time must never drop a live claim: a key
// claimed (fresh, or reclaimed after a 1 ms lock expired) stays claimed.
func TestAttackDeleteExpiredRacesClaims(t *testing.T) {
	p, _ := pool(t, 12)
	s := newStore(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			s.DeleteExpired(ctx)
		}
	})
	var bad atomic.Int32
	var total atomic.Int32
	for w := range 8 {
		wg.Go(func() {
			for i := 0; i < 150; i++ {
				k := testID("attack-del", string(rune(w)), idempotency.NewKey())
				fp := store.NewFingerprint("POST", "/", [32]byte{})
				// a 1 ms lock that expires, then the reclaim
				if _, err := s.Begin(ctx, k, fp, time.Millisecond); err != nil {
					return
				}
				for {
					res, err := s.Begin(ctx, k, fp, time.Hour)
					if err != nil {
						return
					}
					if res.Outcome == store.Claimed {
						break
					}
				}
				res, err := s.Begin(ctx, k, fp, time.Hour)
				if err != nil {
					return
				}
				total.Add(1)
				if res.Outcome != store.InProgress {
					bad.Add(1)
				}
			}
		})
	}
	time.AfterFunc(20*time.Second, cancel)
	for total.Load() < 8*150 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	if bad.Load() > 0 {
		t.Fatalf("%d of %d live claims lost to DeleteExpired", bad.Load(), total.Load())
	}
	t.Logf("%d claims checked", total.Load())
}
